package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// Server names in the report.
const (
	nameStrictrate = "strictrate-rls"
	nameReference  = "reference"
)

// startTimeout bounds how long a server may take to answer its first request.
const startTimeout = 30 * time.Second

// stopTimeout is how long a server gets to exit after SIGTERM before it is killed.
const stopTimeout = 10 * time.Second

// server is one rate limit service running as a process of the bench's, with the gRPC
// connections that drive it.
type server struct {
	name      string
	prefix    string // its CACHE_KEY_PREFIX
	proc      *valkeytest.Process
	logPath   string
	grpcAddr  string
	httpAddr  string
	debugAddr string
	conns     []*grpc.ClientConn
	clients   []pb.RateLimitServiceClient
}

// processSpec is what startServer needs to launch one server.
type processSpec struct {
	name      string
	bin       string
	valkey    string   // host:port
	configDir string   // the runtime root: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/*.yaml
	prefix    string   // CACHE_KEY_PREFIX
	extraEnv  []string // NAME=value, after the bench's own
	logDir    string
	conns     int
}

// buildStrictrate builds strictrate-rls into dir and returns the binary's path.
func buildStrictrate(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "strictrate-rls")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/strictrate/strictrate/rls/cmd/strictrate-rls")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("bench: build strictrate-rls: %w\n%s", err, out)
	}
	return bin, nil
}

// environment is the reference's environment variables for a server of spec on the given
// ports: the same for both servers but for the prefix and the ports. The rest of the
// bench's own environment is not passed on, so that a REDIS_URL or LOG_LEVEL set in the
// shell cannot change what is measured.
func (spec processSpec) environment(grpcPort, httpPort, debugPort string) []string {
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + os.Getenv("HOME"),
		"REDIS_SOCKET_TYPE=tcp",
		"REDIS_URL=" + spec.valkey,
		"RUNTIME_ROOT=" + spec.configDir,
		"RUNTIME_SUBDIRECTORY=" + runtimeSubdirectory,
		"RUNTIME_WATCH_ROOT=false",
		"USE_STATSD=false",
		"LOG_LEVEL=warn",
		"CACHE_KEY_PREFIX=" + spec.prefix,
		"HOST=127.0.0.1",
		"PORT=" + httpPort,
		"GRPC_HOST=127.0.0.1",
		"GRPC_PORT=" + grpcPort,
		"DEBUG_HOST=127.0.0.1",
		"DEBUG_PORT=" + debugPort,
	}
	return append(env, spec.extraEnv...)
}

// startServer launches spec's binary, waits until it answers a request of the bench's
// domain, and connects spec.conns gRPC connections to it. The caller must stop it.
func startServer(ctx context.Context, spec processSpec) (*server, error) {
	ports, err := valkeytest.FreePorts(3)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	s := &server{
		name:      spec.name,
		prefix:    spec.prefix,
		logPath:   filepath.Join(spec.logDir, spec.name+".log"),
		grpcAddr:  net.JoinHostPort("127.0.0.1", ports[0]),
		httpAddr:  net.JoinHostPort("127.0.0.1", ports[1]),
		debugAddr: net.JoinHostPort("127.0.0.1", ports[2]),
	}
	logFile, err := os.Create(s.logPath)
	if err != nil {
		return nil, fmt.Errorf("bench: %s log: %w", spec.name, err)
	}
	defer logFile.Close() // the child holds its own descriptor
	if s.proc, err = valkeytest.StartProcess(spec.bin, nil, spec.environment(ports[0], ports[1], ports[2]), logFile); err != nil {
		return nil, fmt.Errorf("bench: %s: %w", spec.name, err)
	}

	if err := s.connect(spec.conns); err != nil {
		s.stop()
		return nil, err
	}
	if err := s.waitReady(ctx); err != nil {
		s.stop()
		return nil, err
	}
	return s, nil
}

// connect makes n gRPC connections to the server (they connect on first use).
func (s *server) connect(n int) error {
	for range n {
		// Each connection its own, not multiplexed with the others: grpc.NewClient shares
		// nothing between ClientConns.
		conn, err := grpc.NewClient(s.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("bench: dial %s: %w", s.name, err)
		}
		s.conns = append(s.conns, conn)
		s.clients = append(s.clients, pb.NewRateLimitServiceClient(conn))
	}
	return nil
}

// waitReady waits until /healthcheck answers 200 and a request of the bench's domain is
// answered OK on every connection, or the process exits, or startTimeout passes.
func (s *server) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(startTimeout)
	probe := &pb.RateLimitRequest{Domain: benchDomain, Descriptors: []*rlv3.RateLimitDescriptor{
		{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "user", Value: "probe"}}},
	}}
	var last error
	for ready := 0; ready < len(s.clients); {
		select {
		case <-s.proc.Done():
			return fmt.Errorf("bench: %s exited at start; its log:\n%s", s.name, tail(s.logPath))
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench: %s not ready within %s: %v; its log:\n%s", s.name, startTimeout, last, tail(s.logPath))
		}
		last = s.healthy(ctx)
		if last == nil {
			last = s.ask(ctx, ready, probe)
		}
		if last == nil {
			ready++
			continue
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// healthy asks /healthcheck.
func (s *server) healthy(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.httpAddr+"/healthcheck", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/healthcheck: %s", resp.Status)
	}
	return nil
}

// ask sends req on connection i and wants OK.
func (s *server) ask(ctx context.Context, i int, req *pb.RateLimitRequest) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	resp, err := s.clients[i].ShouldRateLimit(ctx, req)
	if err != nil {
		return err
	}
	if resp.GetOverallCode() != pb.RateLimitResponse_OK {
		return fmt.Errorf("probe answered %s", resp.GetOverallCode())
	}
	return nil
}

// alive reports an error when the process has exited.
func (s *server) alive() error {
	select {
	case <-s.proc.Done():
		return fmt.Errorf("bench: %s exited; its log:\n%s", s.name, tail(s.logPath))
	default:
		return nil
	}
}

// pid is the server's process id.
func (s *server) pid() int { return s.proc.Pid() }

// stop closes the connections and stops the process: SIGTERM, then SIGKILL after
// stopTimeout. It waits for the exit.
func (s *server) stop() {
	for _, c := range s.conns {
		_ = c.Close()
	}
	s.conns, s.clients = nil, nil
	_ = s.proc.Stop(stopTimeout)
}

// tail is the end of a log file, for an error message.
func tail(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	const max = 4000
	text := strings.TrimSpace(string(data))
	if len(text) > max {
		text = "..." + text[len(text)-max:]
	}
	if text == "" {
		return "(empty)"
	}
	return text
}
