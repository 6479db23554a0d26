// Package valkeytest provides a throwaway Valkey server for strictrate's tests and benchmarks,
// and the one runner (Process) of every program they start: the server itself, the rate
// limit service, the test binary run again as a child (Rerun).
//
// Start finds a server in this order: the address given with Addr; else the address in
// VALKEY_ADDR; else a valkey-server (or redis-server) binary on PATH, started on a free loopback
// port in a temporary directory with persistence off (unless AppendOnly or ServerArgs say
// otherwise); else a valkey/valkey:8 container through a local Docker engine. Whatever it
// starts, Close stops; New ties that to the test's cleanup, so it runs when a test fails too.
// The package talks to servers through valkey-go only.
package valkeytest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ory/dockertest/v3"
	dc "github.com/ory/dockertest/v3/docker"
	"github.com/valkey-io/valkey-go"
)

// EnvAddr names the environment variable that points the tests at an existing server.
const EnvAddr = "VALKEY_ADDR"

// ErrNoServer is returned by Start when no way to get a server worked.
var ErrNoServer = errors.New("no Valkey server for the tests: set VALKEY_ADDR=host:port, " +
	"put valkey-server on PATH (Debian: apt-get install -t bookworm-backports valkey-server), " +
	"or start a Docker engine")

// Server is a Valkey server the tests may use. Addr is its host:port.
type Server struct {
	// Addr is the server's address, host:port.
	Addr string
	// Source says where the server came from: "addr" (the Addr option), "env", the binary's
	// name, or "docker".
	Source string

	proc  *process     // set when Start launched a binary
	close func() error // stops what Start started; nil for VALKEY_ADDR
}

// Option adjusts Start.
type Option func(*config)

type config struct {
	allowExternal bool
	addr          string
	args          []string // more server arguments (ServerArgs)
	env           []string // more environment for the server (ServerEnv)
}

// OwnServer makes Start launch a server of its own even when VALKEY_ADDR is set: for tests
// that stop, restart or reconfigure the server, which they must never do to a shared one.
func OwnServer() Option { return func(c *config) { c.allowExternal = false } }

// ServerArgs adds arguments to the command line of the server Start launches, after its own,
// so that they win over them: ServerArgs("--appendonly", "yes") turns on the append-only file
// the default line turns off. It implies OwnServer (a shared server cannot be started with
// arguments); a container gets them too.
func ServerArgs(args ...string) Option {
	return func(c *config) {
		c.allowExternal = false
		c.args = append(c.args, args...)
	}
}

// ServerEnv adds variables ("NAME=value") to the environment of the server Start launches,
// e.g. LD_PRELOAD for a fault-injecting library. It implies OwnServer, and a valkey-server (or
// redis-server) binary on PATH: Start fails rather than start a container without them.
func ServerEnv(vars ...string) Option {
	return func(c *config) {
		c.allowExternal = false
		c.env = append(c.env, vars...)
	}
}

// AppendOnly makes Start launch a server of its own that keeps an append-only file in its
// directory, fsynced as fsync says ("always", "everysec" or "no"): after Crash (or Stop),
// Restart brings the server back with what the file holds, as a production server restarts.
func AppendOnly(fsync string) Option {
	return ServerArgs("--appendonly", "yes", "--appendfsync", fsync)
}

// Addr makes Start use the server at addr (host:port) as it is, once it answers PING, before
// anything else the package comment lists; Close then leaves it running. An empty addr changes
// nothing, so a command's -addr flag can be passed through whether it was given or not.
func Addr(addr string) Option { return func(c *config) { c.addr = addr } }

// Start provisions a server as the package comment describes. The caller must Close it.
func Start(ctx context.Context, opts ...Option) (*Server, error) {
	cfg := config{allowExternal: true}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.addr != "" {
		if err := ping(ctx, cfg.addr); err != nil {
			return nil, fmt.Errorf("valkeytest: %s does not answer PING: %w", cfg.addr, err)
		}
		return &Server{Addr: cfg.addr, Source: "addr"}, nil
	}
	if addr := os.Getenv(EnvAddr); addr != "" && cfg.allowExternal {
		if err := ping(ctx, addr); err != nil {
			return nil, fmt.Errorf("valkeytest: %s=%s does not answer PING: %w", EnvAddr, addr, err)
		}
		return &Server{Addr: addr, Source: "env"}, nil
	}
	if bin := FindBinary(); bin != "" {
		return startBinary(ctx, bin, cfg.args, cfg.env)
	}
	if len(cfg.env) > 0 {
		return nil, fmt.Errorf("valkeytest: %w: ServerEnv needs valkey-server or redis-server on PATH", ErrNoServer)
	}
	s, dockerErr := startDocker(ctx, cfg.args)
	if dockerErr == nil {
		return s, nil
	}
	return nil, fmt.Errorf("valkeytest: %w (docker: %v)", ErrNoServer, dockerErr)
}

// New starts a server for a test or benchmark and stops it in tb's cleanup. It fails tb with
// ErrNoServer's advice when no server can be had.
func New(tb testing.TB, opts ...Option) *Server {
	tb.Helper()
	return forTest(tb, "server", func(ctx context.Context) (*Server, error) { return Start(ctx, opts...) })
}

// forTest runs start with a deadline of two minutes, fails tb if it fails, and closes what it
// started in tb's cleanup: New and NewCluster.
func forTest[T interface{ Close() error }](tb testing.TB, what string, start func(context.Context) (T, error)) T {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := start(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := v.Close(); err != nil {
			tb.Errorf("valkeytest: stop %s: %v", what, err)
		}
	})
	return v
}

// Main is the whole TestMain of a package whose tests share one server: it starts the server,
// stores it in *server, runs the tests, stops the server and exits with the run's code. Use it
// as
//
//	var server *valkeytest.Server
//
//	func TestMain(m *testing.M) { valkeytest.Main(m, &server) }
func Main(m *testing.M, server **Server) {
	os.Exit(RunWithServer(m, func(s *Server) { *server = s }))
}

// RunWithServer is Main for a TestMain that wants the server in another shape (set receives
// it) or has more to do: it returns the exit code instead of exiting. A server that cannot be
// had fails the run with ErrNoServer's advice.
func RunWithServer(m *testing.M, set func(*Server)) int {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	s, err := Start(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	set(s)
	code := m.Run()
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "valkeytest: stop server:", err)
		code = 1
	}
	return code
}

// Client returns a valkey-go client for the server, closed in tb's cleanup.
func (s *Server) Client(tb testing.TB) valkey.Client {
	tb.Helper()
	return NewClient(tb, s.Addr)
}

// NewClient connects a valkey-go client to the given addresses and closes it in tb's cleanup.
func NewClient(tb testing.TB, addrs ...string) valkey.Client {
	tb.Helper()
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: addrs})
	if err != nil {
		tb.Fatalf("valkeytest: connect to %v: %v", addrs, err)
	}
	tb.Cleanup(c.Close)
	return c
}

// NewUser creates (or redefines) the ACL user name on the server, with password, access to
// every key and channel, and the given rules (e.g. "+@all", "-@scripting"), and returns a
// client logged in as that user, closed in tb's cleanup. The server must be one the test may
// reconfigure (OwnServer).
func (s *Server) NewUser(tb testing.TB, name, password string, rules ...string) valkey.Client {
	tb.Helper()
	admin := s.Client(tb)
	acl := admin.B().AclSetuser().Username(name).Rule(append([]string{"on", ">" + password, "~*", "&*"}, rules...)...).Build()
	if err := admin.Do(context.Background(), acl).Error(); err != nil {
		tb.Fatalf("valkeytest: create user %s: %v", name, err)
	}
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{s.Addr}, Username: name, Password: password})
	if err != nil {
		tb.Fatalf("valkeytest: connect as %s: %v", name, err)
	}
	tb.Cleanup(c.Close)
	return c
}

// dial connects a client to the one server at addr, whatever it is (a standalone server, or a
// cluster node before or after it joins a cluster): it never asks for the cluster's layout and
// is never redirected to another node. opt sets everything else, e.g. Username and Password.
func dial(addr string, opt valkey.ClientOption) (valkey.Client, error) {
	opt.InitAddress = []string{addr}
	opt.ForceSingleClient = true
	c, err := valkey.NewClient(opt)
	if err != nil {
		if c != nil { // ForceSingleClient returns the client even when its first dial failed
			c.Close()
		}
		return nil, err
	}
	return c, nil
}

// Close stops the server if Start launched it, and removes its files. It is safe to call twice.
func (s *Server) Close() error {
	if s.close == nil {
		return nil
	}
	err := s.close()
	s.close = nil
	return err
}

// FindBinary returns the path of valkey-server, or else redis-server, on PATH; "" if neither.
func FindBinary() string {
	for _, name := range []string{"valkey-server", "redis-server"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// FindTool returns the path of the first of the given names found on PATH; "" if none is.
func FindTool(names ...string) string {
	for _, name := range names {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// process is a server binary Start launched, with what it takes to start it again.
type process struct {
	bin   string
	dir   string
	port  string
	extra []string // more server arguments, e.g. cluster mode
	env   []string // more environment, added to the test process's
	run   *Process // the current (or last) run; nil before the first start
}

func startBinary(ctx context.Context, bin string, args, env []string) (*Server, error) {
	dir, err := os.MkdirTemp("", "strictrate-valkey-")
	if err != nil {
		return nil, fmt.Errorf("valkeytest: temp dir: %w", err)
	}
	p := &process{bin: bin, dir: dir, extra: args, env: env}
	var lastErr error
	// A free port can be taken by someone else between the probe and the bind: try a few.
	for attempt := 0; attempt < 5; attempt++ {
		ports, err := FreePorts(1)
		if err != nil {
			lastErr = err
			continue
		}
		p.port = ports[0]
		if lastErr = p.start(ctx); lastErr == nil {
			name := filepath.Base(bin)
			return &Server{Addr: p.addr(), Source: name, proc: p, close: p.stopAndClean}, nil
		}
	}
	_ = os.RemoveAll(dir)
	return nil, fmt.Errorf("valkeytest: start %s: %w", bin, lastErr)
}

func (p *process) addr() string { return net.JoinHostPort("127.0.0.1", p.port) }

// start launches the binary on p.port and waits until it answers PING.
func (p *process) start(ctx context.Context) error {
	logFile := filepath.Join(p.dir, "server.log")
	args := append([]string{
		"--port", p.port,
		"--bind", "127.0.0.1",
		"--dir", p.dir,
		"--logfile", logFile,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--enable-debug-command", "local",
	}, p.extra...)
	var env []string // nil: the test process's
	if len(p.env) > 0 {
		env = append(os.Environ(), p.env...)
	}
	run, err := StartProcess(p.bin, args, env, nil)
	if err != nil {
		return err
	}
	p.run = run

	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case <-run.Done():
			return fmt.Errorf("server exited at start: %s", tail(logFile))
		case <-ctx.Done():
			p.kill()
			return ctx.Err()
		default:
		}
		if err := ping(ctx, p.addr()); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			p.kill()
			return fmt.Errorf("server did not answer PING within 15s: %w; log: %s", err, tail(logFile))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// crash kills the process at once (SIGKILL), as a machine failure would.
func (p *process) crash() {
	if p.run != nil {
		_ = p.run.Kill()
	}
}

// kill stops the process: SIGTERM, then SIGKILL after five seconds.
func (p *process) kill() {
	if p.run != nil {
		_ = p.run.Stop(5 * time.Second)
	}
}

func (p *process) stopAndClean() error {
	p.kill()
	return os.RemoveAll(p.dir)
}

// Stop stops a server that Start launched from a binary (SIGTERM), keeping its address and
// directory, so that Restart can bring it back: loaded scripts are gone, and so is the data,
// as after a real restart without persistence, unless the server keeps an append-only file
// (AppendOnly). It fails for a server Start did not launch.
func (s *Server) Stop() error {
	if s.proc == nil {
		return errors.New("valkeytest: Stop needs a server launched by Start (use OwnServer)")
	}
	s.proc.kill()
	return nil
}

// Crash kills a server that Start launched from a binary at once (SIGKILL, kill -9), as a
// failure kills a process: nothing is flushed, but what the server had written to its files
// is in the kernel's hands and stays. Its address and directory are kept for Restart. It
// fails for a server Start did not launch.
func (s *Server) Crash() error {
	if s.proc == nil {
		return errors.New("valkeytest: Crash needs a server launched by Start (use OwnServer)")
	}
	s.proc.crash()
	return nil
}

// Restart starts a stopped or crashed server again on the same address, in the same directory
// and with the same arguments: a server with an append-only file loads it.
func (s *Server) Restart(ctx context.Context) error {
	if s.proc == nil {
		return errors.New("valkeytest: Restart needs a server launched by Start (use OwnServer)")
	}
	s.proc.kill()
	return s.proc.start(ctx)
}

func startDocker(ctx context.Context, args []string) (*Server, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return nil, err
	}
	if err := pool.Client.Ping(); err != nil {
		return nil, fmt.Errorf("no Docker engine: %w", err)
	}
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: "valkey/valkey",
		Tag:        "8",
		Cmd:        append([]string{"valkey-server", "--save", "", "--appendonly", "no"}, args...),
		PortBindings: map[dc.Port][]dc.PortBinding{
			"6379/tcp": {{HostIP: "127.0.0.1", HostPort: ""}},
		},
	}, func(hc *dc.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = dc.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return nil, err
	}
	_ = res.Expire(600) // a crashed test run must not leave the container behind for long
	addr := net.JoinHostPort("127.0.0.1", res.GetPort("6379/tcp"))
	pool.MaxWait = time.Minute
	if err := pool.Retry(func() error { return ping(ctx, addr) }); err != nil {
		_ = pool.Purge(res)
		return nil, fmt.Errorf("container did not answer PING: %w", err)
	}
	return &Server{Addr: addr, Source: "docker", close: func() error { return pool.Purge(res) }}, nil
}

// ping connects to addr on a fresh connection and sends PING, once: no retry.
func ping(ctx context.Context, addr string) error {
	c, err := dial(addr, valkey.ClientOption{DisableRetry: true, DisableCache: true, Dialer: net.Dialer{Timeout: time.Second}})
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return c.Do(ctx, c.B().Ping().Build()).Error()
}

// FreePorts returns n distinct TCP ports free on 127.0.0.1 a moment ago, for servers a test
// or bench starts: they are held open together while they are picked, so that none repeats.
// Another process may still take one before it is bound: callers that can, retry.
func FreePorts(n int) ([]string, error) {
	ports := make([]string, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("valkeytest: free port: %w", err)
		}
		defer l.Close()
		if _, ports[i], err = net.SplitHostPort(l.Addr().String()); err != nil {
			return nil, err
		}
	}
	return ports, nil
}

// tail returns the last lines of a log file, for error messages.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no log)"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}

// Must returns r's value as conv reads it (e.g. valkey.ValkeyResult.AsInt64), and fails tb,
// naming what was sent, if the command failed or its reply is not of that type.
func Must[T any](tb testing.TB, what string, r valkey.ValkeyResult, conv func(valkey.ValkeyResult) (T, error)) T {
	tb.Helper()
	v, err := conv(r)
	if err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
	return v
}
