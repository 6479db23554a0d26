package engine_test

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// The tests of Limit.Resolution (a log that keeps one entry per slot of time), then of long
// quotas, Resolution and calendar limits together, across a cluster and across processes.
// A limit's validation and its window's rounding are tested inside the package
// (limit_internal_test.go).

// finestResolution is the resolution a set of limits records at, in µs: 0 (an exact log) when
// any sliding limit has none, else the smallest.
func finestResolution(limits []engine.Limit) int64 {
	res := int64(-1)
	for _, l := range limits {
		g := micros(l.Resolution)
		if l.Resolution%time.Microsecond != 0 {
			g++
		}
		if g == 0 {
			return 0
		}
		if res < 0 || g < res {
			res = g
		}
	}
	return max(res, 0)
}

// slotEnd is the time an admission at t (µs, t > 0) is recorded at under resolution g: t
// rounded up to a multiple of g, t itself when it is one (or when g is 0: an exact log).
func slotEnd(t, g int64) int64 {
	if g == 0 || t%g == 0 {
		return t
	}
	return t - t%g + g
}

// resModel is the model log (helpers_test.go) with the Resolution rule: an admission is
// recorded at the end of its slot, and joins an entry of that time that carries events among
// the log's newest (mergeSlot; the newest itself when the callers' clocks agree), else goes in
// as a new entry at its place; a shared entry's Settle gives Cost - actual back on every call,
// never below 0. Exact sets (and every peek) are the exact model's, unchanged.
type resModel struct {
	*modelLog
	merges       int // admissions that joined a slot's entry
	mergesBehind int // of them, into an entry older than the newest
}

// decide is AllowPolicy (write) or Peek/PeekPolicy (read-only), limits ascending; alt is
// the other answer the script may give when the model cannot tell whether it reads the log as
// a unit log (modelLog.unit).
func (m *resModel) decide(now int64, n int, limits []engine.Limit, write bool) (engine.Result, *engine.Result) {
	res := finestResolution(limits)
	if !write || res == 0 {
		return m.modelLog.decide(now, n, limits, write)
	}
	longest := micros(limits[len(limits)-1].Window)
	m.horizon = max(m.horizon, longest)
	m.trim(now - m.horizon)
	reach := m.horizon
	r, alt, remaining, denied := m.judge(now, n, limits, reach)
	if denied {
		return r, alt
	}
	// Admitted: quota comes back when the window's first event leaves it, at most a window
	// from now (the new entry counts at least that long; an entry at a slot's end in the
	// future is capped likewise).
	q := m.quotaAfter(now, r.Window)
	if q == 0 || q > r.Window {
		q = r.Window
	}
	r.Allowed, r.Remaining, r.QuotaAfter = true, remaining-n, q
	t := slotEnd(now, res)
	seq, ok := m.mergeSlot(t, n)
	if ok {
		m.merges++
	} else {
		seq = m.insert(t, n)
	}
	r.ResetAfter = time.Duration(m.newest()+reach-now) * time.Microsecond
	r.Entry = engine.EntryID{Key: m.key, At: time.UnixMicro(t), Seq: seq, Cost: n, Shared: true, Decided: time.UnixMicro(now)}
	return r, nil
}

// mergeReach is how many of the log's newest entries an admission's slot may join: callers'
// clocks a little out of step record slots out of order (lib_log.lua, g.merge_slot).
const mergeReach = 8

// mergeSlot adds n to the entry of time t that carries events, the last such among the
// newest mergeReach entries, and returns its seq; false, having changed nothing, when there is
// none, or when the entries of t reach back past those (their seqs unknown: append instead).
func (m *resModel) mergeSlot(t int64, n int) (int, bool) {
	es := m.entries
	if len(es) == 0 || t > es[len(es)-1].at {
		return 0, false
	}
	from := max(len(es)-mergeReach, 0)
	for j := len(es) - 1; j >= from; j-- {
		switch {
		case es[j].at < t:
			return 0, false
		case es[j].at == t && es[j].cost > 0:
			k := j - 1
			for k >= from && es[k].at == t {
				k--
			}
			if k < from && from > 0 {
				return 0, false
			}
			es[j].cost += n
			es[j].was += n
			m.weigh(t, es[j].cost)
			if j < len(es)-1 {
				m.mergesBehind++
			}
			return es[j].seq, true
		}
	}
	return 0, false
}

// settle is Settle(id, actual): a shared entry gives id.Cost - actual back on every call,
// never below 0; an entry of its own is the exact model's settle.
func (m *resModel) settle(id engine.EntryID, actual int) {
	if !id.Shared {
		m.modelLog.settle(id, actual)
		return
	}
	for i := range m.entries {
		e := &m.entries[i]
		if e.at == id.At.UnixMicro() && id.Seq >= e.seq && id.Seq < e.seq+e.span {
			if left := max(e.cost-(id.Cost-actual), 0); left < e.cost {
				e.cost = left
				m.weigh(e.at, left)
				if left == 0 {
					m.compact(i)
				}
			}
			return
		}
	}
}

// resolutionCase is a seed's limit sets: each operation picks one, on the seed's one key.
type resolutionCase struct {
	name string
	sets [][]engine.Limit // each sorted by window
	long bool             // small steps and a big Max: logs of more than 32 entries
}

func resolutionCases() []resolutionCase {
	s := time.Second
	one := func(max int, w, g time.Duration) []engine.Limit {
		return []engine.Limit{{Max: max, Window: w, Resolution: g}}
	}
	a, b, c := one(20, 10*s, s), one(16, 10*s, 2500*time.Millisecond), one(12, 10*s, 10*s)
	// Both with resolutions: the finer, 500ms, wins.
	d := []engine.Limit{{Max: 6, Window: 2 * s, Resolution: 500 * time.Millisecond}, {Max: 24, Window: 10 * s, Resolution: 2500 * time.Millisecond}}
	// An exact limit: the log is exact.
	x := []engine.Limit{{Max: 6, Window: 2 * s}, {Max: 24, Window: 10 * s, Resolution: s}}
	exact := one(20, 10*s, 0) // decide_small's path, on a log slots wrote
	f := one(500, time.Minute, s)
	gp := []engine.Limit{{Max: 40, Window: 10 * s, Resolution: 2 * s}, {Max: 400, Window: time.Minute, Resolution: s}}
	return []resolutionCase{
		{name: "10s~1s", sets: [][]engine.Limit{a}},
		{name: "10s~2.5s", sets: [][]engine.Limit{b}},
		{name: "10s~10s", sets: [][]engine.Limit{c}},
		{name: "2s~500ms and 10s~2.5s", sets: [][]engine.Limit{d}},
		{name: "2s exact and 10s~1s", sets: [][]engine.Limit{x}},
		{name: "1m~1s long", sets: [][]engine.Limit{f}, long: true},
		{name: "10s~2s and 1m~1s long", sets: [][]engine.Limit{gp}, long: true},
		{name: "mixed on one key", sets: [][]engine.Limit{a, b, d, x, exact}},
		{name: "mixed long", sets: [][]engine.Limit{f, gp, a, x}, long: true},
		{name: "10s~1s again", sets: [][]engine.Limit{a, c}},
	}
}

// Random operations on one key per seed under a caller's clock that steps forward (a little
// and a lot), stands still, snaps to slot boundaries and steps back (a caller behind the
// others: its slot's end may be older than the newest entry, and goes in at its place): single
// limits with resolutions, policies of two resolutions (the finer wins) and of an exact limit
// and a resolution (the log is exact), costs 1 to Max, peeks, refunds and settles (retried:
// a shared entry gives back again): every Result field equals the model's, and the stored log
// holds the model's entries. A long log of one limit is decided on
// its busy header (lib_busy.lua), slots included.
func TestResolutionAgainstModel(t *testing.T) {
	client := exampleClient()
	defer client.Close()
	clock := &steppedClock{}
	e, err := engine.New(client, engine.WithClock(clock.Now), engine.WithPersistenceCheck(engine.Ignore))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	merged, mergedBehind, behind, sharedSettles, denied := 0, 0, 0, 0, 0
	cases := resolutionCases()
	for seed := uint64(1); seed <= 20; seed++ {
		tc := cases[(seed-1)%uint64(len(cases))]
		t.Run(fmt.Sprintf("seed %d %s", seed, tc.name), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 77))
			key := exampleKey(fmt.Sprint("resolution-model-", seed))
			model := &resModel{modelLog: &modelLog{key: "strictrate:" + key, weighted: noTime}}
			base := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC).UnixMicro() + 123_457
			now := base
			ops, step := 800, int64(600_000)
			if tc.long {
				ops, step = 1200, 400_000
			}
			var admitted []engine.Result
			longest := 0
			for op := 0; op < ops; op++ {
				switch k := rng.IntN(100); {
				case k < 40:
					now += rng.Int64N(step) // forward, a little
				case k < 48 && !tc.long:
					now += rng.Int64N(3_000_000) // forward, a lot
				case k < 56:
					// standing still
				case k < 62:
					now += 500_000 - now%500_000 // onto a slot boundary
				case k < 70 && !tc.long, k < 64:
					now -= rng.Int64N(1_500_000) // a caller behind the others
				case k < 72 && !tc.long:
					now += 12_000_000 // a pause: every 10s window empties
				default:
					now += rng.Int64N(step / 8)
				}
				clock.now = time.UnixMicro(now)
				limits := tc.sets[rng.IntN(len(tc.sets))]
				smallest := slices.MinFunc(limits, func(a, b engine.Limit) int { return cmp.Compare(a.Max, b.Max) }).Max
				n := 1 + rng.IntN(min(3, smallest))
				if rng.IntN(8) == 0 {
					n = 1 + rng.IntN(smallest)
				}

				var got, want engine.Result
				var alt *engine.Result
				what := ""
				switch k := rng.IntN(100); {
				case k < 12:
					if len(limits) == 1 {
						what = fmt.Sprintf("Peek(%v) at +%dµs", limits, now-base)
						got, err = e.Peek(ctx, key, limits[0])
						want, alt = model.decide(now, 1, limits, false)
					} else {
						what = fmt.Sprintf("PeekPolicy(%v, %d) at +%dµs", limits, n, now-base)
						got, err = e.PeekPolicy(ctx, key, engine.Policy(limits), n)
						want, alt = model.decide(now, n, limits, false)
					}
				case k < 26 && len(admitted) > 0:
					r := admitted[rng.IntN(len(admitted))]
					actual := rng.IntN(r.Entry.Cost + 1)
					if rng.IntN(2) == 0 {
						actual = 0
					}
					tries := 1
					if rng.IntN(3) == 0 {
						tries = 2 // a retried settle: a shared entry gives back again
					}
					for try := 0; try < tries; try++ {
						if actual == 0 && rng.IntN(2) == 0 {
							err = e.Refund(ctx, key, r)
						} else {
							err = e.Settle(ctx, key, r, actual)
						}
						if err != nil {
							t.Fatalf("op %d: Settle(%+v, %d): %v", op, r.Entry, actual, err)
						}
						model.settle(r.Entry, actual)
						if debugRes {
							t.Logf("op %d: settle %+v to %d: entries %v", op, r.Entry, actual, model.entries)
						}
						if r.Entry.Shared {
							sharedSettles++
						}
					}
					if op%10 == 0 {
						checkStored(t, client, key, model.modelLog)
					}
					continue
				default:
					what = fmt.Sprintf("AllowPolicy(%v, %d) at +%dµs", limits, n, now-base)
					if len(limits) == 1 && rng.IntN(2) == 0 {
						got, err = e.AllowN(ctx, key, limits[0], n)
					} else {
						got, err = e.AllowPolicy(ctx, key, engine.Policy(limits), n)
					}
					newest := int64(0)
					if len(model.entries) > 0 {
						newest = model.newest()
					}
					want, alt = model.decide(now, n, limits, true)
					if want.Allowed && want.Entry.At.UnixMicro() < newest {
						behind++
					}
				}
				if err != nil {
					t.Fatalf("op %d: %s: %v", op, what, err)
				}
				if debugRes {
					t.Logf("op %d: %s: got %+v entries %v", op, what, got, model.entries)
				}
				if got != want && (alt == nil || got != *alt) {
					checkStored(t, client, key, model.modelLog)
					t.Fatalf("op %d: %s:\n got %+v\nwant %+v", op, what, got, want)
				}
				if !got.Allowed {
					denied++
				}
				if got.Allowed && !got.Entry.IsZero() {
					admitted = append(admitted, got)
					if len(admitted) > 200 {
						admitted = admitted[len(admitted)-200:]
					}
				}
				longest = max(longest, len(model.entries))
				if op%50 == 0 {
					checkStored(t, client, key, model.modelLog)
				}
			}
			checkStored(t, client, key, model.modelLog)
			merged += model.merges
			mergedBehind += model.mergesBehind
			if tc.long && longest <= 32 {
				t.Fatalf("the longest log held %d entries: too few to leave the header (32)", longest)
			}
			t.Logf("longest log: %d entries", longest)
		})
	}
	t.Logf("%d admissions joined a slot's entry (%d an entry behind the newest), %d recorded behind the newest entry, %d settles of shared entries, %d denials",
		merged, mergedBehind, behind, sharedSettles, denied)
	if merged < 100 || mergedBehind < 10 || behind < 50 || sharedSettles < 100 || denied < 100 {
		t.Fatalf("the sequence does not exercise the rule")
	}
}

// resDecision is one decision of a resolution audit: the key it was for (an index), the
// server's decision time, its cost, and whether it was admitted.
type resDecision struct {
	key     int
	at      int64 // µs, the server's clock (Result.At)
	cost    int
	allowed bool
}

// runResolutionLoad runs do from goroutines spread over es, as decideMany does (each calls at
// least, for span at least), and returns every decision. An admission must be recorded at the
// end of its slot of res µs (Entry.At), shared.
func runResolutionLoad(t *testing.T, es []*engine.Engine, goroutines, each int, span time.Duration, res []int64,
	do func(rng *rand.Rand, e *engine.Engine) (key int, r engine.Result, n int, err error)) []resDecision {
	t.Helper()
	return decideMany(t, es, goroutines, runFor{calls: each, span: span}, 31, func(rng *rand.Rand, e *engine.Engine) (resDecision, time.Time, error) {
		k, r, n, err := do(rng, e)
		if err != nil {
			return resDecision{}, r.At, err
		}
		at := r.At.UnixMicro()
		if want := slotEnd(at, res[k]); r.Allowed && (r.Entry.At.UnixMicro() != want || !r.Entry.Shared || r.Entry.Seq < 1 || r.Entry.Cost != n) {
			return resDecision{}, r.At, fmt.Errorf("admitted at %d with resolution %dµs: entry %+v, want at %d, shared, cost %d", at, res[k], r.Entry, want, n)
		}
		return resDecision{key: k, at: at, cost: n, allowed: r.Allowed}, r.At, nil
	})
}

// auditResolution checks one key's decisions, taken on the server's clock by limits recorded
// at resolution g (µs), against the rule. The server's decisions run one after another, their
// times never going back, so when a decision at t runs, every admission at an earlier time has
// run (and those of t itself may have). An entry counts at t in a window w iff its slot's end
// is after t - w: for an admission at ti, ceil(ti/g)*g > t - w, that is ti > floor((t-w)/g)*g,
// which lies in (t - w - g, t - w].
//
//   - An admission at t: for every limit, the cost admitted in (floor((t-w)/g)*g, t] is at
//     most Max; the exact window (t - w, t], a part of it, is then within Max too: no trailing
//     window of decision times ever holds more than Max.
//   - A denial of n at t: some limit had no room, the cost admitted in (floor((t-w)/g)*g, t]
//     plus n over Max (those of t itself count, the benefit of the doubt going to the
//     denial); so within g of the exact log's answer: the cost admitted in (t - w - g, t]
//     plus n is over Max.
//
// It returns the events admitted and the denials.
func auditResolution(t *testing.T, ds []resDecision, limits []engine.Limit, g int64) (events, denials int) {
	t.Helper()
	slices.SortStableFunc(ds, func(a, b resDecision) int { return cmp.Compare(a.at, b.at) })
	var times []int64
	var cum []int
	for _, d := range ds {
		if d.allowed {
			events += d.cost
			times = append(times, d.at)
			cum = append(cum, events)
		}
	}
	// costIn is the admitted cost at times in (from, to].
	costIn := func(from, to int64) int {
		hi, _ := slices.BinarySearch(times, to+1)
		lo, _ := slices.BinarySearch(times, from+1)
		sum := 0
		if hi > 0 {
			sum = cum[hi-1]
		}
		if lo > 0 {
			sum -= cum[lo-1]
		}
		return sum
	}
	floorTo := func(v int64) int64 { return v - ((v%g)+g)%g }
	for _, d := range ds {
		full, nearly := false, false
		for _, l := range limits {
			w := micros(l.Window)
			counted := costIn(floorTo(d.at-w), d.at)
			if d.allowed {
				if counted > l.Max {
					t.Fatalf("admitted %d at %d under %v: %d events admitted in (%d, %d], counted by its slots, over Max %d",
						d.cost, d.at, l, counted, floorTo(d.at-w), d.at, l.Max)
				}
				if exact := costIn(d.at-w, d.at); exact > l.Max {
					t.Fatalf("admitted %d at %d under %v: %d events admitted in the trailing window, over Max %d", d.cost, d.at, l, exact, l.Max)
				}
				continue
			}
			if counted+d.cost > l.Max {
				full = true
			}
			if costIn(d.at-w-g, d.at)+d.cost > l.Max {
				nearly = true
			}
		}
		if !d.allowed {
			denials++
			if !nearly {
				t.Fatalf("denied %d at %d under %v: every window, widened by the resolution %dµs, had room: a false denial", d.cost, d.at, limits, g)
			}
			if !full {
				t.Fatalf("denied %d at %d under %v: every limit had room counting by slots of %dµs: a false denial", d.cost, d.at, limits, g)
			}
		}
	}
	return events, denials
}

// 64 goroutines over 4 clients, each decision its own script call on the server's clock, 100
// each and for 2 s at least, on one key of 50 per 300ms at a resolution of 50ms, with costs of
// 1 and of 1 to 5: audited on the server's decision times, no trailing window holds more than
// Max, and every denial was right by the slots' count (so within the resolution of the exact
// log's answer).
func TestResolutionNeverOverAdmitsUnderConcurrency(t *testing.T) {
	l := engine.Limit{Max: 50, Window: 300 * time.Millisecond, Resolution: 50 * time.Millisecond}
	g := micros(l.Resolution)
	for _, maxCost := range []int{1, 5} {
		t.Run(fmt.Sprint("costs 1 to ", maxCost), func(t *testing.T) {
			es, _ := enginetest.Engines(t, exampleServer, 4, engine.WithBatching(false))
			key := enginetest.NewKey(t)
			ds := runResolutionLoad(t, es, 64, 100, 2*time.Second, []int64{g}, func(rng *rand.Rand, e *engine.Engine) (int, engine.Result, int, error) {
				n := 1 + rng.IntN(maxCost)
				r, err := e.AllowN(context.Background(), key, l, n)
				return 0, r, n, err
			})
			events, denials := auditResolution(t, ds, []engine.Limit{l}, g)
			t.Logf("%d decisions, %d events admitted, %d denials", len(ds), events, denials)
			// A denial, owed by the audit, shows a window full by the slots' count; how many
			// windows filled is the machine's speed.
			if denials == 0 {
				t.Fatalf("%d events admitted, no denial: the limit was not exercised", events)
			}
		})
	}
}

// Group commit (the default): 64 goroutines over 4 clients, 100 decisions each and for 1.5 s
// at least, on 4 keys of different resolutions (a policy among them, and a resolution as long
// as its window), batched into shared calls whose decisions share one server time: each key
// audited as above.
func TestResolutionBatchedNeverOverAdmits(t *testing.T) {
	ms := time.Millisecond
	keys := []struct {
		limits  []engine.Limit
		maxCost int
	}{
		{[]engine.Limit{{Max: 20, Window: 200 * ms, Resolution: 40 * ms}}, 1},
		{[]engine.Limit{{Max: 50, Window: 300 * ms, Resolution: 100 * ms}}, 5},
		{[]engine.Limit{{Max: 10, Window: 100 * ms, Resolution: 20 * ms}, {Max: 40, Window: 500 * ms, Resolution: 100 * ms}}, 3},
		{[]engine.Limit{{Max: 30, Window: 250 * ms, Resolution: 250 * ms}}, 2},
	}
	es, _ := enginetest.Engines(t, exampleServer, 4)
	names := make([]string, len(keys))
	res := make([]int64, len(keys))
	for k := range keys {
		names[k] = enginetest.NewKey(t)
		res[k] = finestResolution(keys[k].limits)
	}
	ds := runResolutionLoad(t, es, 64, 100, 1500*time.Millisecond, res, func(rng *rand.Rand, e *engine.Engine) (int, engine.Result, int, error) {
		k := rng.IntN(len(keys))
		n := 1 + rng.IntN(keys[k].maxCost)
		var r engine.Result
		var err error
		if len(keys[k].limits) == 1 && rng.IntN(2) == 0 {
			r, err = e.AllowN(context.Background(), names[k], keys[k].limits[0], n)
		} else {
			r, err = e.AllowPolicy(context.Background(), names[k], engine.Policy(keys[k].limits), n)
		}
		return k, r, n, err
	})
	for k := range keys {
		var mine []resDecision
		times := map[int64]int{}
		for _, d := range ds {
			if d.key == k {
				mine = append(mine, d)
				times[d.at]++
			}
		}
		events, denials := auditResolution(t, mine, keys[k].limits, res[k])
		t.Logf("key %d (%v): %d decisions at %d distinct server times, %d events admitted, %d denials",
			k, keys[k].limits, len(mine), len(times), events, denials)
		if denials == 0 {
			t.Fatalf("key %d: %d events admitted, no denial: the limit was not exercised", k, events)
		}
		if len(times) == len(mine) {
			t.Fatalf("key %d: every decision at a server time of its own: no call carried two", k)
		}
	}
}

// 20,000 requests spread evenly over 30 days against a 30-day window at a resolution of an
// hour keep at most one entry per slot, 721, and a key of a few kilobytes; every event counts.
func TestResolutionMemoryIsBoundedBySlots(t *testing.T) {
	c := exampleServer.Client(t)
	e, clock := enginetest.Clocked(t, c)
	key, ctx := enginetest.NewKey(t), context.Background()
	l := engine.Limit{Max: 1_000_000, Window: 30 * 24 * time.Hour, Resolution: time.Hour}
	const requests = 20_000
	start := enginetest.T0.Add(17*time.Minute + 123*time.Microsecond) // mid-slot
	step := l.Window / requests
	var last engine.Result
	for i := 0; i < requests; i++ {
		clock.Set(start.Add(time.Duration(i) * step))
		r, err := e.AllowN(ctx, key, l, 1)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if !r.Allowed || r.Remaining != l.Max-i-1 {
			t.Fatalf("request %d: %+v, want admitted with %d remaining", i, r, l.Max-i-1)
		}
		last = r
	}
	log, err := inspect.Read(ctx, c, enginetest.Prefix+key, 0)
	if err != nil {
		t.Fatal(err)
	}
	slots := int(l.Window/l.Resolution) + 1
	bytes := memoryUsage(t, c, key)
	t.Logf("%d requests: %d entries, %d events, MEMORY USAGE %d bytes (entry key %s)", requests, log.Count, log.Events, bytes, last.Entry.Key)
	if log.Count > slots || log.Count < slots-2 || log.Events != requests {
		t.Fatalf("the log holds %d entries and %d events; want at most %d entries (one per slot) and %d events", log.Count, log.Events, slots, requests)
	}
	if bytes > 12_000 {
		t.Fatalf("MEMORY USAGE %d bytes for %d slots: over 12,000", bytes, log.Count)
	}
}

// A Resolution outside 0 < Resolution <= Window is refused with ErrInvalidArgument by every
// call that takes limits, before anything is sent.
func TestResolutionBadInputRefused(t *testing.T) {
	c := exampleServer.Client(t)
	e := enginetest.New(t, c)
	ctx := context.Background()
	exists := func(key string) int64 {
		t.Helper()
		n, err := c.Do(ctx, c.B().Exists().Key(enginetest.Prefix+key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	good := engine.Limit{Max: 10, Window: time.Minute, Resolution: time.Second}
	for name, bad := range map[string]engine.Limit{
		"longer than its window": {Max: 10, Window: time.Second, Resolution: time.Second + time.Microsecond},
		"negative":               {Max: 10, Window: time.Second, Resolution: -time.Millisecond},
		"negative, one µs":       {Max: 10, Window: time.Second, Resolution: -1},
		"a day over a minute":    {Max: 10, Window: time.Minute, Resolution: 24 * time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			key := enginetest.NewKey(t)
			for call, f := range map[string]func() error{
				"Allow":                   func() error { _, err := e.Allow(ctx, key, bad); return err },
				"AllowN":                  func() error { _, err := e.AllowN(ctx, key, bad, 2); return err },
				"Peek":                    func() error { _, err := e.Peek(ctx, key, bad); return err },
				"AllowPolicy alone":       func() error { _, err := e.AllowPolicy(ctx, key, engine.Policy{bad}, 1); return err },
				"AllowPolicy with a good": func() error { _, err := e.AllowPolicy(ctx, key, engine.Policy{good, bad}, 1); return err },
				"PeekPolicy with a good":  func() error { _, err := e.PeekPolicy(ctx, key, engine.Policy{bad, good}, 1); return err },
				"Policy.Validate":         func() error { return engine.Policy{good, bad}.Validate() },
			} {
				if err := f(); !errors.Is(err, engine.ErrInvalidArgument) {
					t.Errorf("%s with a resolution %s: %v, want ErrInvalidArgument", call, name, err)
				}
				if n := exists(key); n != 0 {
					t.Fatalf("%s with a resolution %s: EXISTS %d, want 0", call, name, n)
				}
			}
		})
	}
	// The edges are valid: a resolution as long as the window, and none.
	for _, l := range []engine.Limit{{Max: 3, Window: time.Second, Resolution: time.Second}, {Max: 3, Window: time.Second, Resolution: time.Microsecond}} {
		if err := (engine.Policy{l}).Validate(); err != nil {
			t.Errorf("Validate(%v): %v", l, err)
		}
		if r, err := e.Allow(ctx, enginetest.NewKey(t), l); err != nil || !r.Allowed || !r.Entry.Shared {
			t.Errorf("Allow(%v) on a fresh key: %+v, %v; want admitted, shared", l, r, err)
		}
	}
}

// Requests of one slot share its entry; Refund gives one request's cost back to it, again on
// each call (call it once per request), never below 0; Settle gives back Cost - actual; a
// slot whose entry was refunded in full takes a new entry, the next seq.
func TestResolutionRefundGivesBackToTheSlot(t *testing.T) {
	c := exampleServer.Client(t)
	e, clock := enginetest.Clocked(t, c)
	ctx, key := context.Background(), enginetest.NewKey(t)
	l := engine.Limit{Max: 10, Window: 10 * time.Second, Resolution: time.Second}
	at := func(d time.Duration) { clock.Set(enginetest.T0.Add(d)) }
	ms := time.Millisecond
	remaining := func(what string, want int) {
		t.Helper()
		if r := enginetest.MustPeek(t, e, key, l); r.Remaining != want {
			t.Fatalf("%s: Peek %+v, want %d remaining", what, r, want)
		}
	}
	entries := func(what string, want ...inspect.Entry) {
		t.Helper()
		if got := enginetest.StoredEntries(t, c, key); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("%s: the log holds %v, want %v", what, got, want)
		}
	}
	refund := func(r engine.Result) {
		t.Helper()
		if err := e.Refund(ctx, key, r); err != nil {
			t.Fatal(err)
		}
	}
	slot1, slot2 := enginetest.T0.Add(time.Second), enginetest.T0.Add(2*time.Second)

	at(100 * ms)
	a := enginetest.MustAllowN(t, e, key, l, 3)
	at(600 * ms)
	b := enginetest.MustAllowN(t, e, key, l, 4)
	for name, r := range map[string]engine.Result{"a": a, "b": b} {
		if !r.Allowed || !r.Entry.At.Equal(slot1) || r.Entry.Seq != 1 || !r.Entry.Shared || r.At.Equal(slot1) {
			t.Fatalf("%s: %+v, want admitted at its time, recorded at the slot's end %s, seq 1, shared", name, r, slot1)
		}
	}
	if !a.At.Equal(enginetest.T0.Add(100*ms)) || a.Entry.Cost != 3 || b.Entry.Cost != 4 || b.Remaining != 3 {
		t.Fatalf("a %+v, b %+v; want a at T0+100ms of cost 3, b of cost 4 with 3 remaining", a, b)
	}
	entries("two requests of one slot", inspect.Entry{At: slot1, Cost: 7})

	at(700 * ms)
	remaining("before the refund", 3)
	refund(a)
	remaining("after refunding a's 3", 6)
	entries("after refunding a", inspect.Entry{At: slot1, Cost: 4})
	refund(a) // again: it gives back again, from b's events
	remaining("after refunding a again", 9)
	refund(a) // the entry holds 1: it goes to 0, not below
	remaining("after refunding a a third time", 10)
	entries("the slot's entry refunded in full", inspect.Entry{At: slot1, Cost: 0})
	if log, err := inspect.Read(ctx, c, enginetest.Prefix+key, 0); err != nil || log.Events != 0 {
		t.Fatalf("Inspect: %+v, %v; want 0 events", log, err)
	}
	refund(b) // nothing left to give
	remaining("after refunding b", 10)

	// The slot's entry carries no events: a new request of the slot takes a new entry.
	at(800 * ms)
	d := enginetest.MustAllowN(t, e, key, l, 2)
	if !d.Entry.At.Equal(slot1) || d.Entry.Seq != 2 {
		t.Fatalf("a request of a refunded slot: %+v, want seq 2 at %s", d, slot1)
	}
	entries("a new entry beside the refunded one", inspect.Entry{At: slot1, Cost: 0}, inspect.Entry{At: slot1, Cost: 2})

	// Settle gives back Cost - actual, from the request's own slot.
	at(1200 * ms)
	s := enginetest.MustAllowN(t, e, key, l, 5)
	if !s.Entry.At.Equal(slot2) || s.Entry.Seq != 1 || s.Remaining != 3 {
		t.Fatalf("the next slot: %+v, want seq 1 at %s, 3 remaining", s, slot2)
	}
	if err := e.Settle(ctx, key, s, 2); err != nil {
		t.Fatal(err)
	}
	remaining("after settling 5 to 2", 6)
	entries("after settling 5 to 2", inspect.Entry{At: slot1, Cost: 0}, inspect.Entry{At: slot1, Cost: 2}, inspect.Entry{At: slot2, Cost: 2})
	if err := e.Settle(ctx, key, d, 1); err != nil {
		t.Fatal(err)
	}
	remaining("after settling d 2 to 1", 7)
	// RetryAfter counts from the slot's end: the +1s slot's event leaves at +11s.
	at(1500 * ms)
	full := enginetest.MustAllowN(t, e, key, l, 8)
	if full.Allowed || full.RetryAfter != 11*time.Second-1500*ms {
		t.Fatalf("8 with 7 room: %+v, want denied until the +1s slot leaves at +11s", full)
	}
}

// debugRes logs every operation of TestResolutionAgainstModel, for debugging.
const debugRes = false

// Resolution slots and calendar counters on a 3-primary cluster, batched per primary: keys
// over every slot, each asked more often than its Max by 64 goroutines over 4 clients. Per
// key, exactly Max is admitted (never more, no denial under Max), and the log holds what was
// admitted: the slot entries' events, or the period's counter.
func TestClusterQuotasExactPerKey(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	c := valkeytest.NewCluster(t, 3, 0)
	es := clusterEngines(t, c, 4)
	ctx := context.Background()
	// A calendar period that does not end during the test.
	calendar := engine.Calendar(5, engine.Month, time.UTC)
	if _, end := calendar.PeriodAt(time.Now()); time.Until(end) < 10*time.Minute {
		calendar = engine.Calendar(5, engine.Year, time.UTC)
	}
	slotted := engine.Limit{Max: 5, Window: time.Hour, Resolution: time.Minute}
	policies := []engine.Policy{
		{slotted},
		{calendar},
		{engine.Limit{Max: 50, Window: time.Second, Resolution: 100 * time.Millisecond}, calendar},
		{engine.PerMinute(100), calendar},
	}
	const numKeys, perKey, max = 400, 8, 5
	keys := make([]string, numKeys)
	for i := range keys {
		keys[i] = "quota-cluster:" + uuid.NewString()
	}
	var allowed, denied [numKeys]atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := 0; g < 64; g++ {
		e := es[g%len(es)]
		wg.Go(func() {
			for n := next.Add(1) - 1; n < numKeys*perKey; n = next.Add(1) - 1 {
				i := int(n % numKeys)
				r, err := e.AllowPolicy(ctx, keys[i], policies[i%len(policies)], 1)
				switch {
				case err != nil:
					errs <- err
					return
				case r.Allowed:
					allowed[i].Add(1)
				default:
					denied[i].Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	reader := c.Client(t, valkey.ClientOption{})
	for i, k := range keys {
		if a, d := allowed[i].Load(), denied[i].Load(); a != max || d != perKey-max {
			t.Fatalf("key %s (%v): %d admitted, %d denied; want %d, %d", k, policies[i%len(policies)], a, d, max, perKey-max)
		}
		log, err := inspect.Read(ctx, reader, enginetest.Prefix+k, 0)
		if err != nil {
			t.Fatal(err)
		}
		p := policies[i%len(policies)]
		hasCalendar, hasSliding := false, false
		for _, l := range p {
			hasCalendar = hasCalendar || l.IsCalendar()
			hasSliding = hasSliding || !l.IsCalendar()
		}
		if hasSliding && log.Events != max {
			t.Fatalf("key %s (%v): the log holds %d events, want %d", k, p, log.Events, max)
		}
		if hasCalendar && (len(log.Periods) != 1 || log.Periods[0].Events != max || log.Layout != 5) {
			t.Fatalf("key %s (%v): periods %+v layout %d, want one period of %d events, layout 5", k, p, log.Periods, log.Layout, max)
		}
		if p[0] == slotted && log.Count > 2 {
			t.Fatalf("key %s (%v): %d entries for a minute's slots within seconds, want at most 2", k, p, log.Count)
		}
	}
}

// quotaChildEnv, when set, makes TestQuotasAcrossProcessesNeverOverAdmit a child: it decides on the keys its
// value names until its time is up, and prints every decision.
const quotaChildEnv = "STRICTRATE_TEST_QUOTA_CHILD"

// The quota scenarios of TestQuotasAcrossProcessesNeverOverAdmit: a limit with a resolution, with weighted
// costs; and a sliding limit beside a calendar one, in one policy.
var (
	quotaSlotted = engine.Limit{Max: 40, Window: 300 * time.Millisecond, Resolution: 50 * time.Millisecond}
	quotaSliding = engine.Limit{Max: 30, Window: 200 * time.Millisecond}
)

// quotaCalendar is a calendar limit whose period does not end in the next ten minutes.
func quotaCalendar() engine.Limit {
	l := engine.Calendar(100, engine.Day, time.UTC)
	if _, end := l.PeriodAt(time.Now()); time.Until(end) < 10*time.Minute {
		l = engine.Calendar(100, engine.Year, time.UTC)
	}
	return l
}

// quotaDecision is one decision a child printed: on key "slotted" or "calendar", admitted or
// not, at the server's time, of cost n.
type quotaDecision struct {
	key     string
	allowed bool
	at      int64
	n       int
}

// Three OS processes (this test binary run again), each with 2 clients and 16 goroutines,
// decide 40 times each, for 1.5 s at least and until the calendar is full, on two shared
// keys, on the server's clock: a limit with a resolution, and
// a policy of a sliding limit and a calendar one. Audited on the decisions' times: no
// trailing window holds more than Max, every denial of the slotted limit is one the exact log
// would have given within a resolution of it, and the calendar's counter holds exactly the
// events admitted, at most its Max, and is full by the end.
func TestQuotasAcrossProcessesNeverOverAdmit(t *testing.T) {
	if spec := os.Getenv(quotaChildEnv); spec != "" {
		runQuotaChild(t, spec)
		return
	}
	valkeytest.SkipIfShort(t, "starts OS processes")
	slotted, calendarKey := exampleKey("quota-procs-slotted"), exampleKey("quota-procs-calendar")
	cal := quotaCalendar()
	decisions := childDecisions(t, 3, "TestQuotasAcrossProcessesNeverOverAdmit",
		func(p int) string { return quotaChildEnv + "=" + slotted + " " + calendarKey + " " + fmt.Sprint(p) },
		func(line string) (d quotaDecision, ok bool) {
			var verdict string
			_, err := fmt.Sscanf(line, "decision %s %s %d %d", &d.key, &verdict, &d.at, &d.n)
			d.allowed = verdict == "admitted"
			return d, err == nil
		})
	if t.Failed() {
		return
	}
	byKey := map[string][]quotaDecision{}
	for _, d := range decisions {
		byKey[d.key] = append(byKey[d.key], d)
	}
	for _, k := range []string{"slotted", "calendar"} {
		slices.SortFunc(byKey[k], func(a, b quotaDecision) int { return int(a.at - b.at) })
	}
	w, g := quotaSlotted.Window.Microseconds(), quotaSlotted.Resolution.Microseconds()
	auditWindows(t, "slotted", byKey["slotted"], w, quotaSlotted.Max, g)
	auditWindows(t, "calendar", byKey["calendar"], quotaSliding.Window.Microseconds(), quotaSliding.Max, -1)

	admitted := 0
	for _, d := range byKey["calendar"] {
		if d.allowed {
			admitted += d.n
		}
	}
	log, err := inspect.Read(context.Background(), exampleClient(), enginetest.Prefix+calendarKey, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(log.Periods) != 1 || log.Periods[0].Events != admitted || admitted != cal.Max {
		t.Fatalf("calendar: %d events admitted, counters %+v; want the counter to hold exactly the %d admitted, and %d",
			admitted, log.Periods, admitted, cal.Max)
	}
	t.Logf("%d decisions by 3 processes: slotted %d, calendar %d (%d admitted)", len(decisions),
		len(byKey["slotted"]), len(byKey["calendar"]), admitted)
}

// auditWindows checks decisions sorted by time against a limit of max per window w (µs): no
// admission sees more than max admitted in (t-w, t]; with g >= 0, every denial at t of n sees
// more than max-n admitted in (t-w-g, t] (the exact log would have denied it at t-g).
func auditWindows(t *testing.T, name string, ds []quotaDecision, w int64, max int, g int64) {
	t.Helper()
	var adm []quotaDecision
	denials := 0
	for _, d := range ds {
		if d.allowed {
			adm = append(adm, d)
		}
	}
	sumIn := func(from, to int64) int { // admitted events with from < at <= to
		s := 0
		for _, a := range adm {
			if a.at > from && a.at <= to {
				s += a.n
			}
		}
		return s
	}
	for _, d := range ds {
		switch {
		case d.allowed:
			if s := sumIn(d.at-w, d.at); s > max {
				t.Fatalf("%s: %d events admitted in the window ending at %d, over %d", name, s, d.at, max)
			}
		case g >= 0:
			denials++
			if s := sumIn(d.at-w-g, d.at); s+d.n <= max {
				t.Fatalf("%s: a denial of %d at %d with %d admitted within a window and a resolution before it: a false denial", name, d.n, d.at, s)
			}
		default:
			denials++
		}
	}
	if len(adm) == 0 || denials == 0 {
		t.Fatalf("%s: %d admissions and %d denials: the audit saw no contention", name, len(adm), denials)
	}
}

// runQuotaChild is a child of TestQuotasAcrossProcessesNeverOverAdmit: spec is the two keys and its number.
func runQuotaChild(t *testing.T, spec string) {
	var slotted, calendarKey string
	var id uint64
	if _, err := fmt.Sscanf(spec, "%s %s %d", &slotted, &calendarKey, &id); err != nil {
		t.Fatal(err)
	}
	policy := engine.Policy{quotaSliding, quotaCalendar()}
	var engines []*engine.Engine
	for range 2 {
		e, err := engine.New(exampleClient())
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
	}
	ctx := context.Background()
	// 40 calls each, for 1.5 s at least, and until the calendar is full: a denial that waits
	// past the sliding window is the calendar's.
	var full atomic.Bool
	until := runFor{calls: 40, span: 1500 * time.Millisecond, more: func() bool { return !full.Load() }}
	ds := decideMany(t, engines, 16, until, id, func(rng *rand.Rand, e *engine.Engine) (quotaDecision, time.Time, error) {
		d := quotaDecision{key: "slotted", n: 1 + rng.IntN(3)}
		var r engine.Result
		var err error
		if rng.IntN(2) == 0 {
			r, err = e.AllowN(ctx, slotted, quotaSlotted, d.n)
		} else {
			d.key, d.n = "calendar", 1
			r, err = e.AllowPolicy(ctx, calendarKey, policy, d.n)
			if err == nil && !r.Allowed && r.RetryAfter > quotaSliding.Window {
				full.Store(true)
			}
		}
		d.allowed, d.at = r.Allowed, r.At.UnixMicro()
		return d, r.At, err
	})
	out := bufio.NewWriter(os.Stdout)
	for _, d := range ds {
		verdict := "denied"
		if d.allowed {
			verdict = "admitted"
		}
		fmt.Fprintf(out, "decision %s %s %d %d\n", d.key, verdict, d.at, d.n)
	}
	out.Flush()
}
