package xds_test

import (
	"crypto/tls"
	"crypto/x509"
	"testing"

	"github.com/strictrate/strictrate/rls/internal/testpki"
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
	ca := testpki.New(t, "xds test CA")
	return &testPKI{
		pool: ca.Pool,
		server: ca.Issue(t, testpki.Leaf{CN: "xds server", DNS: []string{"localhost"}, IPs: testpki.Loopback,
			Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}),
		client: ca.Issue(t, testpki.Leaf{CN: "envoy-ratelimit", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}),
	}
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
