package rls_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// One request may carry the same descriptor more than once, with and without a limit
// override: each limit is decided, the descriptors under the same limit share their count,
// and the request is decided whole, never refused for naming a counter twice.
func TestSameDescriptorTwice(t *testing.T) {
	c, _ := newService(t, basicConfig, nil)
	plain := descriptor("five_per_minute", "twice")
	overridden := &rlv3.RateLimitDescriptor{Entries: plain.Entries,
		Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_MINUTE}}
	resp := ask(t, c, "edge", 0, plain, overridden, overridden)
	wantCode(t, "the override's 2 hits against its 2", resp, ok, ok, ok, ok)
	if got := resp.Statuses[1].LimitRemaining; got != 0 {
		t.Fatalf("the override's remaining %d, want 0 (both of its descriptors counted)", got)
	}
	wantCode(t, "again", ask(t, c, "edge", 0, plain, overridden, overridden), over, ok, over, over)
	wantCode(t, "the plain descriptor twice", ask(t, c, "edge", 0, plain, plain), ok, ok, ok)
	wantCode(t, "the plain descriptor twice, again", ask(t, c, "edge", 0, plain, plain), ok, ok, ok)
	wantCode(t, "the plain descriptor twice, over", ask(t, c, "edge", 0, plain, plain), over, over, over)
}

// A rule larger than the engine's largest limit (engine.MaxEvents) limits at that: hits
// beyond it are over the limit, not an error.
func TestHugeRule(t *testing.T) {
	const huge = `
domain: huge
descriptors:
  - key: bulk
    rate_limit: {unit: hour, requests_per_unit: 4294967295}
`
	c, _ := newService(t, huge, nil)
	d := descriptor("bulk", "x")
	wantCode(t, "1 hit", ask(t, c, "huge", 1, d), ok, ok)
	resp, err := askCtx(context.Background(), c, "huge", withHits(d, 3_000_000_000))
	if err != nil {
		t.Fatalf("3e9 hits: %v", err)
	}
	wantCode(t, "3e9 hits", resp, over, over)
	wantCode(t, fmt.Sprint(engine.MaxEvents-1, " hits"), ask(t, c, "huge", 0, withHits(d, engine.MaxEvents-1)), ok, ok)
	wantCode(t, "one more", ask(t, c, "huge", 0, d), over, over)
}

// Under fail-open with Valkey down, a descriptor whose hits exceed its rule is still over the
// limit (that needs no count), and the request with it is denied.
func TestFailOpenStillDeniesTheImpossible(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	r := start(t, enginetest.New(t, own.Client(t), engine.WithFailOpen(true)), basicConfig)
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	askDown := func(ds ...*rlv3.RateLimitDescriptor) *pb.RateLimitResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		resp, err := askCtx(ctx, r.client, "edge", ds...)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := askDown(withHits(descriptor("three_per_minute", "x"), 4), descriptor("ten_per_minute", "x"))
	wantCode(t, "4 hits against 3, Valkey down", resp, over, over, ok)
	resp = askDown(withHits(descriptor("three_per_minute", "x"), 3))
	wantCode(t, "3 hits against 3, Valkey down", resp, ok, ok)
	if got := resp.Statuses[0].LimitRemaining; got != 3 {
		t.Fatalf("fail-open: remaining %d, want 3", got)
	}
}
