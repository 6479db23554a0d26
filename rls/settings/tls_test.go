package settings

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/rls/internal/testpki"
)

// serverCerts is a CA, a server certificate for localhost and a client certificate it issued.
type serverCerts struct {
	ca                    *testCA
	serverCert, serverKey string
	clientCert, clientKey string
}

func newServerCerts(t *testing.T) serverCerts {
	t.Helper()
	ca := newTestCA(t, "rls")
	sc, sk := ca.issue(t, leaf{CN: "server", DNS: []string{"localhost"}, IPs: []net.IP{net.IPv4(127, 0, 0, 1)},
		Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	cc, ck := ca.issue(t, leaf{CN: "client", DNS: []string{"client.example"},
		Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return serverCerts{ca: ca, serverCert: sc, serverKey: sk, clientCert: cc, clientKey: ck}
}

func mustSettings(t *testing.T, kv ...string) Settings {
	t.Helper()
	s, warnings, err := FromEnv(env(kv...))
	if err != nil {
		t.Fatalf("FromEnv: %v", err)
	}
	for _, w := range warnings {
		t.Logf("warning: %s", w)
	}
	return s
}

func keyPairOf(t *testing.T, certFile, keyFile string) tls.Certificate {
	t.Helper()
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestServerTLSOffWithoutUseTLS(t *testing.T) {
	s := mustSettings(t, "GRPC_SERVER_TLS_CERT", "/nonexistent")
	cfg, err := s.ServerTLS()
	if cfg != nil || err != nil {
		t.Fatalf("ServerTLS() = %v, %v; want nil, nil without GRPC_SERVER_USE_TLS", cfg, err)
	}
}

func TestServerTLSMutual(t *testing.T) {
	c := newServerCerts(t)
	other := newTestCA(t, "other")
	strangerCert, strangerKey := other.issue(t, leaf{CN: "stranger", DNS: []string{"client.example"},
		Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})

	for _, caVar := range []string{"GRPC_CLIENT_TLS_CACERT", "GRPC_SERVER_TLS_CA_CERT"} {
		t.Run(caVar, func(t *testing.T) {
			s := mustSettings(t, "GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", c.serverCert,
				"GRPC_SERVER_TLS_KEY", c.serverKey, caVar, c.ca.file)
			serverCfg, err := s.ServerTLS()
			if err != nil {
				t.Fatal(err)
			}
			client := func(certs ...tls.Certificate) *tls.Config {
				return &tls.Config{RootCAs: c.ca.pool(), ServerName: "localhost", Certificates: certs}
			}

			res := handshake(t, serverCfg, client(keyPairOf(t, c.clientCert, c.clientKey)))
			if res.serverErr != nil || res.clientErr != nil {
				t.Fatalf("client with a certificate of the CA: server %v, client %v", res.serverErr, res.clientErr)
			}
			if got := res.server.PeerCertificates[0].Subject.CommonName; got != "client" {
				t.Errorf("the server saw client %q, want client", got)
			}
			if got := res.client.PeerCertificates[0].Subject.CommonName; got != "server" {
				t.Errorf("the client saw server %q, want server", got)
			}

			if res := handshake(t, serverCfg, client()); res.serverErr == nil {
				t.Error("a client without a certificate was accepted")
			}
			if res := handshake(t, serverCfg, client(keyPairOf(t, strangerCert, strangerKey))); res.serverErr == nil {
				t.Error("a client with a certificate of another CA was accepted")
			}
		})
	}
}

func TestServerTLSWithoutCAAsksNoCertificate(t *testing.T) {
	c := newServerCerts(t)
	s := mustSettings(t, "GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", c.serverCert, "GRPC_SERVER_TLS_KEY", c.serverKey)
	serverCfg, err := s.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	res := handshake(t, serverCfg, &tls.Config{RootCAs: c.ca.pool(), ServerName: "localhost"})
	if res.serverErr != nil || res.clientErr != nil {
		t.Fatalf("server %v, client %v", res.serverErr, res.clientErr)
	}
	if len(res.server.PeerCertificates) != 0 {
		t.Error("the server received a client certificate it should not have asked for")
	}
}

func TestServerTLSClientSAN(t *testing.T) {
	c := newServerCerts(t)
	clientCfg := &tls.Config{RootCAs: c.ca.pool(), ServerName: "localhost",
		Certificates: []tls.Certificate{keyPairOf(t, c.clientCert, c.clientKey)}}
	for _, tc := range []struct {
		san    string
		accept bool
	}{{"client.example", true}, {"other.example", false}} {
		s := mustSettings(t, "GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", c.serverCert,
			"GRPC_SERVER_TLS_KEY", c.serverKey, "GRPC_CLIENT_TLS_CACERT", c.ca.file, "GRPC_CLIENT_TLS_SAN", tc.san)
		serverCfg, err := s.ServerTLS()
		if err != nil {
			t.Fatal(err)
		}
		res := handshake(t, serverCfg, clientCfg)
		if accepted := res.serverErr == nil; accepted != tc.accept {
			t.Errorf("GRPC_CLIENT_TLS_SAN=%s: accepted %v (%v), want %v", tc.san, accepted, res.serverErr, tc.accept)
		}
	}
}

func TestServerTLSReloadsRotatedCertificate(t *testing.T) {
	c := newServerCerts(t)
	s := mustSettings(t, "GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", c.serverCert, "GRPC_SERVER_TLS_KEY", c.serverKey)
	serverCfg, err := s.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	clientCfg := &tls.Config{RootCAs: c.ca.pool(), ServerName: "localhost"}
	served := func() string {
		t.Helper()
		res := handshake(t, serverCfg, clientCfg)
		if res.clientErr != nil || res.serverErr != nil {
			t.Fatalf("server %v, client %v", res.serverErr, res.clientErr)
		}
		return res.client.PeerCertificates[0].Subject.CommonName
	}
	if got := served(); got != "server" {
		t.Fatalf("first certificate %q, want server", got)
	}

	c.ca.issueTo(t, leaf{CN: "rotated", DNS: []string{"localhost"}}, c.serverCert, c.serverKey)
	touchLater(t, time.Hour, c.serverCert, c.serverKey)
	if got := served(); got != "rotated" {
		t.Fatalf("after rotation %q, want rotated", got)
	}

	// Files that do not load (a half-written rotation) keep the last good pair.
	if err := os.WriteFile(c.serverCert, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	touchLater(t, 2*time.Hour, c.serverCert)
	if got := served(); got != "rotated" {
		t.Fatalf("after a broken rotation %q, want rotated kept", got)
	}
}

// A pair replaced by one of the same size, written in the same clock tick (so that its files'
// sizes and modification times are the old ones'), and moved over the old files as a
// deployment rotates them, is served within a second or so, as the reference serves it: the
// files are told apart by their content.
func TestServerTLSReloadsSameSizeSameTime(t *testing.T) {
	dir := t.TempDir()
	oldCA, newCA := testpki.New(t, "old CA"), testpki.New(t, "new CA")
	first := oldCA.Issue(t, testpki.LoopbackLeaf("first"))
	second := newCA.IssueLike(t, testpki.LoopbackLeaf("secnd"), first)
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	nextCert, nextKey := filepath.Join(dir, "next.crt"), filepath.Join(dir, "next.key")
	testpki.Write(t, first, certFile, keyFile)
	testpki.Write(t, second, nextCert, nextKey)
	testpki.SameTick(t, certFile, keyFile, nextCert, nextKey)
	for _, pair := range [][2]string{{certFile, nextCert}, {keyFile, nextKey}} {
		a, errA := os.Stat(pair[0])
		b, errB := os.Stat(pair[1])
		if errA != nil || errB != nil || a.Size() != b.Size() || !a.ModTime().Equal(b.ModTime()) {
			t.Fatalf("%s and %s differ in size or time: %v %v", pair[0], pair[1], a, b)
		}
	}

	s := mustSettings(t, "GRPC_SERVER_USE_TLS", "true", "GRPC_SERVER_TLS_CERT", certFile, "GRPC_SERVER_TLS_KEY", keyFile)
	serverCfg, err := s.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	served := func() string {
		t.Helper()
		res := handshake(t, serverCfg, &tls.Config{InsecureSkipVerify: true})
		if res.clientErr != nil || res.serverErr != nil {
			t.Fatalf("server %v, client %v", res.serverErr, res.clientErr)
		}
		return res.client.PeerCertificates[0].Subject.CommonName
	}
	if got := served(); got != "first" {
		t.Fatalf("first certificate %q, want first", got)
	}
	for _, mv := range [][2]string{{nextCert, certFile}, {nextKey, keyFile}} {
		if err := os.Rename(mv[0], mv[1]); err != nil {
			t.Fatal(err)
		}
	}
	if err := valkeytest.WaitFor(context.Background(), 10*time.Second, "the replaced certificate to be served", func() (bool, error) {
		return served() == "secnd", nil
	}); err != nil {
		t.Fatal(err)
	}
}

func TestServerTLSFailsOnMissingFiles(t *testing.T) {
	c := newServerCerts(t)
	for name, kv := range map[string][]string{
		"missing key":     {"GRPC_SERVER_TLS_CERT", c.serverCert, "GRPC_SERVER_TLS_KEY", c.serverKey + ".missing"},
		"key of another":  {"GRPC_SERVER_TLS_CERT", c.serverCert, "GRPC_SERVER_TLS_KEY", c.clientKey},
		"CA not PEM":      {"GRPC_SERVER_TLS_CERT", c.serverCert, "GRPC_SERVER_TLS_KEY", c.serverKey, "GRPC_CLIENT_TLS_CACERT", c.serverKey},
		"CA file missing": {"GRPC_SERVER_TLS_CERT", c.serverCert, "GRPC_SERVER_TLS_KEY", c.serverKey, "GRPC_CLIENT_TLS_CACERT", c.ca.file + ".missing"},
	} {
		s := mustSettings(t, append([]string{"GRPC_SERVER_USE_TLS", "true"}, kv...)...)
		if _, err := s.ServerTLS(); err == nil {
			t.Errorf("%s: ServerTLS succeeded", name)
		} else if !strings.Contains(err.Error(), "GRPC_") {
			t.Errorf("%s: %v does not name the variables", name, err)
		}
	}
}

// TestXDSClientTLSMutual connects the xDS client's configuration to a management server
// that requires client certificates, as Envoy Gateway's does.
func TestXDSClientTLSMutual(t *testing.T) {
	c := newServerCerts(t)
	management := &tls.Config{
		Certificates: []tls.Certificate{keyPairOf(t, c.serverCert, c.serverKey)},
		ClientCAs:    c.ca.pool(),
		ClientAuth:   tls.RequireAndVerifyClientCert,
	}
	base := []string{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", c.clientCert,
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", c.clientKey, "CONFIG_GRPC_XDS_SERVER_TLS_CACERT", c.ca.file}

	s := mustSettings(t, base...)
	cfg, err := s.XDSClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ServerName != "" {
		t.Fatalf("ServerName %q without CONFIG_GRPC_XDS_SERVER_TLS_SAN; gRPC sets the address's host", cfg.ServerName)
	}
	cfg = cfg.Clone()
	cfg.ServerName = "localhost" // what gRPC does for localhost:port
	if res := handshake(t, management, cfg); res.serverErr != nil || res.clientErr != nil {
		t.Fatalf("server %v, client %v", res.serverErr, res.clientErr)
	} else if got := res.server.PeerCertificates[0].Subject.CommonName; got != "client" {
		t.Errorf("the management server saw %q, want client", got)
	}

	// CONFIG_GRPC_XDS_SERVER_TLS_SAN names the certificate's name where the address does not.
	s = mustSettings(t, append(base, "CONFIG_GRPC_XDS_SERVER_TLS_SAN", "localhost")...)
	if cfg, err = s.XDSClientTLS(); err != nil {
		t.Fatal(err)
	}
	if res := handshake(t, management, cfg); res.clientErr != nil {
		t.Fatalf("with the SAN: %v", res.clientErr)
	}
	s = mustSettings(t, append(base, "CONFIG_GRPC_XDS_SERVER_TLS_SAN", "envoy-gateway")...)
	if cfg, err = s.XDSClientTLS(); err != nil {
		t.Fatal(err)
	}
	if res := handshake(t, management, cfg); res.clientErr == nil {
		t.Fatal("a server certificate without the SAN was accepted")
	}

	// A server of another CA is refused.
	other := newTestCA(t, "other")
	oc, ok := other.issue(t, leaf{CN: "impostor", DNS: []string{"localhost"}})
	impostor := &tls.Config{Certificates: []tls.Certificate{keyPairOf(t, oc, ok)}}
	s = mustSettings(t, append(base, "CONFIG_GRPC_XDS_SERVER_TLS_SAN", "localhost")...)
	if cfg, err = s.XDSClientTLS(); err != nil {
		t.Fatal(err)
	}
	if res := handshake(t, impostor, cfg); res.clientErr == nil {
		t.Fatal("a server of another CA was accepted")
	}
}

func TestRedisTLS(t *testing.T) {
	c := newServerCerts(t)
	other := newTestCA(t, "other")
	server := &tls.Config{Certificates: []tls.Certificate{keyPairOf(t, c.serverCert, c.serverKey)}}
	oc, ok := other.issue(t, leaf{CN: "impostor", DNS: []string{"localhost"}})
	impostor := &tls.Config{Certificates: []tls.Certificate{keyPairOf(t, oc, ok)}}

	s := mustSettings(t, "REDIS_TLS_CACERT", c.ca.file)
	if cfg, err := s.RedisTLS(); cfg != nil || err != nil {
		t.Fatalf("RedisTLS() = %v, %v; want nil, nil without REDIS_TLS", cfg, err)
	}

	verifying := func(skip string, serverName string) *tls.Config {
		t.Helper()
		s := mustSettings(t, "REDIS_TLS", "true", "REDIS_TLS_CACERT", c.ca.file, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", skip)
		cfg, err := s.RedisTLS()
		if err != nil {
			t.Fatal(err)
		}
		cfg = cfg.Clone()
		cfg.ServerName = serverName // as tls.Dialer sets it from the address dialed
		return cfg
	}
	if res := handshake(t, server, verifying("false", "localhost")); res.clientErr != nil {
		t.Errorf("the right name: %v", res.clientErr)
	}
	if res := handshake(t, server, verifying("false", "10.0.0.7")); res.clientErr == nil {
		t.Error("a server certificate without the dialed name was accepted")
	}
	if res := handshake(t, server, verifying("true", "10.0.0.7")); res.clientErr != nil {
		t.Errorf("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true still checked the name: %v", res.clientErr)
	}
	if res := handshake(t, impostor, verifying("true", "localhost")); res.clientErr == nil {
		t.Error("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION=true accepted a server of another CA")
	}

	// The client certificate is presented to a server that asks for one.
	mutual := server.Clone()
	mutual.ClientCAs, mutual.ClientAuth = c.ca.pool(), tls.RequireAndVerifyClientCert
	s = mustSettings(t, "REDIS_TLS", "true", "REDIS_TLS_CACERT", c.ca.file,
		"REDIS_TLS_CLIENT_CERT", c.clientCert, "REDIS_TLS_CLIENT_KEY", c.clientKey)
	cfg, err := s.RedisTLS()
	if err != nil {
		t.Fatal(err)
	}
	cfg.ServerName = "localhost"
	if res := handshake(t, mutual, cfg); res.serverErr != nil || res.clientErr != nil {
		t.Errorf("mutual: server %v, client %v", res.serverErr, res.clientErr)
	}
}
