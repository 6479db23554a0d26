package settings

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/strictrate/strictrate/rls/internal/testpki"
)

// testCA is a certificate authority a test makes, with its certificate in a PEM file.
type testCA struct {
	ca   *testpki.CA
	file string
	dir  string
	n    int // certificates issued to files named by issue
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	dir := t.TempDir()
	ca := &testCA{ca: testpki.New(t, name), dir: dir, file: filepath.Join(dir, name+"-ca.pem")}
	ca.ca.WriteCA(t, ca.file)
	return ca
}

// leaf describes a certificate to issue (testpki.Leaf).
type leaf = testpki.Leaf

// issue signs a certificate for l and writes it and its key to two files.
func (ca *testCA) issue(t *testing.T, l leaf) (certFile, keyFile string) {
	t.Helper()
	ca.n++
	certFile = filepath.Join(ca.dir, l.CN+"-"+strconv.Itoa(ca.n)+".crt")
	keyFile = certFile[:len(certFile)-len(".crt")] + ".key"
	ca.issueTo(t, l, certFile, keyFile)
	return certFile, keyFile
}

// issueTo is issue into given files, overwriting them.
func (ca *testCA) issueTo(t *testing.T, l leaf, certFile, keyFile string) {
	t.Helper()
	testpki.Write(t, ca.ca.Issue(t, l), certFile, keyFile)
}

// pool is a pool holding ca's certificate alone.
func (ca *testCA) pool() *x509.CertPool { return ca.ca.Pool }

// handshakeResult is what each side of a TLS handshake saw.
type handshakeResult struct {
	serverErr, clientErr error
	server, client       tls.ConnectionState
}

// handshake runs a real TLS handshake over loopback TCP between a server and a client with
// the given configurations. In TLS 1.3 the client's handshake completes before the server
// has checked the client's certificate, so a refused client shows in serverErr.
func handshake(t *testing.T, serverCfg, clientCfg *tls.Config) handshakeResult {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	var res handshakeResult
	done := make(chan struct{})
	go func() {
		defer close(done)
		conn, err := ln.Accept()
		if err != nil {
			res.serverErr = err
			return
		}
		defer conn.Close()
		tc := tls.Server(conn, serverCfg)
		res.serverErr = tc.HandshakeContext(ctx)
		res.server = tc.ConnectionState()
	}()
	conn, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	tc := tls.Client(conn, clientCfg)
	res.clientErr = tc.HandshakeContext(ctx)
	res.client = tc.ConnectionState()
	<-done
	return res
}

// touchLater moves files' modification time forward, so that a rewrite within the
// filesystem's time resolution still reads as a change.
func touchLater(t *testing.T, d time.Duration, files ...string) {
	t.Helper()
	when := time.Now().Add(d)
	for _, f := range files {
		if err := os.Chtimes(f, when, when); err != nil {
			t.Fatal(err)
		}
	}
}
