package engine_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/scripts"
)

// "3 per second and 5 per minute": the short window denies while the long one has room, then
// the long one denies while the short one has room; each RetryAfter names the binding window.
func TestPolicyEachStackedLimitDenies(t *testing.T) {
	c := exampleServer.Client(t)
	e, clock := enginetest.Clocked(t, c)
	key := enginetest.NewKey(t)
	p := engine.Policy{{Max: 3, Window: time.Second}, {Max: 5, Window: time.Minute}}

	for i := 0; i < 3; i++ {
		r := enginetest.MustAllowPolicy(t, e, key, p, 1)
		enginetest.Want(t, fmt.Sprintf("request %d: allowed", i+1), r.Allowed, true)
		enginetest.Want(t, fmt.Sprintf("request %d: remaining (the second's)", i+1), r.Remaining, 2-i)
	}
	r := enginetest.MustAllowPolicy(t, e, key, p, 1)
	enginetest.Want(t, "4th in the same second: allowed", r.Allowed, false)
	enginetest.Want(t, "4th: remaining", r.Remaining, 0)
	enginetest.Want(t, "4th: retry after (the second ends)", r.RetryAfter, time.Second)

	clock.Set(enginetest.T0.Add(time.Second))
	r = enginetest.MustAllowPolicy(t, e, key, p, 1)
	enginetest.Want(t, "next second: allowed", r.Allowed, true)
	enginetest.Want(t, "next second: remaining (the minute's: 5-3-1)", r.Remaining, 1)
	enginetest.Want(t, "next second, 2nd: allowed", enginetest.MustAllowPolicy(t, e, key, p, 1).Allowed, true)
	r = enginetest.MustAllowPolicy(t, e, key, p, 1)
	enginetest.Want(t, "the minute is full while the second has room: allowed", r.Allowed, false)
	enginetest.Want(t, "minute full: remaining", r.Remaining, 0)
	enginetest.Want(t, "minute full: retry after (the first events leave the minute)", r.RetryAfter, 59*time.Second)
	enginetest.Want(t, "minute full: reset after", r.ResetAfter, time.Minute)
	enginetest.Want(t, "log size", enginetest.StoredEvents(t, c, key), int64(5))

	clock.Set(enginetest.T0.Add(time.Minute - time.Microsecond))
	enginetest.Want(t, "1µs before the minute: allowed", enginetest.MustAllowPolicy(t, e, key, p, 1).Allowed, false)
	clock.Set(enginetest.T0.Add(time.Minute))
	r = enginetest.MustAllowPolicy(t, e, key, p, 3)
	enginetest.Want(t, "3 when the first three left the minute: allowed", r.Allowed, true)
	enginetest.Want(t, "remaining", r.Remaining, 0)
	enginetest.Want(t, "log size (trimmed to the minute)", enginetest.StoredEvents(t, c, key), int64(5))
}

// RetryAfter is exact to the microsecond whichever window binds: denied at t, still denied at
// t+RetryAfter-1µs, admitted at t+RetryAfter.
func TestPolicyRetryAfterExact(t *testing.T) {
	p := engine.Policy{{Max: 2, Window: 100 * time.Millisecond}, {Max: 4, Window: time.Second}}
	ms := time.Millisecond
	for _, tc := range []struct {
		name   string
		events []time.Duration // one event each, admitted in order
		burst  time.Duration   // an event of cost 2, when not zero
		at     time.Duration
		n      int
		retry  time.Duration
	}{
		{"long window binds", []time.Duration{0, 10 * ms, 150 * ms, 160*ms + 7*time.Microsecond}, 0, 300 * ms, 1,
			700 * ms},
		{"short window binds", []time.Duration{0}, 500 * ms, 550 * ms, 1, 50 * ms},
		{"both deny, the long waits longer", []time.Duration{0}, 500 * ms, 550*ms + 3*time.Microsecond, 2,
			time.Second - 550*ms - 3*time.Microsecond},
		{"both deny, the short waits longer", []time.Duration{0, 10 * ms, 950 * ms, 990 * ms}, 0, 995 * ms, 1,
			55 * ms},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, clock := enginetest.Clocked(t, exampleServer.Client(t))
			key := enginetest.NewKey(t)
			for _, at := range tc.events {
				clock.Set(enginetest.T0.Add(at))
				enginetest.Want(t, fmt.Sprintf("event at %s", at), enginetest.MustAllowPolicy(t, e, key, p, 1).Allowed, true)
			}
			if tc.burst > 0 {
				clock.Set(enginetest.T0.Add(tc.burst))
				enginetest.Want(t, "burst of 2", enginetest.MustAllowPolicy(t, e, key, p, 2).Allowed, true)
			}
			deniedAt := enginetest.T0.Add(tc.at)
			clock.Set(deniedAt)
			r := enginetest.MustAllowPolicy(t, e, key, p, tc.n)
			enginetest.Want(t, "at the denial: allowed", r.Allowed, false)
			enginetest.Want(t, "retry after", r.RetryAfter, tc.retry)
			if !r.At.Equal(deniedAt) {
				t.Fatalf("At = %s, want %s", r.At, deniedAt)
			}
			clock.Set(deniedAt.Add(r.RetryAfter - time.Microsecond))
			enginetest.Want(t, "1µs before RetryAfter: allowed", enginetest.MustAllowPolicy(t, e, key, p, tc.n).Allowed, false)
			clock.Set(deniedAt.Add(r.RetryAfter))
			enginetest.Want(t, "at RetryAfter: allowed", enginetest.MustAllowPolicy(t, e, key, p, tc.n).Allowed, true)
		})
	}
}

// ResetAfter is the newest event plus the longest window, and the key expires then.
func TestPolicyResetAfterIsTheLongestWindows(t *testing.T) {
	c := exampleServer.Client(t)
	e, clock := enginetest.Clocked(t, c)
	key := enginetest.NewKey(t)
	p := engine.Policy{{Max: 2, Window: time.Second}, {Max: 10, Window: 10 * time.Second}}

	enginetest.Want(t, "first: reset after", enginetest.MustAllowPolicy(t, e, key, p, 1).ResetAfter, 10*time.Second)
	// On a caller's clock the expiry is relative, with 2 ms more for the server's millisecond
	// (lib_log.lua, keep_log_until).
	if ttl := enginetest.PTTL(t, c, enginetest.Prefix+key); ttl <= 9_000 || ttl > 10_002 {
		t.Fatalf("PTTL %d ms, want close to the longest window", ttl)
	}
	clock.Set(enginetest.T0.Add(300 * time.Millisecond))
	enginetest.Want(t, "second: reset after", enginetest.MustAllowPolicy(t, e, key, p, 1).ResetAfter, 10*time.Second)
	clock.Set(enginetest.T0.Add(700 * time.Millisecond))
	r := enginetest.MustAllowPolicy(t, e, key, p, 1)
	enginetest.Want(t, "denied by the second: allowed", r.Allowed, false)
	enginetest.Want(t, "denied: reset after (the 300ms event leaves the longest window)", r.ResetAfter, 9600*time.Millisecond)
	enginetest.Want(t, "denied: retry after (the first event leaves the second)", r.RetryAfter, 300*time.Millisecond)
}

// 64 goroutines over 4 clients race for one key under two limits: exactly the binding Max is
// admitted, each admitted request sees a different count, and the log holds exactly that many.
func TestPolicyExactUnderConcurrency(t *testing.T) {
	for _, tc := range []struct {
		p       engine.Policy
		binding int // the Max that admits: the least of them
	}{
		{engine.Policy{{Max: 100, Window: time.Hour}, {Max: 150, Window: 2 * time.Hour}}, 100},
		{engine.Policy{{Max: 150, Window: time.Hour}, {Max: 100, Window: 2 * time.Hour}, {Max: 120, Window: time.Minute}}, 100},
	} {
		p, binding := tc.p, tc.binding
		t.Run(fmt.Sprintf("%s admits %d", p, binding), func(t *testing.T) {
			es, c := enginetest.Engines(t, exampleServer, 4)
			key := enginetest.NewKey(t)
			results := enginetest.RunConcurrently(t, es, 64, 800, func(e *engine.Engine) (engine.Result, error) {
				return e.AllowPolicy(context.Background(), key, p, 1)
			})
			var admitted []int
			for _, r := range results {
				if r.Allowed {
					admitted = append(admitted, r.Remaining)
				} else if r.Remaining != 0 || r.RetryAfter <= 0 || r.RetryAfter > p.Longest().Window {
					t.Fatalf("denied result %+v: want Remaining 0 and 0 < RetryAfter <= longest window", r)
				}
			}
			enginetest.Want(t, "requests answered", len(results), 800)
			enginetest.Want(t, "admitted", len(admitted), binding)
			enginetest.Want(t, "log size", enginetest.StoredEvents(t, c, key), int64(binding))
			sort.Ints(admitted)
			for i, rem := range admitted {
				if rem != i {
					t.Fatalf("admitted Remaining values %v: want each of 0..%d once", admitted, binding-1)
				}
			}
		})
	}
}

// policyModel is the decision rule written out in Go, to check the script against.
type policyModel struct{ events []int64 } // admitted events, µs, ascending

func (m *policyModel) decide(now int64, p engine.Policy, n int) engine.Result {
	longest := p.Longest().Window.Microseconds()
	m.events = slices.DeleteFunc(m.events, func(ev int64) bool { return ev <= now-longest })
	remaining, retry := int64(1)<<62, int64(0)
	var tightest time.Duration // the least room; the shortest window among equals
	byWindow := slices.SortedFunc(slices.Values(p), func(a, b engine.Limit) int { return int(a.Window - b.Window) })
	for _, l := range byWindow {
		w := l.Window.Microseconds()
		var in []int64
		for _, ev := range m.events {
			if ev > now-w {
				in = append(in, ev)
			}
		}
		if room := int64(l.Max - len(in)); room < remaining {
			remaining, tightest = room, l.Window
		}
		if leave := len(in) + n - l.Max; leave > 0 {
			retry = max(retry, in[leave-1]+w-now)
		}
	}
	r := engine.Result{At: time.UnixMicro(now), Window: tightest}
	if retry > 0 {
		r.Remaining = int(max(remaining, 0))
		r.RetryAfter = time.Duration(retry) * time.Microsecond
		r.ResetAfter = time.Duration(m.events[len(m.events)-1]+longest-now) * time.Microsecond
		return r
	}
	for range n {
		m.events = append(m.events, now)
	}
	r.Allowed, r.Remaining = true, int(remaining)-n
	r.ResetAfter = time.Duration(longest) * time.Microsecond
	return r
}

// Random requests against three stacked limits, on a clock that moves forward by random steps:
// every Result equals the model's, and the log never holds more than the longest window's Max.
// The windows are seconds long so that the key's real expiry (its TTL runs on the server's
// clock, not the test's) never lapses between two requests of a slow run.
func TestPolicyMatchesModel(t *testing.T) {
	c := exampleServer.Client(t)
	e, clock := enginetest.Clocked(t, c)
	key := enginetest.NewKey(t)
	p := engine.Policy{{Max: 4, Window: time.Second}, {Max: 20, Window: 20 * time.Second}, {Max: 9, Window: 5 * time.Second}}
	rng := rand.New(rand.NewPCG(1, 2))
	var m policyModel
	now := enginetest.T0
	var denied int
	for i := 0; i < 2000; i++ {
		now = now.Add(time.Duration(rng.IntN(400_000)) * time.Microsecond)
		clock.Set(now)
		n := 1 + rng.IntN(4)
		got := enginetest.MustAllowPolicy(t, e, key, p, n)
		wantR := m.decide(now.UnixMicro(), p, n)
		if got.Allowed != wantR.Allowed || got.Remaining != wantR.Remaining || got.RetryAfter != wantR.RetryAfter ||
			got.ResetAfter != wantR.ResetAfter || !got.At.Equal(wantR.At) || got.Window != wantR.Window {
			t.Fatalf("request %d (n=%d at +%s): got %+v, want %+v", i, n, now.Sub(enginetest.T0), got, wantR)
		}
		if !got.Allowed {
			denied++
		}
		if size := enginetest.StoredEvents(t, c, key); size > 20 || size != int64(len(m.events)) {
			t.Fatalf("request %d: log size %d, want the model's %d, at most 20", i, size, len(m.events))
		}
	}
	if denied < 200 || denied > 1800 {
		t.Fatalf("%d of 2000 denied, want 200 to 1800: the walk should exercise both outcomes", denied)
	}
}

// The server's clock: the limits hold and the decision is taken at the server's time.
func TestPolicyDecidesOnTheServersClock(t *testing.T) {
	c := exampleServer.Client(t)
	e := enginetest.New(t, c)
	key := enginetest.NewKey(t)
	p := engine.Policy{{Max: 3, Window: time.Hour}, {Max: 10, Window: 24 * time.Hour}}
	start := time.Now()
	for i := 0; i < 3; i++ {
		r := enginetest.MustAllowPolicy(t, e, key, p, 1)
		enginetest.Want(t, fmt.Sprintf("request %d: allowed", i+1), r.Allowed, true)
		enginetest.Want(t, fmt.Sprintf("request %d: reset after", i+1), r.ResetAfter, 24*time.Hour)
	}
	r := enginetest.MustAllowPolicy(t, e, key, p, 1)
	enginetest.Want(t, "4th: allowed", r.Allowed, false)
	if r.RetryAfter <= 59*time.Minute || r.RetryAfter > time.Hour {
		t.Fatalf("RetryAfter %s, want just under an hour", r.RetryAfter)
	}
	if skew := r.At.Sub(start); skew < -time.Minute || skew > time.Minute {
		t.Fatalf("At %s, want within a minute of the local clock %s", r.At, start)
	}
	// On the server's clock the expiry is the newest entry's time plus the day, rounded up to
	// the millisecond: up to one more than a day from the millisecond PTTL counts from.
	if ttl := enginetest.PTTL(t, c, enginetest.Prefix+key); ttl <= 24*3600_000-60_000 || ttl > 24*3600_000+1 {
		t.Fatalf("PTTL %d ms, want about a day", ttl)
	}
}

// Requests of one microsecond get distinct entries, each its own identity (seq 1, 2, ...),
// a burst of 1200 events among them as one entry; nothing is lost to a collision.
func TestPolicySameMicrosecondKeepsEveryEntry(t *testing.T) {
	at := time.Date(2100, 1, 2, 3, 4, 5, 123456000, time.UTC) // 16 digits of microseconds
	c := exampleServer.Client(t)
	e := enginetest.New(t, c, engine.WithClock(func() time.Time { return at }))
	key := enginetest.NewKey(t)
	p := engine.Policy{{Max: 1500, Window: time.Second}, {Max: 2000, Window: time.Minute}}
	var seqs []int
	for i := 0; i < 5; i++ {
		seqs = append(seqs, enginetest.MustAllowPolicy(t, e, key, p, 1).Entry.Seq)
	}
	r := enginetest.MustAllowPolicy(t, e, key, p, 1200)
	enginetest.Want(t, "burst of 1200: allowed", r.Allowed, true)
	seqs = append(seqs, r.Entry.Seq)
	enginetest.Want(t, "entry seqs", fmt.Sprint(seqs), "[1 2 3 4 5 6]")
	enginetest.Want(t, "log size", enginetest.StoredEvents(t, c, key), int64(1205))
	log := enginetest.StoredEntries(t, c, key)
	enginetest.Want(t, "entries", len(log), 6)
	for i, le := range log {
		if cost := []int{1, 1, 1, 1, 1, 1200}[i]; !le.At.Equal(at) || le.Cost != cost {
			t.Fatalf("entry %d: %+v, want cost %d at %s", i, le, cost, at)
		}
	}
	r = enginetest.MustAllowPolicy(t, e, key, p, 295)
	enginetest.Want(t, "up to the short Max", r.Allowed, true)
	enginetest.Want(t, "remaining", r.Remaining, 0)
	enginetest.Want(t, "one more", enginetest.MustAllowPolicy(t, e, key, p, 1).Allowed, false)
}

// A Policy of one limit decides exactly as AllowN (the entry aside: each names its own key);
// several limits are one atomic script call, and a denied request keeps nothing.
func TestPolicyOneLimitIsAllowN(t *testing.T) {
	c := exampleServer.Client(t)
	e, clock := enginetest.Clocked(t, c)
	k1, k2 := enginetest.NewKey(t), enginetest.NewKey(t)+"2"
	l := engine.Limit{Max: 3, Window: time.Second}
	for i := 0; i < 5; i++ {
		clock.Set(enginetest.T0.Add(time.Duration(i) * 100 * time.Millisecond))
		a, b := enginetest.MustAllowN(t, e, k1, l, 1), enginetest.MustAllowPolicy(t, e, k2, engine.Policy{l}, 1)
		if a.Allowed && (a.Entry.Key != enginetest.Prefix+k1 || b.Entry.Key != enginetest.Prefix+k2) {
			t.Fatalf("request %d: entries %+v and %+v do not name their keys", i, a.Entry, b.Entry)
		}
		a.Entry.Key, b.Entry.Key = "", ""
		if a != b {
			t.Fatalf("request %d: AllowPolicy %+v, want AllowN's %+v", i, b, a)
		}
	}
	key := enginetest.NewKey(t) + "3"
	p := engine.Policy{{Max: 2, Window: time.Second}, {Max: 3, Window: time.Minute}}
	for i, wantAllowed := range []bool{true, true, false} {
		enginetest.Want(t, fmt.Sprintf("policy request %d", i+1), enginetest.MustAllowPolicy(t, e, key, p, 1).Allowed, wantAllowed)
	}
	enginetest.Want(t, "policy log size (no rejected attempt kept)", enginetest.StoredEvents(t, c, key), int64(2))
}

// Every invalid policy or request is refused with ErrInvalidArgument before anything is sent:
// an absent key stays absent, an existing key keeps its events and its expiry.
func TestPolicyInvalidArgumentsWriteNothing(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	e := enginetest.New(t, c)
	zero := enginetest.New(t, c, engine.WithClock(func() time.Time { return time.Time{} }))
	good := engine.Policy{{Max: 3, Window: time.Second}, {Max: 5, Window: time.Minute}}
	tooMany := make(engine.Policy, engine.MaxPolicyLimits+1)
	for i := range tooMany {
		tooMany[i] = engine.Limit{Max: 10, Window: time.Duration(i+1) * time.Second}
	}
	for _, tc := range []struct {
		name string
		key  string
		p    engine.Policy
		n    int
		e    *engine.Engine
	}{
		{"empty key", "", good, 1, e},
		{"nil policy", "k", nil, 1, e},
		{"empty policy", "k", engine.Policy{}, 1, e},
		{"too many limits", "k", tooMany, 1, e},
		{"Max 0", "k", engine.Policy{{Max: 0, Window: time.Second}, {Max: 5, Window: time.Minute}}, 1, e},
		{"Max above MaxEvents", "k", engine.Policy{{Max: 3, Window: time.Second}, {Max: engine.MaxEvents + 1, Window: time.Minute}}, 1, e},
		{"Window 0", "k", engine.Policy{{Max: 3, Window: time.Second}, {Max: 5}}, 1, e},
		{"Window 999µs", "k", engine.Policy{{Max: 3, Window: 999 * time.Microsecond}}, 1, e},
		{"Window above MaxWindow", "k", engine.Policy{{Max: 3, Window: engine.MaxWindow + time.Microsecond}}, 1, e},
		{"duplicate window", "k", engine.Policy{{Max: 3, Window: time.Second}, {Max: 5, Window: time.Second}}, 1, e},
		{"same window once rounded to µs", "k", engine.Policy{{Max: 3, Window: time.Millisecond + 1}, {Max: 5, Window: time.Millisecond + 2}}, 1, e},
		{"n 0", "k", good, 0, e},
		{"n -1", "k", good, -1, e},
		{"n above the smallest Max", "k", good, 4, e},
		{"clock returns zero time", "k", good, 1, zero},
	} {
		for _, existing := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/existing=%v", tc.name, existing), func(t *testing.T) {
				enginetest.WantRefused(t, c, existing, func(key string) { enginetest.MustAllowPolicy(t, e, key, good, 2) }, func(key string) error {
					if tc.key == "" {
						key = ""
					}
					r, err := tc.e.AllowPolicy(ctx, key, tc.p, tc.n)
					if r.Allowed {
						t.Fatalf("refused call returned an admitting Result %+v, want none", r)
					}
					return err
				})
			})
		}
	}
}

// New preloads the policy script with the others, and after SCRIPT FLUSH AllowPolicy still
// decides (EVALSHA answers NOSCRIPT and the source goes with EVAL).
func TestPolicyScriptPreloadedAndFlushed(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	e := enginetest.New(t, c)
	sum := sha1.Sum([]byte(scripts.Source("decide")))
	loaded, err := c.Do(ctx, c.B().ScriptExists().Sha1(hex.EncodeToString(sum[:])).Build()).AsIntSlice()
	if err != nil || len(loaded) != 1 || loaded[0] != 1 {
		t.Fatalf("SCRIPT EXISTS after New: %v, %v; want the policy script loaded", loaded, err)
	}
	key := enginetest.NewKey(t)
	p := engine.Policy{engine.PerMinute(3), engine.PerHour(5)}
	enginetest.MustAllowPolicy(t, e, key, p, 1)
	if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "after flush: remaining", enginetest.MustAllowPolicy(t, e, key, p, 1).Remaining, 1)
	enginetest.Want(t, "log size", enginetest.StoredEvents(t, c, key), int64(2))
}

// PeekPolicy takes AllowPolicy's decision without recording it: on a random sequence, a peek
// before each AllowPolicy answers as it does (the room before it, for an admission), and the
// log only ever holds what AllowPolicy recorded.
func TestPeekPolicyMatchesAllowPolicy(t *testing.T) {
	c := exampleServer.Client(t)
	e, clock := enginetest.Clocked(t, c)
	key, ctx := enginetest.NewKey(t), context.Background()
	p := engine.Policy{{Max: 9, Window: 5 * time.Second}, {Max: 4, Window: time.Second}, {Max: 40, Window: 20 * time.Second}}
	rng := rand.New(rand.NewPCG(13, 5))
	now := enginetest.T0
	var recorded int64
	allowed, denied := 0, 0
	for i := 0; i < 400; i++ {
		now = now.Add(time.Duration(rng.IntN(800_000)) * time.Microsecond)
		clock.Set(now)
		n := 1 + rng.IntN(3)
		peek, err := e.PeekPolicy(ctx, key, p, n)
		if err != nil {
			t.Fatal(err)
		}
		if got := enginetest.StoredEvents(t, c, key); got != recorded {
			t.Fatalf("step %d: the log holds %d events after a peek, want %d", i, got, recorded)
		}
		r := enginetest.MustAllowPolicy(t, e, key, p, n)
		recorded = enginetest.StoredEvents(t, c, key) // what it recorded, less what its trim dropped
		what := fmt.Sprintf("step %d (n=%d at +%s):\n peek  %+v\n allow %+v", i, n, now.Sub(enginetest.T0), peek, r)
		if peek.Allowed != r.Allowed || peek.RetryAfter != r.RetryAfter || peek.Window != r.Window || !peek.At.Equal(r.At) || !peek.Entry.IsZero() {
			t.Fatal(what)
		}
		if r.Allowed {
			allowed++
			if peek.Remaining != r.Remaining+n {
				t.Fatalf("%s\nwant the peek's Remaining to be the room before the admission", what)
			}
			continue
		}
		denied++
		r.Entry = engine.EntryID{}
		if peek != r {
			t.Fatalf("%s\nwant a denial's Result unchanged by the peek", what)
		}
	}
	if allowed < 50 || denied < 50 {
		t.Fatalf("%d admitted, %d denied, want at least 50 of each: the sequence should exercise both", allowed, denied)
	}
	// One limit: PeekPolicy is Peek.
	l := engine.PerSecond(4)
	one, err := e.PeekPolicy(ctx, key, engine.Policy{l}, 1)
	if err != nil || one != enginetest.MustPeek(t, e, key, l) {
		t.Fatalf("PeekPolicy of one limit %+v (%v), want Peek's", one, err)
	}
	// Invalid requests are refused as AllowPolicy refuses them.
	for name, call := range map[string]func() error{
		"empty key":        func() error { _, err := e.PeekPolicy(ctx, "", p, 1); return err },
		"empty policy":     func() error { _, err := e.PeekPolicy(ctx, key, nil, 1); return err },
		"n above a Max":    func() error { _, err := e.PeekPolicy(ctx, key, p, 5); return err },
		"n of 0":           func() error { _, err := e.PeekPolicy(ctx, key, p, 0); return err },
		"duplicate window": func() error { _, err := e.PeekPolicy(ctx, key, engine.Policy{l, l}, 1); return err },
	} {
		if err := call(); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
}
