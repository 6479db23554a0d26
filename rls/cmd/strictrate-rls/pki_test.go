package main

import (
	"crypto/tls"
	"crypto/x509"
	"path/filepath"
	"testing"

	"github.com/strictrate/strictrate/rls/internal/testpki"
)

// testPKI is a certificate authority made for one test, as Envoy Gateway's certgen makes one
// for its rate limit deployment, and the certificates it issued.
type testPKI struct {
	t    *testing.T
	ca   *testpki.CA
	pool *x509.CertPool
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	ca := testpki.New(t, "strictrate-rls test CA")
	return &testPKI{t: t, ca: ca, pool: ca.Pool}
}

// issue makes a certificate for name, good for serving on 127.0.0.1 and localhost and for
// presenting as a client (Envoy Gateway's rate limit deployment uses one certificate for
// both).
func (p *testPKI) issue(name string) tls.Certificate {
	p.t.Helper()
	return p.ca.Issue(p.t, testpki.Leaf{CN: name, DNS: []string{"localhost", name}, IPs: testpki.Loopback,
		Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}})
}

// writeSecret writes cert as a Kubernetes TLS Secret is mounted: dir/tls.crt, dir/tls.key and
// dir/ca.crt, in PEM.
func (p *testPKI) writeSecret(dir string, cert tls.Certificate) {
	p.t.Helper()
	testpki.Write(p.t, cert, filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	p.ca.WriteCA(p.t, filepath.Join(dir, "ca.crt"))
}

// serverTLS presents cert and requires a client certificate of this CA, as Envoy Gateway's
// xDS server does.
func (p *testPKI) serverTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.pool,
		MinVersion:   tls.VersionTLS12,
	}
}

// clientTLS trusts this CA and presents certs (none, for a client without a certificate).
func (p *testPKI) clientTLS(certs ...tls.Certificate) *tls.Config {
	return &tls.Config{RootCAs: p.pool, Certificates: certs, MinVersion: tls.VersionTLS12}
}
