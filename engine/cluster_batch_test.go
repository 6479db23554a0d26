package engine_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
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

// Group commit in a cluster: a batch goes to the primary that serves its keys' slots and may
// hold keys of all of them; a node that does not hold a key (a slot that moved or is moving,
// a failover) makes that decision go again alone, through the cluster client. These tests run
// real clusters and audit every decision: per key, what callers were told against what the
// log holds.

// clusterEngines returns n engines with batching on, each on a cluster client of its own,
// made with opts.
func clusterEngines(t *testing.T, c *valkeytest.Cluster, n int, opts ...engine.Option) []*engine.Engine {
	t.Helper()
	var es []*engine.Engine
	for i := 0; i < n; i++ {
		es = append(es, enginetest.New(t, c.Client(t, valkey.ClientOption{}), append([]engine.Option{engine.WithBatching(true)}, opts...)...))
	}
	return es
}

// primaryScriptCalls sums the script calls (EVALSHA, EVAL) the primaries ran.
func primaryScriptCalls(t *testing.T, c *valkeytest.Cluster) int64 {
	t.Helper()
	var calls int64
	for _, p := range c.Primaries {
		s := commandStats(t, p)
		calls += s["evalsha"].Calls + s["eval"].Calls
	}
	return calls
}

// tally is what callers were told about one key.
type tally struct {
	allowed, denied, errs atomic.Int64
}

// audit counts, per key, the outcomes of decisions taken concurrently.
type audit struct {
	keys    []string
	limitOf func(i int) engine.Limit
	tallies []tally
	// unexpected holds the first error that is not one the test allows.
	mu         sync.Mutex
	unexpected error
}

func newAudit(keys []string, limitOf func(i int) engine.Limit) *audit {
	return &audit{keys: keys, limitOf: limitOf, tallies: make([]tally, len(keys))}
}

// decide takes one decision on key i through e and counts its outcome. allowErr says which
// errors the test expects; any other is kept as unexpected.
func (a *audit) decide(ctx context.Context, e *engine.Engine, i int, allowErr func(error) bool) {
	r, err := e.Allow(ctx, a.keys[i], a.limitOf(i))
	switch {
	case err != nil:
		a.tallies[i].errs.Add(1)
		if allowErr == nil || !allowErr(err) {
			a.mu.Lock()
			if a.unexpected == nil {
				a.unexpected = err
			}
			a.mu.Unlock()
		}
	case r.Allowed:
		a.tallies[i].allowed.Add(1)
	default:
		a.tallies[i].denied.Add(1)
	}
}

// drive takes decisions on random keys from goroutines spread over es until stop is closed,
// and returns once every goroutine has stopped.
func (a *audit) drive(es []*engine.Engine, goroutines int, stop <-chan struct{}, allowErr func(error) bool) {
	var wg sync.WaitGroup
	for g := 0; g < goroutines; g++ {
		e, rng := es[g%len(es)], rand.New(rand.NewPCG(uint64(g), 7))
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				a.decide(ctx, e, rng.IntN(len(a.keys)), allowErr)
				cancel()
			}
		})
	}
	wg.Wait()
}

// entries reads how many entries each key's log holds (every request costs 1, so one entry is
// one admission), through the cluster client c.
func (a *audit) entries(t *testing.T, c valkey.Client) []int {
	t.Helper()
	got := make([]int, len(a.keys))
	for i, k := range a.keys {
		log, err := inspect.Read(context.Background(), c, enginetest.Prefix+k, 0)
		if err != nil {
			t.Fatalf("inspect %s: %v", k, err)
		}
		got[i] = log.Count
	}
	return got
}

// With many keys over many slots, a cluster's batches still carry several decisions each: a
// batch holds keys of every slot of its node. Decisions stay exact per key: Max admitted,
// never more, none denied under Max, and each log holds what was admitted.
func TestClusterBatchesPerNode(t *testing.T) {
	skipClusterIfShort(t)
	c := valkeytest.NewCluster(t, 3, 0)
	ctx := context.Background()
	es := clusterEngines(t, c, 4)
	const numKeys, perKey, max = 2000, 6, 4
	l := engine.PerHour(max)
	keys := make([]string, numKeys)
	slots := map[int]bool{}
	for i := range keys {
		keys[i] = "pernode:" + uuid.NewString()
		slots[valkeytest.KeySlot(enginetest.Prefix+keys[i])] = true
	}
	// Warm-up on keys of their own: each engine's slot map loads on its first decision.
	enginetest.RunConcurrently(t, es, 16, 200, func(e *engine.Engine) (engine.Result, error) {
		return e.Allow(ctx, "pernode:warm:"+uuid.NewString(), l)
	})
	onEvery(t, c.Primaries, func(b valkey.Builder) valkey.Completed { return b.ConfigResetstat().Build() })

	a := newAudit(keys, func(int) engine.Limit { return l })
	var next atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 64; g++ {
		e := es[g%len(es)]
		wg.Go(func() {
			// Request n goes to key n mod numKeys: decisions in flight at once are on different
			// keys, nearly always of different slots.
			for n := next.Add(1) - 1; n < numKeys*perKey; n = next.Add(1) - 1 {
				a.decide(ctx, e, int(n%numKeys), nil)
			}
		})
	}
	wg.Wait()
	if a.unexpected != nil {
		t.Fatal(a.unexpected)
	}
	calls := primaryScriptCalls(t, c)
	mean := float64(numKeys*perKey) / float64(calls)
	t.Logf("%d decisions on %d keys in %d slots: %d script calls, %.1f decisions per call", numKeys*perKey, numKeys, len(slots), calls, mean)
	if mean < 2 {
		t.Fatalf("%.2f decisions per script call, want at least 2: batches do not span slots", mean)
	}
	entries := a.entries(t, c.Client(t, valkey.ClientOption{}))
	for i, k := range keys {
		allowed, denied := a.tallies[i].allowed.Load(), a.tallies[i].denied.Load()
		if allowed != max || denied != perKey-max || entries[i] != max {
			t.Fatalf("key %s: %d admitted, %d denied, log of %d; want %d, %d, %d", k, allowed, denied, entries[i], max, perKey-max, max)
		}
	}
}

// While a slot moves from one primary to another, batches keep spanning it and the node's
// other slots: the source takes the decisions whose keys it still holds, and each of the
// others (a key moved, or not made yet, asked elsewhere with ASK; after the move, MOVED)
// goes again alone. Every decision is taken once: per key, the log holds what callers were
// told was admitted, never above Max, with no denial under Max, during the move and after.
func TestClusterBatchDuringSlotMigration(t *testing.T) {
	skipClusterIfShort(t)
	c := valkeytest.NewCluster(t, 3, 0)
	es := clusterEngines(t, c, 4)
	from, to := c.Primaries[0], c.Primaries[1]
	slot := from.First + 42
	// Keys of the moving slot, of the source's other slots, and of the other primaries; the
	// first half of each group under a small Max (they fill up during the run), the rest under
	// one never reached (any denial there is a false one).
	var keys []string
	for i := 0; i < 24; i++ {
		full := valkeytest.KeyInSlot(enginetest.Prefix+"migrate:"+strconv.Itoa(i)+":"+uuid.NewString()+":", slot)
		keys = append(keys, full[len(enginetest.Prefix):])
	}
	moving := len(keys)
	for i := 0; i < 24; i++ {
		keys = append(keys, keyOn(t, from))
	}
	for i := 0; i < 12; i++ {
		keys = append(keys, keyOn(t, c.Primaries[1+i%2]))
	}
	small, big := engine.PerHour(25), engine.PerHour(1_000_000)
	limitOf := func(i int) engine.Limit {
		if i%2 == 0 {
			return small
		}
		return big
	}
	a := newAudit(keys, limitOf)
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.drive(es, 32, stop, nil)
	}()
	ctx := context.Background()
	step := func(what string, d time.Duration) {
		t.Helper()
		time.Sleep(d)
		t.Logf("%s", what)
	}
	step("traffic before the move", 300*time.Millisecond)
	m, err := c.BeginMigration(ctx, slot, from, to)
	if err != nil {
		close(stop)
		<-done
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		step("traffic while the slot migrates", 200*time.Millisecond)
		if _, err := m.MoveKeys(ctx, 6); err != nil {
			close(stop)
			<-done
			t.Fatal(err)
		}
	}
	step("traffic with most keys moved", 200*time.Millisecond)
	if err := m.Finish(ctx); err != nil {
		close(stop)
		<-done
		t.Fatal(err)
	}
	step("traffic after the move", 500*time.Millisecond)
	close(stop)
	<-done
	if a.unexpected != nil {
		t.Fatalf("a decision failed during the move: %v", a.unexpected)
	}
	if owner, err := from.SlotOwner(ctx, slot); err != nil || owner != to.Addr {
		t.Fatalf("slot %d is %s's after the move (%v), want %s", slot, owner, err, to.Addr)
	}
	if asked := commandStats(t, to)["asking"].Calls; asked == 0 {
		t.Fatal("the target served no ASKING: no decision was sent on to it while the slot migrated")
	}
	entries := a.entries(t, c.Client(t, valkey.ClientOption{}))
	var decisions int64
	for i, k := range keys {
		allowed, denied := a.tallies[i].allowed.Load(), a.tallies[i].denied.Load()
		decisions += allowed + denied
		max := int64(limitOf(i).Max)
		switch {
		case int64(entries[i]) != allowed:
			t.Errorf("key %d (%s, moving slot %v): told %d admissions, the log holds %d", i, k, i < moving, allowed, entries[i])
		case allowed > max:
			t.Errorf("key %d: %d admitted, above Max %d", i, allowed, max)
		case denied > 0 && allowed < max:
			t.Errorf("key %d: %d denied with %d of %d admitted", i, denied, allowed, max)
		case max == int64(small.Max) && allowed+denied >= max && allowed != max:
			t.Errorf("key %d: %d admitted of %d asked, want Max %d", i, allowed, allowed+denied, max)
		}
	}
	t.Logf("%d decisions on %d keys (%d of them in the moving slot)", decisions, len(keys), moving)
}

// A primary crashes under batched traffic and its replica takes over. Calls may fail while it
// is gone, and admissions on the promoted node, which has no replica, fail WithReplicaAck; but
// no decision is taken twice and none acknowledged is lost: per key, the log holds at least
// the admissions callers were told of and at most those plus the calls that failed, and no
// key admits above Max. The engine serves again once the replica is promoted.
func TestClusterBatchFailover(t *testing.T) {
	skipClusterIfShort(t)
	c := valkeytest.NewCluster(t, 3, 1)
	es := clusterEngines(t, c, 4, engine.WithReplicaAck(1, 500*time.Millisecond))
	victim, replica := c.Primaries[0], c.Replicas[0]
	var keys []string
	for i := 0; i < 60; i++ {
		keys = append(keys, keyOn(t, c.Primaries[i%3]))
	}
	// Half the keys fill up (Max is reached, and must hold after the failover), half never do
	// (admissions go on through it).
	l, big := engine.PerHour(15), engine.PerHour(1_000_000)
	limitOf := func(i int) engine.Limit {
		if i%2 == 0 {
			return l
		}
		return big
	}
	a := newAudit(keys, limitOf)
	allowErr := func(err error) bool {
		return errors.Is(err, engine.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.drive(es, 32, stop, allowErr)
	}()
	ctx := context.Background()
	time.Sleep(200 * time.Millisecond)
	victim.Crash()
	promoted, err := c.WaitPromoted(ctx, victim)
	if err == nil && promoted != replica {
		err = errors.New("promoted " + promoted.Addr + ", want " + replica.Addr)
	}
	if err == nil {
		// The engine decides again on every primary's keys (admissions on the promoted node
		// fail the replica ack: it has no replica; its denials and peeks do not).
		err = valkeytest.WaitFor(ctx, 30*time.Second, "the engine to decide on every primary after the failover", func() (bool, error) {
			for _, p := range []*valkeytest.Node{replica, c.Primaries[1], c.Primaries[2]} {
				if _, err := es[0].Peek(ctx, keyOn(t, p), l); err != nil {
					return false, nil
				}
			}
			return true, nil
		})
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	<-done
	if err != nil {
		t.Fatal(err)
	}
	if a.unexpected != nil {
		t.Fatalf("a decision failed with an error other than unavailable: %v", a.unexpected)
	}
	entries := a.entries(t, c.Client(t, valkey.ClientOption{}))
	var allowedAll, errsAll int64
	for i, k := range keys {
		allowed, errs := a.tallies[i].allowed.Load(), a.tallies[i].errs.Load()
		allowedAll, errsAll = allowedAll+allowed, errsAll+errs
		switch {
		case allowed > int64(limitOf(i).Max):
			t.Errorf("key %s: %d admitted, above Max %d", k, allowed, limitOf(i).Max)
		case int64(entries[i]) < allowed:
			t.Errorf("key %s: told %d admissions, the log holds %d: an acknowledged admission was lost", k, allowed, entries[i])
		case int64(entries[i]) > allowed+errs:
			t.Errorf("key %s: the log holds %d, more than the %d admissions and %d failed calls: a decision was taken twice",
				k, entries[i], allowed, errs)
		}
	}
	t.Logf("across the failover: %d admitted, %d calls failed, on %d keys", allowedAll, errsAll, len(keys))
}
