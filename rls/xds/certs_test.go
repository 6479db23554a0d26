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
	ca             *testpki.CA
	server, client tls.Certificate
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	ca := testpki.New(t, "xds test CA")
	return &testPKI{
		ca:     ca,
		server: ca.Issue(t, testpki.LoopbackLeaf("xds server", x509.ExtKeyUsageServerAuth)),
		client: ca.Issue(t, testpki.Leaf{CN: "envoy-ratelimit", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}),
	}
}

// serverTLS requires and verifies client certificates, as Envoy Gateway's xDS server does,
// over TLS 1.3.
func (p *testPKI) serverTLS() *tls.Config {
	c := p.ca.ServerTLS(p.server)
	c.MinVersion = tls.VersionTLS13
	return c
}

// clientTLS trusts the CA, and presents the client certificate when withCert.
func (p *testPKI) clientTLS(withCert bool) *tls.Config {
	if withCert {
		return p.ca.ClientTLS(p.client)
	}
	return p.ca.ClientTLS()
}
