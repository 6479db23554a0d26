package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// The tests run the command as Kubernetes runs it: the binary, built once, as a process of its
// own with only the environment it is given, on loopback ports, stopped with SIGTERM.
var (
	// binary is the command built for the tests (with -race when the tests are).
	binary string
	// server is the Valkey the tests share; each process keeps apart by CACHE_KEY_PREFIX or
	// domain. Tests that stop their Valkey start their own.
	server *valkeytest.Server
)

// drainTimeout is the STRICTRATE_DRAIN_TIMEOUT the processes run with: a process must exit
// within it (and a little more) after SIGTERM.
const drainTimeout = 3 * time.Second

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "strictrate-rls-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := func() int {
		defer os.RemoveAll(dir)
		binary = filepath.Join(dir, "strictrate-rls")
		args := []string{"build", "-o", binary}
		if raceEnabled() {
			args = append(args, "-race")
		}
		build := exec.Command("go", append(args, ".")...)
		if out, err := build.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "go build of the command: %v\n%s", err, out)
			return 1
		}
		return valkeytest.RunWithServer(m, func(s *valkeytest.Server) { server = s })
	}()
	os.Exit(code)
}

// raceEnabled says whether this test binary was built with -race (its build settings say so),
// so that the command under test is built the same way.
func raceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// process is one run of the command.
type process struct {
	t   *testing.T
	run *valkeytest.Process
	log *logBuffer
	// Addresses of its listeners (host:port on 127.0.0.1).
	http, grpc, debug, prometheus string
}

// logBuffer collects a process's output for the test to read while it runs.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// env is a process's environment, as name and value pairs.
type env map[string]string

// baseEnv points a process at the shared Valkey, under a key prefix of the test's own, with a
// short drain.
func baseEnv(t *testing.T) env {
	return env{
		"REDIS_SOCKET_TYPE":        "tcp",
		"REDIS_URL":                server.Addr,
		"CACHE_KEY_PREFIX":         fmt.Sprintf("%s-%d:", t.Name(), time.Now().UnixNano()),
		"STRICTRATE_DRAIN_TIMEOUT": drainTimeout.String(),
	}
}

// launch starts the command with e (and PATH and HOME, nothing else inherited), its listeners
// on free loopback ports unless e places them, and returns without waiting for it to serve.
// The process is stopped at the end of the test (SIGTERM, and it must exit 0), unless it has
// exited before; its output is logged when the test fails.
func launch(t *testing.T, e env) *process { return launchBinary(t, binary, e) }

// launchBinary is launch of another server's binary (the reference's, see compat_test.go).
func launchBinary(t *testing.T, bin string, e env) *process {
	t.Helper()
	ports, err := valkeytest.FreePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	full := env{
		"PATH": os.Getenv("PATH"), "HOME": os.Getenv("HOME"),
		"HOST": "127.0.0.1", "PORT": ports[0],
		"GRPC_HOST": "127.0.0.1", "GRPC_PORT": ports[1],
		"DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": ports[2],
	}
	if e["PROMETHEUS_ADDR"] == "" {
		full["PROMETHEUS_ADDR"] = "127.0.0.1:" + ports[3]
	}
	for k, v := range e {
		full[k] = v
	}
	p := &process{
		t:          t,
		log:        &logBuffer{},
		http:       net.JoinHostPort(full["HOST"], full["PORT"]),
		grpc:       net.JoinHostPort(full["GRPC_HOST"], full["GRPC_PORT"]),
		debug:      net.JoinHostPort(full["DEBUG_HOST"], full["DEBUG_PORT"]),
		prometheus: full["PROMETHEUS_ADDR"],
	}
	var vars []string
	for k, v := range full {
		vars = append(vars, k+"="+v)
	}
	p.run = valkeytest.NewProcess(t, bin, nil, vars, p.log)
	t.Cleanup(func() { // before NewProcess's own, which then finds it stopped
		select {
		case <-p.run.Done():
		default:
			p.stop()
		}
		if t.Failed() || os.Getenv("RLS_TEST_LOG") != "" {
			t.Logf("output of the command:\n%s", p.log)
		}
	})
	return p
}

// start launches the command and waits until its HTTP listener answers (every listener is
// open by then).
func start(t *testing.T, e env) *process {
	t.Helper()
	return startBinary(t, binary, e)
}

// startBinary is start of another server's binary.
func startBinary(t *testing.T, bin string, e env) *process {
	t.Helper()
	p := launchBinary(t, bin, e)
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + p.http + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			return p
		}
		select {
		case <-p.run.Done():
			t.Fatalf("the command exited with %d before serving:\n%s", p.run.ExitCode(), p.log)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command does not answer on %s: %v", p.http, err)
		}
	}
}

// wait waits for the process to exit by itself, and returns its exit code.
func (p *process) wait(limit time.Duration) int {
	p.t.Helper()
	if err := p.run.Wait(limit); err != nil {
		p.t.Fatal(err)
	}
	return p.run.ExitCode()
}

// terminate sends SIGTERM, as Kubernetes stops a pod.
func (p *process) terminate() {
	p.t.Helper()
	if err := p.run.Signal(syscall.SIGTERM); err != nil {
		p.t.Fatal(err)
	}
}

// stop sends SIGTERM and checks that the process exits 0 within the drain timeout (and a
// little more); it is killed if not.
func (p *process) stop() {
	p.t.Helper()
	if err := p.run.Stop(drainTimeout + 2*time.Second); err != nil {
		p.t.Error(err)
	} else if code := p.run.ExitCode(); code != 0 {
		p.t.Errorf("the command exited with %d after SIGTERM, want 0", code)
	}
}

// waitLog waits until the process's output holds want.
func (p *process) waitLog(want string) {
	p.t.Helper()
	p.waitFor("output "+strconv.Quote(want), func() bool { return strings.Contains(p.log.String(), want) })
}

// waitFor waits until cond holds, for at most 10 seconds.
func (p *process) waitFor(what string, cond func() bool) {
	p.t.Helper()
	if err := valkeytest.WaitFor(context.Background(), 10*time.Second, what, func() (bool, error) {
		return cond(), nil
	}); err != nil {
		p.t.Fatal(err)
	}
}

// get fetches a URL on one of the process's listeners: its status and body, or an error when
// nothing answers.
func get(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// health is the status of /healthcheck, 0 when nothing answers.
func (p *process) health() int {
	code, _, _ := get("http://" + p.http + "/healthcheck")
	return code
}

// rlconfig is the configuration the process serves, as /rlconfig on its debug port shows it.
func (p *process) rlconfig() string {
	_, body, _ := get("http://" + p.debug + "/rlconfig")
	return body
}

// waitConfig waits until /rlconfig shows want.
func (p *process) waitConfig(want string) {
	p.t.Helper()
	p.waitFor("/rlconfig showing "+strconv.Quote(want), func() bool { return strings.Contains(p.rlconfig(), want) })
}

// metric is the sum of the samples of name on the process's Prometheus endpoint whose labels
// hold every one of labels ("domain=\"edge\""): -1 when there is none.
func (p *process) metric(path, name string, labels ...string) float64 {
	p.t.Helper()
	code, body, err := get("http://" + p.prometheus + path)
	if err != nil || code != http.StatusOK {
		p.t.Fatalf("GET %s on the Prometheus endpoint: %d %v", path, code, err)
	}
	sum, found := 0.0, false
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		series, value, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		metric, labelText, _ := strings.Cut(series, "{")
		if metric != name || !containsAll(labelText, labels) {
			continue
		}
		v, err := strconv.ParseFloat(strings.Fields(value)[0], 64)
		if err != nil {
			p.t.Fatalf("metric line %q: %v", line, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		return -1
	}
	return sum
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// dial is Envoy's client of the rate limit service at addr, closed at the end of the test;
// plaintext unless opts say otherwise.
func dial(t *testing.T, addr string, opts ...grpc.DialOption) pb.RateLimitServiceClient {
	t.Helper()
	if len(opts) == 0 {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		t.Fatalf("grpc client for %s: %v", addr, err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewRateLimitServiceClient(conn)
}

// request is a request of domain with one descriptor of the given key and value pairs.
func request(domain string, kv ...string) *pb.RateLimitRequest {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return &pb.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{d}}
}

// decide sends req with a 5 s deadline and returns the overall code; the call must succeed.
func decide(t *testing.T, c pb.RateLimitServiceClient, req *pb.RateLimitRequest) pb.RateLimitResponse_Code {
	t.Helper()
	return respond(t, c, req).GetOverallCode()
}

// respond sends req with a 5 s deadline and returns the response; the call must succeed.
func respond(t *testing.T, c pb.RateLimitServiceClient, req *pb.RateLimitRequest) *pb.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatalf("ShouldRateLimit(%v): %v", req, err)
	}
	return resp
}

// decisions sends req n times and returns the overall codes, joined: "OK OK OVER_LIMIT".
func decisions(t *testing.T, c pb.RateLimitServiceClient, req *pb.RateLimitRequest, n int) string {
	t.Helper()
	codes := make([]string, n)
	for i := range codes {
		codes[i] = decide(t, c, req).String()
	}
	return strings.Join(codes, " ")
}

// want is the string decisions returns for ok admissions followed by over denials.
func want(ok, over int) string {
	codes := make([]string, 0, ok+over)
	for range ok {
		codes = append(codes, pb.RateLimitResponse_OK.String())
	}
	for range over {
		codes = append(codes, pb.RateLimitResponse_OVER_LIMIT.String())
	}
	return strings.Join(codes, " ")
}

// writeFile writes data to path atomically (a file written beside the test's directories, then
// renamed over path), as a deployment replaces a file, creating the directories.
func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, err := os.CreateTemp(t.TempDir(), "config")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tmp.WriteString(data); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		t.Fatal(err)
	}
	if err := tmp.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		t.Fatal(err)
	}
}
