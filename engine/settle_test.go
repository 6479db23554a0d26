package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/pipelined"
)

// Refund gives a request's room back at once, Settle the part it did not use; both are
// idempotent, and work on a policy's entry in every window.
func TestRefundAndSettleGiveRoomBackOnce(t *testing.T) {
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

// A Refund or Settle names the log it refunds in: a Result's entry carries its log's name, and
// one given another key, or run by an engine of another prefix, is ErrUnknownEntry (and
// ErrInvalidArgument), before anything is sent; neither the right key nor the wrong one gets
// anything back. The right call still refunds, a retry of it is nil and changes nothing, and a
// refund of an entry that has left the window is a no-op.
func TestRefundNamesItsEntry(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	e, clock := enginetest.Clocked(t, c)
	other := enginetest.New(t, c, engine.WithPrefix("other-prefix:"), engine.WithClock(clock.Now))
	key, wrong, l := enginetest.NewKey(t), enginetest.NewKey(t), engine.PerMinute(3)

	r := enginetest.MustAllowN(t, e, key, l, 2)
	enginetest.Want(t, "the entry's log", r.Entry.Key, enginetest.Prefix+key)
	enginetest.MustAllowN(t, e, wrong, l, 2)
	for name, call := range map[string]func() error{
		"Refund of another key":                   func() error { return e.Refund(ctx, wrong, r) },
		"Settle of another key":                   func() error { return e.Settle(ctx, wrong, r, 1) },
		"Refund by an engine of another prefix":   func() error { return other.Refund(ctx, key, r) },
		"Refund of an entry whose log is unnamed": func() error { s := r; s.Entry.Key = ""; return e.Refund(ctx, key, s) },
	} {
		err := call()
		if !errors.Is(err, engine.ErrUnknownEntry) || !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrUnknownEntry and ErrInvalidArgument", name, err)
		}
	}
	enginetest.Want(t, "the key's events after refused refunds", enginetest.StoredEvents(t, c, key), int64(2))
	enginetest.Want(t, "the other key's events", enginetest.StoredEvents(t, c, wrong), int64(2))

	for i := range 2 {
		if err := e.Refund(ctx, key, r); err != nil {
			t.Fatalf("refund %d: %v", i+1, err)
		}
		enginetest.Want(t, "remaining after the refund", enginetest.MustPeek(t, e, key, l).Remaining, 3)
	}

	// An entry that has left the window: its refund is a no-op, nil.
	old := enginetest.MustAllowN(t, e, key, l, 1)
	clock.Set(clock.Now().Add(l.Window + time.Second))
	full := enginetest.MustAllowN(t, e, key, l, 3)
	enginetest.Want(t, "a fresh window filled", full.Allowed, true)
	if err := e.Refund(ctx, key, old); err != nil {
		t.Fatalf("refund of an entry that left the window: %v", err)
	}
	enginetest.Want(t, "remaining after it", enginetest.MustPeek(t, e, key, l).Remaining, 0)
}

// Refund and Settle refuse, before sending anything, what names no entry or an impossible cost
// (a shared entry cannot be raised).
func TestSettleRefusesBadArgumentsBeforeSending(t *testing.T) {
	c := exampleServer.Client(t)
	e, _ := enginetest.Clocked(t, c)
	ctx, l := context.Background(), engine.PerMinute(2)
	key := enginetest.NewKey(t)
	admitted := enginetest.MustAllowN(t, e, key, l, 2)
	denied := enginetest.MustAllowN(t, e, key, l, 1)
	peeked := enginetest.MustPeek(t, e, key, l)
	for name, call := range map[string]func() error{
		"empty key":              func() error { return e.Refund(ctx, "", admitted) },
		"zero Result":            func() error { return e.Refund(ctx, key, engine.Result{}) },
		"denied Result":          func() error { return e.Refund(ctx, key, denied) },
		"peeked Result":          func() error { return e.Refund(ctx, key, peeked) },
		"actual negative":        func() error { return e.Settle(ctx, key, admitted, -1) },
		"actual above MaxEvents": func() error { return e.Settle(ctx, key, admitted, engine.MaxEvents+1) },
		"shared entry raised": func() error {
			r := admitted
			r.Entry.Shared, r.Entry.Decided = true, r.At
			return e.Settle(ctx, key, r, 3)
		},
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

// Refunds race with admissions from many goroutines: the log never holds more than Max, and
// at the end holds exactly what was admitted and not refunded.
func TestRefundsRacingAdmissionsStayExact(t *testing.T) {
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

// Refunded requests leave no trace that grows with their number: after thousands of
// Allow+Refund pairs against 5 per hour, on their own, behind a live entry, and under a
// caller's clock frozen on one microsecond, the log holds at most one refunded entry beside
// each live one (plus one), and stays a few hundred bytes. Before, every refunded entry stayed
// until it left the hour: 20,000 pairs made a 206 KB key, every decision walking them.
func TestRefundsKeepTheLogBounded(t *testing.T) {
	const pairs = 3000
	for _, tc := range []struct {
		name   string
		frozen bool // a caller's clock that never moves
		live   int  // admitted requests kept before the pairs
	}{
		{"alone", false, 0},
		{"behind a live entry", false, 1},
		{"behind four live entries", false, 4},
		{"frozen clock", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := exampleServer.Client(t)
			var e *engine.Engine
			if tc.frozen {
				e, _ = enginetest.Clocked(t, c)
			} else {
				e = enginetest.New(t, c)
			}
			key, l := enginetest.NewKey(t), engine.PerHour(5)
			var kept []engine.Result
			for i := 0; i < tc.live; i++ {
				kept = append(kept, enginetest.MustAllowN(t, e, key, l, 1))
			}
			for i := 0; i < pairs; i++ {
				r := enginetest.MustAllowN(t, e, key, l, 1)
				if !r.Allowed {
					t.Fatalf("pair %d: denied with %d live events of 5: %+v, want an admission", i, tc.live, r)
				}
				if err := e.Refund(context.Background(), key, r); err != nil {
					t.Fatal(err)
				}
			}
			log := enginetest.Log(t, c, enginetest.Prefix, key)
			if log.Events != tc.live || log.Count > 2*tc.live+1 {
				t.Fatalf("after %d refunded pairs: %d events in %d entries; want %d events in at most %d entries", pairs, log.Events, log.Count, tc.live, 2*tc.live+1)
			}
			if size := memoryUsage(t, c, key); size > 512 {
				t.Fatalf("MEMORY USAGE %d bytes after %d refunded pairs, want under 512", size, pairs)
			}
			// The live entries keep their identities: refunding them still gives their room back.
			for _, r := range kept {
				if err := e.Refund(context.Background(), key, r); err != nil {
					t.Fatal(err)
				}
			}
			if got := enginetest.MustPeek(t, e, key, l); got.Remaining != 5 {
				t.Fatalf("after refunding the live entries: %d remaining, want 5", got.Remaining)
			}
		})
	}
}

// 16 goroutines over 4 clients, batched (so that many entries share a microsecond), admit,
// refund most of what they admit and retry refunds of earlier ones: no identity ever names
// another request's entry (the events the log holds are exactly those admitted and not
// refunded), and the log keeps no more refunded entries than live ones, plus one.
func TestRefundsBoundedAndExactUnderConcurrency(t *testing.T) {
	es, c := enginetest.Engines(t, exampleServer, 4)
	key, l := enginetest.NewKey(t), engine.Limit{Max: 1_000_000, Window: time.Hour}
	var mu sync.Mutex
	kept := 0
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			e := es[g%len(es)]
			var refunded []engine.Result
			for i := 0; i < 300; i++ {
				n := 1 + rng.IntN(3)
				r, err := e.AllowN(context.Background(), key, l, n)
				if err == nil && !r.Allowed {
					err = fmt.Errorf("denied far below Max: %+v", r)
				}
				if err != nil {
					errs <- err
					return
				}
				if rng.IntN(10) == 0 {
					mu.Lock()
					kept += n
					mu.Unlock()
					continue
				}
				refunded = append(refunded, r)
				// Refund it, and now and then retry the refund of an earlier one.
				for _, x := range []engine.Result{r, refunded[rng.IntN(len(refunded))]} {
					if err := e.Refund(context.Background(), key, x); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	log := enginetest.Log(t, c, enginetest.Prefix, key)
	live := 0
	for _, le := range log.Entries {
		if le.Cost > 0 {
			live++
		}
	}
	t.Logf("%d events kept in %d live entries; the log holds %d entries", kept, live, log.Count)
	if log.Events != kept {
		t.Fatalf("the log holds %d events, want %d: a refund took another request's events", log.Events, kept)
	}
	if log.Count > 2*live+1 {
		t.Fatalf("the log holds %d entries for %d live ones, want at most %d: refunded entries pile up", log.Count, live, 2*live+1)
	}
}

// A slotted request recorded in the same microsecond as a busy log's newest exact entry is a
// new entry at its slot's end, numbered 1 there, and its Refund gives its whole cost back;
// later exact entries at that time are numbered after it. Small and busy logs.
func TestSlotBesideAnExactEntryOfItsMicrosecondRefunds(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	exact := engine.Limit{Max: 1000, Window: 10 * time.Second}
	slotted := engine.Limit{Max: 1000, Window: 10 * time.Second, Resolution: 100 * time.Millisecond}
	for _, before := range []int{0, 40} {
		t.Run(fmt.Sprintf("%d entries before", before), func(t *testing.T) {
			e, clock := enginetest.Clocked(t, c)
			key := enginetest.NewKey(t)
			for i := range before {
				clock.Set(enginetest.T0.Add(time.Duration(i) * time.Millisecond))
				enginetest.MustAllowN(t, e, key, exact, 1)
			}
			at := enginetest.T0.Add(time.Second + 7*time.Microsecond) // not on a slot's end
			clock.Set(at)
			enginetest.MustAllowN(t, e, key, exact, 1)
			r := enginetest.MustAllowN(t, e, key, slotted, 3)
			if !r.Allowed || r.Entry.Seq != 1 || !r.Entry.Shared {
				t.Fatalf("the slotted request: %+v; want admitted, entry seq 1 at its slot's end", r)
			}
			room := enginetest.MustPeek(t, e, key, exact).Remaining
			if err := e.Refund(ctx, key, r); err != nil {
				t.Fatal(err)
			}
			if got := enginetest.MustPeek(t, e, key, exact).Remaining; got != room+3 {
				t.Fatalf("after the slotted request's Refund: %d remaining, want %d (its 3 events back)", got, room+3)
			}
			clock.Set(r.Entry.At)
			later := enginetest.MustAllowN(t, e, key, exact, 1)
			if later.Entry.Seq != 2 {
				t.Fatalf("an exact request at the slot's end after it: seq %d, want 2", later.Entry.Seq)
			}
		})
	}
}
