package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// AllowAll decides several keys all or nothing. These tests read the logs back (Inspect) to
// see what each decision left there, and audit concurrent runs on the times the decisions were
// taken (Result.At): per key, never more than Max in any trailing window, and what the log
// holds is exactly what callers were told was admitted.

// mustAllowAll returns e.AllowAll's answer, and fails t on an error.
func mustAllowAll(t *testing.T, e *engine.Engine, reqs ...engine.Request) (bool, []engine.Result) {
	t.Helper()
	allowed, results, err := e.AllowAll(context.Background(), reqs)
	if err != nil {
		t.Fatalf("AllowAll: %v", err)
	}
	if len(results) != len(reqs) {
		t.Fatalf("AllowAll: %d results for %d requests, want one each", len(results), len(reqs))
	}
	return allowed, results
}

// logOf reads key's log under the default prefix.
func logOf(t *testing.T, c valkey.Client, key string) inspect.Log {
	t.Helper()
	return enginetest.Log(t, c, enginetest.Prefix, key)
}

// A request that one key denies records nothing on the others; their Results say they had
// room, as a peek does. A later request then fits exactly the room left, no more, and its
// entries are real ones (Refund gives their room back).
func TestAllowAllDenialRecordsNothing(t *testing.T) {
	c := exampleServer.Client(t)
	e, _ := enginetest.Clocked(t, c)
	a, b, full := enginetest.NewKey(t), enginetest.NewKey(t), enginetest.NewKey(t)
	pa := engine.Policy{engine.PerMinute(5)}
	pb := engine.Policy{engine.PerSecond(2), engine.PerMinute(10)}
	pfull := engine.Policy{engine.PerMinute(3)}
	enginetest.MustAllowPolicy(t, e, full, pfull, 3)

	allowed, rs := mustAllowAll(t, e,
		engine.Request{Key: a, Policy: pa, N: 2},
		engine.Request{Key: b, Policy: pb, N: 1},
		engine.Request{Key: full, Policy: pfull, N: 1})
	enginetest.Want(t, "denied: allowed", allowed, false)
	for i, want := range []struct {
		allowed   bool
		remaining int
	}{{true, 5}, {true, 2}, {false, 0}} {
		r := rs[i]
		if r.Allowed != want.allowed || r.Remaining != want.remaining || !r.Entry.IsZero() || !r.At.Equal(enginetest.T0) {
			t.Fatalf("denied group, result %d: %+v; want Allowed %v, Remaining %d, no entry, At T0", i, r, want.allowed, want.remaining)
		}
	}
	enginetest.Want(t, "the full key's retry after", rs[2].RetryAfter, time.Minute)
	for _, k := range []string{a, b} {
		if l := logOf(t, c, k); l.Layout != 0 || l.Events != 0 {
			t.Fatalf("key %s after a denied group: %+v, want no log", k, l)
		}
	}
	enginetest.Want(t, "the full key's events", logOf(t, c, full).Events, 3)

	// The room left on a is 5, on b 2 this second.
	allowed, rs = mustAllowAll(t, e, engine.Request{Key: a, Policy: pa, N: 5}, engine.Request{Key: b, Policy: pb, N: 2})
	enginetest.Want(t, "the room left: allowed", allowed, true)
	for i, r := range rs {
		if !r.Allowed || r.Remaining != 0 || r.Entry.IsZero() {
			t.Fatalf("admitted group, result %d: %+v; want admitted, 0 remaining, an entry", i, r)
		}
	}
	enginetest.Want(t, "a's events", logOf(t, c, a).Events, 5)
	enginetest.Want(t, "b's events", logOf(t, c, b).Events, 2)
	allowed, _ = mustAllowAll(t, e, engine.Request{Key: a, Policy: pa, N: 1})
	enginetest.Want(t, "one more on a: allowed", allowed, false)

	if err := e.Refund(context.Background(), a, rs[0]); err != nil {
		t.Fatalf("refund of an AllowAll entry: %v", err)
	}
	enginetest.Want(t, "a's events after the refund", logOf(t, c, a).Events, 0)
	allowed, _ = mustAllowAll(t, e, engine.Request{Key: a, Policy: pa, N: 5})
	enginetest.Want(t, "after the refund, 5 on a: allowed", allowed, true)
}

// An advisory request's denial denies nothing, and records nothing; with room it is recorded
// with the group, and not when the group is denied. A cost of 0 is judged, never recorded.
func TestAllowAllAdvisoryRequestsAndChecksDenyNothing(t *testing.T) {
	c := exampleServer.Client(t)
	e, _ := enginetest.Clocked(t, c)
	a, full, shadow := enginetest.NewKey(t), enginetest.NewKey(t), enginetest.NewKey(t)
	p := engine.Policy{engine.PerMinute(3)}
	enginetest.MustAllowPolicy(t, e, full, p, 3)

	allowed, rs := mustAllowAll(t, e, engine.Request{Key: a, Policy: p, N: 1}, engine.Request{Key: full, Policy: p, N: 1, Advisory: true})
	enginetest.Want(t, "an advisory key without room: allowed", allowed, true)
	if !rs[0].Allowed || rs[0].Entry.IsZero() || rs[0].Remaining != 2 {
		t.Fatalf("the other key's result: %+v, want admitted and recorded, 2 left", rs[0])
	}
	if rs[1].Allowed || !rs[1].Entry.IsZero() || rs[1].RetryAfter != time.Minute {
		t.Fatalf("the advisory key's result: %+v, want its own denial, nothing recorded", rs[1])
	}
	enginetest.Want(t, "the advisory full key's events", logOf(t, c, full).Events, 3)

	allowed, rs = mustAllowAll(t, e, engine.Request{Key: a, Policy: p, N: 1}, engine.Request{Key: shadow, Policy: p, N: 2, Advisory: true})
	enginetest.Want(t, "an advisory key with room: allowed", allowed, true)
	if !rs[1].Allowed || rs[1].Entry.IsZero() || rs[1].Remaining != 1 {
		t.Fatalf("the advisory key with room: %+v, want recorded, 1 left", rs[1])
	}
	enginetest.Want(t, "the advisory key's events", logOf(t, c, shadow).Events, 2)

	// a holds 2 of 3: a cost of 2 denies, and the advisory key with room is not recorded.
	allowed, rs = mustAllowAll(t, e, engine.Request{Key: a, Policy: p, N: 2}, engine.Request{Key: shadow, Policy: p, N: 1, Advisory: true})
	enginetest.Want(t, "denied by a: allowed", allowed, false)
	if !rs[1].Allowed || !rs[1].Entry.IsZero() || rs[1].Remaining != 1 {
		t.Fatalf("the advisory key in a denied group: %+v, want room, nothing recorded", rs[1])
	}
	enginetest.Want(t, "the advisory key's events after a denied group", logOf(t, c, shadow).Events, 2)

	// Checks: a cost of 0 on a full key has room (nothing over Max), on a fresh key too, and
	// neither records anything.
	fresh := enginetest.NewKey(t)
	allowed, rs = mustAllowAll(t, e, engine.Request{Key: full, Policy: p, N: 0}, engine.Request{Key: fresh, Policy: p, N: 0},
		engine.Request{Key: a, Policy: p, N: 1})
	enginetest.Want(t, "checks and one request: allowed", allowed, true)
	if !rs[0].Allowed || rs[0].Remaining != 0 || !rs[0].Entry.IsZero() || !rs[1].Allowed || rs[1].Remaining != 3 || !rs[1].Entry.IsZero() {
		t.Fatalf("checks: %+v and %+v, want room, 0 and 3 left, nothing recorded", rs[0], rs[1])
	}
	if rs[2].Entry.IsZero() || rs[2].Remaining != 0 {
		t.Fatalf("the request beside the checks: %+v, want recorded, 0 left", rs[2])
	}
	enginetest.Want(t, "the checked full key's events", logOf(t, c, full).Events, 3)
	enginetest.Want(t, "the checked fresh key's layout (no log)", logOf(t, c, fresh).Layout, 0)
}

// Every invalid call is refused before anything is sent, naming the bad request: nothing is
// written on any of its keys. Pipelined mode offers no AllowAll.
func TestAllowAllRefusesInvalidCallsBeforeSending(t *testing.T) {
	c := exampleServer.Client(t)
	e := enginetest.New(t, c)
	ctx := context.Background()
	p := engine.Policy{engine.PerMinute(3)}
	a, b := enginetest.NewKey(t), enginetest.NewKey(t)
	for name, reqs := range map[string][]engine.Request{
		"none":          nil,
		"duplicate key": {{Key: a, Policy: p, N: 1}, {Key: b, Policy: p, N: 1}, {Key: a, Policy: p, N: 1}},
		"empty key":     {{Key: a, Policy: p, N: 1}, {Key: "", Policy: p, N: 1}},
		"empty policy":  {{Key: a, Policy: p, N: 1}, {Key: b, N: 1}},
		"bad limit":     {{Key: a, Policy: p, N: 1}, {Key: b, Policy: engine.Policy{{Max: 0, Window: time.Second}}, N: 1}},
		"cost over Max": {{Key: a, Policy: p, N: 1}, {Key: b, Policy: p, N: 4}},
		"negative cost": {{Key: a, Policy: p, N: 1}, {Key: b, Policy: p, N: -1}},
		"same window twice": {{Key: a, Policy: p, N: 1},
			{Key: b, Policy: engine.Policy{engine.PerMinute(3), engine.PerMinute(4)}, N: 1}},
	} {
		allowed, results, err := e.AllowAll(ctx, reqs)
		if !errors.Is(err, engine.ErrInvalidArgument) || allowed || results != nil {
			t.Fatalf("%s: %v, %v, %v; want ErrInvalidArgument and nothing else", name, allowed, results, err)
		}
	}
	var nilCtx context.Context
	if _, _, err := e.AllowAll(nilCtx, []engine.Request{{Key: a, Policy: p, N: 1}}); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Fatalf("nil context: %v, want ErrInvalidArgument", err)
	}
	for _, k := range []string{a, b} {
		enginetest.Want(t, "layout of "+k+" after refused calls", logOf(t, c, k).Layout, 0)
	}
}

// manyRequests is one request of cost n under p for each of keys.
func manyRequests(keys []string, p engine.Policy, n int) []engine.Request {
	reqs := make([]engine.Request, len(keys))
	for i, k := range keys {
		reqs[i] = engine.Request{Key: k, Policy: p, N: n}
	}
	return reqs
}

// An AllowAll of more requests than one call carries (MaxAllowAllRequests) is decided in
// several calls, and still all or nothing: with one key used up, wherever it lies (the first
// call, a call's first request, the last), the group is denied and no key holds an event;
// with room on every key, every request is recorded. A bad request in a later call is refused
// before the first call is sent.
func TestAllowAllOfManyRequestsIsAllOrNothing(t *testing.T) {
	c := exampleServer.Client(t)
	e := enginetest.New(t, c)
	const max = 3
	p := engine.Policy{engine.PerMinute(max)}
	const most = engine.MaxAllowAllRequests
	for _, tc := range []struct {
		n    int
		full int // the used-up key's index
	}{
		{most + 1, most},
		{200, 0},
		{200, most},
		{200, 2*most + 5},
		{200, 199},
	} {
		keys := make([]string, tc.n)
		for i := range keys {
			keys[i] = enginetest.NewKey(t)
		}
		enginetest.MustAllowPolicy(t, e, keys[tc.full], p, max)
		what := fmt.Sprintf("%d requests, key %d used up", tc.n, tc.full)
		allowed, rs := mustAllowAll(t, e, manyRequests(keys, p, 1)...)
		if allowed {
			t.Fatalf("%s: admitted, want the group denied", what)
		}
		for i, k := range keys {
			r := rs[i]
			if i == tc.full {
				if r.Allowed || !r.Entry.IsZero() {
					t.Fatalf("%s: the used-up key: %+v, want no room", what, r)
				}
				enginetest.Want(t, what+": the used-up key's events", logOf(t, c, k).Events, max)
				continue
			}
			if !r.Allowed || !r.Entry.IsZero() || r.Remaining != max || r.At.IsZero() {
				t.Fatalf("%s: key %d: %+v, want room, no entry, Remaining %d", what, i, r, max)
			}
			enginetest.Want(t, fmt.Sprintf("%s: events on key %d", what, i), logOf(t, c, k).Events, 0)
		}

		fresh := make([]string, tc.n)
		for i := range fresh {
			fresh[i] = enginetest.NewKey(t)
		}
		allowed, rs = mustAllowAll(t, e, manyRequests(fresh, p, 2)...)
		if !allowed {
			t.Fatalf("%d requests with room: denied, want the group admitted", tc.n)
		}
		for i, k := range fresh {
			if rs[i].Entry.IsZero() || rs[i].Remaining != max-2 {
				t.Fatalf("%d requests with room: key %d: %+v, want recorded, %d left", tc.n, i, rs[i], max-2)
			}
			enginetest.Want(t, fmt.Sprintf("%d requests with room: events on key %d", tc.n, i), logOf(t, c, k).Events, 2)
		}
	}

	keys := make([]string, 3*most)
	for i := range keys {
		keys[i] = enginetest.NewKey(t)
	}
	reqs := manyRequests(keys, p, 1)
	reqs[len(reqs)-1].N = max + 1
	if allowed, rs, err := e.AllowAll(context.Background(), reqs); !errors.Is(err, engine.ErrInvalidArgument) || allowed || rs != nil {
		t.Fatalf("a bad request in the last call: %v, %v, %v; want ErrInvalidArgument", allowed, rs, err)
	}
	for i, k := range keys {
		enginetest.Want(t, fmt.Sprintf("layout of key %d after a refused call", i), logOf(t, c, k).Layout, 0)
	}
}

// 16 goroutines over 4 clients fire AllowAlls of 100 requests each (two calls) on overlapping
// sets of keys, with far more demand than room: per key, what was recorded never exceeds Max,
// and once they are done each log holds exactly what callers were told was recorded (what a
// denied group held between its calls was given back).
func TestAllowAllOfManyRequestsNeverOverAdmits(t *testing.T) {
	es, c := enginetest.Engines(t, exampleServer, 4)
	l := engine.PerHour(10)
	p := engine.Policy{l}
	keys := make([]string, 150)
	for i := range keys {
		keys[i] = enginetest.NewKey(t)
	}
	run, ok := fireAllowAll(t, es, 16, 12, 19, func(rng *rand.Rand) []engine.Request {
		perm := rng.Perm(len(keys))[:100]
		reqs := make([]engine.Request, len(perm))
		for i, k := range perm {
			reqs[i] = engine.Request{Key: keys[k], Policy: p, N: 1 + rng.IntN(2)}
		}
		return reqs
	})
	if !ok {
		return
	}
	sums := run.audit(t, keys, l)
	t.Logf("%d calls, %d denied", run.calls, run.denials)
	for _, k := range keys {
		if sums[k] > l.Max {
			t.Fatalf("key %s: %d recorded, want at most Max %d", k, sums[k], l.Max)
		}
		enginetest.Want(t, "events in "+k+"'s log", logOf(t, c, k).Events, sums[k])
	}
	if run.denials == 0 || run.denials == run.calls {
		t.Fatalf("%d of %d groups denied: want some admitted and some denied", run.denials, run.calls)
	}
}

// allowAllRun is what a concurrent run of AllowAll told its callers.
type allowAllRun struct {
	mu       sync.Mutex
	admitted map[string][]admission // per key, what was recorded on it
	costs    map[string]int         // per key, the cost recorded on it
	sawFull  map[string]bool        // per key, whether a Result said it had no room
	calls    int
	denials  int
}

// admission is one recorded request: its decision's time and cost.
type admission struct {
	at   time.Time
	cost int
}

func newAllowAllRun() *allowAllRun {
	return &allowAllRun{admitted: map[string][]admission{}, costs: map[string]int{}, sawFull: map[string]bool{}}
}

// add checks one AllowAll's answer against its requests and records it: admitted, every
// request that is not advisory had room and is recorded (unless a check), an advisory one is
// recorded exactly when it had room; denied, a request that is not advisory had no room, and
// nothing is recorded.
func (run *allowAllRun) add(t *testing.T, reqs []engine.Request, allowed bool, rs []engine.Result) {
	run.mu.Lock()
	defer run.mu.Unlock()
	run.calls++
	denier := false
	for i, r := range rs {
		q := reqs[i]
		recorded := !r.Entry.IsZero()
		switch {
		case r.At.IsZero():
			t.Errorf("request %d on %s: no decision (%+v)", i, q.Key, r)
		case !allowed && recorded:
			t.Errorf("denied group recorded request %d on %s: %+v, want nothing recorded", i, q.Key, r)
		case allowed && !q.Advisory && !r.Allowed:
			t.Errorf("admitted group with request %d on %s denied: %+v, want room on every request that is not advisory", i, q.Key, r)
		case allowed && r.Allowed && q.N > 0 && !recorded:
			t.Errorf("admitted group did not record request %d on %s: %+v", i, q.Key, r)
		case !r.Allowed && recorded:
			t.Errorf("request %d on %s recorded without room: %+v, want no entry", i, q.Key, r)
		}
		if !r.Allowed {
			run.sawFull[q.Key] = true
			denier = denier || !q.Advisory
		}
		if recorded {
			run.admitted[q.Key] = append(run.admitted[q.Key], admission{at: r.At, cost: r.Entry.Cost})
			run.costs[q.Key] += r.Entry.Cost
		}
	}
	if !allowed {
		run.denials++
		if !denier {
			t.Errorf("denied group without a request that had no room: %+v", rs)
		}
	}
}

// audit checks, per key, that no trailing window of l's held more than its Max of what was
// recorded, and returns the events recorded per key.
func (run *allowAllRun) audit(t *testing.T, keys []string, l engine.Limit) map[string]int {
	t.Helper()
	sums := map[string]int{}
	for _, k := range keys {
		adm := slices.Clone(run.admitted[k])
		slices.SortFunc(adm, func(a, b admission) int { return a.at.Compare(b.at) })
		for i, x := range adm {
			held := 0
			for _, y := range adm {
				if y.at.After(x.at.Add(-l.Window)) && !y.at.After(x.at) {
					held += y.cost
				}
			}
			if held > l.Max {
				t.Fatalf("key %s: %d events admitted in the window ending at admission %d (%s), want at most Max %d", k, held, i, x.at, l.Max)
			}
			sums[k] += x.cost
		}
	}
	return sums
}

// fireAllowAll releases goroutines at once over es (in turn), each deciding rounds AllowAlls
// of the requests next makes from its own random source (seeded by its number and seed), and
// returns what they were told; false when a call failed (t has failed).
func fireAllowAll(t *testing.T, es []*engine.Engine, goroutines, rounds int, seed uint64, next func(*rand.Rand) []engine.Request) (*allowAllRun, bool) {
	run := newAllowAllRun()
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range goroutines {
		e, rng := es[g%len(es)], rand.New(rand.NewPCG(uint64(g), seed))
		wg.Go(func() {
			<-start
			for range rounds {
				reqs := next(rng)
				allowed, rs, err := e.AllowAll(context.Background(), reqs)
				if err != nil {
					t.Errorf("AllowAll: %v", err)
					return
				}
				run.add(t, reqs, allowed, rs)
			}
		})
	}
	close(start)
	wg.Wait()
	return run, !t.Failed()
}

// 64 goroutines over 4 clients fire AllowAll at once on overlapping sets of 8 keys, all within
// one window, with more demand than room, the keys under policies of every kind (exact, with a
// Resolution, calendar, several limits): per key, what was recorded never exceeds Max, the log
// holds exactly that, a key any Result found without room was full (no false denial), and what
// is left of each key is exactly what a caller can still take.
func TestAllowAllExactUnderConcurrency(t *testing.T) {
	es, c := enginetest.Engines(t, exampleServer, 4)
	const max = 20
	// A calendar period that does not end during the test.
	calendar := engine.Calendar(max, engine.Month, time.UTC)
	if _, end := calendar.PeriodAt(time.Now()); time.Until(end) < 10*time.Minute {
		calendar = engine.Calendar(max, engine.Year, time.UTC)
	}
	policies := []engine.Policy{
		{engine.PerHour(max)},
		{{Max: max, Window: time.Hour, Resolution: time.Minute}},
		{calendar},
		{engine.PerSecond(1000), engine.PerHour(max), engine.PerMinute(500)},
	}
	keys := make([]string, 8)
	for i := range keys {
		keys[i] = enginetest.NewKey(t)
	}
	policyOf := func(k int) engine.Policy { return policies[k%len(policies)] }
	run, ok := fireAllowAll(t, es, 64, 20, 11, func(rng *rand.Rand) []engine.Request {
		// 1 to 3 keys; now and then one advisory, or a check.
		perm := rng.Perm(len(keys))[:1+rng.IntN(3)]
		reqs := make([]engine.Request, len(perm))
		for i, k := range perm {
			reqs[i] = engine.Request{Key: keys[k], Policy: policyOf(k), N: 1}
			switch rng.IntN(10) {
			case 0:
				reqs[i].Advisory = true
			case 1:
				reqs[i].N = 0
			}
		}
		return reqs
	})
	if !ok {
		return
	}
	// Every decision fell within an hour: the audit's window.
	sums := run.audit(t, keys, engine.PerHour(max))
	t.Logf("%d calls, %d denied", run.calls, run.denials)
	for i, k := range keys {
		if sums[k] > max {
			t.Fatalf("key %s: %d recorded, want at most Max %d", k, sums[k], max)
		}
		if run.sawFull[k] && sums[k] != max {
			t.Fatalf("key %s (%s): a Result found it without room, yet only %d of %d were recorded", k, policyOf(i), sums[k], max)
		}
		log := logOf(t, c, k)
		if p := policyOf(i); p[0].IsCalendar() {
			if len(log.Periods) != 1 || log.Periods[0].Events != sums[k] {
				t.Fatalf("key %s (%s): periods %+v, want one of %d events", k, p, log.Periods, sums[k])
			}
		} else {
			enginetest.Want(t, "events in "+k+"'s log", log.Events, sums[k])
		}
		// What is left is exactly the room: one at a time until denied.
		left := 0
		for {
			allowed, _ := mustAllowAll(t, es[0], engine.Request{Key: k, Policy: policyOf(i), N: 1})
			if !allowed {
				break
			}
			left++
		}
		enginetest.Want(t, "room left on "+k, sums[k]+left, max)
	}
	if run.denials == 0 {
		t.Fatal("no group was denied: the demand did not exceed the room")
	}
}

// On the server's clock, with a window that slides many times during the run, no trailing
// window of any key ever holds more than Max of the requests AllowAll recorded, and the logs
// hold exactly what was recorded.
func TestAllowAllNeverOverAdmitsAsTheWindowSlides(t *testing.T) {
	es, c := enginetest.Engines(t, exampleServer, 4)
	l := engine.Limit{Max: 6, Window: 50 * time.Millisecond}
	p := engine.Policy{l}
	keys := make([]string, 5)
	for i := range keys {
		keys[i] = enginetest.NewKey(t)
	}
	run := newAllowAllRun()
	// 20 calls each, for 12 windows at least, and until every key has recorded more than 3
	// windows' Max: the window slid on each, however the machine's stalls fell.
	slid := func() bool {
		run.mu.Lock()
		defer run.mu.Unlock()
		for _, k := range keys {
			if run.costs[k] <= 3*l.Max {
				return false
			}
		}
		return true
	}
	decideMany(t, es, 64, runFor{calls: 20, span: 12 * l.Window, more: func() bool { return !slid() }}, 13, func(rng *rand.Rand, e *engine.Engine) (struct{}, time.Time, error) {
		perm := rng.Perm(len(keys))[:1+rng.IntN(3)]
		reqs := make([]engine.Request, len(perm))
		for i, k := range perm {
			reqs[i] = engine.Request{Key: keys[k], Policy: p, N: 1 + rng.IntN(2)}
		}
		allowed, rs, err := e.AllowAll(context.Background(), reqs)
		if err != nil {
			return struct{}{}, time.Time{}, fmt.Errorf("AllowAll: %w", err)
		}
		run.add(t, reqs, allowed, rs)
		return struct{}{}, rs[0].At, nil
	})
	if t.Failed() {
		return
	}
	// The logs, read at once, each with a time no earlier than the server's when it was read:
	// what left the window by then may have been trimmed (by any decision, a denial too) or
	// expired with its key.
	logs, readBy := map[string]inspect.Log{}, map[string]time.Time{}
	for _, k := range keys {
		logs[k] = logOf(t, c, k)
		readBy[k] = time.Now()
	}
	sums := run.audit(t, keys, l)
	t.Logf("%d calls, %d denied, recorded per key %v", run.calls, run.denials, sums)
	// Every entry one a caller was told of, and every admission younger than a window before
	// the log was read still there.
	for _, k := range keys {
		if sums[k] <= 3*l.Max {
			t.Fatalf("key %s: %d recorded over 12 windows of Max %d: the window did not slide", k, sums[k], l.Max)
		}
		told := map[admission]int{}
		for _, a := range run.admitted[k] {
			told[admission{at: a.at.UTC(), cost: a.cost}]++
		}
		for _, entry := range logs[k].Entries {
			x := admission{at: entry.At.UTC(), cost: entry.Cost}
			if told[x] == 0 {
				t.Fatalf("key %s: the log holds an entry %+v no caller was told of", k, entry)
			}
			told[x]--
		}
		for x, n := range told {
			if n > 0 && x.at.After(readBy[k].Add(-l.Window)) {
				t.Fatalf("key %s: admission %+v of the last window is not in the log", k, x)
			}
		}
	}
}

// Shadow mode admits a group that would be denied and records nothing of it; the Result of
// the key without room says ShadowDenied. Fail-open admits a group the server could not
// decide, each Result carrying the error; fail-closed returns the error. A key that holds
// something else is ErrUnknownLayout, which fail-open never admits. The metrics count one
// decision per call, of operation allow_all, one
// request included.
func TestAllowAllFollowsShadowFailOpenAndMetrics(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	e, _ := enginetest.Clocked(t, c, engine.WithMeterProvider(mp))
	shadow, _ := enginetest.Clocked(t, c, engine.WithMeterProvider(mp), engine.WithShadow(true))
	open := enginetest.New(t, c, engine.WithMeterProvider(mp), engine.WithFailOpen(true))
	closed := enginetest.New(t, c, engine.WithMeterProvider(mp))
	p := engine.Policy{engine.PerMinute(2)}
	a, full := enginetest.NewKey(t), enginetest.NewKey(t)

	if allowed, _ := mustAllowAll(t, e, engine.Request{Key: full, Policy: p, N: 2}); !allowed { // allow_all/allowed
		t.Fatal("filling a key: denied, want an admission")
	}
	if allowed, _ := mustAllowAll(t, e, engine.Request{Key: a, Policy: p, N: 1}, engine.Request{Key: full, Policy: p, N: 1}); allowed { // allow_all/denied
		t.Fatal("a group with a full key: admitted, want a denial")
	}
	allowed, rs := mustAllowAll(t, shadow, engine.Request{Key: a, Policy: p, N: 1}, engine.Request{Key: full, Policy: p, N: 1}) // allow_all/shadow_denied
	if !allowed || !rs[0].Allowed || rs[0].ShadowDenied || !rs[0].Entry.IsZero() || !rs[1].Allowed || !rs[1].ShadowDenied {
		t.Fatalf("shadow: %v, %+v; want admitted, the full key's Result ShadowDenied, nothing recorded", allowed, rs)
	}
	enginetest.Want(t, "a's events after a shadow admission", logOf(t, c, a).Events, 0)

	bad := enginetest.NewKey(t)
	if err := c.Do(ctx, c.B().Set().Key(enginetest.Prefix+bad).Value("not a log").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := open.AllowAll(ctx, []engine.Request{{Key: a, Policy: p, N: 1}, {Key: bad, Policy: p, N: 1}}); !errors.Is(err, engine.ErrUnknownLayout) { // allow_all/error
		t.Fatalf("a key that holds a string, fail-open: %v, want ErrUnknownLayout", err)
	}
	enginetest.Want(t, "a's events after a failed group", logOf(t, c, a).Events, 0)

	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	reqs := []engine.Request{{Key: a, Policy: p, N: 1}, {Key: full, Policy: p, N: 1}}
	allowed, rs, err := open.AllowAll(tctx, reqs) // allow_all/fail_open
	if err != nil || !allowed || len(rs) != 2 || !rs[0].Allowed || rs[0].BackendErr == nil || !rs[1].Allowed || rs[1].BackendErr == nil {
		t.Fatalf("fail-open with the server down: %v, %+v, %v; want the group admitted, each Result carrying a BackendErr", allowed, rs, err)
	}
	if _, _, err := closed.AllowAll(tctx, reqs); !errors.Is(err, engine.ErrUnavailable) { // allow_all/error
		t.Fatalf("fail-closed with the server down: %v, want ErrUnavailable", err)
	}

	got := collected(t, reader)["strictrate.decisions"]
	want := map[string]int64{"allow_all/allowed": 1, "allow_all/denied": 1, "allow_all/shadow_denied": 1, "allow_all/fail_open": 1, "allow_all/error": 2}
	for attrs, n := range want {
		if got[attrs] != n {
			t.Errorf("strictrate.decisions{%s} = %d, want %d (all: %v)", attrs, got[attrs], n, got)
		}
	}
	if len(got) != len(want) {
		t.Errorf("strictrate.decisions has points %v, want exactly %v", got, want)
	}
}

// On a 3-primary cluster, 64 goroutines over 4 clients fire AllowAll on sets of keys that lie
// on different primaries: decided one primary after another, refunded when a later one
// denies. No key is ever over-admitted, and once every goroutine is done each key's log holds
// exactly what callers were told was recorded: what denied requests held for a while was
// given back.
func TestAllowAllClusterNeverOverAdmits(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	c := valkeytest.NewCluster(t, 3, 0)
	es := clusterEngines(t, c, 4)
	l := engine.PerHour(15)
	p := engine.Policy{l}
	var keys []string
	for i := range 9 {
		keys = append(keys, keyOn(t, c.Primaries[i%3]))
	}
	reader := c.Client(t, valkey.ClientOption{})
	run, ok := fireAllowAll(t, es, 64, 15, 17, func(rng *rand.Rand) []engine.Request {
		perm := rng.Perm(len(keys))[:2+rng.IntN(3)]
		reqs := make([]engine.Request, len(perm))
		for i, k := range perm {
			reqs[i] = engine.Request{Key: keys[k], Policy: p, N: 1 + rng.IntN(2), Advisory: rng.IntN(12) == 0}
		}
		return reqs
	})
	if !ok {
		return
	}
	sums := run.audit(t, keys, l)
	t.Logf("%d calls, %d denied, recorded per key %v", run.calls, run.denials, sums)
	for _, k := range keys {
		if sums[k] > l.Max {
			t.Fatalf("key %s: %d recorded, want at most Max %d", k, sums[k], l.Max)
		}
		log, err := inspect.Read(context.Background(), reader, enginetest.Prefix+k, 0)
		if err != nil {
			t.Fatal(err)
		}
		if log.Events != sums[k] {
			t.Fatalf("key %s: the log holds %d events, want the %d callers were told were recorded", k, log.Events, sums[k])
		}
	}
	if run.denials == 0 {
		t.Fatal("no group was denied: the demand did not exceed the room")
	}
}

// One request with a cost is AllowPolicy's decision: the deny cache answers its repeated
// denial, and an advisory one denied denies nothing and records nothing.
func TestAllowAllOfOneRequestIsAllowPolicy(t *testing.T) {
	c := exampleServer.Client(t)
	e := enginetest.New(t, c, engine.WithDenyCache(16))
	k := enginetest.NewKey(t)
	p := engine.Policy{engine.PerMinute(2)}
	allowed, rs := mustAllowAll(t, e, engine.Request{Key: k, Policy: p, N: 2})
	if !allowed || !rs[0].Allowed || rs[0].Entry.IsZero() || rs[0].Remaining != 0 {
		t.Fatalf("first: %v %+v; want admitted, recorded, 0 remaining", allowed, rs[0])
	}
	allowed, rs = mustAllowAll(t, e, engine.Request{Key: k, Policy: p, N: 1})
	if allowed || rs[0].Allowed || rs[0].FromCache {
		t.Fatalf("second: %v %+v; want denied by the server", allowed, rs[0])
	}
	allowed, rs = mustAllowAll(t, e, engine.Request{Key: k, Policy: p, N: 1})
	if allowed || rs[0].Allowed || !rs[0].FromCache {
		t.Fatalf("third: %v %+v; want denied by the deny cache", allowed, rs[0])
	}
	allowed, rs = mustAllowAll(t, e, engine.Request{Key: k, Policy: p, N: 1, Advisory: true})
	if !allowed || rs[0].Allowed || !rs[0].Entry.IsZero() {
		t.Fatalf("advisory: %v %+v; want the group allowed, the request without room", allowed, rs[0])
	}
	enginetest.Want(t, "events", logOf(t, c, k).Events, 2)
}
