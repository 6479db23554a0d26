package rls_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/rls"
)

// The variables a child process of TestServicesInProcesses reads.
const (
	childEnv       = "STRICTRATE_RLS_CHILD"
	childValkeyEnv = "STRICTRATE_RLS_CHILD_VALKEY"
	childPrefixEnv = "STRICTRATE_RLS_CHILD_PREFIX"
)

const processesConfig = `
domain: procs
descriptors:
  - key: account
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: feature
    rate_limit: {unit: minute, requests_per_unit: 30}
`

// TestChildService is not a test: run by TestServicesInProcesses in a process of its own, it
// serves the rate limit service on loopback, prints its address, and serves until SIGTERM.
func TestChildService(t *testing.T) {
	if os.Getenv(childEnv) != "1" {
		t.Skip("a child process of TestServicesInProcesses")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	e := enginetest.New(t, valkeytest.NewClient(t, os.Getenv(childValkeyEnv)))
	svc := rls.New(e, rls.WithKeyPrefix(os.Getenv(childPrefixEnv)), rls.WithRequestTimeout(requestTimeout))
	svc.SetConfig(mustConfig(t, processesConfig))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterRateLimitServiceServer(g, svc)
	go g.Serve(ln)
	fmt.Printf("listening %s\n", ln.Addr())
	<-ctx.Done() // the parent stops it at the end of its test
	g.Stop()
}

// startChild starts a service in a process of its own and returns its client; the process
// stops when the test ends.
func startChild(t *testing.T, prefix string) pb.RateLimitServiceClient {
	t.Helper()
	_, stdout := valkeytest.Rerun(t, "TestChildService", childEnv+"=1", childValkeyEnv+"="+server.Addr, childPrefixEnv+"="+prefix)
	lines := bufio.NewScanner(stdout)
	var addr string
	for lines.Scan() {
		if a, ok := strings.CutPrefix(lines.Text(), "listening "); ok {
			addr = a
			break
		}
	}
	if addr == "" {
		t.Fatal("the child process never said where it listens")
	}
	go func() { // keep draining the child's output so it never blocks on a full pipe
		for lines.Scan() {
		}
	}()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewRateLimitServiceClient(conn)
}

// Three services in three OS processes on one Valkey, 48 callers spread over them: requests
// carry an account descriptor (100 per minute) and, one in two, a feature descriptor too (30
// per minute), so the feature's limit denies requests whose account has room. Exactly 100
// account hits and 30 feature hits are admitted, the keys hold exactly what was admitted (a
// denied request consumed nothing anywhere), and no process admitted past a limit.
func TestServicesInProcesses(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts OS processes")
	prefix := t.Name() + uuid.NewString() + ":"
	clients := []pb.RateLimitServiceClient{startChild(t, prefix), startChild(t, prefix), startChild(t, prefix)}
	account, feature := descriptor("account", "a1"), descriptor("feature", "f1")

	var accountHits, featureHits, errs atomic.Int64
	var wg sync.WaitGroup
	for g := range 48 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := clients[g%len(clients)]
			for i := range 12 {
				ds := []*rlv3.RateLimitDescriptor{account}
				if (g+i)%2 == 0 {
					ds = append(ds, feature)
				}
				resp, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "procs", Descriptors: ds})
				if err != nil {
					errs.Add(1)
					continue
				}
				if resp.OverallCode == ok {
					accountHits.Add(1)
					if len(ds) == 2 {
						featureHits.Add(1)
					}
				}
			}
		}()
	}
	wg.Wait()
	if errs.Load() > 0 {
		t.Fatalf("%d calls failed", errs.Load())
	}
	// 576 requests, 288 with the feature: every limit is exhausted, none exceeded.
	if accountHits.Load() != 100 {
		t.Fatalf("%d account hits admitted, want exactly 100 (the limit, with demand above it)", accountHits.Load())
	}
	if featureHits.Load() != 30 {
		t.Fatalf("%d feature hits admitted, want exactly 30 (the limit, reached long before the account's)", featureHits.Load())
	}
	c := server.Client(t)
	for _, k := range []struct {
		key  string
		want int64
	}{{prefix + "procs_account_a1_", accountHits.Load()}, {prefix + "procs_feature_f1_", featureHits.Load()}} {
		if got := enginetest.Events(t, c, enginetest.Prefix, k.key); got != k.want {
			t.Fatalf("key %s holds %d events, want %d: the admitted hits, and nothing of denied requests", k.key, got, k.want)
		}
	}
}
