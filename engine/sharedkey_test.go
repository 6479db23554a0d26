package engine_test

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
)

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
				t.Fatalf("PTTL %d ms: the key would go before the hour limit's window ends", ms)
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
		t.Fatalf("the hour limit of 2 admitted a request with 3 events in its window: %+v", r)
	}
	time.Sleep(120 * time.Millisecond) // past the short window and its expiry
	if r := enginetest.MustAllowN(t, e, key, long, 1); r.Allowed {
		t.Fatalf("the hour limit of 2 admitted once the short window's expiry passed: %+v", r)
	}
}

// 32 goroutines over 4 clients, batched and not, decide on one key by three single limits and
// a policy of two, picked at random per call, once a first decision has asked every window of
// the key: audited on the server's timestamps, every admission keeps every window of its
// limits within Max counting all the key's events, and every denial had a limit without room.
func TestLimitsSharingAKeyUnderConcurrency(t *testing.T) {
	a := engine.Limit{Max: 5, Window: 20 * time.Millisecond}
	b := engine.Limit{Max: 40, Window: 200 * time.Millisecond}
	c := engine.Limit{Max: 100, Window: 2 * time.Second}
	choices := [][]engine.Limit{{a}, {b}, {c}, {a, c}}
	for _, batching := range []bool{false, true} {
		t.Run(fmt.Sprint("batching ", batching), func(t *testing.T) {
			es, _ := enginetest.Engines(t, exampleServer, 4, engine.WithBatching(batching))
			key := enginetest.NewKey(t)
			var mu sync.Mutex
			// The key's first decision counts every window the test asks: from then on the
			// key keeps what each of them counts (a limit first asked of a key later counts
			// only what the key kept for the longest window asked before).
			first, err := es[0].AllowPolicy(context.Background(), key, engine.Policy{a, b, c}, 1)
			if err != nil || !first.Allowed {
				t.Fatalf("the first decision: %+v, %v", first, err)
			}
			ds := []sharedDecision{{at: first.At.UnixMicro(), seq: first.Entry.Seq, cost: 1, limits: []engine.Limit{a, b, c}, allowed: true}}
			var wg sync.WaitGroup
			deadline := time.Now().Add(1500 * time.Millisecond)
			errs := make(chan error, 32)
			for g := 0; g < 32; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rng := rand.New(rand.NewPCG(uint64(g), 22))
					e := es[g%len(es)]
					for time.Now().Before(deadline) {
						limits := choices[rng.IntN(len(choices))]
						n := 1 + rng.IntN(3)
						var r engine.Result
						var err error
						if len(limits) == 1 {
							r, err = e.AllowN(context.Background(), key, limits[0], n)
						} else {
							r, err = e.AllowPolicy(context.Background(), key, engine.Policy(limits), n)
						}
						if err != nil {
							errs <- err
							return
						}
						mu.Lock()
						ds = append(ds, sharedDecision{at: r.At.UnixMicro(), seq: r.Entry.Seq, cost: n, limits: limits, allowed: r.Allowed})
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			admitted := auditShared(t, ds)
			t.Logf("%d decisions; admissions by limit: %v", len(ds), admitted)
			if admitted[c] == 0 || admitted[a] == 0 {
				t.Fatalf("admissions by limit %v: a limit never admitted, the audit proves little", admitted)
			}
		})
	}
}
