package settings

import (
	"context"
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

// testCA is a certificate authority a test makes, with its certificate in a PEM file.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string
	dir  string
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
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
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca := &testCA{cert: cert, key: key, dir: dir, file: filepath.Join(dir, name+"-ca.pem")}
	writePEM(t, ca.file, "CERTIFICATE", der)
	return ca
}

// leaf describes a certificate to issue. No usages means none listed, as Envoy Gateway's
// certgen issues them (valid for any use).
type leaf struct {
	cn     string
	dns    []string
	ips    []net.IP
	usages []x509.ExtKeyUsage
}

// issue signs a certificate for l and writes it and its key to two files.
func (ca *testCA) issue(t *testing.T, l leaf) (certFile, keyFile string) {
	t.Helper()
	certFile = filepath.Join(ca.dir, l.cn+"-"+serial(t).String()+".crt")
	keyFile = certFile[:len(certFile)-len(".crt")] + ".key"
	ca.issueTo(t, l, certFile, keyFile)
	return certFile, keyFile
}

// issueTo is issue into given files, overwriting them.
func (ca *testCA) issueTo(t *testing.T, l leaf, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: l.cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		DNSNames:     l.dns,
		IPAddresses:  l.ips,
		ExtKeyUsage:  l.usages,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
}

func serial(t *testing.T) *big.Int {
	t.Helper()
	n, err := rand.Int(rand.Reader, big.NewInt(1<<62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writePEM(t *testing.T, file, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// pool is a pool holding ca's certificate alone.
func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

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
