package engine_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
)

// quotaStep is one request of a QuotaAfter test: when, what, and the Result fields it must get.
type quotaStep struct {
	at        time.Duration // after enginetest.T0
	peek      bool          // PeekPolicy instead of AllowPolicy
	allowed   bool
	remaining int
	retry     time.Duration
	quota     time.Duration
	window    time.Duration
}

// runQuotaSteps runs steps on keys copies of one history at once (so that a batching engine
// may carry several of them in one call), and checks every copy's Result.
func runQuotaSteps(t *testing.T, e *engine.Engine, clock *enginetest.Clock, p engine.Policy, keys int, steps []quotaStep) {
	t.Helper()
	names := make([]string, keys)
	for i := range names {
		names[i] = enginetest.NewKey(t)
	}
	for i, s := range steps {
		clock.Set(enginetest.T0.Add(s.at))
		results := make([]engine.Result, keys)
		errs := make([]error, keys)
		var wg sync.WaitGroup
		for k := range names {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if s.peek {
					results[k], errs[k] = e.PeekPolicy(context.Background(), names[k], p, 1)
				} else {
					results[k], errs[k] = e.AllowPolicy(context.Background(), names[k], p, 1)
				}
			}()
		}
		wg.Wait()
		for k, r := range results {
			if errs[k] != nil {
				t.Fatalf("step %d, key %d: %v", i+1, k, errs[k])
			}
			if r.Allowed != s.allowed || r.Remaining != s.remaining || r.RetryAfter != s.retry || r.QuotaAfter != s.quota || r.Window != s.window {
				t.Fatalf("step %d (+%s), key %d: %+v\nwant allowed %v, remaining %d, retry after %s, quota after %s, window %s",
					i+1, s.at, k, r, s.allowed, s.remaining, s.retry, s.quota, s.window)
			}
		}
	}
}

// QuotaAfter is when the named limit next gets quota back: its window's oldest event leaving,
// long before its newest does (ResetAfter). On the fast path (one limit, a short log), the
// general one (a policy's shorter window, counted from its cursor), and a log long enough that
// the window's first entry sits behind the header.
func TestQuotaAfterOldestEventLeavesFirst(t *testing.T) {
	const copies = 6
	t.Run("one limit", func(t *testing.T) {
		e, clock := enginetest.Clocked(t, exampleServer.Client(t))
		m := time.Minute
		runQuotaSteps(t, e, clock, engine.Policy{{Max: 3, Window: m}}, copies, []quotaStep{
			{at: 0, allowed: true, remaining: 2, quota: m, window: m},                               // the only event
			{at: 20 * time.Second, allowed: true, remaining: 1, quota: 40 * time.Second, window: m}, // the first leaves at +60s
			{at: 30 * time.Second, allowed: true, remaining: 0, quota: 30 * time.Second, window: m},
			{at: 45 * time.Second, allowed: false, retry: 15 * time.Second, quota: 15 * time.Second, window: m},
			{at: 45 * time.Second, peek: true, retry: 15 * time.Second, quota: 15 * time.Second, window: m},
			{at: 61 * time.Second, allowed: true, remaining: 0, quota: 19 * time.Second, window: m}, // the +20s event is the oldest now
			{at: 200 * time.Second, peek: true, allowed: true, remaining: 3, quota: 0, window: m},   // nothing in the window
		})
	})
	t.Run("policy", func(t *testing.T) {
		e, clock := enginetest.Clocked(t, exampleServer.Client(t))
		w := 10 * time.Second
		runQuotaSteps(t, e, clock, engine.Policy{{Max: 3, Window: w}, {Max: 10, Window: time.Minute}}, copies, []quotaStep{
			{at: 0, allowed: true, remaining: 2, quota: w, window: w},
			{at: 2 * time.Second, allowed: true, remaining: 1, quota: 8 * time.Second, window: w},
			{at: 4 * time.Second, allowed: true, remaining: 0, quota: 6 * time.Second, window: w},
			{at: 4 * time.Second, peek: true, retry: 6 * time.Second, quota: 6 * time.Second, window: w},
			// The +0s and +2s events left the 10s window, the +4s one has not: it leaves first.
			{at: 12 * time.Second, allowed: true, remaining: 1, quota: 2 * time.Second, window: w},
		})
	})
	t.Run("long log", func(t *testing.T) {
		e, clock := enginetest.Clocked(t, exampleServer.Client(t))
		key, ctx := enginetest.NewKey(t), context.Background()
		p := engine.Policy{{Max: 30, Window: 20 * time.Second}, {Max: 100, Window: time.Minute}}
		for i := range 40 { // 32 stay in the header; the oldest move behind it
			clock.Set(enginetest.T0.Add(time.Duration(i) * time.Second))
			enginetest.MustAllowN(t, e, key, p[1], 1)
		}
		// The 20s window holds +26s..+39s: +26s leaves it first, 1s from now.
		clock.Set(enginetest.T0.Add(45 * time.Second))
		peek, err := e.PeekPolicy(ctx, key, p, 1)
		if err != nil || peek.QuotaAfter != time.Second || peek.Window != p[0].Window || peek.Remaining != 16 {
			t.Fatalf("PeekPolicy: %+v, %v; want quota after 1s for the 20s window, 16 remaining", peek, err)
		}
		r := enginetest.MustAllowPolicy(t, e, key, p, 1)
		if r.QuotaAfter != time.Second || r.ResetAfter != time.Minute || r.Window != p[0].Window {
			t.Fatalf("AllowPolicy: %+v, want quota after 1s, reset after 1m, the 20s window named", r)
		}
		// The minute alone: +0s and +1s have left it at +61s, +2s leaves next.
		clock.Set(enginetest.T0.Add(61 * time.Second))
		if r := enginetest.MustAllowN(t, e, key, p[1], 1); r.QuotaAfter != time.Second {
			t.Fatalf("AllowN on the minute: %+v, want quota after 1s", r)
		}
	})
}

// A refunded entry gives no quota back when it leaves: QuotaAfter skips it.
func TestQuotaAfterSkipsRefundedEntries(t *testing.T) {
	e, clock := enginetest.Clocked(t, exampleServer.Client(t))
	key, ctx, l := enginetest.NewKey(t), context.Background(), engine.PerMinute(5)
	first := enginetest.MustAllowN(t, e, key, l, 2)
	clock.Set(enginetest.T0.Add(10 * time.Second))
	enginetest.MustAllowN(t, e, key, l, 1)
	if err := e.Refund(ctx, key, first); err != nil {
		t.Fatal(err)
	}
	clock.Set(enginetest.T0.Add(15 * time.Second))
	if r := enginetest.MustPeek(t, e, key, l); r.QuotaAfter != 55*time.Second {
		t.Fatalf("Peek after refunding the oldest: %+v, want quota after 55s (the +10s entry)", r)
	}
	if r := enginetest.MustAllowN(t, e, key, l, 1); r.QuotaAfter != 55*time.Second || r.Remaining != 3 {
		t.Fatalf("AllowN after refunding the oldest: %+v, want quota after 55s, 3 remaining", r)
	}
}
