package engine

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// On a standalone server an AllowAll of up to MaxAllowAllRequests requests is one script
// call, whatever its keys; one of more is calls of at most that many: 65 requests are two,
// 200 four, admitted or denied (a denial in the first call leaves the later ones peeked only,
// still a call each).
func TestAllowAllTakesOneCallPerMaxAllowAllRequests(t *testing.T) {
	srv := valkeytest.New(t, valkeytest.OwnServer())
	c := srv.Client(t)
	e, err := New(c, WithPersistenceCheck(Ignore))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p := Policy{PerMinute(1)}
	for _, tc := range []struct{ n, calls int }{{10, 1}, {MaxAllowAllRequests, 1}, {MaxAllowAllRequests + 1, 2}, {200, 4}} {
		reqs := make([]Request, tc.n)
		for i := range reqs {
			reqs[i] = Request{Key: "calls:" + itoa(tc.n) + ":" + itoa(i), Policy: p, N: 1}
		}
		for _, want := range []bool{true, false} { // the second time, every key is used up
			if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if allowed, _, err := e.AllowAll(ctx, reqs); err != nil || allowed != want {
				t.Fatalf("AllowAll of %d keys: %v, %v; want %v", tc.n, allowed, err, want)
			}
			info, err := valkeytest.ReadInfo(ctx, c, "commandstats")
			if err != nil {
				t.Fatal(err)
			}
			stats := info.CommandStats()
			if calls := stats["evalsha"].Calls + stats["eval"].Calls; calls != int64(tc.calls) {
				t.Fatalf("%d script calls for an AllowAll of %d (admitted %v), want %d", calls, tc.n, want, tc.calls)
			}
		}
	}
}

// With the group commit (WithBatching, the default), concurrent AllowAlls bound for one server
// share script calls, each group still decided all or nothing: fewer calls than decisions, and
// exactly what a decision alone would record. Without it, one call per AllowAll.
func TestAllowAllsShareCallsUnderGroupCommit(t *testing.T) {
	srv := valkeytest.New(t, valkeytest.OwnServer())
	c := srv.Client(t)
	ctx := context.Background()
	for _, batching := range []bool{true, false} {
		e, err := New(c, WithPersistenceCheck(Ignore), WithBatching(batching), WithPrefix("group-commit:"+strconv.FormatBool(batching)+":"))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		const goroutines, each, max = 32, 20, 100
		shared := Policy{PerHour(max)}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Go(func() {
				for i := range each {
					// Each goroutine's first key its own: a group is queued by its
					// server, not by its first key's slot.
					reqs := []Request{
						{Key: "own:" + itoa(g), Policy: Policy{PerHour(each)}, N: 1},
						{Key: "shared", Policy: shared, N: 1},
						{Key: "round:" + itoa(i), Policy: Policy{PerHour(goroutines)}, N: 1},
					}
					allowed, _, err := e.AllowAll(ctx, reqs)
					if err != nil {
						t.Errorf("AllowAll: %v", err)
						return
					}
					if allowed {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		info, err := valkeytest.ReadInfo(ctx, c, "commandstats")
		if err != nil {
			t.Fatal(err)
		}
		stats := info.CommandStats()
		calls := stats["evalsha"].Calls + stats["eval"].Calls
		t.Logf("batching %v: %d AllowAlls in %d script calls, %d admitted", batching, goroutines*each, calls, admitted.Load())
		// Every request fits its own and its round's limit; the shared key admits max.
		if got := admitted.Load(); got != max {
			t.Fatalf("batching %v: %d admitted, want the shared key's Max %d", batching, got, max)
		}
		switch {
		case batching && calls > goroutines*each/2:
			t.Fatalf("batching: %d script calls for %d AllowAlls: calls carried fewer than two on average", calls, goroutines*each)
		case !batching && calls != goroutines*each:
			t.Fatalf("without batching: %d script calls for %d AllowAlls, want one each", calls, goroutines*each)
		}
	}
}

// On a cluster, an AllowAll is one call per primary, in the order of their addresses. A
// denial on a later primary gives back what the earlier ones recorded; a denial on the first
// leaves the later ones peeked only. A call for a primary that no longer serves a key (a stale
// slot map) records nothing there, and its requests go again per slot through the client.
// (A call for a node gone from the client goes the same way: the transport's tests hold it.)
func TestAllowAllTakesOneCallPerPrimary(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	cl := valkeytest.NewCluster(t, 3, 0)
	e := clusterEngine(t, cl)
	ctx := context.Background()
	primaries := slices.Clone(cl.Primaries)
	slices.SortFunc(primaries, func(a, b *valkeytest.Node) int { return strings.Compare(a.Addr, b.Addr) })
	const max = 4
	p := Policy{PerHour(max)}
	// keys returns two fresh keys on each primary, in decision order.
	keys := func() []string {
		var ks []string
		for _, n := range primaries {
			ks = append(ks, keysOn(t, e, n, 2, -1)...)
		}
		return ks
	}
	requests := func(ks []string, n int) []Request {
		reqs := make([]Request, len(ks))
		for i, k := range ks {
			reqs[i] = Request{Key: k, Policy: p, N: n}
		}
		return reqs
	}
	events := func(k string) int {
		t.Helper()
		return readLog(t, e, k).Events
	}
	fill := func(k string) {
		t.Helper()
		if r, err := e.AllowPolicy(ctx, k, p, max); err != nil || !r.Allowed {
			t.Fatalf("filling %s: %+v, %v", k, r, err)
		}
	}

	t.Run("one call per primary", func(t *testing.T) {
		ks := keys()
		before := make([]int64, len(primaries))
		for i, n := range primaries {
			before[i], _ = scriptCallsOn(t, n)
		}
		allowed, rs, err := e.AllowAll(ctx, requests(ks, 2))
		if err != nil || !allowed {
			t.Fatalf("AllowAll over three primaries: %v, %v", allowed, err)
		}
		for i, n := range primaries {
			if calls, _ := scriptCallsOn(t, n); calls-before[i] != 1 {
				t.Fatalf("primary %s ran %d script calls, want 1", n.Addr, calls-before[i])
			}
		}
		for i, k := range ks {
			if rs[i].Entry.IsZero() || rs[i].Remaining != max-2 || events(k) != 2 {
				t.Fatalf("key %d: %+v, %d events; want recorded, %d left, 2 events", i, rs[i], events(k), max-2)
			}
		}
	})

	t.Run("a later primary denies", func(t *testing.T) {
		ks := keys()
		fill(ks[len(ks)-1])
		allowed, rs, err := e.AllowAll(ctx, requests(ks, 1))
		if err != nil || allowed {
			t.Fatalf("AllowAll with the last primary's key full: %v, %v", allowed, err)
		}
		for i, k := range ks[:len(ks)-1] {
			if !rs[i].Allowed || !rs[i].Entry.IsZero() || rs[i].Remaining != max || rs[i].At.IsZero() {
				t.Fatalf("key %d: %+v; want room, no entry, Remaining %d (given back)", i, rs[i], max)
			}
			if events(k) != 0 {
				t.Fatalf("key %d holds %d events after the group was denied, want 0", i, events(k))
			}
		}
		if r := rs[len(ks)-1]; r.Allowed || r.RetryAfter <= 0 {
			t.Fatalf("the full key: %+v, want no room", r)
		}
		// The room given back is whole: Max fits on each key.
		if allowed, _, err := e.AllowAll(ctx, requests(ks[:len(ks)-2], max)); err != nil || !allowed {
			t.Fatalf("Max on each key after the refunds: %v, %v", allowed, err)
		}
	})

	t.Run("the first primary denies", func(t *testing.T) {
		ks := keys()
		fill(ks[0])
		allowed, rs, err := e.AllowAll(ctx, requests(ks, 1))
		if err != nil || allowed {
			t.Fatalf("AllowAll with the first primary's key full: %v, %v", allowed, err)
		}
		for i, k := range ks[2:] {
			r := rs[2+i]
			if !r.Allowed || !r.Entry.IsZero() || r.Remaining != max || r.At.IsZero() {
				t.Fatalf("key %d, peeked only: %+v; want room, no entry, Remaining %d", 2+i, r, max)
			}
			if log := readLog(t, e, k); log.Layout != 0 {
				t.Fatalf("key %d, peeked only: log %+v; want none", 2+i, log)
			}
		}
	})

	t.Run("a stale slot map", func(t *testing.T) {
		// A slot of the first primary moves whole to the second, which the engine's slot map
		// does not know: the first primary's call finds a key it does not serve, records
		// nothing, and its keys, of several slots, go again one slot at a time.
		from, to := primaries[0], primaries[1]
		slot := from.First + 7
		m, err := cl.BeginMigration(ctx, slot, from, to)
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Finish(ctx); err != nil {
			t.Fatal(err)
		}
		moved := strings.TrimPrefix(valkeytest.KeyInSlot(e.prefix+"moved:"+uuid.NewString()+":", slot), e.prefix)
		if d := e.groups.Route(e.prefix+moved, false); d.Node() != from.Addr {
			t.Fatalf("the moved slot routes to %q before the map reloads, want the source %s", d.Node(), from.Addr)
		}
		ks := append(keysOn(t, e, from, 2, slot), moved)
		for _, n := range primaries[1:] {
			ks = append(ks, keysOn(t, e, n, 2, slot)...)
		}
		allowed, rs, err := e.AllowAll(ctx, requests(ks, 1))
		if err != nil || !allowed {
			t.Fatalf("AllowAll on a stale slot map: %v, %v", allowed, err)
		}
		for i, k := range ks {
			if rs[i].Entry.IsZero() || events(k) != 1 {
				t.Fatalf("key %d: %+v, %d events; want recorded once", i, rs[i], events(k))
			}
		}
		if err := valkeytest.WaitFor(ctx, 5*time.Second, "the slot map to load again and name the target", func() (bool, error) {
			return e.groups.Route(e.prefix+moved, false).Node() == to.Addr, nil
		}); err != nil {
			t.Fatal(err)
		}
	})
}
