package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// TestValkeyDown: while Valkey is down, a request is answered before its deadline, UNAVAILABLE
// (so that Envoy's failure_mode_deny decides) or, with STRICTRATE_FAIL_OPEN=true, OK;
// /healthcheck fails; once Valkey is back on its address, decisions resume.
func TestValkeyDown(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	valkey := valkeytest.New(t, valkeytest.OwnServer())
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "ratelimit", "config", "edge.yaml"), edgeConfig(2))
	e := fileEnv(t, root)
	e["REDIS_URL"] = valkey.Addr
	closed := start(t, e)
	e["STRICTRATE_FAIL_OPEN"] = "true"
	e["CACHE_KEY_PREFIX"] += "open:"
	open := start(t, e)
	closedClient, openClient := dial(t, closed.grpc), dial(t, open.grpc)
	req := request("edge", "remote_address", "10.0.0.1")
	if got := decide(t, closedClient, req); got != pb.RateLimitResponse_OK {
		t.Fatalf("a first request with Valkey up: %v, want OK", got)
	}

	if err := valkey.Stop(); err != nil {
		t.Fatalf("stop Valkey: %v", err)
	}
	// The service answers a tenth of the remaining time before the deadline: 100 ms here, room
	// enough for a busy machine's scheduling, which a 200 ms deadline (20 ms) was not (as in
	// the rls package's TestValkeyRestart).
	const deadline = time.Second
	call := func(c pb.RateLimitServiceClient) (*pb.RateLimitResponse, error, time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		began := time.Now()
		resp, err := c.ShouldRateLimit(ctx, req)
		return resp, err, time.Since(began)
	}
	for range 3 {
		resp, err, took := call(closedClient)
		if status.Code(err) != codes.Unavailable || took >= deadline {
			t.Errorf("fail closed, Valkey down: %v, %v after %v; want UNAVAILABLE before the %v deadline", resp, err, took, deadline)
		}
		resp, err, took = call(openClient)
		if err != nil || resp.GetOverallCode() != pb.RateLimitResponse_OK || took >= deadline {
			t.Errorf("fail open, Valkey down: %v, %v after %v; want OK before the %v deadline", resp, err, took, deadline)
		}
	}
	if code := closed.health(); code == http.StatusOK {
		t.Errorf("/healthcheck with Valkey down: 200, want a failure")
	}
	if got := closed.metric("/metrics", "ratelimit_service_should_rate_limit_error", `err_type="redis_error"`); got < 3 {
		t.Errorf(`should_rate_limit_error{err_type="redis_error"}: %v, want at least 3`, got)
	}

	// Valkey restarts empty on the same address: the processes reconnect by themselves, and
	// the limit is decided again from nothing.
	if err := valkey.Restart(context.Background()); err != nil {
		t.Fatalf("restart Valkey: %v", err)
	}
	closed.waitFor("/healthcheck to pass once Valkey is back", func() bool { return closed.health() == http.StatusOK })
	for name, c := range map[string]pb.RateLimitServiceClient{"fail closed": closedClient, "fail open": openClient} {
		// A pipeline connection of the client's that was open before the restart and not used
		// since fails the one call it next carries (EOF): valkey-go does not send a script that
		// may write twice. That call is answered UNAVAILABLE, or under fail-open OK uncounted
		// (the whole limit remaining). Decisions have resumed when a fresh address gets exact
		// answers: codes and remaining quota.
		const exact = "OK:1 OK:0 OVER_LIMIT:0"
		for attempt := 0; ; attempt++ {
			req := request("edge", "remote_address", fmt.Sprintf("10.0.1.%d", attempt))
			got, err := tryDecisions(c, req, 3)
			if got == exact {
				break
			}
			if attempt == 5 || (err == nil && !strings.Contains(got, "OK:2")) || (err != nil && status.Code(err) != codes.Unavailable) {
				t.Fatalf("%s: 3 requests against 2 a minute after Valkey restarted, attempt %d: %q, %v; want %q",
					name, attempt, got, err, exact)
			}
			t.Logf("%s: a call after Valkey restarted: %q, %v", name, got, err)
		}
	}
}

// tryDecisions sends req n times, and returns each answer's overall code and the first
// descriptor's remaining quota ("OK:1 OVER_LIMIT:0"), or the first error.
func tryDecisions(c pb.RateLimitServiceClient, req *pb.RateLimitRequest, n int) (string, error) {
	answers := make([]string, n)
	for i := range answers {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := c.ShouldRateLimit(ctx, req)
		cancel()
		if err != nil {
			return "", err
		}
		answers[i] = fmt.Sprintf("%s:%d", resp.GetOverallCode(), resp.GetStatuses()[0].GetLimitRemaining())
	}
	return strings.Join(answers, " "), nil
}
