package settings

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// ServerTLS returns the gRPC server's TLS configuration, or nil without GRPC_SERVER_USE_TLS.
// The server presents GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY, loaded again when either
// file changes (a rotated Kubernetes Secret reaches new connections without a restart). With
// a client CA (GRPC_CLIENT_TLS_CACERT, or GRPC_SERVER_TLS_CA_CERT as Envoy Gateway names it),
// every client must present a certificate that chains to it, and, with GRPC_CLIENT_TLS_SAN,
// that holds that name. Client certificates are verified against that CA alone, not the
// system's roots beside it as the reference does: a certificate a public CA issued to anyone
// must not open the service.
func (s Settings) ServerTLS() (*tls.Config, error) {
	if !s.GRPCServerUseTLS {
		return nil, nil
	}
	pair, err := loadKeyPair(s.GRPCServerTLSCert, s.GRPCServerTLSKey)
	if err != nil {
		return nil, fmt.Errorf("settings: gRPC server TLS (GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY): %w", err)
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return pair.get() },
	}
	if s.GRPCServerTLSCACert == "" {
		return cfg, nil
	}
	cfg.ClientCAs, err = certPool(s.GRPCServerTLSCACert, false)
	if err != nil {
		return nil, fmt.Errorf("settings: gRPC server TLS client CA (GRPC_CLIENT_TLS_CACERT or GRPC_SERVER_TLS_CA_CERT): %w", err)
	}
	cfg.ClientAuth = tls.RequireAndVerifyClientCert
	if san := s.GRPCClientTLSSAN; san != "" {
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("settings: no client certificate")
			}
			if err := cs.PeerCertificates[0].VerifyHostname(san); err != nil {
				return fmt.Errorf("settings: the client certificate does not hold GRPC_CLIENT_TLS_SAN=%s: %w", san, err)
			}
			return nil
		}
	}
	return cfg, nil
}

// XDSClientTLS returns the xDS client's TLS configuration, or nil without
// CONFIG_GRPC_XDS_SERVER_USE_TLS. The client presents CONFIG_GRPC_XDS_CLIENT_TLS_CERT and
// CONFIG_GRPC_XDS_CLIENT_TLS_KEY when set (reloaded when they change), and verifies the server
// against the system's roots and CONFIG_GRPC_XDS_SERVER_TLS_CACERT, under the name
// CONFIG_GRPC_XDS_SERVER_TLS_SAN when set (gRPC verifies the address's host otherwise).
func (s Settings) XDSClientTLS() (*tls.Config, error) {
	if !s.ConfigGRPCXDSServerUseTLS {
		return nil, nil
	}
	cfg, err := clientTLS(s.ConfigGRPCXDSClientTLSCert, s.ConfigGRPCXDSClientTLSKey, s.ConfigGRPCXDSServerTLSCACert)
	if err != nil {
		return nil, fmt.Errorf("settings: xDS client TLS (CONFIG_GRPC_XDS_*_TLS_*): %w", err)
	}
	cfg.ServerName = s.ConfigGRPCXDSServerTLSSAN
	return cfg, nil
}

// RedisTLS returns the TLS configuration of the connections to Valkey, or nil without
// REDIS_TLS. The client presents REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY when set
// (reloaded when they change) and verifies each server against the system's roots and
// REDIS_TLS_CACERT, under the name of the address it dialed; with
// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION, the chain alone (for servers announced by IP address
// in a cluster, whose certificates do not name them).
func (s Settings) RedisTLS() (*tls.Config, error) {
	if !s.RedisUseTLS {
		return nil, nil
	}
	cfg, err := clientTLS(s.RedisTLSClientCert, s.RedisTLSClientKey, s.RedisTLSCACert)
	if err != nil {
		return nil, fmt.Errorf("settings: Valkey TLS (REDIS_TLS_*): %w", err)
	}
	if s.RedisTLSSkipHostnameVerification {
		roots := cfg.RootCAs // nil: the system's
		cfg.InsecureSkipVerify = true
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("settings: the server sent no certificate")
			}
			opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
			for _, c := range cs.PeerCertificates[1:] {
				opts.Intermediates.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(opts)
			return err
		}
	}
	return cfg, nil
}

// clientTLS is a client's configuration: its certificate when certFile is set, and the
// system's roots with caFile's certificates when caFile is set.
func clientTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if certFile != "" || keyFile != "" {
		pair, err := loadKeyPair(certFile, keyFile)
		if err != nil {
			return nil, err
		}
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return pair.get() }
	}
	if caFile != "" {
		pool, err := certPool(caFile, true)
		if err != nil {
			return nil, err
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// certPool reads the PEM certificates of file into a pool, added to a copy of the system's
// roots when withSystem is set.
func certPool(file string, withSystem bool) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var pool *x509.CertPool
	if withSystem {
		pool, _ = x509.SystemCertPool() // nil where the system has none
	}
	if pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

// keyPair is a certificate and key read from files and read again when they change, checked
// at each handshake so that rotated files reach the next connection. A change is told by the
// files' content: a pair replaced by one of the same size, written in the same clock tick (two
// EC pairs can be both), has the old files' sizes and modification times. The files are
// stated at each handshake and read again when their size or time changed, and at least once
// every contentCheck; they are small, and a flood of handshakes reads them at most that often.
// A pair that fails to load (the certificate written, the key not yet) keeps the last good one
// until the files load together.
type keyPair struct {
	certFile, keyFile string

	mu      sync.Mutex
	cert    *tls.Certificate
	sum     [sha256.Size]byte // of the files cert was loaded from
	stamps  [2]fileStamp      // of certFile and keyFile when they were last read
	checked time.Time         // when the files were last read
}

// contentCheck is how often the files are read when neither their size nor their time
// changed: the reference serves a replaced certificate within about a second.
const contentCheck = time.Second

// fileStamp tells a file's versions apart, when they differ in time or size.
type fileStamp struct {
	mod  int64 // modification time, Unix nanoseconds
	size int64
}

// loadKeyPair loads the pair once, so that a missing or bad file fails at start.
func loadKeyPair(certFile, keyFile string) (*keyPair, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("a certificate needs both its file and its key's file")
	}
	p := &keyPair{certFile: certFile, keyFile: keyFile}
	if _, err := p.get(); err != nil {
		return nil, err
	}
	return p, nil
}

// get returns the current certificate, loading the files again if they changed.
func (p *keyPair) get() (*tls.Certificate, error) {
	stamps, statErr := p.stat()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cert != nil && (statErr != nil || stamps == p.stamps && time.Since(p.checked) < contentCheck) {
		return p.cert, nil
	}
	if statErr != nil {
		return nil, statErr
	}
	certPEM, certErr := os.ReadFile(p.certFile)
	keyPEM, keyErr := os.ReadFile(p.keyFile)
	if err := errors.Join(certErr, keyErr); err != nil {
		if p.cert != nil {
			return p.cert, nil
		}
		return nil, err
	}
	p.checked = time.Now()
	sum := pairSum(certPEM, keyPEM)
	if p.cert != nil && sum == p.sum {
		p.stamps = stamps
		return p.cert, nil
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		if p.cert != nil {
			// Read again when the files change, or at the next check: the other file may be
			// on its way.
			p.stamps = stamps
			return p.cert, nil
		}
		return nil, fmt.Errorf("load %s and %s: %w", p.certFile, p.keyFile, err)
	}
	p.cert, p.sum, p.stamps = &cert, sum, stamps
	return p.cert, nil
}

// pairSum is the SHA-256 of a pair's files: each one's length, then its bytes, so that no
// two pairs of contents give one input.
func pairSum(certPEM, keyPEM []byte) [sha256.Size]byte {
	h := sha256.New()
	for _, b := range [][]byte{certPEM, keyPEM} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

func (p *keyPair) stat() ([2]fileStamp, error) {
	var stamps [2]fileStamp
	for i, f := range []string{p.certFile, p.keyFile} {
		fi, err := os.Stat(f)
		if err != nil {
			return stamps, err
		}
		stamps[i] = fileStamp{mod: fi.ModTime().UnixNano(), size: fi.Size()}
	}
	return stamps, nil
}
