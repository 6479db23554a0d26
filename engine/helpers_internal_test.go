package engine

import (
	"context"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/loader"
	"github.com/strictrate/strictrate/scripts"
)

// clusterEngine returns an engine on a cluster client of c, with batching on, and its slot map
// loaded: a decision routes to a primary.
func clusterEngine(t *testing.T, c *valkeytest.Cluster, opts ...Option) *Engine {
	t.Helper()
	e, err := New(c.Client(t, valkey.ClientOption{}), append([]Option{WithBatching(true)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	if err := valkeytest.WaitFor(context.Background(), 10*time.Second, "the slot map to load", func() (bool, error) {
		return e.decides.Route(e.prefix+"slot-map", false).Node() != "", nil
	}); err != nil {
		t.Fatal(err)
	}
	return e
}

// keysOn returns n fresh keys (without the engine's prefix) whose full keys are in slots node
// serves, each in a slot of its own, none in skip.
func keysOn(t *testing.T, e *Engine, node *valkeytest.Node, n, skip int) []string {
	t.Helper()
	var keys []string
	slots := map[int]bool{skip: true}
	for len(keys) < n {
		k := "split:" + uuid.NewString()
		if slot := valkeytest.KeySlot(e.prefix + k); node.Owns(e.prefix+k) && !slots[slot] {
			slots[slot] = true
			keys = append(keys, k)
		}
	}
	return keys
}

// storedLog is what key's log (key without the engine's prefix) holds, as inspect.lua reads
// it: its events, its entries and its layout (0: no key). Package inspect reads the rest; these
// tests are inside package engine, which it imports.
type storedLog struct{ Events, Count, Layout int }

func readLog(t *testing.T, e *Engine, key string) storedLog {
	t.Helper()
	reply, _ := loader.NewReadOnly("inspect", scripts.Source("inspect")).Exec(context.Background(), e.client,
		loader.Call{Keys: []string{e.prefix + key}, Args: []string{"1"}})
	vals, err := reply.AsIntSlice()
	if err != nil || len(vals) < 3 {
		t.Fatalf("inspect %s: %v, %v", key, vals, err)
	}
	return storedLog{Events: int(vals[0]), Count: int(vals[1]), Layout: int(vals[2])}
}

// scriptCallsOn reads how many script calls (EVALSHA, EVAL) node ran, and how many it refused
// before running them (a redirection).
func scriptCallsOn(t *testing.T, node *valkeytest.Node) (calls, rejected int64) {
	t.Helper()
	stats := commandStatsOn(t, node)
	for _, name := range []string{"evalsha", "eval"} {
		calls += stats[name].Calls
		rejected += stats[name].RejectedCalls
	}
	return calls, rejected
}

// commandStatsOn reads node's INFO commandstats.
func commandStatsOn(t *testing.T, node *valkeytest.Node) map[string]valkeytest.CommandStat {
	t.Helper()
	info, err := valkeytest.ReadInfo(context.Background(), node.Client(), "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	return info.CommandStats()
}

// BenchmarkCommitterBatched takes decisions on many keys through the group commit from 64
// goroutines: the transport's own allocations per decision (no key prefixing, no Result).
func BenchmarkCommitterBatched(b *testing.B) {
	client := valkeytest.New(b).Client(b)
	e, err := New(client, WithBatching(true))
	if err != nil {
		b.Fatal(err)
	}
	set := e.oneLimit(Limit{Max: 1 << 20, Window: time.Second})
	keys := make([]request, 1024)
	for i := range keys {
		if keys[i], err = newRequest(e.prefix+"bench:"+uuid.NewString(), clockReading{}, 1, true, set); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx, i := context.Background(), 0
		for pb.Next() {
			req := keys[i%len(keys)]
			if o := e.decides.Do(ctx, req, e.decides.Route(req.key, false)); o.Err != nil || o.Invalid != nil {
				b.Error(o.Err, o.Invalid)
				return
			}
			i += 7
		}
	})
}

// Reserve is reserve, for the tests of package engine_test: reservations are local quota's
// ground, not yet part of the API.
func (e *Engine) Reserve(ctx context.Context, key string, p Policy, k int, hold time.Duration) (Result, error) {
	return e.reserve(ctx, key, p, k, hold)
}
