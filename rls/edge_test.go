package rls_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/rls"
	"github.com/strictrate/strictrate/rls/config"
)

// overridden is d with a limit override (descriptor.limit, set by Envoy's route) of n per unit.
func overridden(d *rlv3.RateLimitDescriptor, n uint32, unit typev3.RateLimitUnit) *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: d.Entries, Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: unit}}
}

// One request may carry the same descriptor more than once, with and without a limit override
// of the rule's unit: every one counts on the rule's counter and is judged against its own
// limit with the hits of all of them, and the request is decided whole, never refused for
// naming a counter twice.
func TestSameDescriptorTwice(t *testing.T) {
	r := start(t, enginetest.New(t, server.Client(t)), basicConfig)
	c := r.client
	plain := descriptor("five_per_minute", "twice")
	two := overridden(plain, 2, typev3.RateLimitUnit_MINUTE)
	key := r.key("edge", "five_per_minute", "twice")
	resp := ask(t, c, "edge", 0, plain, two, two)
	wantCode(t, "3 hits on the key, against 5 and twice 2", resp, over, ok, over, over)
	if got := enginetest.StoredEvents(t, server.Client(t), key); got != 0 {
		t.Fatalf("a denied request left %d events", got)
	}
	resp = ask(t, c, "edge", 0, plain, two)
	wantCode(t, "2 hits on the key, against 5 and 2", resp, ok, ok, ok)
	if got, want := []uint32{resp.Statuses[0].LimitRemaining, resp.Statuses[1].LimitRemaining}, []uint32{3, 0}; !slices.Equal(got, want) {
		t.Fatalf("remaining %v, want %v (each limit less the key's 2 events)", got, want)
	}
	wantCode(t, "the override is used up", ask(t, c, "edge", 0, plain, two), over, ok, over)
	wantCode(t, "the plain descriptor twice", ask(t, c, "edge", 0, plain, plain), ok, ok, ok)
	wantCode(t, "the plain descriptor twice, over", ask(t, c, "edge", 0, plain, plain), over, over, over)
	wantCode(t, "the plain descriptor's last", ask(t, c, "edge", 0, plain), ok, ok)
	if got := enginetest.StoredEvents(t, server.Client(t), key); got != 5 {
		t.Fatalf("the key holds %d events, want 5", got)
	}
}

// A request's override of the rule's unit counts on the rule's counter, whichever comes
// first in a request or across requests: under 10 per minute, 10 plain requests and 10
// requests carrying the descriptor twice, once with a 1,000-per-minute override, admit 10
// events in all (the reference: 10), in either order. An override of another unit counts on a
// key of its own, named by its unit.
func TestOverrideSharesTheRulesCounter(t *testing.T) {
	r := start(t, enginetest.New(t, server.Client(t)), basicConfig)
	events := func(kv ...string) int64 {
		return enginetest.StoredEvents(t, server.Client(t), r.key("edge", kv...))
	}
	for _, tc := range []struct {
		name         string
		plainFirst   bool
		overrideLast bool // within a request carrying both
	}{
		{"plain requests first, the override last", true, true},
		{"plain requests first, the override first", true, false},
		{"the pairs first, the override last", false, true},
		{"the pairs first, the override first", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plain := descriptor("ten_per_minute", tc.name)
			loose := overridden(plain, 1000, typev3.RateLimitUnit_MINUTE)
			pair := []*rlv3.RateLimitDescriptor{loose, plain}
			if tc.overrideLast {
				pair = []*rlv3.RateLimitDescriptor{plain, loose}
			}
			admitted := 0
			plains := func() {
				for range 10 {
					if ask(t, r.client, "edge", 0, plain).OverallCode == ok {
						admitted++
					}
				}
			}
			pairs := func() {
				for range 10 {
					if ask(t, r.client, "edge", 0, pair...).OverallCode == ok {
						admitted += 2
					}
				}
			}
			if tc.plainFirst {
				plains()
				pairs()
			} else {
				pairs()
				plains()
			}
			if admitted != 10 {
				t.Fatalf("%d events admitted in the minute, want 10", admitted)
			}
			if got := events("ten_per_minute", tc.name); got != 10 {
				t.Fatalf("the rule's counter holds %d events, want 10", got)
			}
		})
	}

	t.Run("another unit", func(t *testing.T) {
		plain := descriptor("ten_per_minute", "hourly")
		hourly := overridden(plain, 5, typev3.RateLimitUnit_HOUR)
		for i := range 10 {
			wantCode(t, fmt.Sprintf("plain %d", i+1), ask(t, r.client, "edge", 0, plain), ok, ok)
		}
		for i := range 5 {
			wantCode(t, fmt.Sprintf("5 per hour, %d", i+1), ask(t, r.client, "edge", 0, hourly), ok, ok)
		}
		wantCode(t, "5 per hour, sixth", ask(t, r.client, "edge", 0, hourly), over, over)
		wantCode(t, "both", ask(t, r.client, "edge", 0, hourly, plain), over, over, over)
		if got := events("ten_per_minute", "hourly"); got != 10 {
			t.Fatalf("the rule's counter holds %d events, want 10", got)
		}
		hourKey := r.key("edge", "ten_per_minute", "hourly") + "hour"
		if got := enginetest.StoredEvents(t, server.Client(t), hourKey); got != 5 {
			t.Fatalf("the hour override's counter %q holds %d events, want 5", hourKey, got)
		}
	})
}

// Concurrent requests on a 10-per-minute rule, some plain, some carrying the descriptor twice
// (once with a 1,000-per-minute override of the rule's unit, in either order), admit at most
// 10 events in all, and the rule's counter holds exactly what was admitted.
func TestOverrideBesideTheRuleUnderConcurrency(t *testing.T) {
	r := start(t, enginetest.New(t, server.Client(t)), basicConfig)
	plain := descriptor("ten_per_minute", "concurrent")
	loose := overridden(plain, 1000, typev3.RateLimitUnit_MINUTE)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 10 {
				ds := [][]*rlv3.RateLimitDescriptor{{plain}, {plain, loose}, {loose, plain}}[(g+i)%3]
				resp, err := askCtx(context.Background(), r.client, "edge", ds...)
				if err != nil {
					t.Error(err)
					return
				}
				if resp.OverallCode == ok {
					admitted.Add(int64(len(ds)))
				}
			}
		})
	}
	wg.Wait()
	if got := admitted.Load(); got > 10 || got < 9 {
		t.Fatalf("%d events admitted in the minute, want at most 10 (and at least 9: denials only when full)", got)
	}
	if got := enginetest.StoredEvents(t, server.Client(t), r.key("edge", "ten_per_minute", "concurrent")); got != admitted.Load() {
		t.Fatalf("the rule's counter holds %d events, %d were admitted", got, admitted.Load())
	}
}

// Concurrent requests of 80 descriptors each, over 100 values of a 3-per-minute rule, never
// admit more than 3 on any value, and each counter holds exactly what was admitted on it.
func TestManyDescriptorsUnderConcurrency(t *testing.T) {
	r := start(t, enginetest.New(t, server.Client(t)), basicConfig)
	pool := manyDescriptors("pool", 100)
	var mu sync.Mutex
	admitted := make([]int64, len(pool))
	var wg sync.WaitGroup
	for g := range 8 {
		rng := rand.New(rand.NewPCG(uint64(g), 23))
		wg.Go(func() {
			for range 6 {
				picked := rng.Perm(len(pool))[:80]
				ds := make([]*rlv3.RateLimitDescriptor, len(picked))
				for i, v := range picked {
					ds[i] = pool[v]
				}
				resp, err := askCtx(context.Background(), r.client, "edge", ds...)
				if err != nil {
					t.Error(err)
					return
				}
				if resp.OverallCode == ok {
					mu.Lock()
					for _, v := range picked {
						admitted[v]++
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	for v, n := range admitted {
		if n > 3 {
			t.Fatalf("value %d: %d admitted, want at most 3", v, n)
		}
		if got := enginetest.StoredEvents(t, server.Client(t), r.key("edge", "three_per_minute", fmt.Sprintf("pool-%d", v))); got != n {
			t.Fatalf("value %d: the counter holds %d events, %d were admitted", v, got, n)
		}
	}
}

// manyDescriptors is n descriptors of the rule three_per_minute, each of a value of its own.
func manyDescriptors(prefix string, n int) []*rlv3.RateLimitDescriptor {
	ds := make([]*rlv3.RateLimitDescriptor, n)
	for i := range ds {
		ds[i] = descriptor("three_per_minute", fmt.Sprintf("%s-%d", prefix, i))
	}
	return ds
}

// A request of more limited descriptors than one engine call carries (65, 200) is decided
// whole: with one of them used up, wherever it lies, the request is OVER_LIMIT (the reference
// answers so; an error would let Envoy admit it) and nothing is recorded; with room, OK and
// every descriptor counted.
func TestManyDescriptors(t *testing.T) {
	r := start(t, enginetest.New(t, server.Client(t)), basicConfig)
	client := server.Client(t)
	for _, tc := range []struct{ n, full int }{{65, 64}, {65, 0}, {200, 130}, {200, 199}} {
		name := fmt.Sprintf("%d-%d", tc.n, tc.full)
		ds := manyDescriptors(name, tc.n)
		for range 3 {
			wantCode(t, name+": using one up", ask(t, r.client, "edge", 0, ds[tc.full]), ok, ok)
		}
		resp, err := askCtx(context.Background(), r.client, "edge", ds...)
		if err != nil {
			t.Fatalf("%d descriptors, one used up: %v, want OVER_LIMIT", tc.n, err)
		}
		wantCode(t, name, resp, over)
		for i, st := range resp.Statuses {
			if i == tc.full {
				if st.Code != over {
					t.Fatalf("%d descriptors: the used-up one: %v, want OVER_LIMIT", tc.n, st)
				}
				continue
			}
			if st.Code != ok || st.LimitRemaining != 3 {
				t.Fatalf("%d descriptors: status %d: %v, want OK with all 3 left", tc.n, i, st)
			}
			if got := enginetest.StoredEvents(t, client, r.key("edge", "three_per_minute", fmt.Sprintf("%s-%d", name, i))); got != 0 {
				t.Fatalf("%d descriptors: descriptor %d's counter holds %d events after a denial", tc.n, i, got)
			}
		}

		fresh := manyDescriptors(name+"-fresh", tc.n)
		resp = ask(t, r.client, "edge", 0, fresh...)
		wantCode(t, name+" with room", resp, ok)
		for i := range fresh {
			if st := resp.Statuses[i]; st.Code != ok || st.LimitRemaining != 2 {
				t.Fatalf("%d descriptors with room: status %d: %v", tc.n, i, st)
			}
			if got := enginetest.StoredEvents(t, client, r.key("edge", "three_per_minute", fmt.Sprintf("%s-fresh-%d", name, i))); got != 1 {
				t.Fatalf("%d descriptors with room: descriptor %d's counter holds %d events", tc.n, i, got)
			}
		}
	}
}

// A limit override whose unit the service does not know (UNKNOWN, or a number that names no
// unit) is ignored, the configured rule applies, and the request is decided, not refused: a
// used-up descriptor beside it still denies. An override of unit 7 is a week, as the
// reference reads it.
func TestOverrideWithUnknownUnit(t *testing.T) {
	r := start(t, enginetest.New(t, server.Client(t)), basicConfig)
	full := descriptor("one_per_minute", "unknown-unit")
	wantCode(t, "using it up", ask(t, r.client, "edge", 0, full), ok, ok)
	for _, unit := range []typev3.RateLimitUnit{typev3.RateLimitUnit_UNKNOWN, 8, -1} {
		name := fmt.Sprint("unit ", int32(unit))
		odd := overridden(descriptor("three_per_minute", name), 1000, unit)
		resp, err := askCtx(context.Background(), r.client, "edge", odd, full)
		if err != nil {
			t.Fatalf("%s beside a used-up descriptor: %v, want OVER_LIMIT", name, err)
		}
		wantCode(t, name+" beside a used-up descriptor", resp, over, ok, over)
		for i := range 3 {
			resp := ask(t, r.client, "edge", 0, odd)
			wantCode(t, fmt.Sprintf("%s alone, %d", name, i+1), resp, ok, ok)
			if l := resp.Statuses[0].CurrentLimit; l.GetRequestsPerUnit() != 3 || l.GetUnit() != pb.RateLimitResponse_RateLimit_MINUTE {
				t.Fatalf("%s: current_limit %v, want the rule's 3 per minute", name, l)
			}
		}
		wantCode(t, name+" alone, fourth", ask(t, r.client, "edge", 0, odd), over, over)
	}
	weekly := overridden(descriptor("three_per_minute", "weekly"), 1, 7)
	resp := ask(t, r.client, "edge", 0, weekly)
	wantCode(t, "1 per week", resp, ok, ok)
	if l := resp.Statuses[0].CurrentLimit; l.GetRequestsPerUnit() != 1 || l.GetUnit() != pb.RateLimitResponse_RateLimit_WEEK {
		t.Fatalf("unit 7: current_limit %v, want 1 per week", l)
	}
	wantCode(t, "1 per week, second", ask(t, r.client, "edge", 0, weekly), over, over)
}

// The configuration refuses exactly the rules the engine cannot decide: its largest
// requests_per_unit is the engine's largest limit.
func TestMaxRequestsPerUnitIsTheEngines(t *testing.T) {
	if config.MaxRequestsPerUnit != engine.MaxEvents {
		t.Fatalf("config.MaxRequestsPerUnit %d, engine.MaxEvents %d", config.MaxRequestsPerUnit, engine.MaxEvents)
	}
}

// A configured rule cannot be larger than engine.MaxEvents (the configuration is refused), but
// a request's override can: it is decided against engine.MaxEvents, so hits beyond that are
// over the limit, never an error and never more than asked.
func TestHugeOverride(t *testing.T) {
	c, _ := newService(t, basicConfig, nil)
	d := overridden(descriptor("ten_per_minute", "huge"), math.MaxUint32, typev3.RateLimitUnit_HOUR)
	wantCode(t, "1 hit", ask(t, c, "edge", 1, d), ok, ok)
	resp, err := askCtx(context.Background(), c, "edge", withHits(d, 3_000_000_000))
	if err != nil {
		t.Fatalf("3e9 hits: %v", err)
	}
	wantCode(t, "3e9 hits", resp, over, over)
	if l := resp.Statuses[0].CurrentLimit.GetRequestsPerUnit(); l != math.MaxUint32 {
		t.Fatalf("current_limit %d, want the override's %d", l, uint32(math.MaxUint32))
	}
	wantCode(t, fmt.Sprint(engine.MaxEvents-1, " hits"), ask(t, c, "edge", 0, withHits(d, engine.MaxEvents-1)), ok, ok)
	wantCode(t, "one more", ask(t, c, "edge", 0, d), over, over)
}

// Under fail-open with Valkey down, a descriptor whose hits exceed its rule is still over the
// limit (that needs no count), and the request with it is denied.
func TestFailOpenStillDeniesTheImpossible(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	r := start(t, enginetest.New(t, own.Client(t), engine.WithFailOpen(true)), basicConfig)
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	askDown := func(ds ...*rlv3.RateLimitDescriptor) *pb.RateLimitResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		resp, err := askCtx(ctx, r.client, "edge", ds...)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := askDown(withHits(descriptor("three_per_minute", "x"), 4), descriptor("ten_per_minute", "x"))
	wantCode(t, "4 hits against 3, Valkey down", resp, over, over, ok)
	resp = askDown(withHits(descriptor("three_per_minute", "x"), 3))
	wantCode(t, "3 hits against 3, Valkey down", resp, ok, ok)
	if got := resp.Statuses[0].LimitRemaining; got != 3 {
		t.Fatalf("fail-open: remaining %d, want 3", got)
	}
}

// Under fail-open, a client's short deadline never buys an OK past a used-up limit: 2,000
// requests with deadlines of 0.1 to 3 ms on a descriptor at 3 per minute, used up, Valkey
// healthy: none answered OK. With Valkey stopped, a request without a deadline is admitted
// once the request timeout (the service's bound on Valkey's answer) passes, and one with a
// deadline is not.
func TestFailOpenShortDeadlinesNeverAdmit(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	e := enginetest.New(t, own.Client(t), engine.WithFailOpen(true))
	r := start(t, e, basicConfig, rls.WithRequestTimeout(50*time.Millisecond))
	d := descriptor("three_per_minute", "victim")
	for range 3 {
		wantCode(t, "filling", ask(t, r.client, "edge", 0, d), ok, ok)
	}
	var okAnswers, over, failed atomic.Int64
	var wg sync.WaitGroup
	const calls = 2000
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < calls; i += 16 {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Microsecond+time.Duration(i%30)*100*time.Microsecond)
				resp, err := askCtx(ctx, r.client, "edge", d)
				cancel()
				switch {
				case err != nil:
					failed.Add(1)
				case resp.OverallCode == ok:
					okAnswers.Add(1)
				default:
					over.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if okAnswers.Load() != 0 {
		t.Fatalf("%d of %d requests with deadlines of 0.1-3 ms answered OK on a used-up descriptor (%d over, %d failed); want 0",
			okAnswers.Load(), calls, over.Load(), failed.Load())
	}

	if err := own.Pause(); err != nil {
		t.Fatal(err)
	}
	defer own.Resume()
	fresh := descriptor("three_per_minute", "fresh")
	resp, err := askCtx(context.Background(), r.client, "edge", fresh)
	if err != nil || resp.OverallCode != ok {
		t.Fatalf("Valkey stopped, a request without a deadline: %v, %v; want OK once the request timeout passed (fail-open)", resp, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if resp, err := askCtx(ctx, r.client, "edge", fresh); err == nil {
		t.Fatalf("Valkey stopped, a request whose 20 ms deadline passed: %v; want an error, not an admission", resp)
	}
}
