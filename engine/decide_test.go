package engine_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/scripts"
)

// The model reads as far as the scripts do: lib_log.lua's COVER_WALK is coverWalk.
func TestCoverWalkIsTheScripts(t *testing.T) {
	m := regexp.MustCompile(`(?m)^--const COVER_WALK (\d+)$`).FindStringSubmatch(scripts.Source("decide"))
	if m == nil {
		t.Fatal("lib_log.lua defines no COVER_WALK")
	}
	if got, _ := strconv.Atoi(m[1]); got != coverWalk {
		t.Fatalf("lib_log.lua's COVER_WALK is %d, want the model's %d", got, coverWalk)
	}
}

// Thousands of random operations on a few keys, with callers' clocks that jump forward, lag
// behind each other and stand still, single limits and policies of up to four windows on the
// same key, costs from 1 to Max, peeks, refunds and settles (retried, and of entries long
// gone), and 20 different windows on one key (more than the log keeps cursors for): every
// Result field equals the model's, and the stored log holds the model's entries.
// Seeds past 12 keep to one window, so that the log never holds a cursor and
// the fast paths decide most requests: short logs (lib_small.lua), and past 15, long ones
// (lib_busy.lua), of cost 1 alone past 17, whose denials' waits the script reads exactly.
func TestLogAgainstModel(t *testing.T) {
	client := exampleClient()
	defer client.Close()
	clock := &steppedClock{}
	e, err := engine.New(client, engine.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	deep := 0 // denials whose wait the script reads exactly, deeper than it walks
	for seed := uint64(1); seed <= 20; seed++ {
		// Seeds past 6 keep logs long (larger limits, smaller steps), so that the log's oldest
		// entries move behind its header and back out; past 15, long logs of one window, which
		// the busy path (lib_busy.lua) decides; past 17, of cost 1 alone and no refund: unit
		// logs, whose every denial's wait is exact.
		long, oneWindow, unitOnly := seed > 6 && seed <= 12 || seed > 15, seed > 12, seed > 17
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			step, maxes, ops := int64(400_000), 30, 700
			if long {
				step, maxes, ops = 40_000, 300, 1500
			}
			longest := 0
			key := exampleKey(fmt.Sprint("model-", seed))
			model := &modelLog{key: "strictrate:" + key, weighted: noTime}
			base := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).UnixMicro()
			now := base
			// The windows this key sees: a few common ones, and now and then a rare one.
			windows := []time.Duration{2 * time.Second, 3 * time.Second, 5 * time.Second, 8 * time.Second}
			var admitted []engine.Result
			for op := 0; op < ops; op++ {
				switch k := rng.IntN(100); {
				case k < 55:
					now += rng.Int64N(step) // forward
				case k < 70 && !long, k < 62:
					now -= rng.Int64N(4 * step) // a caller behind the others
				case k < 72 && !long:
					now += 4_000_000 // a pause: most entries leave
				}
				clock.now = time.UnixMicro(now)
				var limits []engine.Limit
				count := 1 + rng.IntN(4)
				if long {
					count = 1 + rng.IntN(2)
				}
				pool := slices.Clone(windows)
				if oneWindow {
					count, pool = 1, pool[1:2]
				} else if seed%2 == 0 && rng.IntN(10) == 0 {
					pool = append(pool, time.Duration(1+rng.IntN(20))*time.Second+time.Duration(op)*time.Microsecond)
				}
				rng.Shuffle(len(pool), func(i, j int) { pool[i], pool[j] = pool[j], pool[i] })
				for _, w := range pool[:min(count, len(pool))] {
					limits = append(limits, engine.Limit{Max: maxes/3 + rng.IntN(maxes), Window: w})
				}
				slices.SortFunc(limits, func(a, b engine.Limit) int { return cmp.Compare(a.Window, b.Window) })
				smallest := slices.MinFunc(limits, func(a, b engine.Limit) int { return cmp.Compare(a.Max, b.Max) }).Max
				n := 1 + rng.IntN(smallest)
				if rng.IntN(3) > 0 {
					n = 1 + rng.IntN(min(3, smallest))
				}
				if unitOnly {
					n = 1
				}

				var got, want engine.Result
				var alt *engine.Result
				what := ""
				switch k := rng.IntN(100); {
				case k < 12:
					what = fmt.Sprintf("Peek %v at +%dµs", limits, now-base)
					if len(limits) == 1 {
						got, err = e.Peek(ctx, key, limits[0])
						want, alt = model.decide(now, 1, limits, false)
					} else {
						continue
					}
				case k < 24 && len(admitted) > 0 && !unitOnly:
					r := admitted[rng.IntN(len(admitted))]
					actual := rng.IntN(r.Entry.Cost + 1)
					if rng.IntN(2) == 0 {
						actual = 0
					}
					if err := e.Settle(ctx, key, r, actual); err != nil {
						t.Fatalf("op %d: Settle(%+v, %d): %v", op, r.Entry, actual, err)
					}
					model.settle(r.Entry, actual)
					continue
				default:
					what = fmt.Sprintf("AllowPolicy(%v, %d) at +%dµs", limits, n, now-base)
					if len(limits) == 1 && rng.IntN(2) == 0 {
						got, err = e.AllowN(ctx, key, limits[0], n)
					} else {
						got, err = e.AllowPolicy(ctx, key, engine.Policy(limits), n)
					}
					want, alt = model.decide(now, n, limits, true)
				}
				if err != nil {
					t.Fatalf("op %d: %s: %v", op, what, err)
				}
				if got != want && (alt == nil || got != *alt) {
					checkStored(t, client, key, model)
					t.Fatalf("op %d: %s:\n got %+v\nwant %+v", op, what, got, want)
				}
				if got.Allowed && !got.Entry.IsZero() {
					admitted = append(admitted, got)
				}
				longest = max(longest, len(model.entries))
				if op%50 == 0 {
					checkStored(t, client, key, model)
				}
			}
			checkStored(t, client, key, model)
			if long && longest < 64 {
				t.Fatalf("the longest log held %d entries: too short to leave the header", longest)
			}
			deep += model.deepExact
		})
	}
	if deep == 0 {
		t.Fatal("no denial's wait lay deeper than the script walks on a unit log: the exact read went untested")
	}
}

// maxFuzzKey bounds the fuzzed string of FuzzAllowN's key. Go minimizes each new interesting
// input's strings one candidate at a time, each candidate a whole run of the fuzz function
// (some 30 round trips): it removes every byte, then every range of bytes, then tries 32
// printable bytes in place of each, some L + L²/2 + 32L runs for a string of L bytes whose
// length its coverage depends on. A key's always does, since every command hashes the key
// byte by byte (valkey-go's slot). A fuzzed 4 KB key took the whole budget Go gives one
// minimization, half of CI's 8,000 runs, some 20 seconds of "0 execs/sec" while the other
// worker idled. At 16 bytes a minimization is at most some 650 runs, and the length of long
// keys comes from pad, which Go does not minimize.
const maxFuzzKey = 16

// FuzzAllowN throws arbitrary keys (any bytes, any length), limits, windows and costs (up to
// MaxEvents) at the engine: it must never panic, must answer bad input with
// ErrInvalidArgument and write nothing, and otherwise must admit exactly while the limit has
// room, give back exactly a refunded request's cost, and never let the log exceed Max. CI runs
// it for a bounded number of inputs: go test -run='^$' -fuzz=FuzzAllowN -fuzztime=8000x ./engine/
//
// A key is up to maxFuzzKey fuzzed bytes, then pad%4096 zero bytes: any bytes, any length up
// to 4 KiB, but only a short string for Go to minimize (see maxFuzzKey).
func FuzzAllowN(f *testing.F) {
	for _, seed := range []struct {
		key    string
		pad    uint16
		max    int
		window int64
		n      int
	}{
		{"user:1", 0, 3, 1_000_000, 1},
		{"", 0, 3, 1_000_000, 1},
		{"k", 0, 0, 1_000_000, 1},
		{"k", 0, 5, 999, 1},
		{"k", 0, 5, 1000, 6},
		{"k", 0, 5, 1000, 0},
		{"\x00\xff{braces}\r\n", 0, 2, 50_000, 2},
		{"\x00", 4095, 1, 3_600_000_000, 1},
		{"{", 4095, 2, 1_000_000, 1},
		{"k", 0, engine.MaxEvents, 1 << 50, 1},
		{"k", 0, 1, 1<<62 + 1, 1},
		{"k", 0, -7, -1, -1},
	} {
		f.Add(seed.key, seed.pad, seed.max, seed.window, seed.n)
	}
	c := exampleServer.Client(f)
	// A frozen caller's clock: the window cannot slide while one input is checked, so the
	// admitted count must be exact even for a 1ms window (and every event shares one
	// microsecond, which exercises the members' collision path).
	at := time.Date(2026, 11, 30, 0, 0, 0, 0, time.UTC)
	e, err := engine.New(c, engine.WithClock(func() time.Time { return at }))
	if err != nil {
		f.Fatal(err)
	}
	onServerClock, err := engine.New(c)
	if err != nil {
		f.Fatal(err)
	}
	ctx := context.Background()

	f.Fuzz(func(t *testing.T, key string, pad uint16, max int, windowMicros int64, n int) {
		if len(key) > maxFuzzKey {
			key = key[:maxFuzzKey]
		}
		key += strings.Repeat("\x00", int(pad%4096))
		l := engine.Limit{Max: max, Window: time.Duration(windowMicros) * time.Microsecond}
		if key != "" {
			// The fuzzer runs inputs in several processes at once, and many inputs share a
			// key ("k"): each input gets a key of its own, ending in the fuzzed bytes.
			key = uuid.NewString() + ":" + key
			if err := e.Reset(ctx, key); err != nil {
				t.Fatalf("Reset: %v", err)
			}
		}
		r, err := e.AllowN(ctx, key, l, n)
		if err != nil {
			if !errors.Is(err, engine.ErrInvalidArgument) {
				t.Fatalf("AllowN(%q, %+v, %d): %v, want nil or ErrInvalidArgument", key, l, n, err)
			}
			if key != "" {
				if got := enginetest.StoredEvents(t, c, key); got != 0 {
					t.Fatalf("refused call left %d events, want 0", got)
				}
			}
			return
		}
		// A fresh key with n <= Max: admitted, and the rest is exact. The key's expiry runs on
		// the server's real clock, so below a second it may lapse while this loop runs; there
		// only the bounds are checked.
		exact := l.Window >= time.Second
		if !r.Allowed || r.Remaining != max-n {
			t.Fatalf("first AllowN(%d) of %d: %+v, want admitted with %d remaining", n, max, r, max-n)
		}
		admitted := n
		for i := 0; i < 20 && admitted < max+1; i++ {
			r, err := e.Allow(ctx, key, l)
			if err != nil {
				t.Fatalf("Allow: %v", err)
			}
			if r.Remaining < 0 || r.Remaining > max {
				t.Fatalf("Remaining %d outside [0, %d]", r.Remaining, max)
			}
			if exact && r.Allowed != (admitted < max) {
				t.Fatalf("with %d of %d admitted: Allowed %v, want %v", admitted, max, r.Allowed, admitted < max)
			}
			if r.Allowed {
				admitted++
			}
		}
		if got := enginetest.StoredEvents(t, c, key); exact && got != int64(admitted) || got > int64(max) {
			t.Fatalf("log holds %d, want the %d admitted (exact: %v), at most Max %d", got, admitted, exact, max)
		}
		// Refunding the first request gives back its n events, once.
		for i := 0; i < 2; i++ {
			if err := e.Refund(ctx, key, r); err != nil {
				t.Fatalf("Refund: %v", err)
			}
		}
		if got := enginetest.StoredEvents(t, c, key); exact && got != int64(admitted-n) || got > int64(max) {
			t.Fatalf("after refunding %d of %d admitted: log holds %d, want %d (exact: %v), at most Max %d", n, admitted, got, admitted-n, exact, max)
		}
		// The server's clock moves, so only the bound holds: the log never exceeds Max.
		for i := 0; i < 3; i++ {
			if _, err := onServerClock.AllowN(ctx, key, l, n); err != nil {
				t.Fatalf("AllowN on the server's clock: %v", err)
			}
		}
		if got := enginetest.StoredEvents(t, c, key); got > int64(max) {
			t.Fatalf("log holds %d, want at most Max %d", got, max)
		}
		if err := e.Reset(ctx, key); err != nil {
			t.Fatalf("Reset: %v", err)
		}
	})
}

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
				t.Fatalf("AllowN(%d) on a fresh key with %s: denied, want an admission", n, l)
			}
		}
	}
	one, million := leastScriptUsec(t, c, 100, admit(1)), leastScriptUsec(t, c, 100, admit(1_000_000))
	t.Logf("least server µs per call: AllowN(1) %d, AllowN(1e6) %d", one, million)
	if million > 2*one+20 {
		t.Fatalf("AllowN(1e6) costs the server %d µs per call, AllowN(1) %d; want at most %d: cost grows with n", million, one, 2*one+20)
	}
}

// denialUsec runs calls denials of cost n against l on key and returns the least server time
// one of them took (leastScriptUsec), with the last denial.
func denialUsec(t *testing.T, c valkey.Client, e *engine.Engine, key string, l engine.Limit, n, calls int) (int64, engine.Result) {
	t.Helper()
	var r engine.Result
	least := leastScriptUsec(t, c, calls, func(int) {
		if r = enginetest.MustAllowN(t, e, key, l, n); r.Allowed {
			t.Fatalf("a request of cost %d against %s on a full log: admitted, want a denial", n, l)
		}
	})
	return least, r
}

// No request buys server time with its cost, or with how far a lowered limit leaves a long log
// over it: on a log of 20,000 entries, a denial of cost 10,000, or of cost 1 against a limit of
// half the log, costs the server about what a denial of cost 1 on the full log does (each used
// to walk 10,000 entries: 1.5 ms, against 20 µs). On this log of cost-1 entries (a unit log,
// layout 5) their RetryAfter is exact at any depth: the entry at which enough events leave is
// found by its number.
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
				t.Fatalf("filling the log: denied at %s, want an admission", r.At)
			}
		}
	}
	now := enginetest.T0.Add(time.Second)
	clock.Set(now)
	lowered := engine.Limit{Max: entries / 2, Window: time.Hour}
	// The oldest entry is of the first millisecond; the 10,000th of the 100th, the 10,001st of
	// the 101st.
	earliest := enginetest.T0.Add(time.Hour).Sub(now)
	wait := func(ms int) time.Duration {
		return enginetest.T0.Add(time.Duration(ms)*time.Millisecond + time.Hour).Sub(now)
	}
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
			t.Fatalf("least server µs per denial: cost %d %d, cost %d %d, over a lowered limit %d; want each at most %d (3 × cost 1's %d, and 100): a denial's server time grows with its cost or with the log's excess over the limit", entries/2, costly, entries, whole, over, 3*one+100, one)
		}
	}
	enginetest.Want(t, "cost 1 on the full log: retry after", rOne.RetryAfter, earliest)
	enginetest.Want(t, "cost 10,000 on the full log: retry after", rCostly.RetryAfter, wait(99))
	enginetest.Want(t, "cost 1 over a lowered limit: retry after", rOver.RetryAfter, wait(100))
	// The whole limit: the newest entry must leave, found from the newest end.
	enginetest.Want(t, "cost 20,000 on the full log: retry after", rWhole.RetryAfter, enginetest.T0.Add(199*time.Millisecond+time.Hour).Sub(now))
}

// 64 goroutines over 4 clients ask for random costs against a limit, 100 decisions each and
// for 5 windows at least: audited on the server's timestamps, no window over Max and no false
// denial. Costs 1 to 50 against Max 1000 keep about 40 entries in a window (the log's older
// entries leave its header); costs 1 to 8 against Max 60 keep it within the header.
func TestWeightedExactUnderConcurrency(t *testing.T) {
	for _, tc := range []struct {
		max, maxCost int
	}{{1000, 50}, {60, 8}} {
		t.Run(fmt.Sprintf("Max %d, costs 1 to %d", tc.max, tc.maxCost), func(t *testing.T) {
			es, _ := enginetest.Engines(t, exampleServer, 4)
			key, l := enginetest.NewKey(t), engine.Limit{Max: tc.max, Window: 200 * time.Millisecond}
			ds, _ := hammer(t, es, 64, 100, 5*l.Window, func(rng *rand.Rand, e *engine.Engine) (engine.Result, int, error) {
				n := 1 + rng.IntN(tc.maxCost)
				r, err := e.AllowN(context.Background(), key, l, n)
				return r, n, err
			})
			// A denial of the largest cost leaves the least admitted in its window.
			wantLimitReached(t, ds, auditWeighted(t, ds, l), l.Max-tc.maxCost+1)
		})
	}
}

// sharedDecision is one decision of a key that several limits share: when the server took
// it, its cost, the limits it was judged by, and whether it was admitted.
type sharedDecision struct {
	at      int64 // µs, the server's clock
	seq     int   // an admission's Entry.Seq: its place among the admissions of its microsecond
	cost    int
	limits  []engine.Limit
	allowed bool
}

// auditShared checks decisions on one key against each decision's own limits, counting every
// admitted event on the key whatever limit admitted it: an admission leaves no window of any
// of its limits over that limit's Max, counting the admissions taken before it and itself
// (those of its own microsecond, one batch's, in the order of their seq); a denial had at
// least one of its limits without room (the events before it in that window, plus its cost,
// over Max; admissions of the same microsecond count as before it, the benefit of the doubt
// going to the denial). It returns the admissions per limit.
func auditShared(t *testing.T, ds []sharedDecision) map[engine.Limit]int {
	t.Helper()
	type point struct {
		at  int64
		seq int
	}
	order := func(a, b point) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.seq, b.seq)) }
	slices.SortStableFunc(ds, func(a, b sharedDecision) int { return order(point{a.at, a.seq}, point{b.at, b.seq}) })
	var points []point
	var cum []int
	total := 0
	for _, d := range ds {
		if d.allowed {
			total += d.cost
			points = append(points, point{d.at, d.seq})
			cum = append(cum, total)
		}
	}
	// costIn is the admitted cost after t - w, up to and including the point upto.
	costIn := func(upto point, w int64) int {
		last, found := slices.BinarySearchFunc(points, upto, order)
		if found {
			last++
		}
		first, _ := slices.BinarySearchFunc(points, point{upto.at - w + 1, 0}, order)
		sum := 0
		if last > 0 {
			sum = cum[last-1]
		}
		if first > 0 {
			sum -= cum[first-1]
		}
		return sum
	}
	admitted := map[engine.Limit]int{}
	for _, d := range ds {
		full := false
		for _, l := range d.limits {
			upto := point{d.at, d.seq}
			if !d.allowed {
				upto.seq = math.MaxInt // every admission of its microsecond
			}
			in := costIn(upto, l.Window.Microseconds())
			if d.allowed && in > l.Max {
				t.Fatalf("admitted cost %d at %d by %v: %d events in the %s window, over Max %d", d.cost, d.at, d.limits, in, l.Window, l.Max)
			}
			if !d.allowed && in+d.cost > l.Max {
				full = true
			}
		}
		if !d.allowed && !full {
			t.Fatalf("cost %d denied at %d by %v though each of its windows had room: a false denial", d.cost, d.at, d.limits)
		}
		if d.allowed {
			for _, l := range d.limits {
				admitted[l]++
			}
		}
	}
	return admitted
}

// Two limits on one key, each decided by its own calls: the short one's decisions must not
// trim what the long one counts. 5 per hour alternating with 100 per 10 ms admitted 20 of 20
// when each call trimmed the log to its own window; every limit holds on every event of the
// key.
func TestLimitsSharingAKeyEachHold(t *testing.T) {
	for _, batching := range []bool{false, true} {
		t.Run(fmt.Sprint("batching ", batching), func(t *testing.T) {
			e := enginetest.New(t, exampleServer.Client(t), engine.WithBatching(batching))
			key := enginetest.NewKey(t)
			hour, short := engine.PerHour(5), engine.Limit{Max: 100, Window: 10 * time.Millisecond}
			var ds []sharedDecision
			for i := 0; i < 20; i++ {
				l := hour
				if i%2 == 1 {
					l = short
					time.Sleep(15 * time.Millisecond) // past the short window: it trims all it can
				}
				r := enginetest.MustAllowN(t, e, key, l, 1)
				ds = append(ds, sharedDecision{at: r.At.UnixMicro(), seq: r.Entry.Seq, cost: 1, limits: []engine.Limit{l}, allowed: r.Allowed})
			}
			admitted := auditShared(t, ds)
			// Hour calls admit while the hour holds at most 4 events: the 1st, 3rd and 5th
			// event of the key.
			if admitted[hour] != 3 || admitted[short] != 10 {
				t.Fatalf("admitted %d by the hour limit and %d by the short one; want 3 and 10", admitted[hour], admitted[short])
			}
			if r := enginetest.MustPeek(t, e, key, hour); r.Remaining != 0 || r.Allowed {
				t.Fatalf("the hour limit after 13 events: %+v; want full", r)
			}
			// The key lives as long as the longest window counted on it needs.
			if ms := enginetest.PTTL(t, exampleServer.Client(t), enginetest.Prefix+key); ms < (time.Hour - time.Minute).Milliseconds() {
				t.Fatalf("PTTL %d ms, want at least %d: the key would go before the hour limit's window ends", ms, (time.Hour - time.Minute).Milliseconds())
			}
		})
	}
}

// A long limit's first decision on a key a short one wrote is a denial: the key's expiry must
// still move out to the long window, or the events that denied it go with the short expiry.
func TestLongerLimitDeniedStillKeepsTheKey(t *testing.T) {
	e := enginetest.New(t, exampleServer.Client(t), engine.WithBatching(false))
	key := enginetest.NewKey(t)
	short, long := engine.Limit{Max: 3, Window: 50 * time.Millisecond}, engine.Limit{Max: 2, Window: time.Hour}
	for i := 0; i < 3; i++ {
		enginetest.MustAllowN(t, e, key, short, 1)
	}
	if r := enginetest.MustAllowN(t, e, key, long, 1); r.Allowed {
		t.Fatalf("the hour limit of 2 admitted a request with 3 events in its window: %+v, want a denial", r)
	}
	time.Sleep(120 * time.Millisecond) // past the short window and its expiry
	if r := enginetest.MustAllowN(t, e, key, long, 1); r.Allowed {
		t.Fatalf("the hour limit of 2 admitted once the short window's expiry passed: %+v, want a denial", r)
	}
}

// 32 goroutines over 4 clients, batched and not, decide on one key by three single limits and
// a policy of two, picked at random per call, 50 calls each and for 1.5 s at least, once a
// first decision has asked every window of the key: audited on the server's timestamps, every
// admission keeps every window of its limits within Max counting all the key's events, and
// every denial had a limit without room.
func TestLimitsSharingAKeyUnderConcurrency(t *testing.T) {
	a := engine.Limit{Max: 5, Window: 20 * time.Millisecond}
	b := engine.Limit{Max: 40, Window: 200 * time.Millisecond}
	c := engine.Limit{Max: 100, Window: 2 * time.Second}
	choices := [][]engine.Limit{{a}, {b}, {c}, {a, c}}
	for _, batching := range []bool{false, true} {
		t.Run(fmt.Sprint("batching ", batching), func(t *testing.T) {
			es, _ := enginetest.Engines(t, exampleServer, 4, engine.WithBatching(batching))
			key := enginetest.NewKey(t)
			// The key's first decision counts every window the test asks: from then on the
			// key keeps what each of them counts (a limit first asked of a key later counts
			// only what the key kept for the longest window asked before).
			first, err := es[0].AllowPolicy(context.Background(), key, engine.Policy{a, b, c}, 1)
			if err != nil || !first.Allowed {
				t.Fatalf("the first decision: %+v, %v", first, err)
			}
			ds := decideMany(t, es, 32, runFor{calls: 50, span: 1500 * time.Millisecond}, 22, func(rng *rand.Rand, e *engine.Engine) (sharedDecision, time.Time, error) {
				limits := choices[rng.IntN(len(choices))]
				n := 1 + rng.IntN(3)
				var r engine.Result
				var err error
				if len(limits) == 1 {
					r, err = e.AllowN(context.Background(), key, limits[0], n)
				} else {
					r, err = e.AllowPolicy(context.Background(), key, engine.Policy(limits), n)
				}
				return sharedDecision{at: r.At.UnixMicro(), seq: r.Entry.Seq, cost: n, limits: limits, allowed: r.Allowed}, r.At, err
			})
			ds = append(ds, sharedDecision{at: first.At.UnixMicro(), seq: first.Entry.Seq, cost: 1, limits: []engine.Limit{a, b, c}, allowed: true})
			admitted := auditShared(t, ds)
			t.Logf("%d decisions; admissions by limit: %v", len(ds), admitted)
			if admitted[c] == 0 || admitted[a] == 0 {
				t.Fatalf("admissions by limit %v: a limit never admitted, the audit proves little", admitted)
			}
		})
	}
}

// A nil context is refused with ErrInvalidArgument by every method, before anything is counted
// or queued: the engine goes on deciding for everyone else, with its batch queue busy at the
// time, and no background goroutine ever sees the nil context.
func TestNilContextIsRefused(t *testing.T) {
	e := enginetest.New(t, exampleServer.Client(t))
	key, l := enginetest.NewKey(t), engine.PerHour(1000)
	ctx := context.Background()
	admitted := enginetest.MustAllowN(t, e, key, l, 1)
	lease, err := e.Acquire(ctx, key, 5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// Keep the queue busy, so that a nil-context call would have been queued behind others.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := e.Allow(ctx, key, l); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	var nilCtx context.Context
	calls := map[string]func() error{
		"Allow":       func() error { _, err := e.Allow(nilCtx, key, l); return err },
		"AllowN":      func() error { _, err := e.AllowN(nilCtx, key, l, 2); return err },
		"AllowPolicy": func() error { _, err := e.AllowPolicy(nilCtx, key, engine.Policy{l}, 1); return err },
		"Peek":        func() error { _, err := e.Peek(nilCtx, key, l); return err },
		"PeekPolicy":  func() error { _, err := e.PeekPolicy(nilCtx, key, engine.Policy{l}, 1); return err },
		"Wait":        func() error { _, err := e.Wait(nilCtx, key, l); return err },
		"Check":       func() error { return e.Check(nilCtx, key, 5, time.Minute, time.Now()) },
		"Record":      func() error { return e.Record(nilCtx, key, 5, time.Minute, time.Now()) },
		"Reset":       func() error { return e.Reset(nilCtx, key) },
		"Clear":       func() error { return e.Clear(nilCtx, key) },
		"Refund":      func() error { return e.Refund(nilCtx, key, admitted) },
		"Settle":      func() error { return e.Settle(nilCtx, key, admitted, 0) },
		"Acquire":     func() error { _, err := e.Acquire(nilCtx, key, 5, time.Minute); return err },
		"Extend":      func() error { _, err := e.Extend(nilCtx, lease, time.Minute); return err },
		"Release":     func() error { return e.Release(nilCtx, lease) },
	}
	for name, call := range calls {
		for i := 0; i < 20; i++ {
			if err := call(); !errors.Is(err, engine.ErrInvalidArgument) {
				t.Fatalf("%s(nil context): %v; want ErrInvalidArgument", name, err)
			}
		}
	}
	close(stop)
	wg.Wait()
	// The engine still decides at once: nothing was left counted in flight.
	tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := e.Allow(tctx, key, l); err != nil {
		t.Fatalf("Allow after the nil-context calls: %v", err)
	}
	if got := enginetest.Log(t, exampleServer.Client(t), enginetest.Prefix, key); got.Events < 1 {
		t.Fatalf("the log lost its entries: %+v", got)
	}
}

// A decision the server refuses midway (the user lost PEXPIRE and PEXPIREAT after New)
// records nothing and leaves no key without an expiry: on a new key and on one that holds
// entries.
func TestRefusedDecisionLeavesNoTrace(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	admin := own.Client(t)
	c := own.NewUser(t, "loses", "pw", "+@all")
	e := enginetest.New(t, c)
	ctx := context.Background()
	old, fresh := enginetest.NewKey(t), enginetest.NewKey(t)
	for _, l := range []engine.Limit{engine.PerHour(10), {Max: 10, Window: time.Minute}} {
		enginetest.MustAllowN(t, e, old, l, 1) // one limit, then a second: the general path too
	}
	before := enginetest.Log(t, admin, enginetest.Prefix, old)
	// Take the expiry away: every later decision must fail without writing.
	if err := admin.Do(ctx, admin.B().AclSetuser().Username("loses").Rule("-pexpire", "-pexpireat").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key    string
		policy engine.Policy
	}{
		{fresh, engine.Policy{engine.PerHour(10)}},
		{fresh, engine.Policy{{Max: 10, Window: time.Minute}, engine.PerHour(10)}},
		{old, engine.Policy{engine.PerHour(10)}},
		{old, engine.Policy{{Max: 10, Window: time.Minute}, engine.PerHour(10)}},
	} {
		for _, batching := range []bool{false, true} {
			e := enginetest.New(t, c, engine.WithPreload(false), engine.WithBatching(batching))
			if r, err := e.AllowPolicy(ctx, tc.key, tc.policy, 1); err == nil {
				t.Fatalf("AllowPolicy(%v) without PEXPIRE: %+v, no error", tc.policy, r)
			}
		}
	}
	if n := valkeytest.Must(t, "EXISTS", admin.Do(ctx, admin.B().Exists().Key(enginetest.Prefix+fresh).Build()), valkey.ValkeyResult.AsInt64); n != 0 {
		t.Fatalf("a refused decision left the new key %q behind, want no key", fresh)
	}
	after := enginetest.Log(t, admin, enginetest.Prefix, old)
	if after.Count != before.Count || after.Events != before.Events {
		t.Fatalf("refused decisions changed the log: %d entries, %d events; want %d, %d as before", after.Count, after.Events, before.Count, before.Events)
	}
	if ms := enginetest.PTTL(t, admin, enginetest.Prefix+old); ms <= 0 {
		t.Fatalf("PTTL %d: the key lost its expiry", ms)
	}
}

// Fail-closed (the default) denies and returns the error; fail-open admits, says so in
// BackendErr, and returns no error. Bad input and a cancelled caller are errors either way.
func TestFailOpenAndFailClosed(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	closed := enginetest.New(t, c)
	open := enginetest.New(t, c, engine.WithFailOpen(true))
	key, l := enginetest.NewKey(t), engine.PerMinute(3)
	ctx := context.Background()

	r := enginetest.MustAllowN(t, open, key, l, 1)
	if !r.Allowed || r.BackendErr != nil || r.Remaining != 2 {
		t.Fatalf("fail-open engine with the server up: %+v, want an admission with 2 remaining and no BackendErr", r)
	}
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	// Reads are retried by the client until the context ends: keep it short.
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()

	r, err := closed.Allow(tctx, key, l)
	if !errors.Is(err, engine.ErrUnavailable) || r.Allowed {
		t.Fatalf("fail-closed, server down: %+v, %v; want denied and ErrUnavailable", r, err)
	}
	r, err = open.Allow(tctx, key, l)
	if err != nil || !r.Allowed || !errors.Is(r.BackendErr, engine.ErrUnavailable) || r.Remaining != 0 {
		t.Fatalf("fail-open Allow, server down: %+v, %v; want admitted with BackendErr ErrUnavailable", r, err)
	}
	// A read is retried by the client until its caller's context ends (its deadline is not the
	// connection's: package sendctx). A deadline the caller set is its own end, never an
	// admission; one set as a bound on the server's answer (its cause ErrUnavailable) is the
	// server's failure, and fails open.
	r, err = open.Peek(tctx, key, l)
	if !errors.Is(err, context.DeadlineExceeded) && (err != nil || !errors.Is(r.BackendErr, engine.ErrUnavailable)) {
		t.Fatalf("fail-open Peek, server down, the caller's deadline: %+v, %v; want its deadline's error, or an admission for the server's failure before it", r, err)
	}
	bctx, cancelBound := context.WithTimeoutCause(ctx, time.Second, engine.ErrUnavailable)
	defer cancelBound()
	r, err = open.Peek(bctx, key, l)
	if err != nil || !r.Allowed || r.Remaining != 0 || !errors.Is(r.BackendErr, engine.ErrUnavailable) {
		t.Fatalf("fail-open Peek, server down, a bound on its answer: %+v, %v; want admitted with BackendErr ErrUnavailable", r, err)
	}
	if _, err := open.Allow(tctx, "", l); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Fatalf("fail-open with an empty key: %v, want ErrInvalidArgument", err)
	}
	cancelled, cancelNow := context.WithCancel(ctx)
	cancelNow()
	if r, err := open.Allow(cancelled, key, l); !errors.Is(err, context.Canceled) || r.Allowed {
		t.Fatalf("fail-open with a cancelled context: %+v, %v; want context.Canceled", r, err)
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
			t.Fatalf("shadow request %d: %+v; want admitted, ShadowDenied %v, an entry only when not", i+1, r, i >= 3)
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

// A scripted sequence of decisions gives exactly these counts: allowed, denied, cached, shadow
// denied, fail-open, errors, by operation (give-backs and AllowAll included, a call refused
// before anything is sent not counted); durations for each; no key anywhere.
func TestMetricsCountEveryOutcome(t *testing.T) {
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
	// charge/denied: recorded on the server though the deny cache holds the key's denial.
	ch, err := e.Charge(ctx, key, l, 3)
	if err != nil || ch.Allowed || ch.FromCache || ch.Entry.IsZero() {
		t.Fatalf("charge on a key the deny cache denies: %+v, %v; want recorded by the server, denied", ch, err)
	}
	enginetest.Want(t, "events after the charge", enginetest.StoredEvents(t, c, key), int64(5))
	if ch, err = e.Charge(ctx, enginetest.NewKey(t), l, 1); err != nil || !ch.Allowed { // charge/allowed
		t.Fatalf("charge that fits: %+v, %v", ch, err)
	}
	enginetest.MustAllowPolicy(t, e, enginetest.NewKey(t), engine.Policy{engine.PerSecond(1), engine.PerMinute(5)}, 1)
	r := enginetest.MustAllowN(t, shadow, key, l, 1) // allow/shadow_denied
	enginetest.Want(t, "shadow: allowed", r.Allowed && r.ShadowDenied, true)
	given := enginetest.NewKey(t)
	r = enginetest.MustAllowN(t, closed, given, engine.PerMinute(5), 3) // allow/allowed
	// settle/allowed, then refund/allowed:
	if err := closed.Settle(ctx, given, r, 2); err != nil {
		t.Fatalf("Settle: %v", err)
	}
	if err := closed.Refund(ctx, given, r); err != nil {
		t.Fatalf("Refund: %v", err)
	}
	// Not counted: refused before anything is sent.
	if err := closed.Refund(ctx, given, engine.Result{}); err == nil {
		t.Fatal("Refund of a Result that recorded nothing: no error")
	}
	// allow_all/allowed:
	all := []engine.Request{{Key: enginetest.NewKey(t), Policy: engine.Policy{l}, N: 1}, {Key: enginetest.NewKey(t), Policy: engine.Policy{l}, N: 1}}
	if allowed, _, err := closed.AllowAll(ctx, all); err != nil || !allowed {
		t.Fatalf("AllowAll: %v, %v", allowed, err)
	}
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
		"allow/allowed": 2, "allow/denied": 1, "allow/cache_denied": 1, "allow/shadow_denied": 1,
		"allow/fail_open": 1, "allow/error": 1, "peek/denied": 1, "policy/allowed": 1,
		"settle/allowed": 1, "refund/allowed": 1, "allow_all/allowed": 1, "charge/denied": 1, "charge/allowed": 1,
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
	if bs := got["strictrate.batch.size"]; bs["allow"] < 5 || bs["peek"] != 1 || bs["allow_all"] != 1 {
		t.Errorf("strictrate.batch.size = %v, want allow >= 5, peek 1 and allow_all 1", bs)
	}
}
