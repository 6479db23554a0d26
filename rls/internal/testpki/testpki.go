// Package testpki makes what the service's TLS tests need: a certificate authority of the
// test's own, certificates it signs for loopback servers and clients, and their PEM files,
// as an operator's (or Envoy Gateway's) would be mounted. Nothing here is for production use:
// keys are P-256 and live a day.
package testpki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Loopback is the addresses a test's server listens on: 127.0.0.1 and ::1.
var Loopback = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}

// CA is a certificate authority made for one test.
type CA struct {
	Cert *x509.Certificate
	Pool *x509.CertPool // holds Cert alone
	key  *ecdsa.PrivateKey
}

// New makes a CA whose certificate's common name is name.
func New(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(t),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		IsCA:                  true,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("testpki: CA certificate: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("testpki: parse CA certificate: %v", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, Pool: pool, key: key}
}

// Leaf describes a certificate to issue. No Usages means none listed, as Envoy Gateway's
// certgen issues them (valid for any use).
type Leaf struct {
	CN     string
	DNS    []string
	IPs    []net.IP
	Usages []x509.ExtKeyUsage
}

// Issue signs a certificate for l, with a key of its own.
func (ca *CA) Issue(t testing.TB, l Leaf) tls.Certificate {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: l.CN},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		DNSNames:     l.DNS,
		IPAddresses:  l.IPs,
		ExtKeyUsage:  l.Usages,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatalf("testpki: %s certificate: %v", l.CN, err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// IssueLike is Issue of a certificate as long as like's, so that the two pairs' files are the
// same size (a P-256 key in PKCS #8 always is): a rotation that a file's size, and time when
// both are written in one clock tick, cannot tell apart. l's names must be as long as like's.
func (ca *CA) IssueLike(t testing.TB, l Leaf, like tls.Certificate) tls.Certificate {
	t.Helper()
	// The serial's and the signature's encodings vary by a few bytes: a few tries match.
	for range 1000 {
		if c := ca.Issue(t, l); len(c.Certificate[0]) == len(like.Certificate[0]) {
			return c
		}
	}
	t.Fatalf("testpki: no certificate for %s as long as the one given (%d bytes)", l.CN, len(like.Certificate[0]))
	return tls.Certificate{}
}

// SameTick gives files one modification time, the start of the current second, as files
// written in one tick of a coarse clock have: with IssueLike's equal sizes, a rotation that
// neither the files' sizes nor their times tell.
func SameTick(t testing.TB, files ...string) {
	t.Helper()
	tick := time.Now().Truncate(time.Second)
	for _, f := range files {
		if err := os.Chtimes(f, tick, tick); err != nil {
			t.Fatalf("testpki: %v", err)
		}
	}
}

// WriteCA writes the CA's certificate to file in PEM.
func (ca *CA) WriteCA(t testing.TB, file string) {
	t.Helper()
	writePEM(t, file, "CERTIFICATE", ca.Cert.Raw)
}

// Write writes cert and its key to two files in PEM (the key as PKCS #8), replacing them.
func Write(t testing.TB, cert tls.Certificate, certFile, keyFile string) {
	t.Helper()
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatalf("testpki: marshal key: %v", err)
	}
	writePEM(t, certFile, "CERTIFICATE", cert.Certificate[0])
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
}

func writePEM(t testing.TB, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatalf("testpki: %v", err)
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("testpki: generate key: %v", err)
	}
	return key
}

// serial is a random serial number, so that certificates issued in one test never share one.
func serial(t testing.TB) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatalf("testpki: serial: %v", err)
	}
	return n
}

// LoopbackLeaf describes a certificate for a server on 127.0.0.1, ::1 and localhost, named
// name (also one of its DNS names), for the usages given (none: any use).
func LoopbackLeaf(name string, usages ...x509.ExtKeyUsage) Leaf {
	return Leaf{CN: name, DNS: []string{"localhost", name}, IPs: Loopback, Usages: usages}
}

// ServerTLS presents cert and requires a client certificate this CA issued, as Envoy Gateway's
// servers do.
func (ca *CA) ServerTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    ca.Pool,
		MinVersion:   tls.VersionTLS12,
	}
}

// ClientTLS trusts this CA alone and presents certs (none, for a client without one).
func (ca *CA) ClientTLS(certs ...tls.Certificate) *tls.Config {
	return &tls.Config{RootCAs: ca.Pool, Certificates: certs, MinVersion: tls.VersionTLS12}
}

// WriteSecret writes cert as a Kubernetes TLS Secret is mounted: dir/tls.crt, dir/tls.key and
// dir/ca.crt (this CA's certificate), in PEM.
func (ca *CA) WriteSecret(t testing.TB, dir string, cert tls.Certificate) {
	t.Helper()
	Write(t, cert, filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key"))
	ca.WriteCA(t, filepath.Join(dir, "ca.crt"))
}
