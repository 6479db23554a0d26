package engine_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// collected reads every metric point the reader has: a counter's value, or a histogram's count
// of recordings, by metric name and its attributes "operation/outcome" (or "operation", or
// local quota's kind of events).
func collected(t *testing.T, reader *sdkmetric.ManualReader) map[string]map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	label := func(set attribute.Set) string {
		if kind, ok := set.Value("strictrate.local"); ok {
			return kind.AsString()
		}
		op, _ := set.Value("strictrate.operation")
		s := op.AsString()
		if oc, ok := set.Value("strictrate.outcome"); ok {
			s += "/" + oc.AsString()
		}
		return s
	}
	out := map[string]map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			points := map[string]int64{}
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range data.DataPoints {
					points[label(p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range data.DataPoints {
					points[label(p.Attributes)] = int64(p.Count)
				}
			case metricdata.Histogram[int64]:
				for _, p := range data.DataPoints {
					points[label(p.Attributes)] = int64(p.Count)
				}
			}
			out[m.Name] = points
		}
	}
	return out
}

// A scripted sequence of decisions gives exactly these counts: allowed, denied, cached, shadow
// denied, fail-open, errors, by operation; durations for each; no key anywhere.
func TestMetrics(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)

	e, _ := enginetest.Clocked(t, c, engine.WithMeterProvider(mp), engine.WithDenyCache(100))
	shadow, _ := enginetest.Clocked(t, c, engine.WithMeterProvider(mp), engine.WithShadow(true))
	open := enginetest.New(t, c, engine.WithMeterProvider(mp), engine.WithFailOpen(true))
	closed := enginetest.New(t, c, engine.WithMeterProvider(mp))
	key, l := enginetest.NewKey(t), engine.PerMinute(2)

	enginetest.MustAllowN(t, e, key, l, 2)                                                // allow/allowed
	enginetest.Want(t, "denied", enginetest.MustAllowN(t, e, key, l, 1).FromCache, false) // allow/denied
	enginetest.Want(t, "cached", enginetest.MustAllowN(t, e, key, l, 1).FromCache, true)  // allow/cache_denied
	enginetest.MustPeek(t, e, key, l)                                                     // peek/denied
	enginetest.MustAllowPolicy(t, e, enginetest.NewKey(t), engine.Policy{engine.PerSecond(1), engine.PerMinute(5)}, 1)
	r := enginetest.MustAllowN(t, shadow, key, l, 1) // allow/shadow_denied
	enginetest.Want(t, "shadow: allowed", r.Allowed && r.ShadowDenied, true)
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if r, err := open.Allow(tctx, enginetest.NewKey(t), l); err != nil || r.BackendErr == nil { // allow/fail_open
		t.Fatalf("fail-open with the server down: %+v, %v", r, err)
	}
	if _, err := closed.Allow(tctx, enginetest.NewKey(t), l); err == nil { // allow/error
		t.Fatal("fail-closed with the server down: no error")
	}

	got := collected(t, reader)
	wantCounts := map[string]int64{
		"allow/allowed": 1, "allow/denied": 1, "allow/cache_denied": 1, "allow/shadow_denied": 1,
		"allow/fail_open": 1, "allow/error": 1, "peek/denied": 1, "policy/allowed": 1,
	}
	for _, name := range []string{"strictrate.decisions", "strictrate.decision.duration"} {
		for attrs, n := range wantCounts {
			if got[name][attrs] != n {
				t.Errorf("%s{%s} = %d, want %d (all: %v)", name, attrs, got[name][attrs], n, got[name])
			}
		}
		if len(got[name]) != len(wantCounts) {
			t.Errorf("%s has points %v, want exactly %v", name, got[name], wantCounts)
		}
	}
	// Batching is on by default: every call to the server is a batch, of one here.
	if got["strictrate.batch.size"]["allow"] < 4 || got["strictrate.batch.size"]["peek"] != 1 {
		t.Errorf("strictrate.batch.size = %v, want allow >= 4 and peek 1", got["strictrate.batch.size"])
	}
}

// Shadow mode admits what the limit denies, says so, and never writes a denied request into
// the log: switched off, the limit holds on a truthful log.
func TestShadowNeverRecordsADenial(t *testing.T) {
	c := exampleServer.Client(t)
	shadow, clock := enginetest.Clocked(t, c, engine.WithShadow(true))
	enforcing := enginetest.New(t, c, engine.WithClock(clock.Now))
	key, l := enginetest.NewKey(t), engine.PerMinute(3)
	for i := 0; i < 10; i++ {
		r := enginetest.MustAllowN(t, shadow, key, l, 1)
		if !r.Allowed || r.ShadowDenied != (i >= 3) || (i >= 3) && !r.Entry.IsZero() {
			t.Fatalf("shadow request %d: %+v", i+1, r)
		}
	}
	enginetest.Want(t, "events after 10 shadow requests", enginetest.StoredEvents(t, c, key), int64(3))
	enginetest.Want(t, "enforced: allowed", enginetest.MustAllowN(t, enforcing, key, l, 1).Allowed, false)
	if err := shadow.Record(context.Background(), key, 3, time.Minute, enginetest.T0); err != nil {
		t.Fatalf("Record in shadow: %v, want nil", err)
	}
	if err := enforcing.Record(context.Background(), key, 3, time.Minute, enginetest.T0); !errors.Is(err, engine.ErrRateLimitExceeded) {
		t.Fatalf("Record enforced: %v, want ErrRateLimitExceeded", err)
	}
}

// Under 64 goroutines on one key, the deny cache sheds most of the load locally, the audit on
// the decisions' timestamps (a cached denial's is the real denial's, moved on by the time since)
// finds no overshoot and no false denial, and once a window has room
// the server admits again at once (no cached denial outlives the real one). Reset through the
// engine clears the key's denials.
func TestDenyCacheExactUnderLoad(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	var es []*engine.Engine
	for i := 0; i < 4; i++ {
		es = append(es, enginetest.New(t, own.Client(t), engine.WithDenyCache(64)))
	}
	key, l := enginetest.NewKey(t), engine.Limit{Max: 20, Window: 100 * time.Millisecond}
	resetStats(t, c)
	ds, cached := hammer(t, es, 64, 5*l.Window, func(_ *rand.Rand, e *engine.Engine) (engine.Result, int, error) {
		r, err := e.Allow(context.Background(), key, l)
		return r, 1, err
	})
	admitted := auditWeighted(t, ds, l)
	calls := scriptCalls(t, c)
	t.Logf("%d decisions, %d by the cache, the rest in %d server calls; %d admitted", len(ds), cached, calls, admitted)
	if cached < len(ds)/2 {
		t.Fatalf("the cache answered %d of %d requests: it shed little", cached, len(ds))
	}
	// Every window admitted its Max: the cache never kept a window that had room from filling.
	if admitted < 4*l.Max {
		t.Fatalf("%d admitted in 5 windows of Max %d: room went unused", admitted, l.Max)
	}

	// A cached denial ends exactly when the real one does: the first request after its
	// RetryAfter goes to the server and is admitted.
	clocked, clock := enginetest.Clocked(t, c, engine.WithDenyCache(8))
	key = enginetest.NewKey(t)
	enginetest.MustAllowN(t, clocked, key, engine.PerSecond(1), 1)
	clock.Set(enginetest.T0.Add(300 * time.Millisecond))
	r := enginetest.MustAllowN(t, clocked, key, engine.PerSecond(1), 1)
	enginetest.Want(t, "denied by the server", r.FromCache, false)
	enginetest.Want(t, "retry after", r.RetryAfter, 700*time.Millisecond)
	clock.Set(enginetest.T0.Add(999 * time.Millisecond))
	r = enginetest.MustAllowN(t, clocked, key, engine.PerSecond(1), 1)
	enginetest.Want(t, "1 ms before: cached", r.FromCache, true)
	enginetest.Want(t, "1 ms before: retry after counted down", r.RetryAfter, time.Millisecond)
	clock.Set(enginetest.T0.Add(time.Second))
	enginetest.Want(t, "at RetryAfter: allowed", enginetest.MustAllowN(t, clocked, key, engine.PerSecond(1), 1).Allowed, true)

	// Reset clears the key's cached denials; a cheaper request than the one denied asks the
	// server.
	clock.Set(enginetest.T0.Add(1100 * time.Millisecond))
	enginetest.Want(t, "denied again", enginetest.MustAllowN(t, clocked, key, engine.PerSecond(1), 1).Allowed, false)
	enginetest.Want(t, "cached", enginetest.MustAllowN(t, clocked, key, engine.PerSecond(1), 1).FromCache, true)
	if err := clocked.Reset(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "after Reset: allowed", enginetest.MustAllowN(t, clocked, key, engine.PerSecond(1), 1).Allowed, true)
	big := engine.Limit{Max: 5, Window: time.Minute}
	enginetest.MustAllowN(t, clocked, key+":big", big, 4)
	enginetest.Want(t, "cost 2 denied", enginetest.MustAllowN(t, clocked, key+":big", big, 2).Allowed, false)
	r = enginetest.MustAllowN(t, clocked, key+":big", big, 1)
	enginetest.Want(t, "cost 1 after a cost-2 denial: asks the server, admitted", r.Allowed && !r.FromCache, true)
}

// Waiters under contention each get in exactly once, at the rate the limit allows; a wait that
// would pass its deadline returns at once; a cost above Max is refused.
func TestWait(t *testing.T) {
	es, c := enginetest.Engines(t, exampleServer, 2)
	key, l := enginetest.NewKey(t), engine.Limit{Max: 5, Window: 200 * time.Millisecond}
	start := time.Now()
	var admitted []time.Time
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := 0; g < 15; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := es[g%2].Wait(ctx, key, l)
			if err != nil || !r.Allowed {
				t.Errorf("waiter %d: %+v, %v", g, r, err)
				return
			}
			mu.Lock()
			admitted = append(admitted, r.At)
			mu.Unlock()
		}()
	}
	wg.Wait()
	enginetest.Want(t, "waiters admitted", len(admitted), 15)
	if n := enginetest.StoredEvents(t, c, key); n > int64(l.Max) {
		t.Fatalf("the log holds %d events, over Max %d", n, l.Max)
	}
	sort.Slice(admitted, func(i, j int) bool { return admitted[i].Before(admitted[j]) })
	for i := l.Max; i < len(admitted); i++ {
		if gap := admitted[i].Sub(admitted[i-l.Max]); gap < l.Window {
			t.Fatalf("admissions %d and %d only %s apart: more than %d in a window", i-l.Max, i, gap, l.Max)
		}
	}
	t.Logf("15 waiters through a limit of 5 per 200ms in %s", time.Since(start).Round(time.Millisecond))

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	full := enginetest.NewKey(t)
	enginetest.MustAllowN(t, es[0], full, engine.PerMinute(1), 1)
	began := time.Now()
	_, err := es[0].Wait(ctx, full, engine.PerMinute(1))
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, engine.ErrRateLimitExceeded) {
		t.Fatalf("a wait past the deadline: %v, want DeadlineExceeded and ErrRateLimitExceeded", err)
	}
	if waited := time.Since(began); waited > 40*time.Millisecond {
		t.Errorf("a wait that could not end in time took %s to say so", waited)
	}
	if _, err := es[0].WaitN(context.Background(), full, engine.PerMinute(1), 2); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Fatalf("WaitN above Max: %v, want ErrInvalidArgument", err)
	}
}
