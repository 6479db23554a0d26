package settings

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// connect builds a client from the settings and checks that it can write and read a key.
func connect(t *testing.T, s Settings) valkey.Client {
	t.Helper()
	opt, err := s.ValkeyOption()
	if err != nil {
		t.Fatal(err)
	}
	c, err := valkey.NewClient(opt)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(c.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Do(ctx, c.B().Set().Key("settings:probe").Value("ok").Build()).Error(); err != nil {
		t.Fatalf("SET through the client: %v", err)
	}
	return c
}

// refused checks that a client built from the settings cannot use the server.
func refused(t *testing.T, s Settings) {
	t.Helper()
	opt, err := s.ValkeyOption()
	if err != nil {
		t.Fatal(err)
	}
	opt.DisableRetry = true
	c, err := valkey.NewClient(opt)
	if err != nil {
		return
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := c.Do(ctx, c.B().Ping().Build()).Error(); err == nil {
		t.Fatal("the server accepted a client it should have refused")
	}
}

func clientInfo(t *testing.T, c valkey.Client) string {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().ClientInfo().Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func TestValkeyOptionMapping(t *testing.T) {
	s := mustSettings(t, "REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "redis://alice:from-url@valkey:6379/4",
		"REDIS_AUTH", "s3cret", "REDIS_TIMEOUT", "2s", "REDIS_PIPELINE_WINDOW", "150us")
	opt, err := s.ValkeyOption()
	if err != nil {
		t.Fatal(err)
	}
	// REDIS_AUTH without a user keeps the URL's user and replaces its password, as the
	// reference's client does.
	if !slices.Equal(opt.InitAddress, []string{"valkey:6379"}) || opt.Username != "alice" || opt.Password != "s3cret" ||
		opt.SelectDB != 4 || !opt.ForceSingleClient || opt.Dialer.Timeout != 2*time.Second ||
		opt.ConnWriteTimeout != 2*time.Second || opt.MaxFlushDelay != 150*time.Microsecond || opt.TLSConfig != nil {
		t.Errorf("SINGLE: %+v", opt)
	}

	s = mustSettings(t, "REDIS_TYPE", "cluster", "REDIS_URL", "valkey-0:6379, valkey-1:6379,valkey-2:6379", "REDIS_AUTH", "rls:pw")
	if opt, err = s.ValkeyOption(); err != nil {
		t.Fatal(err)
	}
	if len(opt.InitAddress) != 3 || opt.InitAddress[1] != "valkey-1:6379" || opt.ForceSingleClient || opt.Username != "rls" || opt.Password != "pw" {
		t.Errorf("CLUSTER: %+v", opt)
	}

	s = mustSettings(t, "REDIS_TYPE", "SENTINEL", "REDIS_URL", "mymaster,sentinel-0:26379,sentinel-1:26379",
		"REDIS_AUTH", "master-pw", "REDIS_SENTINEL_AUTH", "watcher:sentinel-pw")
	if opt, err = s.ValkeyOption(); err != nil {
		t.Fatal(err)
	}
	if opt.Sentinel.MasterSet != "mymaster" || !slices.Equal(opt.InitAddress, []string{"sentinel-0:26379", "sentinel-1:26379"}) ||
		opt.Password != "master-pw" || opt.Username != "" || opt.Sentinel.Username != "watcher" || opt.Sentinel.Password != "sentinel-pw" {
		t.Errorf("SENTINEL: %+v", opt)
	}
}

func TestValkeySingleTCPAndAuth(t *testing.T) {
	srv := valkeytest.New(t, valkeytest.OwnServer())
	srv.NewUser(t, "rls", "rls-pw", "+@all")
	admin := srv.Client(t)

	c := connect(t, mustSettings(t, "REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", srv.Addr, "REDIS_AUTH", "rls:rls-pw"))
	if info := clientInfo(t, c); !strings.Contains(info, " user=rls ") {
		t.Errorf("REDIS_AUTH=user:password logged in as %q", info)
	}
	refused(t, mustSettings(t, "REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", srv.Addr, "REDIS_AUTH", "rls:wrong"))

	// A URL's credentials and database.
	c = connect(t, mustSettings(t, "REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "redis://rls:rls-pw@"+srv.Addr+"/3"))
	if info := clientInfo(t, c); !strings.Contains(info, " user=rls ") || !strings.Contains(info, " db=3 ") {
		t.Errorf("redis://rls:…@addr/3 gave %q", info)
	}
	if err := c.Do(context.Background(), c.B().Set().Key("settings:db3").Value("v").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if n, err := admin.Do(context.Background(), admin.B().Exists().Key("settings:db3").Build()).AsInt64(); err != nil || n != 0 {
		t.Errorf("the key written in database 3 shows in database 0: %d, %v", n, err)
	}

	// A password alone authenticates the default user.
	if err := admin.Do(context.Background(), admin.B().ConfigSet().ParameterValue().ParameterValue("requirepass", "default-pw").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	c = connect(t, mustSettings(t, "REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", srv.Addr, "REDIS_AUTH", "default-pw"))
	if info := clientInfo(t, c); !strings.Contains(info, " user=default ") {
		t.Errorf("REDIS_AUTH=password logged in as %q", info)
	}
	refused(t, mustSettings(t, "REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", srv.Addr))
}

func TestValkeyUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "rls-sock") // short: a socket path has at most 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "valkey.sock")
	valkeytest.New(t, valkeytest.ServerArgs("--unixsocket", sock, "--unixsocketperm", "700"))

	// REDIS_SOCKET_TYPE defaults to unix, as in the reference.
	c := connect(t, mustSettings(t, "REDIS_URL", sock))
	if info := clientInfo(t, c); !strings.Contains(info, "laddr="+sock) && !strings.Contains(info, "addr="+sock) {
		t.Errorf("not connected over the socket: %q", info)
	}
}

func TestValkeyTLS(t *testing.T) {
	ca := newTestCA(t, "valkey")
	// The certificate names localhost, not 127.0.0.1: dialed by address, its name does not match.
	serverCert, serverKey := ca.issue(t, leaf{CN: "valkey", DNS: []string{"localhost"},
		Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	clientCert, clientKey := ca.issue(t, leaf{CN: "rls", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	port := freeTCPPort(t)
	valkeytest.New(t, valkeytest.ServerArgs("--tls-port", port, "--tls-cert-file", serverCert, "--tls-key-file", serverKey,
		"--tls-ca-cert-file", ca.file, "--tls-auth-clients", "yes"))

	tlsVars := func(addr string, more ...string) []string {
		return append([]string{"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", addr, "REDIS_TLS", "true", "REDIS_TLS_CACERT", ca.file}, more...)
	}
	withCert := []string{"REDIS_TLS_CLIENT_CERT", clientCert, "REDIS_TLS_CLIENT_KEY", clientKey}
	c := connect(t, mustSettings(t, tlsVars("localhost:"+port, withCert...)...))
	if info := clientInfo(t, c); !strings.Contains(info, ":"+port+" ") {
		t.Errorf("not connected to the TLS port: %q", info)
	}
	refused(t, mustSettings(t, tlsVars("localhost:"+port)...)) // the server requires a client certificate
	refused(t, mustSettings(t, tlsVars("127.0.0.1:"+port, withCert...)...))
	connect(t, mustSettings(t, tlsVars("127.0.0.1:"+port, append(withCert, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "true")...)...))
}

func freeTCPPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

func TestValkeyCluster(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	cluster := valkeytest.NewCluster(t, 3, 0)
	s := mustSettings(t, "REDIS_TYPE", "CLUSTER", "REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", strings.Join(cluster.Addrs()[:2], ","))
	c := connect(t, s)
	if c.Mode() != valkey.ClientModeCluster {
		t.Fatalf("client mode %v, want cluster", c.Mode())
	}
	ctx := context.Background()
	for i := range 30 {
		if err := c.Do(ctx, c.B().Set().Key(fmt.Sprintf("k%d", i)).Value("v").Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range cluster.Primaries {
		n, err := p.Client().Do(ctx, p.Client().B().Dbsize().Build()).AsInt64()
		if err != nil || n == 0 {
			t.Errorf("primary %s holds %d keys (%v): the client did not spread them", p.Addr, n, err)
		}
	}
}

func TestValkeySentinel(t *testing.T) {
	master := valkeytest.New(t, valkeytest.OwnServer())
	host, masterPort, _ := net.SplitHostPort(master.Addr)
	sentinelPort := freeTCPPort(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf("port %s\nbind 127.0.0.1\ndir %s\nrequirepass sentinel-pw\n"+
		"sentinel monitor rls-master %s %s 1\n", sentinelPort, dir, host, masterPort)), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := valkeytest.FindBinary()
	if bin == "" {
		t.Skip("no valkey-server on PATH to run a sentinel")
	}
	valkeytest.NewProcess(t, bin, []string{conf, "--sentinel"}, nil, nil)
	sentinelAddr := net.JoinHostPort("127.0.0.1", sentinelPort)
	waitSentinel(t, sentinelAddr, "sentinel-pw")

	s := mustSettings(t, "REDIS_TYPE", "SENTINEL", "REDIS_URL", "rls-master,"+sentinelAddr, "REDIS_SENTINEL_AUTH", "sentinel-pw")
	connect(t, s)
	admin := master.Client(t)
	if got, err := admin.Do(context.Background(), admin.B().Get().Key("settings:probe").Build()).ToString(); err != nil || got != "ok" {
		t.Errorf("the key written through the sentinel's master reads %q, %v on the master", got, err)
	}
	refused(t, mustSettings(t, "REDIS_TYPE", "SENTINEL", "REDIS_URL", "rls-master,"+sentinelAddr, "REDIS_SENTINEL_AUTH", "wrong"))
}

// waitSentinel waits until the sentinel at addr answers with its master's address.
func waitSentinel(t *testing.T, addr, password string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	var lastErr error
	for time.Now().Before(deadline) {
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{addr}, Password: password,
			ForceSingleClient: true, DisableCache: true, DisableRetry: true})
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, err = c.Do(ctx, c.B().SentinelGetMasterAddrByName().Master("rls-master").Build()).AsStrSlice()
			cancel()
			c.Close()
			if err == nil {
				return
			}
		} else if c != nil {
			c.Close()
		}
		lastErr = err
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the sentinel at %s did not come up: %v", addr, lastErr)
}
