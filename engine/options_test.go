package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// expiresAtMicros is the time, in the server's microseconds, at which key's log goes: its
// PEXPIRETIME; it fails tb for a key without an expiry.
func expiresAtMicros(tb testing.TB, c valkey.Client, key string) int64 {
	tb.Helper()
	ms := valkeytest.Must(tb, "PEXPIRETIME", c.Do(context.Background(), c.B().Pexpiretime().Key(enginetest.Prefix+key).Build()),
		valkey.ValkeyResult.AsInt64)
	if ms < 0 {
		tb.Fatalf("PEXPIRETIME of %s = %d: no expiry", key, ms)
	}
	return ms * 1000
}

// Layout 3 keeps the key's expiry in the header: the first admission sets it a window of
// slack beyond the entry's need, the next ones, which it covers, set none, and every entry
// is always covered by the key's expiry. Denials, peeks, refunds and policies work on a
// layout 3 log; an engine that writes layout 2 reads it and writes it back as layout 2, with
// the exact expiry; and a caller's clock writes layout 2 (the header's expiry is the
// server's time).
func TestWriteLayout3KeepsTheExpiryInTheHeader(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	e3 := enginetest.New(t, c, engine.WithWriteLayout(3))
	e2 := enginetest.New(t, c, engine.WithWriteLayout(2))
	key, l := enginetest.NewKey(t), engine.Limit{Max: 4, Window: 2 * time.Second}
	w := l.Window.Microseconds()
	// covered checks that the key lasts until r's entry leaves the window, and says when it
	// goes.
	covered := func(what string, r engine.Result) int64 {
		t.Helper()
		at := expiresAtMicros(t, c, key)
		if need := r.At.UnixMicro() + w; at < need {
			t.Fatalf("%s: the key goes at %d µs, want no earlier than its entry of %s leaves the window, at %d", what, at, r.At, need)
		}
		return at
	}

	first := enginetest.MustAllowN(t, e3, key, l, 1)
	set := covered("first admission", first)
	if slack := set - (first.At.UnixMicro() + w); slack < w-1000 || slack > w+1000 {
		t.Fatalf("first admission: the key goes %d µs after its entry leaves; want about one window, %d", slack, w)
	}
	enginetest.Want(t, "layout after an admission", enginetest.Log(t, c, enginetest.Prefix, key).Layout, 3)
	second := enginetest.MustAllowN(t, e3, key, l, 2)
	enginetest.Want(t, "expiry after a second admission inside the slack", covered("second admission", second), set)
	enginetest.Want(t, "peek: remaining", enginetest.MustPeek(t, e3, key, l).Remaining, 1)
	denied := enginetest.MustAllowN(t, e3, key, l, 2)
	enginetest.Want(t, "2 more with 1 left: allowed", denied.Allowed, false)
	enginetest.Want(t, "expiry after a denial", expiresAtMicros(t, c, key), set)
	if err := e3.Refund(ctx, key, second); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "after refunding 2: remaining", enginetest.MustPeek(t, e3, key, l).Remaining, 3)
	enginetest.Want(t, "events after the refund", enginetest.StoredEvents(t, c, key), int64(1))

	// The refunded entry, last in the log, leaves with the next admission, which takes the
	// general path: it sets the exact expiry and writes layout 2. The one after, on the small
	// path again, sets an expiry with slack and writes layout 3.
	third := enginetest.MustAllowN(t, e3, key, l, 1)
	covered("admission after a refund", third)
	enginetest.Want(t, "layout after the general path's admission", enginetest.Log(t, c, enginetest.Prefix, key).Layout, 2)
	enginetest.MustAllowN(t, e3, key, l, 1)
	enginetest.Want(t, "layout after the small path's admission", enginetest.Log(t, c, enginetest.Prefix, key).Layout, 3)

	// An engine that writes layout 2 reads layout 3 and writes layout 2 with the exact expiry.
	fourth := enginetest.MustAllowN(t, e2, key, l, 1)
	enginetest.Want(t, "layout 2 engine: allowed with 4 of 4", fourth.Allowed, true)
	at := covered("layout 2 admission", fourth)
	if at > fourth.At.UnixMicro()+w+1000 {
		t.Fatalf("layout 2 admission: the key goes at %d, %d µs after its entry leaves; want the exact expiry", at, at-fourth.At.UnixMicro()-w)
	}
	enginetest.Want(t, "layout after a layout 2 admission", enginetest.Log(t, c, enginetest.Prefix, key).Layout, 2)
	enginetest.Want(t, "full: allowed", enginetest.MustAllowN(t, e3, key, l, 1).Allowed, false)

	// A policy reads a layout 3 log through the general path.
	key = enginetest.NewKey(t)
	enginetest.MustAllowN(t, e3, key, l, 3)
	enginetest.Want(t, "layout", enginetest.Log(t, c, enginetest.Prefix, key).Layout, 3)
	p := engine.Policy{{Max: 100, Window: time.Second}, l}
	r := enginetest.MustAllowPolicy(t, e3, key, p, 1)
	enginetest.Want(t, "policy on a layout 3 log: remaining", r.Remaining, 0)
	covered("policy admission", r)
	enginetest.Want(t, "policy: one more allowed", enginetest.MustAllowPolicy(t, e3, key, p, 1).Allowed, false)

	// On a caller's clock, layout 2.
	clocked, _ := enginetest.Clocked(t, c, engine.WithWriteLayout(3))
	key = enginetest.NewKey(t)
	enginetest.MustAllowN(t, clocked, key, engine.PerHour(3), 1)
	enginetest.Want(t, "layout on a caller's clock", enginetest.Log(t, c, enginetest.Prefix, key).Layout, 2)

	for _, v := range []int{0, 1, 4} {
		if _, err := engine.New(c, engine.WithWriteLayout(v)); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("WithWriteLayout(%d): %v, want ErrInvalidArgument", v, err)
		}
	}
}

// Layout 3 stays exact under concurrency, its admissions decided on the server's clock by 64
// goroutines over 4 clients, batched, 100 decisions each and for 8 windows at least: audited
// on the decisions' server timestamps, no window over Max and no false denial; and no key ever
// goes before its newest entry has left the window (a key that went early would forget its
// entries and admit more: the audit would see it).
func TestWriteLayout3ExactUnderConcurrency(t *testing.T) {
	es, _ := enginetest.Engines(t, exampleServer, 4, engine.WithWriteLayout(3))
	key, l := enginetest.NewKey(t), engine.Limit{Max: 20, Window: 100 * time.Millisecond}
	ds, _ := hammer(t, es, 64, 100, 8*l.Window, func(_ *rand.Rand, e *engine.Engine) (engine.Result, int, error) {
		r, err := e.Allow(context.Background(), key, l)
		return r, 1, err
	})
	wantLimitReached(t, ds, auditWeighted(t, ds, l), l.Max)
}

// A log lasts until its newest entry has left the longest window, to the microsecond: on the
// server's clock its expiry is absolute and rounded up, so a key never goes while an entry
// still counts (a key that went early would forget that entry, and admit it again). Checked
// on many keys, each admitted once, through the small path and the general one (a policy), in
// both layouts.
func TestEveryLogOutlivesItsNewestEntry(t *testing.T) {
	c := exampleServer.Client(t)
	l := engine.Limit{Max: 5, Window: 1500 * time.Millisecond}
	p := engine.Policy{{Max: 3, Window: 500 * time.Millisecond}, l}
	for _, layout := range []int{2, 3} {
		e := enginetest.New(t, c, engine.WithWriteLayout(layout))
		for i := 0; i < 100; i++ {
			key := enginetest.NewKey(t)
			var r engine.Result
			if i%2 == 0 {
				r = enginetest.MustAllowN(t, e, key, l, 1)
			} else {
				r = enginetest.MustAllowPolicy(t, e, key, p, 1)
			}
			if at, need := expiresAtMicros(t, c, key), r.At.UnixMicro()+l.Window.Microseconds(); at < need {
				t.Fatalf("layout %d, decision %d: the key goes at %d µs, %d µs before its entry leaves the window at %d, want no earlier", layout, i, at, need-at, need)
			}
		}
	}
}

func TestWithPrefixKeepsKeysUnderIt(t *testing.T) {
	c := exampleServer.Client(t)
	e := enginetest.New(t, c, engine.WithPrefix("other:"))
	key := enginetest.NewKey(t)
	enginetest.MustAllowN(t, e, key, engine.PerMinute(1), 1)
	for k, n := range map[string]int64{"other:" + key: 1, enginetest.Prefix + key: 0} {
		got, err := c.Do(context.Background(), c.B().Exists().Key(k).Build()).AsInt64()
		if err != nil || got != n {
			t.Fatalf("EXISTS %s = %d, %v; want %d", k, got, err, n)
		}
	}
}

// Layout 5 decides a busy key (a log longer than the header's 32 entries) on its header, and
// stays exact under concurrency: 64 goroutines over 4 clients, half of the engines writing
// layout 5 and half layout 2 (a rollout under way: each reads the other's headers), on logs
// of up to 150 entries, of cost 1 and of cost 2, audited on the decisions' server timestamps:
// no window over Max and no false denial. A key that only layout 5 engines wrote reads as
// layout 5 while its log is long.
func TestWriteLayout5ExactUnderConcurrency(t *testing.T) {
	es5, c := enginetest.Engines(t, exampleServer, 2, engine.WithWriteLayout(5))
	es2, _ := enginetest.Engines(t, exampleServer, 2)
	mixed := append(append([]*engine.Engine{}, es5...), es2...)
	l := engine.Limit{Max: 150, Window: 300 * time.Millisecond}
	for _, cost := range []int{1, 2} {
		for _, engines := range [][]*engine.Engine{es5, mixed} {
			key := enginetest.NewKey(t)
			rs := enginetest.RunConcurrently(t, engines, 64, 3000, func(e *engine.Engine) (engine.Result, error) {
				return e.AllowN(context.Background(), key, l, cost)
			})
			ds := make([]weightedDecision, len(rs))
			for i, r := range rs {
				ds[i] = weightedDecision{at: r.At.UnixMicro(), cost: cost, allowed: r.Allowed}
			}
			admitted := auditWeighted(t, ds, l)
			if admitted < l.Max {
				t.Fatalf("cost %d: admitted %d events of 3000 requests: the limit was never reached", cost, admitted)
			}
			if len(engines) == len(es5) {
				// Long enough to be a busy key, and the next admission writes it as one.
				enginetest.MustAllowN(t, es5[0], key, engine.Limit{Max: 1 << 20, Window: time.Hour}, cost)
				if log := enginetest.Log(t, c, enginetest.Prefix, key); log.Count > 32 {
					enginetest.Want(t, "layout of a long log written by layout 5 engines", log.Layout, 5)
				} else {
					t.Fatalf("cost %d: the log holds %d entries, want more than the header's 32", cost, log.Count)
				}
			}
		}
	}
}

// On a log of layout 5 whose live entries all cost 1, a denial's RetryAfter is exact at any
// depth: the entry whose leaving brings the window under the limit is found by its number.
// 1,000 entries 1 ms apart, then a limit lowered to 300: 701 entries must leave, the 701st
// oldest last; the request is denied until that moment, to the microsecond, and admitted at
// it. Under layout 2 the same denial reads at most 32 entries from each end and answers the
// wait for the 32nd oldest, a lower bound; a weighted entry in the log makes layout 5 answer
// that way too.
func TestWriteLayout5RetryAfterExactAtAnyDepth(t *testing.T) {
	c := exampleServer.Client(t)
	const entries, dt = 1000, time.Millisecond
	l := engine.Limit{Max: entries + 1, Window: 2 * entries * dt}
	lowered := engine.Limit{Max: 300, Window: l.Window}
	for _, tc := range []struct {
		layout   int
		weighted bool
		exact    bool
	}{{5, false, true}, {2, false, false}, {5, true, false}} {
		e, clock := enginetest.Clocked(t, c, engine.WithWriteLayout(tc.layout))
		key := enginetest.NewKey(t)
		t0 := clock.Now()
		for i := 0; i < entries; i++ {
			clock.Set(t0.Add(time.Duration(i) * dt))
			n := 1
			if tc.weighted && i == entries/2 {
				n = 2 // one weighted entry, in the middle: the log is no unit log
			}
			enginetest.MustAllowN(t, e, key, engine.Limit{Max: entries + 2, Window: l.Window}, n)
		}
		enginetest.Want(t, "layout", enginetest.Log(t, c, enginetest.Prefix, key).Layout, tc.layout)
		now := t0.Add(entries * dt)
		clock.Set(now)
		r := enginetest.MustAllowN(t, e, key, lowered, 1)
		if r.Allowed {
			t.Fatalf("layout %d: admitted over a lowered limit", tc.layout)
		}
		// The entries to leave: as many as leave the log's events but Max-1, so that one more
		// fits (the weighted entry's second event is one more to leave: the same count).
		leave := entries - (lowered.Max - 1)
		exact := t0.Add(time.Duration(leave-1)*dt + l.Window).Sub(now)
		lowerBound := t0.Add(31*dt + l.Window).Sub(now)
		switch {
		case tc.exact && r.RetryAfter != exact:
			t.Fatalf("layout %d: RetryAfter %s, want exactly %s", tc.layout, r.RetryAfter, exact)
		case !tc.exact && r.RetryAfter != lowerBound:
			t.Fatalf("layout %d, weighted %v: RetryAfter %s, want the 32nd oldest's %s", tc.layout, tc.weighted, r.RetryAfter, lowerBound)
		}
		clock.Set(now.Add(exact - time.Microsecond))
		if r := enginetest.MustAllowN(t, e, key, lowered, 1); r.Allowed {
			t.Fatalf("layout %d: admitted a microsecond before the exact wait", tc.layout)
		}
		clock.Set(now.Add(exact))
		if !enginetest.MustAllowN(t, e, key, lowered, 1).Allowed {
			t.Fatalf("layout %d: denied at the exact wait", tc.layout)
		}
	}
}

// Layout 5 answers every request as layout 2 does, but that a denial's RetryAfter may be
// later (exact where layout 2 answers the 32nd oldest entry's wait, a lower bound): the same
// random operations on two keys, one written by each, on a caller's clock, with policies,
// resolutions, calendar limits (a log with counters), weighted costs, peeks, refunds and
// settles, on logs that grow past the header's 32 entries and shrink again.
func TestWriteLayout5AnswersAsLayout2(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	clock := &steppedClock{now: time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC)}
	e2 := enginetest.New(t, c, engine.WithClock(clock.Now), engine.WithWriteLayout(2))
	e5 := enginetest.New(t, c, engine.WithClock(clock.Now), engine.WithWriteLayout(5))
	sets := []engine.Policy{
		{{Max: 80, Window: time.Minute}},
		{{Max: 80, Window: time.Minute, Resolution: 500 * time.Millisecond}},
		{{Max: 10, Window: 5 * time.Second}, {Max: 80, Window: time.Minute}},
		{{Max: 80, Window: time.Minute}, engine.Calendar(150, engine.Day, time.UTC)},
	}
	for seed := uint64(1); seed <= 4; seed++ {
		rng := rand.New(rand.NewPCG(seed, 5))
		k2, k5 := enginetest.NewKey(t), enginetest.NewKey(t)
		var admitted2, admitted5 []engine.Result
		longest, deeper := 0, 0
		for op := 0; op < 1500; op++ {
			clock.now = clock.now.Add(time.Duration(rng.Int64N(int64(800 * time.Millisecond))))
			p := sets[rng.IntN(len(sets))]
			if seed <= 2 {
				p = sets[seed-1] // one policy a key: the busy path's case
			}
			n := 1
			if rng.IntN(6) == 0 {
				n = 1 + rng.IntN(5)
			}
			switch k := rng.IntN(10); {
			case k == 0 && len(admitted2) > 0:
				i := rng.IntN(len(admitted2))
				actual := rng.IntN(admitted2[i].Entry.Cost + 1)
				if err := e2.Settle(ctx, k2, admitted2[i], actual); err != nil {
					t.Fatalf("seed %d op %d: layout 2 settle: %v", seed, op, err)
				}
				if err := e5.Settle(ctx, k5, admitted5[i], actual); err != nil {
					t.Fatalf("seed %d op %d: layout 5 settle: %v", seed, op, err)
				}
				continue
			case k == 1:
				r2, err2 := e2.PeekPolicy(ctx, k2, p, n)
				r5, err5 := e5.PeekPolicy(ctx, k5, p, n)
				if err2 != nil || err5 != nil {
					t.Fatalf("seed %d op %d: peek: %v, %v", seed, op, err2, err5)
				}
				compareLayouts(t, fmt.Sprintf("seed %d op %d: PeekPolicy(%v, %d)", seed, op, p, n), r2, r5)
				continue
			}
			r2, err2 := e2.AllowPolicy(ctx, k2, p, n)
			r5, err5 := e5.AllowPolicy(ctx, k5, p, n)
			if err2 != nil || err5 != nil {
				t.Fatalf("seed %d op %d: allow: %v, %v", seed, op, err2, err5)
			}
			if r5.RetryAfter > r2.RetryAfter {
				deeper++
			}
			compareLayouts(t, fmt.Sprintf("seed %d op %d: AllowPolicy(%v, %d)", seed, op, p, n), r2, r5)
			if r2.Allowed {
				admitted2, admitted5 = append(admitted2, r2), append(admitted5, r5)
			}
			if op%100 == 0 {
				l2, l5 := enginetest.Log(t, c, enginetest.Prefix, k2), enginetest.Log(t, c, enginetest.Prefix, k5)
				if l2.Events != l5.Events || l2.Count != l5.Count {
					t.Fatalf("seed %d op %d: layout 2 stores %d events in %d entries, layout 5 %d in %d", seed, op, l2.Events, l2.Count, l5.Events, l5.Count)
				}
				longest = max(longest, l5.Count)
			}
		}
		t.Logf("seed %d: longest log %d entries; %d denials of layout 5 answered a later (exact) wait", seed, longest, deeper)
		if longest <= 32 {
			t.Fatalf("seed %d: the longest log held %d entries: it never left the header", seed, longest)
		}
	}
}

// compareLayouts fails t unless r5, layout 5's answer, is r2, layout 2's, but for the key in
// its entry and a RetryAfter at least as late.
func compareLayouts(t *testing.T, what string, r2, r5 engine.Result) {
	t.Helper()
	if r5.RetryAfter < r2.RetryAfter {
		t.Fatalf("%s: layout 5 answers RetryAfter %s, sooner than layout 2's %s", what, r5.RetryAfter, r2.RetryAfter)
	}
	r5.RetryAfter, r5.Entry.Key, r2.Entry.Key = r2.RetryAfter, "", ""
	if r2 != r5 {
		t.Fatalf("%s:\nlayout 2 %+v\nlayout 5 %+v", what, r2, r5)
	}
}
