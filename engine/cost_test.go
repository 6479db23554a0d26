package engine_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/pipelined"
)

// leastScriptUsec runs calls decisions (decide, given each call's number) and returns the least
// server time one of their script calls took, in µs, from the server's slow log, which a
// test's own server logs every call to (slowLogged): the least, since a busy machine only ever
// adds to a call's time, where a mean or a sum takes every preemption in.
func leastScriptUsec(t *testing.T, c valkey.Client, calls int, decide func(i int)) int64 {
	t.Helper()
	ctx := context.Background()
	if err := c.Do(ctx, c.B().SlowlogReset().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for i := range calls {
		decide(i)
	}
	logged, err := c.Do(ctx, c.B().SlowlogGet().Count(-1).Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	least, seen := int64(-1), 0
	for _, entry := range logged {
		fields, err := entry.ToArray()
		if err != nil || len(fields) < 4 {
			t.Fatalf("SLOWLOG GET entry %v (%v)", entry, err)
		}
		args, _ := fields[3].AsStrSlice()
		if len(args) == 0 || !strings.EqualFold(args[0], "evalsha") {
			continue
		}
		usec, err := fields[2].AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		if seen++; least < 0 || usec < least {
			least = usec
		}
	}
	if seen != calls {
		t.Fatalf("the slow log holds %d script calls, want %d", seen, calls)
	}
	return least
}

// slowLogged is a server of the test's own that logs every call's time (leastScriptUsec).
func slowLogged(t *testing.T) *valkeytest.Server {
	return valkeytest.New(t, valkeytest.ServerArgs("--slowlog-log-slower-than", "0", "--slowlog-max-len", "1000"))
}

// A cost of a million is one entry: admitted, a log of one entry and well under a kilobyte,
// and the script's server time no larger than for a cost of one (the first layout took 2 s).
func TestHugeCostIsOneEntry(t *testing.T) {
	own := slowLogged(t)
	c := own.Client(t)
	e := enginetest.New(t, c)
	l := engine.Limit{Max: 10_000_000, Window: time.Hour}

	key := enginetest.NewKey(t)
	r := enginetest.MustAllowN(t, e, key, l, 1_000_000)
	enginetest.Want(t, "AllowN(1e6): allowed", r.Allowed, true)
	enginetest.Want(t, "AllowN(1e6): remaining", r.Remaining, 9_000_000)
	log := enginetest.Log(t, c, enginetest.Prefix, key)
	enginetest.Want(t, "entries", log.Count, 1)
	enginetest.Want(t, "events", log.Events, 1_000_000)
	size, err := c.Do(context.Background(), c.B().MemoryUsage().Key(enginetest.Prefix+key).Samples(0).Build()).AsInt64()
	if err != nil || size >= 1024 {
		t.Fatalf("MEMORY USAGE %d (%v), want under 1 KB", size, err)
	}

	// The least of 100 admissions of each, each on a fresh key.
	admit := func(n int) func(int) {
		return func(int) {
			if r := enginetest.MustAllowN(t, e, enginetest.NewKey(t), l, n); !r.Allowed {
				t.Fatalf("AllowN(%d) on a fresh key with %s: denied", n, l)
			}
		}
	}
	one, million := leastScriptUsec(t, c, 100, admit(1)), leastScriptUsec(t, c, 100, admit(1_000_000))
	t.Logf("least server µs per call: AllowN(1) %d, AllowN(1e6) %d", one, million)
	if million > 2*one+20 {
		t.Fatalf("AllowN(1e6) costs the server %d µs per call, AllowN(1) %d: cost grows with n", million, one)
	}
}

// denialUsec runs calls denials of cost n against l on key and returns the least server time
// one of them took (leastScriptUsec), with the last denial.
func denialUsec(t *testing.T, c valkey.Client, e *engine.Engine, key string, l engine.Limit, n, calls int) (int64, engine.Result) {
	t.Helper()
	var r engine.Result
	least := leastScriptUsec(t, c, calls, func(int) {
		if r = enginetest.MustAllowN(t, e, key, l, n); r.Allowed {
			t.Fatalf("a request of cost %d against %s on a full log: admitted", n, l)
		}
	})
	return least, r
}

// No request buys server time with its cost, or with how far a lowered limit leaves a long log
// over it: on a log of 20,000 entries, a denial of cost 10,000, or of cost 1 against a limit of
// half the log, costs the server about what a denial of cost 1 on the full log does (each used
// to walk 10,000 entries: 1.5 ms, against 20 µs). Their RetryAfter is then the wait until the
// 32nd oldest entry of the window leaves, before which they cannot be admitted.
func TestDenialWorkDoesNotGrowWithCostOrOverLimit(t *testing.T) {
	c := slowLogged(t).Client(t)
	e, clock := enginetest.Clocked(t, c)
	const entries, perMilli = 20_000, 100
	full := engine.Limit{Max: entries, Window: time.Hour}
	key := enginetest.NewKey(t)
	// 100 entries a millisecond, for 200 milliseconds.
	for ms := 0; ms < entries/perMilli; ms++ {
		clock.Set(enginetest.T0.Add(time.Duration(ms) * time.Millisecond))
		rs := enginetest.RunConcurrently(t, []*engine.Engine{e}, 8, perMilli, func(e *engine.Engine) (engine.Result, error) {
			return e.Allow(context.Background(), key, full)
		})
		for _, r := range rs {
			if !r.Allowed {
				t.Fatalf("filling the log: denied at %s", r.At)
			}
		}
	}
	now := enginetest.T0.Add(time.Second)
	clock.Set(now)
	lowered := engine.Limit{Max: entries / 2, Window: time.Hour}
	// The 32nd oldest entry is of the first millisecond; the events that must leave end in the
	// 100th.
	earliest := enginetest.T0.Add(time.Hour).Sub(now)
	// The least of 20 calls of each: a denial of cost 1 walks one entry or two.
	one, rOne := denialUsec(t, c, e, key, full, 1, 20)
	costly, rCostly := denialUsec(t, c, e, key, full, entries/2, 20)
	over, rOver := denialUsec(t, c, e, key, lowered, 1, 20)
	whole, rWhole := denialUsec(t, c, e, key, full, entries, 20)
	t.Logf("least server µs per denial on a log of %d entries: cost 1 %d, cost %d %d, cost %d %d, cost 1 over a limit of %d %d",
		entries, one, entries/2, costly, entries, whole, lowered.Max, over)
	// Walking half the log took 1,500 µs here; a walk that does not grow takes a few dozen.
	for _, got := range []int64{costly, whole, over} {
		if got > 3*one+100 {
			t.Fatalf("a denial's server time grows with its cost or with the log's excess over the limit")
		}
	}
	enginetest.Want(t, "cost 1 on the full log: retry after", rOne.RetryAfter, earliest)
	enginetest.Want(t, "cost 10,000 on the full log: retry after", rCostly.RetryAfter, earliest)
	enginetest.Want(t, "cost 1 over a lowered limit: retry after", rOver.RetryAfter, earliest)
	// The whole limit: the newest entry must leave, found from the newest end.
	enginetest.Want(t, "cost 20,000 on the full log: retry after", rWhole.RetryAfter, enginetest.T0.Add(199*time.Millisecond+time.Hour).Sub(now))
}

// weightedDecision is one decision of the weighted audit: when the server took it, its cost,
// and whether it was admitted.
type weightedDecision struct {
	at      int64 // µs, the server's clock
	cost    int
	allowed bool
}

// auditWeighted checks decisions against the limit on their server timestamps: no trailing
// window holds more than Max of admitted cost (at or before each admission, the admission
// included), and no request was denied while its trailing window had room for it (admitted
// cost strictly before it in the window, plus its cost, at most Max; decisions of the same
// microsecond count as before it, the benefit of the doubt going to the denial).
func auditWeighted(t *testing.T, ds []weightedDecision, l engine.Limit) (admitted int) {
	t.Helper()
	w := l.Window.Microseconds()
	var times []int64 // the admitted decisions' times, ascending, and their running cost
	var cum []int
	slices.SortStableFunc(ds, func(a, b weightedDecision) int { return cmp.Compare(a.at, b.at) })
	for _, d := range ds {
		if d.allowed {
			times = append(times, d.at)
			cum = append(cum, admitted+d.cost)
			admitted += d.cost
		}
	}
	// costIn is the admitted cost in (t - w, t]: this microsecond included.
	costIn := func(t int64) int {
		upto, _ := slices.BinarySearchFunc(times, t+1, cmp.Compare[int64])
		from, _ := slices.BinarySearchFunc(times, t-w+1, cmp.Compare[int64])
		total := 0
		if upto > 0 {
			total = cum[upto-1]
		}
		if from > 0 {
			total -= cum[from-1]
		}
		return total
	}
	for _, d := range ds {
		inWindow := costIn(d.at)
		switch {
		case d.allowed && inWindow > l.Max:
			t.Fatalf("admitted cost %d in the window ending at %d, over Max %d", inWindow, d.at, l.Max)
		case !d.allowed && inWindow+d.cost <= l.Max:
			t.Fatalf("cost %d denied at %d with %d admitted in its window of Max %d: a false denial", d.cost, d.at, inWindow, l.Max)
		}
	}
	return admitted
}

// hammer runs do from goroutines spread over es until d has passed, each with a random
// source of its own, and returns every decision (its timestamp, cost and outcome) and how many
// the deny cache took.
func hammer(t *testing.T, es []*engine.Engine, goroutines int, d time.Duration,
	do func(rng *rand.Rand, e *engine.Engine) (engine.Result, int, error)) (ds []weightedDecision, cached int) {
	t.Helper()
	var mu sync.Mutex
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := 0; g < goroutines; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 9))
			e := es[g%len(es)]
			for time.Now().Before(deadline) {
				r, n, err := do(rng, e)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				ds = append(ds, weightedDecision{at: r.At.UnixMicro(), cost: n, allowed: r.Allowed})
				if r.FromCache {
					cached++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return ds, cached
}

// 64 goroutines over 4 clients ask for random costs against a limit for several windows:
// audited on the server's timestamps, no window over Max and no false denial. Costs 1 to 50
// against Max 1000 keep about 40 entries in a window (the log's older entries leave its
// header); costs 1 to 8 against Max 60 keep it within the header.
func TestWeightedExactUnderConcurrency(t *testing.T) {
	for _, tc := range []struct {
		max, maxCost int
	}{{1000, 50}, {60, 8}} {
		t.Run(fmt.Sprintf("Max %d, costs 1 to %d", tc.max, tc.maxCost), func(t *testing.T) {
			es, _ := enginetest.Engines(t, exampleServer, 4)
			key, l := enginetest.NewKey(t), engine.Limit{Max: tc.max, Window: 200 * time.Millisecond}
			ds, _ := hammer(t, es, 64, 5*l.Window, func(rng *rand.Rand, e *engine.Engine) (engine.Result, int, error) {
				n := 1 + rng.IntN(tc.maxCost)
				r, err := e.AllowN(context.Background(), key, l, n)
				return r, n, err
			})
			admitted := auditWeighted(t, ds, l)
			t.Logf("%d decisions, %d events admitted over about 5 windows of Max %d", len(ds), admitted, l.Max)
			if admitted < 4*l.Max {
				t.Fatalf("admitted %d events over 5 windows of Max %d: the limit was not reached", admitted, l.Max)
			}
		})
	}
}

// Refund gives a request's room back at once, Settle the part it did not use; both are
// idempotent, and work on a policy's entry in every window.
func TestRefundAndSettle(t *testing.T) {
	c := exampleServer.Client(t)
	e, clock := enginetest.Clocked(t, c)
	ctx := context.Background()
	key, l := enginetest.NewKey(t), engine.PerHour(10)

	first := enginetest.MustAllowN(t, e, key, l, 4)
	second := enginetest.MustAllowN(t, e, key, l, 6)
	enginetest.Want(t, "full: allowed", enginetest.MustAllowN(t, e, key, l, 1).Allowed, false)
	if err := e.Refund(ctx, key, first); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "after refunding 4: remaining", enginetest.MustPeek(t, e, key, l).Remaining, 4)
	if err := e.Refund(ctx, key, first); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "after refunding it again: remaining", enginetest.MustPeek(t, e, key, l).Remaining, 4)
	copied := second // a Result is a plain value
	if err := e.Settle(ctx, key, copied, 2); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "after settling 6 to 2: remaining", enginetest.MustPeek(t, e, key, l).Remaining, 8)
	if err := e.Settle(ctx, key, second, 5); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "settling up again changes nothing: remaining", enginetest.MustPeek(t, e, key, l).Remaining, 8)
	enginetest.Want(t, "8 more: allowed", enginetest.MustAllowN(t, e, key, l, 8).Allowed, true)
	enginetest.Want(t, "one more: allowed", enginetest.MustAllowN(t, e, key, l, 1).Allowed, false)
	enginetest.Want(t, "log events", enginetest.StoredEvents(t, c, key), int64(10))

	// Same microsecond: refunding the first request, twice, never touches the second.
	key = enginetest.NewKey(t)
	a := enginetest.MustAllowN(t, e, key, l, 3)
	b := enginetest.MustAllowN(t, e, key, l, 3)
	enginetest.Want(t, "same microsecond: distinct seqs", a.Entry.Seq != b.Entry.Seq, true)
	for i := 0; i < 2; i++ {
		if err := e.Refund(ctx, key, a); err != nil {
			t.Fatal(err)
		}
	}
	enginetest.Want(t, "after refunding the first twice: events", enginetest.StoredEvents(t, c, key), int64(3))

	// A policy's entry counts in every window; its refund frees every window.
	key = enginetest.NewKey(t)
	p := engine.Policy{engine.PerSecond(5), engine.PerMinute(8)}
	r := enginetest.MustAllowPolicy(t, e, key, p, 5)
	clock.Set(enginetest.T0.Add(2 * time.Second))
	enginetest.Want(t, "the minute has 3 left", enginetest.MustAllowPolicy(t, e, key, p, 3).Allowed, true)
	enginetest.Want(t, "the minute is full", enginetest.MustAllowPolicy(t, e, key, p, 1).Allowed, false)
	if err := e.Refund(ctx, key, r); err != nil {
		t.Fatal(err)
	}
	r = enginetest.MustAllowPolicy(t, e, key, p, 2)
	enginetest.Want(t, "after the refund: allowed", r.Allowed, true)
	enginetest.Want(t, "after the refund: remaining (the second's)", r.Remaining, 0)

	// Once the entry left the window, a refund is a no-op and gives nothing back.
	key = enginetest.NewKey(t)
	clock.Set(enginetest.T0)
	old := enginetest.MustAllowN(t, e, key, engine.PerSecond(2), 2)
	clock.Set(enginetest.T0.Add(time.Second))
	enginetest.MustAllowN(t, e, key, engine.PerSecond(2), 2) // trims the old entry, fills the window
	if err := e.Refund(ctx, key, old); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "refund of an entry that left: allowed", enginetest.MustAllowN(t, e, key, engine.PerSecond(2), 1).Allowed, false)
}

// Refunds race with admissions from many goroutines: the log never holds more than Max, and
// at the end holds exactly what was admitted and not refunded.
func TestRefundRacingAdmissions(t *testing.T) {
	es, c := enginetest.Engines(t, exampleServer, 4)
	key, l := enginetest.NewKey(t), engine.PerHour(50)
	var net atomic.Int64 // events admitted minus events refunded, as callers saw them
	stop := make(chan struct{})
	sampled := make(chan int64, 1)
	go func() { // an independent reader of the log
		largest := int64(0)
		defer func() { sampled <- largest }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			largest = max(largest, enginetest.StoredEvents(t, c, key))
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := 0; g < 32; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			e := es[g%len(es)]
			for i := 0; i < 60; i++ {
				n := 1 + rng.IntN(5)
				r, err := e.AllowN(context.Background(), key, l, n)
				if err != nil {
					errs <- err
					return
				}
				if !r.Allowed {
					continue
				}
				net.Add(int64(n))
				if rng.IntN(2) == 0 {
					continue
				}
				actual := rng.IntN(n)
				for try := 0; try < 2; try++ { // a retried settle changes nothing more
					if err := e.Settle(context.Background(), key, r, actual); err != nil {
						errs <- err
						return
					}
				}
				net.Add(int64(actual - n))
			}
		}()
	}
	wg.Wait()
	close(stop)
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if most := <-sampled; most > int64(l.Max) {
		t.Fatalf("the log held %d events, over Max %d", most, l.Max)
	}
	enginetest.Want(t, "events left", enginetest.StoredEvents(t, c, key), net.Load())
	if net.Load() > int64(l.Max) {
		t.Fatalf("net admitted %d, over Max %d", net.Load(), l.Max)
	}
}

// Refund and Settle refuse, before sending anything, what names no entry or an impossible cost.
func TestSettleInvalidArguments(t *testing.T) {
	c := exampleServer.Client(t)
	e, _ := enginetest.Clocked(t, c)
	ctx, l := context.Background(), engine.PerMinute(2)
	key := enginetest.NewKey(t)
	admitted := enginetest.MustAllowN(t, e, key, l, 2)
	denied := enginetest.MustAllowN(t, e, key, l, 1)
	peeked := enginetest.MustPeek(t, e, key, l)
	for name, call := range map[string]func() error{
		"empty key":          func() error { return e.Refund(ctx, "", admitted) },
		"zero Result":        func() error { return e.Refund(ctx, key, engine.Result{}) },
		"denied Result":      func() error { return e.Refund(ctx, key, denied) },
		"peeked Result":      func() error { return e.Refund(ctx, key, peeked) },
		"actual negative":    func() error { return e.Settle(ctx, key, admitted, -1) },
		"actual above cost":  func() error { return e.Settle(ctx, key, admitted, 3) },
		"pipelined Result":   func() error { return e.Refund(ctx, key, pipelinedResult(t, c)) },
		"entry of cost zero": func() error { r := admitted; r.Entry.Cost = 0; return e.Refund(ctx, key, r) },
	} {
		if err := call(); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	enginetest.Want(t, "log events after refused calls", enginetest.StoredEvents(t, c, key), int64(2))
}

// pipelinedResult is an admission of package pipelined's, which records no entry.
func pipelinedResult(t *testing.T, c valkey.Client) engine.Result {
	t.Helper()
	p, err := pipelined.New(c)
	if err != nil {
		t.Fatal(err)
	}
	r, err := p.Allow(context.Background(), enginetest.NewKey(t), engine.PerMinute(1))
	if err != nil || !r.Allowed {
		t.Fatalf("pipelined Allow: %+v, %v", r, err)
	}
	return r
}

// place by the first decision: its events still count, and its expiry stays.
