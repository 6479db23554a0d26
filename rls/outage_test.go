package rls_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/rls"
)

// While Valkey is paused or down, a request with a deadline is answered before it: UNAVAILABLE
// (so that Envoy's failure_mode_deny decides), counted as a redis_error, and 400 on /json (as
// the reference answers), under the engine's fail-open too: the deadline is the client's own
// end, never an admission. A request without a deadline is admitted under fail-open once the
// request timeout (the service's bound on Valkey's answer) passes. Once Valkey is back,
// decisions resume, exact again.
func TestValkeyRestart(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	reg := prometheus.NewRegistry()
	closed := start(t, enginetest.New(t, own.Client(t)), basicConfig, rls.WithMetrics(reg),
		rls.WithRequestTimeout(200*time.Millisecond))
	open := start(t, enginetest.New(t, own.Client(t), engine.WithFailOpen(true)), basicConfig,
		rls.WithRequestTimeout(200*time.Millisecond))
	d := descriptor("three_per_minute", "restart")
	wantCode(t, "before the outage", ask(t, closed.client, "edge", 0, d), ok, ok)
	wantCode(t, "before the outage, fail-open", ask(t, open.client, "edge", 0, d), ok, ok)

	// The service answers a tenth of the remaining time before the deadline: 100 ms here, room
	// enough for a busy machine's scheduling, which a 200 ms deadline (20 ms) was not.
	const deadline = time.Second
	// A server that takes the calls but does not answer them (CLIENT PAUSE): the answer comes
	// before the deadline all the same. (The paused calls run once the pause ends: what they
	// record there can only under-admit, so the descriptor is not looked at again.)
	c := own.Client(t)
	if err := c.Do(context.Background(), c.B().Arbitrary("CLIENT", "PAUSE", "30000", "ALL").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	paused := descriptor("three_per_minute", "paused")
	for i := range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		began := time.Now()
		resp, err := askCtx(ctx, closed.client, "edge", paused)
		took := time.Since(began)
		cancel()
		if status.Code(err) != codes.Unavailable || took >= deadline {
			t.Fatalf("request %d with Valkey paused: %v, %v after %s; want UNAVAILABLE before the %s deadline", i+1, resp, err, took, deadline)
		}
		ctx, cancel = context.WithTimeout(context.Background(), deadline)
		resp, err = askCtx(ctx, open.client, "edge", paused)
		cancel()
		if status.Code(err) != codes.Unavailable {
			t.Fatalf("fail-open request %d with Valkey paused, its deadline passing: %v, %v; want UNAVAILABLE, not an admission", i+1, resp, err)
		}
		resp, err = askCtx(context.Background(), open.client, "edge", paused)
		if err != nil {
			t.Fatalf("fail-open request %d without a deadline, Valkey paused: %v", i+1, err)
		}
		wantCode(t, fmt.Sprintf("fail-open request %d without a deadline, Valkey paused", i+1), resp, ok, ok)
	}

	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		began := time.Now()
		resp, err := askCtx(ctx, closed.client, "edge", d)
		took := time.Since(began)
		cancel()
		if status.Code(err) != codes.Unavailable || took >= deadline {
			t.Fatalf("request %d with Valkey down: %v, %v after %s; want UNAVAILABLE before the %s deadline", i+1, resp, err, took, deadline)
		}

		ctx, cancel = context.WithTimeout(context.Background(), deadline)
		resp, err = askCtx(ctx, open.client, "edge", d)
		cancel()
		if err != nil {
			t.Fatalf("fail-open request %d with Valkey down: %v", i+1, err)
		}
		wantCode(t, fmt.Sprintf("fail-open request %d with Valkey down", i+1), resp, ok, ok)
		if got := resp.Statuses[0].LimitRemaining; got != 3 {
			t.Fatalf("fail-open request %d: remaining %d, want the whole limit, 3 (nothing is known)", i+1, got)
		}
	}
	srv := httptest.NewServer(closed.svc.HTTPHandler())
	defer srv.Close()
	resp, err := http.Post(srv.URL+"/json", "application/json", strings.NewReader(`{"domain":"edge","descriptors":[{"entries":[{"key":"three_per_minute","value":"restart"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || resp.Header.Get("Strictrate-Error") == "" {
		t.Fatalf("/json with Valkey down: %d, reason %q; want 400, as the reference answers, with a reason", resp.StatusCode, resp.Header.Get("Strictrate-Error"))
	}
	if got := metricValue(t, reg, "ratelimit_service_should_rate_limit_error", map[string]string{"err_type": "redis_error"}); got != 6 {
		t.Fatalf("should_rate_limit_error{redis_error} = %v, want 6", got)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := own.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := valkeytest.WaitFor(ctx, 10*time.Second, "decisions to resume", func() (bool, error) {
		_, err := askCtx(ctx, closed.client, "edge", withHits(d, 0))
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	// The server kept nothing: a new descriptor is decided exactly from scratch.
	fresh := descriptor("three_per_minute", "after-restart")
	for _, c := range []running{closed, open} {
		for i := range 3 {
			wantCode(t, fmt.Sprintf("after the restart, %d", i+1), ask(t, c.client, "edge", 0, fresh), ok, ok)
		}
		wantCode(t, "after the restart, 4", ask(t, c.client, "edge", 0, fresh), over, over)
		fresh = descriptor("three_per_minute", "after-restart-open")
	}
}
