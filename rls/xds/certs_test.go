package xds_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"
)

// testPKI is a certificate authority with a server certificate for 127.0.0.1 and localhost,
// and a client certificate, all made for one test.
type testPKI struct {
	pool   *x509.CertPool
	server tls.Certificate
	client tls.Certificate
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	caKey := newKey(t)
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "xds test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatalf("CA certificate: %v", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatalf("parse CA certificate: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)

	issue := func(serial int64, name string, usage x509.ExtKeyUsage, ips []net.IP, dns []string) tls.Certificate {
		key := newKey(t)
		template := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  ips,
			DNSNames:     dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatalf("%s certificate: %v", name, err)
		}
		return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	return &testPKI{
		pool: pool,
		server: issue(2, "xds server", x509.ExtKeyUsageServerAuth,
			[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}, []string{"localhost"}),
		client: issue(3, "envoy-ratelimit", x509.ExtKeyUsageClientAuth, nil, nil),
	}
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("generate key: %v", err)
	}
	return key
}

// serverTLS requires and verifies client certificates, as Envoy Gateway's xDS server does.
func (p *testPKI) serverTLS() *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{p.server},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.pool,
		MinVersion:   tls.VersionTLS13,
	}
}

// clientTLS trusts the CA, and presents the client certificate when withCert.
func (p *testPKI) clientTLS(withCert bool) *tls.Config {
	c := &tls.Config{RootCAs: p.pool, MinVersion: tls.VersionTLS12}
	if withCert {
		c.Certificates = []tls.Certificate{p.client}
	}
	return c
}
