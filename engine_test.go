// engine_test.go stays at the module's root because the product's layout names it there: the
// engine's core contract (the classic worked example, the window's bounds, exactness under
// concurrency, expiry, invalid input, the server down and back, the pipelined design's
// weakness beside it). The
// engine's other tests live in engine/, beside the code they test; the helpers both packages'
// tests use are in internal/enginetest.

package strictrate_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/pipelined"
)

// server is the one Valkey every test in this package shares; tests keep apart by key.
var server *valkeytest.Server

func TestMain(m *testing.M) { valkeytest.Main(m, &server) }

// allower is what both designs decide with: the exact engine and the pipelined one.
type allower interface {
	Allow(ctx context.Context, key string, l engine.Limit) (engine.Result, error)
}

// mustAllow is a's decision, failing t on an error.
func mustAllow(t *testing.T, a allower, key string, l engine.Limit) engine.Result {
	t.Helper()
	r, err := a.Allow(context.Background(), key, l)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// newPipelined is a pipelined engine on c, failing t when New does.
func newPipelined(t *testing.T, c valkey.Client, opts ...pipelined.Option) *pipelined.Engine {
	t.Helper()
	p, err := pipelined.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The worked example of the classic sliding window log: limit 3 per second, events A, B, C. A
// request just as A leaves the window is admitted; the next one is denied. The pipelined
// design takes the first four decisions alike.
func TestWorkedExample(t *testing.T) {
	c := server.Client(t)
	exact, clock := enginetest.Clocked(t, c)
	for name, a := range map[string]allower{"engine": exact, "pipelined": newPipelined(t, c, pipelined.WithClock(clock.Now))} {
		t.Run(name, func(t *testing.T) {
			key, l := enginetest.NewKey(t), engine.PerSecond(3)

			for i, at := range []time.Duration{0, 200 * time.Millisecond, 400 * time.Millisecond} {
				clock.Set(enginetest.T0.Add(at))
				r := mustAllow(t, a, key, l)
				enginetest.Want(t, fmt.Sprintf("event %c allowed", 'A'+i), r.Allowed, true)
				enginetest.Want(t, fmt.Sprintf("event %c remaining", 'A'+i), r.Remaining, 2-i)
			}
			clock.Set(enginetest.T0.Add(999 * time.Millisecond))
			enginetest.Want(t, "request 1µs before A leaves: allowed", mustAllow(t, a, key, l).Allowed, false)
			if name == "pipelined" {
				return // its log now holds the rejected attempt, which changes the rest of the story
			}
			clock.Set(enginetest.T0.Add(time.Second))
			r := mustAllow(t, a, key, l)
			enginetest.Want(t, "request as A leaves: allowed", r.Allowed, true)
			enginetest.Want(t, "request as A leaves: remaining", r.Remaining, 0)
			r = mustAllow(t, a, key, l)
			enginetest.Want(t, "next request: allowed", r.Allowed, false)
			enginetest.Want(t, "next request: retry after (B leaves)", r.RetryAfter, 200*time.Millisecond)
		})
	}
}

// The same story through the classic Limiter interface, which the engine implements.
func TestLimiterInterface(t *testing.T) {
	var lim pipelined.Limiter = enginetest.New(t, server.Client(t))
	ctx, key := context.Background(), enginetest.NewKey(t)
	for i := 0; i < 3; i++ {
		if err := lim.Check(ctx, key, 3, time.Second, enginetest.T0); err != nil {
			t.Fatalf("Check %d: %v", i, err)
		}
		if err := lim.Record(ctx, key, 3, time.Second, enginetest.T0.Add(time.Duration(i)*100*time.Millisecond)); err != nil {
			t.Fatalf("Record %d: %v", i, err)
		}
	}
	at := enginetest.T0.Add(500 * time.Millisecond)
	for name, err := range map[string]error{
		"Check":  lim.Check(ctx, key, 3, time.Second, at),
		"Record": lim.Record(ctx, key, 3, time.Second, at),
	} {
		if !errors.Is(err, engine.ErrRateLimitExceeded) {
			t.Fatalf("%s when full: %v, want ErrRateLimitExceeded", name, err)
		}
		var denied *engine.DeniedError
		if !errors.As(err, &denied) || denied.Result.RetryAfter != 500*time.Millisecond {
			t.Fatalf("%s when full: %#v, want a DeniedError with RetryAfter 500ms", name, err)
		}
	}
	if err := lim.Record(ctx, key, 3, time.Second, enginetest.T0.Add(time.Second)); err != nil {
		t.Fatalf("Record after the first event left: %v", err)
	}
	if err := lim.Clear(ctx, key); err != nil {
		t.Fatalf("Clear: %v", err)
	}
	for i := 0; i < 3; i++ {
		if err := lim.Record(ctx, key, 3, time.Second, enginetest.T0.Add(time.Second)); err != nil {
			t.Fatalf("Record %d after Clear: %v", i, err)
		}
	}
}

// An event exactly one window old no longer counts; one microsecond younger still does.
func TestWindowBoundary(t *testing.T) {
	c := server.Client(t)
	e, clock := enginetest.Clocked(t, c)
	// The caller's clock is frozen between steps, but the key's expiry runs on the server's: a
	// window of seconds keeps the key while a loaded machine runs the test.
	key, l := enginetest.NewKey(t), engine.Limit{Max: 1, Window: 5 * time.Second}

	enginetest.Want(t, "first", enginetest.MustAllowN(t, e, key, l, 1).Allowed, true)
	clock.Set(enginetest.T0.Add(l.Window - time.Microsecond))
	r := enginetest.MustAllowN(t, e, key, l, 1)
	enginetest.Want(t, "one µs before the window ends: allowed", r.Allowed, false)
	enginetest.Want(t, "one µs before the window ends: retry after", r.RetryAfter, time.Microsecond)
	enginetest.Want(t, "peek one µs before: allowed", enginetest.MustPeek(t, e, key, l).Allowed, false)

	clock.Set(enginetest.T0.Add(l.Window))
	enginetest.Want(t, "peek at the window's end: allowed", enginetest.MustPeek(t, e, key, l).Allowed, true)
	enginetest.Want(t, "at the window's end: allowed", enginetest.MustAllowN(t, e, key, l, 1).Allowed, true)
	enginetest.Want(t, "log size (the old event trimmed)", enginetest.StoredEvents(t, c, key), int64(1))
}

// 64 goroutines over 4 clients race for one key: exactly Max are admitted, each admitted
// request sees a different count, and the log holds exactly Max events.
func TestAtomicExactUnderConcurrency(t *testing.T) {
	es, c := enginetest.Engines(t, server, 4)
	key, l := enginetest.NewKey(t), engine.PerHour(100)
	results := enginetest.RunConcurrently(t, es, 64, 800, func(e *engine.Engine) (engine.Result, error) {
		return e.Allow(context.Background(), key, l)
	})

	var admitted []int
	for _, r := range results {
		if r.Remaining < 0 {
			t.Fatalf("Remaining %d, want at least 0", r.Remaining)
		}
		if r.Allowed {
			admitted = append(admitted, r.Remaining)
		} else if r.Remaining != 0 || r.RetryAfter <= 0 || r.RetryAfter > l.Window {
			t.Fatalf("denied result %+v: want Remaining 0 and 0 < RetryAfter <= window", r)
		}
	}
	enginetest.Want(t, "requests answered", len(results), 800)
	enginetest.Want(t, "admitted", len(admitted), l.Max)
	enginetest.Want(t, "log size", enginetest.StoredEvents(t, c, key), int64(l.Max))
	slices.Sort(admitted)
	for i, rem := range admitted {
		if rem != i {
			t.Fatalf("admitted Remaining values %v: want each of 0..%d once", admitted, l.Max-1)
		}
	}
}

// Requests of cost 1 to 3 race for one key: the admitted costs add up to the log's size, never
// above Max; what is left is exactly what Peek reports, and single events then fill it to Max.
func TestAtomicAllowNExactUnderConcurrency(t *testing.T) {
	es, c := enginetest.Engines(t, server, 4)
	key, l := enginetest.NewKey(t), engine.PerHour(100)
	var cost atomic.Int64
	var admittedCost atomic.Int64
	enginetest.RunConcurrently(t, es, 64, 600, func(e *engine.Engine) (engine.Result, error) {
		n := int(cost.Add(1)%3) + 1
		r, err := e.AllowN(context.Background(), key, l, n)
		if err == nil && r.Allowed {
			admittedCost.Add(int64(n))
		}
		if err == nil && !r.Allowed && r.Remaining >= n {
			err = fmt.Errorf("cost %d denied with %d remaining, want it admitted", n, r.Remaining)
		}
		return r, err
	})
	got := admittedCost.Load()
	if got > int64(l.Max) || got < int64(l.Max)-2 {
		t.Fatalf("admitted cost %d, want %d-2 to %d", got, l.Max, l.Max)
	}
	enginetest.Want(t, "log size", enginetest.StoredEvents(t, c, key), got)
	enginetest.Want(t, "peek remaining", enginetest.MustPeek(t, es[0], key, l).Remaining, l.Max-int(got))
	for i := got; i < int64(l.Max); i++ {
		enginetest.Want(t, "filling single event", enginetest.MustAllowN(t, es[0], key, l, 1).Allowed, true)
	}
	enginetest.Want(t, "one more", enginetest.MustAllowN(t, es[0], key, l, 1).Allowed, false)
}

// All or nothing: a request that does not fit, in any window of a policy, is denied whole and
// adds nothing; what does fit is admitted next. For a single limit (AllowN) as for a policy
// whose short window has room again while its long one has not.
func TestAllowNAllOrNothing(t *testing.T) {
	perMinute := engine.PerMinute(5)
	for _, tc := range []struct {
		name      string
		allow     func(t *testing.T, e *engine.Engine, key string, n int) engine.Result
		window    time.Duration // the tightest window after the first 3
		remaining int           // what it has left
	}{
		{"AllowN", func(t *testing.T, e *engine.Engine, key string, n int) engine.Result {
			return enginetest.MustAllowN(t, e, key, perMinute, n)
		}, perMinute.Window, 2},
		{"AllowPolicy", func(t *testing.T, e *engine.Engine, key string, n int) engine.Result {
			return enginetest.MustAllowPolicy(t, e, key, engine.Policy{{Max: 3, Window: time.Second}, perMinute}, n)
		}, time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := server.Client(t)
			e, clock := enginetest.Clocked(t, c)
			key := enginetest.NewKey(t)

			r := tc.allow(t, e, key, 3)
			enginetest.Want(t, "3 of 5: allowed", r.Allowed, true)
			enginetest.Want(t, "3 of 5: window", r.Window, tc.window)
			enginetest.Want(t, "3 of 5: remaining", r.Remaining, tc.remaining)
			clock.Set(enginetest.T0.Add(time.Second)) // a policy's second has room again; the minute has 2
			r = tc.allow(t, e, key, 3)
			enginetest.Want(t, "3 more: allowed", r.Allowed, false)
			enginetest.Want(t, "3 more: remaining", r.Remaining, 2)
			enginetest.Want(t, "3 more: retry after", r.RetryAfter, 59*time.Second)
			enginetest.Want(t, "log size after the denial", enginetest.StoredEvents(t, c, key), int64(3))
			r = tc.allow(t, e, key, 2)
			enginetest.Want(t, "2 more: allowed", r.Allowed, true)
			enginetest.Want(t, "2 more: remaining", r.Remaining, 0)
			enginetest.Want(t, "log size", enginetest.StoredEvents(t, c, key), int64(5))
		})
	}
}

// A denied request waits exactly RetryAfter, to the microsecond, and is then admitted.
func TestRetryAfterExact(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	key, l := enginetest.NewKey(t), engine.Limit{Max: 3, Window: 100 * time.Millisecond}
	for _, at := range []time.Duration{0, 10 * time.Millisecond, 20*time.Millisecond + 7*time.Microsecond} {
		clock.Set(enginetest.T0.Add(at))
		enginetest.MustAllowN(t, e, key, l, 1)
	}
	deniedAt := enginetest.T0.Add(30*time.Millisecond + 3*time.Microsecond)

	for _, tc := range []struct {
		n     int
		retry time.Duration // the (n)-th oldest event leaves at its time + window
	}{
		{1, 100*time.Millisecond - 30*time.Millisecond - 3*time.Microsecond},
		{2, 110*time.Millisecond - 30*time.Millisecond - 3*time.Microsecond},
		{3, 120*time.Millisecond + 7*time.Microsecond - 30*time.Millisecond - 3*time.Microsecond},
	} {
		clock.Set(deniedAt)
		r := enginetest.MustAllowN(t, e, key, l, tc.n)
		enginetest.Want(t, fmt.Sprintf("n=%d at denial: allowed", tc.n), r.Allowed, false)
		enginetest.Want(t, fmt.Sprintf("n=%d retry after", tc.n), r.RetryAfter, tc.retry)
		if !r.At.Equal(deniedAt) {
			t.Fatalf("At = %s, want the caller's clock %s", r.At, deniedAt)
		}
		clock.Set(deniedAt.Add(r.RetryAfter - time.Microsecond))
		// 1µs early, the n-1 oldest events have left and the n-th has not.
		p := enginetest.MustPeek(t, e, key, l)
		if tc.n == 1 && p.Allowed {
			t.Fatalf("n=%d: admitted 1µs before RetryAfter, want a denial until it", tc.n)
		}
		enginetest.Want(t, fmt.Sprintf("n=%d 1µs early: peek remaining", tc.n), p.Remaining, tc.n-1)
		enginetest.Want(t, fmt.Sprintf("n=%d 1µs early", tc.n), enginetest.MustAllowN(t, e, key, l, tc.n).Allowed, false)
	}
	clock.Set(deniedAt.Add(100*time.Millisecond - 30*time.Millisecond - 3*time.Microsecond))
	enginetest.Want(t, "n=1 at RetryAfter", enginetest.MustAllowN(t, e, key, l, 1).Allowed, true)
}

// ResetAfter is the wait until the newest event leaves; 0 for an empty log.
func TestResetAfter(t *testing.T) {
	c := server.Client(t)
	e, clock := enginetest.Clocked(t, c)
	key, l := enginetest.NewKey(t), engine.Limit{Max: 10, Window: time.Second}

	r := enginetest.MustPeek(t, e, key, l)
	enginetest.Want(t, "empty: reset after", r.ResetAfter, time.Duration(0))
	enginetest.Want(t, "empty: remaining", r.Remaining, 10)
	enginetest.Want(t, "first event: reset after", enginetest.MustAllowN(t, e, key, l, 1).ResetAfter, time.Second)
	clock.Set(enginetest.T0.Add(300 * time.Millisecond))
	enginetest.Want(t, "peek 300ms later: reset after", enginetest.MustPeek(t, e, key, l).ResetAfter, 700*time.Millisecond)
	enginetest.Want(t, "second event: reset after", enginetest.MustAllowN(t, e, key, l, 1).ResetAfter, time.Second)
	clock.Set(enginetest.T0.Add(1200 * time.Millisecond))
	r = enginetest.MustAllowN(t, e, key, l, 9)
	enginetest.Want(t, "9 more after the first left: allowed", r.Allowed, true)
	enginetest.Want(t, "9 more: remaining", r.Remaining, 0)
	r = enginetest.MustAllowN(t, e, key, l, 1)
	enginetest.Want(t, "full: reset after", r.ResetAfter, time.Second)
	enginetest.Want(t, "full: retry after (the 300ms event leaves)", r.RetryAfter, 100*time.Millisecond)
}

// A caller whose clock lags another's still counts the other's later events, in every window
// of a policy, and the key lives until the latest of them leaves the longest window: for a
// single limit (AllowN) as for a policy of two.
func TestCallersClocksDisagree(t *testing.T) {
	short := engine.Limit{Max: 2, Window: 10 * time.Second}
	for _, tc := range []struct {
		name    string
		allow   func(t *testing.T, e *engine.Engine, key string) engine.Result
		longest time.Duration
	}{
		{"AllowN", func(t *testing.T, e *engine.Engine, key string) engine.Result {
			return enginetest.MustAllowN(t, e, key, short, 1)
		}, short.Window},
		{"AllowPolicy", func(t *testing.T, e *engine.Engine, key string) engine.Result {
			return enginetest.MustAllowPolicy(t, e, key, engine.Policy{short, {Max: 3, Window: 20 * time.Second}}, 1)
		}, 20 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ahead, behind := enginetest.NewClock(enginetest.T0.Add(time.Second)), enginetest.NewClock(enginetest.T0)
			c := server.Client(t)
			ea := enginetest.New(t, c, engine.WithClock(ahead.Now))
			eb := enginetest.New(t, c, engine.WithClock(behind.Now))
			key := enginetest.NewKey(t)

			tc.allow(t, ea, key)
			r := tc.allow(t, eb, key)
			enginetest.Want(t, "behind: allowed", r.Allowed, true)
			enginetest.Want(t, "behind: reset after counts the later event", r.ResetAfter, tc.longest+time.Second)
			// On a caller's clock the expiry is relative, with relativeSlackMS more (TestExpiry).
			if ttl, lo := enginetest.PTTL(t, c, enginetest.Prefix+key), tc.longest.Milliseconds(); ttl <= lo || ttl > lo+1000+relativeSlackMS {
				t.Fatalf("PTTL %d ms, want (%d, %d]", ttl, lo, lo+1000+relativeSlackMS)
			}
			r = tc.allow(t, eb, key)
			enginetest.Want(t, "behind, short window full: allowed", r.Allowed, false)
			enginetest.Want(t, "behind: retry after (its own event leaves the short window)", r.RetryAfter, short.Window)
			enginetest.Want(t, "behind: reset after", r.ResetAfter, tc.longest+time.Second)
		})
	}
}

// relativeSlackMS is what a relative expiry (a caller's clock) adds to the time the newest
// entry needs, in milliseconds: the server counts it from its millisecond at the call's
// start, which lies up to a millisecond (and one more across a boundary) before the entry's
// time (scripts/lib_log.lua, keep_log_until).
const relativeSlackMS = 2

// The key's expiry on a caller's clock is set in milliseconds, rounded up, and is relative,
// with relativeSlackMS more: a caller's clock far from the server's still gets a key that
// lives one window. (On the server's clock it is absolute: TestEveryLogOutlivesItsNewestEntry
// in engine/.)
//
// The TTL the script set is read exactly, however long the reads take: PEXPIRETIME is the
// server's millisecond at the script's start plus that TTL, and that millisecond is known
// whenever the server's TIME reads the same millisecond before the decision and after the
// PEXPIRETIME. Attempts are repeated until one does; every attempt must bracket the TTL.
func TestExpiry(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	millis := func(t *testing.T, r valkey.ValkeyResult) int64 {
		t.Helper()
		tm := valkeytest.Must(t, "TIME", r, valkey.ValkeyResult.AsIntSlice)
		return tm[0]*1000 + tm[1]/1000
	}
	for _, tc := range []struct {
		name   string
		window time.Duration
		skew   time.Duration
		maxTTL int64
	}{
		{"500ms", 500 * time.Millisecond, 0, 500 + relativeSlackMS},
		{"1.5ms rounds up to 2ms", 1500 * time.Microsecond, 0, 2 + relativeSlackMS},
		{"10s+1µs rounds up", 10*time.Second + time.Microsecond, 0, 10_001 + relativeSlackMS},
		{"clock an hour ahead", 3 * time.Second, time.Hour, 3000 + relativeSlackMS},
		{"clock an hour behind", 3 * time.Second, -time.Hour, 3000 + relativeSlackMS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			skew := tc.skew
			e := enginetest.New(t, c, engine.WithClock(func() time.Time { return time.Now().Add(skew) }))
			attempts := 0
			err := valkeytest.WaitFor(ctx, time.Minute, "a decision within one server millisecond", func() (bool, error) {
				attempts++
				key := enginetest.NewKey(t)
				before := millis(t, c.Do(ctx, c.B().Time().Build()))
				enginetest.MustAllowN(t, e, key, engine.Limit{Max: 1, Window: tc.window}, 1)
				rs := c.DoMulti(ctx, c.B().Pexpiretime().Key(enginetest.Prefix+key).Build(), c.B().Time().Build())
				expireAt := valkeytest.Must(t, "PEXPIRETIME", rs[0], valkey.ValkeyResult.AsInt64)
				after := millis(t, rs[1])
				if ttl := enginetest.PTTL(t, c, enginetest.Prefix+key); attempts == 1 && (tc.maxTTL > 100 && ttl < tc.maxTTL-100 || ttl > tc.maxTTL || ttl == -1) {
					t.Fatalf("PTTL %d ms, want at most %d and close to it", ttl, tc.maxTTL)
				}
				if expireAt == -2 && before != after {
					return false, nil // a short-lived key gone before PEXPIRETIME: try again
				}
				if set := expireAt - before; before == after && set != tc.maxTTL {
					t.Fatalf("the script set a TTL of %d ms, want %d", set, tc.maxTTL)
				}
				if expireAt-after > tc.maxTTL || expireAt-before < tc.maxTTL {
					t.Fatalf("PEXPIRETIME %d with the server's clock at %d to %d ms: the TTL set is not %d ms", expireAt, before, after, tc.maxTTL)
				}
				return before == after, nil
			})
			if err != nil {
				t.Fatalf("%v (%d attempts)", err, attempts)
			}
		})
	}
}

// Sub-second windows on the server's clock: the limit holds, PTTL is at most the window, and
// after RetryAfter the key admits again.
func TestSubSecondWindowServerClock(t *testing.T) {
	c := server.Client(t)
	e := enginetest.New(t, c)
	l := engine.Limit{Max: 5, Window: 50 * time.Millisecond}
	// An attempt whose calls took longer than the window proves nothing and is made again,
	// until one is quick enough; the bound only ends a test that never gets one.
	const tryFor = 30 * time.Second
	for began := time.Now(); ; {
		key := enginetest.NewKey(t)
		start := time.Now()
		r := enginetest.MustAllowN(t, e, key, l, 5)
		enginetest.Want(t, "5 at once: allowed", r.Allowed, true)
		if skew := r.At.Sub(start); skew < -time.Minute || skew > time.Minute {
			t.Fatalf("At %s is far from this machine's clock %s: not the server's TIME", r.At, start)
		}
		denied := enginetest.MustAllowN(t, e, key, l, 1)
		ttl := enginetest.PTTL(t, c, enginetest.Prefix+key)
		if elapsed := time.Since(start); elapsed >= l.Window {
			// The machine stalled longer than the window: nothing can be concluded; try again.
			if time.Since(began) > tryFor {
				t.Fatalf("every attempt for %s took over %s", tryFor, l.Window)
			}
			continue
		}
		enginetest.Want(t, "6th within the window: allowed", denied.Allowed, false)
		if denied.RetryAfter <= 0 || denied.RetryAfter > l.Window {
			t.Fatalf("RetryAfter %s, want (0, %s]", denied.RetryAfter, l.Window)
		}
		// The expiry is the entry's time plus the window and, as a small header of layout 5
		// keeps the expiry it set, up to a window of slack (lib_small.lua), rounded up to the
		// millisecond: up to one more than two windows from the millisecond PTTL counts from.
		if ttl <= 0 || ttl > 101 {
			t.Fatalf("PTTL %d ms, want (0, 101]", ttl)
		}
		time.Sleep(denied.RetryAfter)
		enginetest.Want(t, "after RetryAfter: allowed", enginetest.MustAllowN(t, e, key, l, 1).Allowed, true)
		time.Sleep(l.Window + 5*time.Millisecond)
		r = enginetest.MustPeek(t, e, key, l)
		enginetest.Want(t, "after a quiet window: remaining", r.Remaining, 5)
		return
	}
}

// Many requests in the same microsecond (a caller's clock fixed at one instant) are all kept,
// each its own entry with its own identity: seqs 1 to Max, none twice.
func TestSameMicrosecondBurst(t *testing.T) {
	clock := enginetest.NewClock(enginetest.T0)
	es, c := enginetest.Engines(t, server, 4, engine.WithClock(clock.Now))
	l := engine.PerMinute(200)

	key := enginetest.NewKey(t)
	results := enginetest.RunConcurrently(t, es, 32, 300, func(e *engine.Engine) (engine.Result, error) {
		return e.Allow(context.Background(), key, l)
	})
	var seqs []int
	for _, r := range results {
		if r.Allowed {
			seqs = append(seqs, r.Entry.Seq)
		}
	}
	enginetest.Want(t, "admitted at one instant", len(seqs), l.Max)
	sort.Ints(seqs)
	for i, seq := range seqs {
		if seq != i+1 {
			t.Fatalf("admitted entries' seqs %v: want each of 1..%d once", seqs, l.Max)
		}
	}
	enginetest.Want(t, "log size", enginetest.StoredEvents(t, c, key), int64(l.Max))
	for _, e := range enginetest.StoredEntries(t, c, key) {
		if !e.At.Equal(enginetest.T0) || e.Cost != 1 {
			t.Fatalf("entry %+v, want cost 1 at %s", e, enginetest.T0)
		}
	}

	// One AllowN larger than a script's batch of members, then singles at the same instant.
	key = enginetest.NewKey(t)
	big := engine.PerMinute(3000)
	enginetest.Want(t, "AllowN(2500)", enginetest.MustAllowN(t, es[0], key, big, 2500).Allowed, true)
	for i := 0; i < 10; i++ {
		enginetest.MustAllowN(t, es[1], key, big, 1)
	}
	enginetest.Want(t, "log size after 2510 events", enginetest.StoredEvents(t, c, key), int64(2510))
}

// Every invalid input is refused with ErrInvalidArgument before anything is sent: an absent
// key stays absent, and an existing key keeps its events and its expiry.
func TestInvalidArgumentsWriteNothing(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	good := engine.PerMinute(3)
	e := enginetest.New(t, c)
	zero := enginetest.New(t, c, engine.WithClock(func() time.Time { return time.Time{} }))
	far := enginetest.New(t, c, engine.WithClock(func() time.Time { return time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC) }))

	calls := []struct {
		name string
		call func(key string) error
	}{
		{"Allow empty key", func(string) error { _, err := e.Allow(ctx, "", good); return err }},
		{"Peek empty key", func(string) error { _, err := e.Peek(ctx, "", good); return err }},
		{"Reset empty key", func(string) error { return e.Reset(ctx, "") }},
		{"Max 0", func(k string) error { _, err := e.Allow(ctx, k, engine.Limit{Max: 0, Window: time.Second}); return err }},
		{"Max -1", func(k string) error {
			_, err := e.Allow(ctx, k, engine.Limit{Max: -1, Window: time.Second})
			return err
		}},
		{"Max above MaxEvents", func(k string) error {
			_, err := e.Allow(ctx, k, engine.Limit{Max: engine.MaxEvents + 1, Window: time.Second})
			return err
		}},
		{"Window 0", func(k string) error { _, err := e.Allow(ctx, k, engine.Limit{Max: 3}); return err }},
		{"Window 999µs", func(k string) error {
			_, err := e.Allow(ctx, k, engine.Limit{Max: 3, Window: 999 * time.Microsecond})
			return err
		}},
		{"Window negative", func(k string) error {
			_, err := e.Allow(ctx, k, engine.Limit{Max: 3, Window: -time.Second})
			return err
		}},
		{"Window above MaxWindow", func(k string) error {
			_, err := e.Allow(ctx, k, engine.Limit{Max: 3, Window: engine.MaxWindow + time.Microsecond})
			return err
		}},
		{"n 0", func(k string) error { _, err := e.AllowN(ctx, k, good, 0); return err }},
		{"n -2", func(k string) error { _, err := e.AllowN(ctx, k, good, -2); return err }},
		{"n above Max", func(k string) error { _, err := e.AllowN(ctx, k, good, 4); return err }},
		{"Peek Max 0", func(k string) error { _, err := e.Peek(ctx, k, engine.Limit{Window: time.Second}); return err }},
		{"Record limit 0", func(k string) error { return e.Record(ctx, k, 0, time.Second, time.Now()) }},
		{"Check window 0", func(k string) error { return e.Check(ctx, k, 3, 0, time.Now()) }},
		{"Record zero time", func(k string) error { return e.Record(ctx, k, 3, time.Second, time.Time{}) }},
		{"clock returns zero time", func(k string) error { _, err := zero.Allow(ctx, k, good); return err }},
		{"clock in 2200", func(k string) error { _, err := far.Allow(ctx, k, good); return err }},
	}
	for _, existing := range []bool{false, true} {
		for _, tc := range calls {
			t.Run(fmt.Sprintf("%s/existing=%v", tc.name, existing), func(t *testing.T) {
				enginetest.WantRefused(t, c, existing, func(key string) { enginetest.MustAllowN(t, e, key, good, 2) }, tc.call)
			})
		}
	}

	if _, err := engine.New(nil); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Fatalf("New(nil) = %v, want ErrInvalidArgument", err)
	}
}

// A server that is down gives ErrUnavailable, writes nothing in the engine's name, and the
// same engine serves again once the server is back.
func TestServerDownAndBack(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	e := enginetest.New(t, c)
	key, l := enginetest.NewKey(t), engine.PerMinute(3)
	enginetest.MustAllowN(t, e, key, l, 1)

	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.Allow(ctx, key, l); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("Allow with the server down: %v, want ErrUnavailable", err)
	}
	if err := e.Reset(ctx, key); !errors.Is(err, engine.ErrUnavailable) {
		t.Fatalf("Reset with the server down: %v, want ErrUnavailable", err)
	}
	if err := own.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// The restarted server has neither the data (no persistence) nor the scripts.
	var r engine.Result
	if err := valkeytest.WaitFor(ctx, 10*time.Second, "a decision after the restart", func() (bool, error) {
		var err error
		if r, err = e.Allow(ctx, key, l); errors.Is(err, engine.ErrUnavailable) {
			return false, nil
		}
		return err == nil, err
	}); err != nil {
		t.Fatalf("Allow after restart: %v", err)
	}
	enginetest.Want(t, "first decision after restart: remaining", r.Remaining, 2)
}

// The pipelined design decides as the classic one does, one request at a time: three
// admitted, the fourth denied.
func TestPipelinedSequential(t *testing.T) {
	p := newPipelined(t, server.Client(t))
	key, l := enginetest.NewKey(t), engine.PerMinute(3)
	for i := 0; i < 3; i++ {
		r := mustAllow(t, p, key, l)
		enginetest.Want(t, fmt.Sprintf("request %d: allowed", i+1), r.Allowed, true)
		enginetest.Want(t, fmt.Sprintf("request %d: remaining", i+1), r.Remaining, 2-i)
	}
	enginetest.Want(t, "request 4: allowed", mustAllow(t, p, key, l).Allowed, false)
}

// The pipelined design's weakness: every attempt stays in the log, denied or not. Under a
// burst the log holds every attempt (far more than Max) and never more than Max are admitted,
// often fewer; and retries that were denied keep denying after every admitted event has left.
func TestPipelinedLogKeepsRejectedAttempts(t *testing.T) {
	c := server.Client(t)
	var ps []*pipelined.Engine
	for range 4 {
		ps = append(ps, newPipelined(t, valkeytest.NewClient(t, server.Addr)))
	}
	key, l := enginetest.NewKey(t), engine.PerHour(100)
	results := enginetest.RunConcurrently(t, ps, 64, 800, func(p *pipelined.Engine) (engine.Result, error) {
		return p.Allow(context.Background(), key, l)
	})
	admitted := 0
	var counts []int // the log size each admitted request counted: Max - Remaining
	for _, r := range results {
		if r.Allowed {
			admitted++
			counts = append(counts, l.Max-r.Remaining)
		}
	}
	t.Logf("pipelined burst: %d admitted of Max %d, log holds %d", admitted, l.Max, enginetest.StoredEvents(t, c, key))
	if admitted > l.Max {
		t.Fatalf("admitted %d, more than Max %d", admitted, l.Max)
	}
	// Each request counts the log after its own add, and within the hour nothing leaves it: the
	// request whose count ran i-th counted at least i events. So the i-th smallest count among
	// the admitted is at least i, whatever the interleaving (what bounds admitted by Max).
	slices.Sort(counts)
	for i, n := range counts {
		if n < i+1 {
			t.Fatalf("admitted requests counted %v: the %d-th smallest is %d, below %d", counts, i+1, n, i+1)
		}
	}
	enginetest.Want(t, "log size (every attempt)", enginetest.StoredEvents(t, c, key), int64(800))

	// False denial, deterministic: 3 admitted at enginetest.T0, 3 denied retries at enginetest.T0+0.5s. At enginetest.T0+1s no
	// admitted event is in the window, yet the request is denied: the retries fill the log.
	clock := enginetest.NewClock(enginetest.T0)
	p := newPipelined(t, c, pipelined.WithClock(clock.Now))
	a := enginetest.New(t, c, engine.WithClock(clock.Now))
	l = engine.PerSecond(3)
	pk, ak := enginetest.NewKey(t), enginetest.NewKey(t)
	for _, d := range []struct {
		a   allower
		key string
	}{{p, pk}, {a, ak}} {
		clock.Set(enginetest.T0)
		for range 3 {
			mustAllow(t, d.a, d.key, l)
		}
		clock.Set(enginetest.T0.Add(500 * time.Millisecond))
		for i := 0; i < 3; i++ {
			enginetest.Want(t, "retry in a full window: allowed", mustAllow(t, d.a, d.key, l).Allowed, false)
		}
		clock.Set(enginetest.T0.Add(time.Second))
	}
	enginetest.Want(t, "pipelined, window free of admitted events: allowed", mustAllow(t, p, pk, l).Allowed, false)
	enginetest.Want(t, "engine, window free of admitted events: allowed", mustAllow(t, a, ak, l).Allowed, true)
}
