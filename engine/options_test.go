package engine_test

import (
	"context"
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

// A small log keeps the key's expiry in its header: the first admission sets it a window of
// slack beyond the entry's need, the next ones, which it covers, set none, and every entry is
// always covered by the key's expiry. Denials, peeks, refunds and policies work on such a log,
// and the admission after a refund (the general path) sets an expiry that still covers it.
func TestSmallLogKeepsTheExpiryInTheHeader(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	e := enginetest.New(t, c)
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

	first := enginetest.MustAllowN(t, e, key, l, 1)
	set := covered("first admission", first)
	if slack := set - (first.At.UnixMicro() + w); slack < w-1000 || slack > w+1000 {
		t.Fatalf("first admission: the key goes %d µs after its entry leaves; want about one window, %d", slack, w)
	}
	second := enginetest.MustAllowN(t, e, key, l, 2)
	enginetest.Want(t, "expiry after a second admission inside the slack", covered("second admission", second), set)
	enginetest.Want(t, "peek: remaining", enginetest.MustPeek(t, e, key, l).Remaining, 1)
	denied := enginetest.MustAllowN(t, e, key, l, 2)
	enginetest.Want(t, "2 more with 1 left: allowed", denied.Allowed, false)
	enginetest.Want(t, "expiry after a denial", expiresAtMicros(t, c, key), set)
	if err := e.Refund(ctx, key, second); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "after refunding 2: remaining", enginetest.MustPeek(t, e, key, l).Remaining, 3)
	enginetest.Want(t, "events after the refund", enginetest.StoredEvents(t, c, key), int64(1))
	covered("admission after a refund", enginetest.MustAllowN(t, e, key, l, 1))
	covered("admission after that", enginetest.MustAllowN(t, e, key, l, 1))
	covered("last admission", enginetest.MustAllowN(t, e, key, l, 1))
	enginetest.Want(t, "full: allowed", enginetest.MustAllowN(t, e, key, l, 1).Allowed, false)

	// A policy reads a small log through the general path.
	key = enginetest.NewKey(t)
	enginetest.MustAllowN(t, e, key, l, 3)
	p := engine.Policy{{Max: 100, Window: time.Second}, l}
	r := enginetest.MustAllowPolicy(t, e, key, p, 1)
	enginetest.Want(t, "policy on a small log: remaining", r.Remaining, 0)
	covered("policy admission", r)
	enginetest.Want(t, "policy: one more allowed", enginetest.MustAllowPolicy(t, e, key, p, 1).Allowed, false)

	// On a caller's clock too (the header's expiry is the server's time: such a write keeps none).
	clocked, _ := enginetest.Clocked(t, c)
	key = enginetest.NewKey(t)
	r = enginetest.MustAllowN(t, clocked, key, engine.PerHour(3), 1)
	if at := expiresAtMicros(t, c, key); at <= 0 {
		t.Fatalf("on a caller's clock: the key has no expiry (%d)", at)
	}
}

// A small log stays exact under concurrency, its admissions decided on the server's clock by
// 64 goroutines over 4 clients, batched, 100 decisions each and for 8 windows at least:
// audited on the decisions' server timestamps, no window over Max and no false denial; and no
// key ever goes before its newest entry has left the window (a key that went early would
// forget its entries and admit more: the audit would see it).
func TestSmallLogExactUnderConcurrency(t *testing.T) {
	es, _ := enginetest.Engines(t, exampleServer, 4)
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
// on many keys, each admitted once, through the fast path and the general one (a policy).
func TestEveryLogOutlivesItsNewestEntry(t *testing.T) {
	c := exampleServer.Client(t)
	l := engine.Limit{Max: 5, Window: 1500 * time.Millisecond}
	p := engine.Policy{{Max: 3, Window: 500 * time.Millisecond}, l}
	e := enginetest.New(t, c)
	for i := 0; i < 200; i++ {
		key := enginetest.NewKey(t)
		var r engine.Result
		if i%2 == 0 {
			r = enginetest.MustAllowN(t, e, key, l, 1)
		} else {
			r = enginetest.MustAllowPolicy(t, e, key, p, 1)
		}
		if at, need := expiresAtMicros(t, c, key), r.At.UnixMicro()+l.Window.Microseconds(); at < need {
			t.Fatalf("decision %d: the key goes at %d µs, %d µs before its entry leaves the window at %d, want no earlier", i, at, need-at, need)
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

// A busy key (a log longer than the header's 32 entries) is decided on its header, and stays
// exact under concurrency: 64 goroutines over 4 clients, on logs of up to 150 entries, of cost
// 1 and of cost 2, audited on the decisions' server timestamps: no window over Max and no
// false denial.
func TestBusyLogExactUnderConcurrency(t *testing.T) {
	es, c := enginetest.Engines(t, exampleServer, 4)
	l := engine.Limit{Max: 150, Window: 300 * time.Millisecond}
	for _, cost := range []int{1, 2} {
		key := enginetest.NewKey(t)
		rs := enginetest.RunConcurrently(t, es, 64, 3000, func(e *engine.Engine) (engine.Result, error) {
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
		enginetest.MustAllowN(t, es[0], key, engine.Limit{Max: 1 << 20, Window: time.Hour}, cost)
		if log := enginetest.Log(t, c, enginetest.Prefix, key); log.Count <= 32 {
			t.Fatalf("cost %d: the log holds %d entries, want more than the header's 32", cost, log.Count)
		}
	}
}

// On a long log whose live entries all cost 1, a denial's RetryAfter is exact at any depth:
// the entry whose leaving brings the window under the limit is found by its number. 1,000
// entries 1 ms apart, then a limit lowered to 300: 701 entries must leave, the 701st oldest
// last; the request is denied until that moment, to the microsecond, and admitted at it. A
// weighted entry in the log makes the denial read at most 32 entries from each end and
// answer the wait for the 32nd oldest, a lower bound.
func TestRetryAfterExactAtAnyDepth(t *testing.T) {
	c := exampleServer.Client(t)
	const entries, dt = 1000, time.Millisecond
	l := engine.Limit{Max: entries + 1, Window: 2 * entries * dt}
	lowered := engine.Limit{Max: 300, Window: l.Window}
	for _, weighted := range []bool{false, true} {
		e, clock := enginetest.Clocked(t, c)
		key := enginetest.NewKey(t)
		t0 := clock.Now()
		for i := 0; i < entries; i++ {
			clock.Set(t0.Add(time.Duration(i) * dt))
			n := 1
			if weighted && i == entries/2 {
				n = 2 // one weighted entry, in the middle: the log is no unit log
			}
			enginetest.MustAllowN(t, e, key, engine.Limit{Max: entries + 2, Window: l.Window}, n)
		}
		now := t0.Add(entries * dt)
		clock.Set(now)
		r := enginetest.MustAllowN(t, e, key, lowered, 1)
		if r.Allowed {
			t.Fatalf("weighted %v: admitted over a lowered limit", weighted)
		}
		// The entries to leave: as many as leave the log's events but Max-1, so that one more
		// fits (the weighted entry's second event is one more to leave: the same count).
		leave := entries - (lowered.Max - 1)
		exact := t0.Add(time.Duration(leave-1)*dt + l.Window).Sub(now)
		lowerBound := t0.Add(31*dt + l.Window).Sub(now)
		switch {
		case !weighted && r.RetryAfter != exact:
			t.Fatalf("unit log: RetryAfter %s, want exactly %s", r.RetryAfter, exact)
		case weighted && r.RetryAfter != lowerBound:
			t.Fatalf("weighted log: RetryAfter %s, want the 32nd oldest's %s", r.RetryAfter, lowerBound)
		}
		clock.Set(now.Add(exact - time.Microsecond))
		if r := enginetest.MustAllowN(t, e, key, lowered, 1); r.Allowed {
			t.Fatalf("weighted %v: admitted a microsecond before the exact wait", weighted)
		}
		clock.Set(now.Add(exact))
		if !enginetest.MustAllowN(t, e, key, lowered, 1).Allowed {
			t.Fatalf("weighted %v: denied at the exact wait", weighted)
		}
	}
}
