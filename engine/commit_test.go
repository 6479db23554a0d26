package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
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
	"github.com/strictrate/strictrate/pipelined"
)

// With batching on, 64 goroutines over 4 clients racing for one key are decided in batches
// (fewer script calls than decisions), the same key many times in one batch, and stay exact:
// Max admitted, each admitted count seen once, the log at Max.
func TestBatchedExactUnderConcurrency(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	var es []*engine.Engine
	for i := 0; i < 4; i++ {
		es = append(es, enginetest.New(t, own.Client(t), engine.WithBatching(true)))
	}
	c := own.Client(t)
	key, l := enginetest.NewKey(t), engine.PerHour(200)
	resetStats(t, c)
	results := enginetest.RunConcurrently(t, es, 64, 2000, func(e *engine.Engine) (engine.Result, error) {
		return e.Allow(context.Background(), key, l)
	})
	calls := scriptCalls(t, c)
	t.Logf("2000 decisions in %d script calls (%.1f per call)", calls, 2000/float64(calls))
	if calls >= 1500 {
		t.Fatalf("2000 decisions took %d script calls, want under 1500: hardly batched", calls)
	}
	seen := map[int]bool{}
	for _, r := range results {
		if !r.Allowed {
			continue
		}
		if seen[r.Remaining] {
			t.Fatalf("two admissions saw remaining %d, want each count seen once", r.Remaining)
		}
		seen[r.Remaining] = true
	}
	enginetest.Want(t, "admitted", len(seen), l.Max)
	enginetest.Want(t, "log size", enginetest.StoredEvents(t, c, key), int64(l.Max))
}

// One batch mixes single limits of different Max and cost, policies and keys, and a key that
// holds a string: every request gets exactly what it would get alone, the poisoned one alone
// fails, and each Result names its own limit.
func TestBatchMixesRequestsAndIsolatesFailures(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	ctx := context.Background()
	batchedEngine, clock := enginetest.Clocked(t, c, engine.WithBatching(true))
	aloneEngine := enginetest.New(t, c, engine.WithBatching(false), engine.WithClock(clock.Now))
	poisoned := enginetest.NewKey(t)
	if err := c.Do(ctx, c.B().Set().Key(enginetest.Prefix+poisoned).Value("a string").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	type job struct {
		key    string
		limit  engine.Limit
		policy engine.Policy
		n      int
	}
	keys := []string{enginetest.NewKey(t), enginetest.NewKey(t), enginetest.NewKey(t)}
	var jobs []job
	for i := 0; i < 60; i++ {
		j := job{key: keys[i%3], n: 1 + i%4}
		switch i % 3 {
		case 0:
			j.limit = engine.PerMinute(20)
		case 1:
			j.limit = engine.Limit{Max: 35, Window: time.Hour}
		default:
			j.policy = engine.Policy{engine.PerSecond(9), engine.PerMinute(30)}
		}
		jobs = append(jobs, j)
	}
	do := func(e *engine.Engine, prefix string, j job) (engine.Result, error) {
		if j.policy != nil {
			return e.AllowPolicy(ctx, prefix+j.key, j.policy, j.n)
		}
		return e.AllowN(ctx, prefix+j.key, j.limit, j.n)
	}
	// Alone first, on keys of their own: the expected results, one at a time.
	wantResults := make([]engine.Result, len(jobs))
	for i, j := range jobs {
		r, err := do(aloneEngine, "alone:", j)
		if err != nil {
			t.Fatal(err)
		}
		wantResults[i] = r
	}
	// Then through the batching engine: while the server takes no writes, one decision is in
	// flight and the jobs queue behind it, in order (each waits for the one before it to be
	// queued), the poisoned key among them; when the pause ends they go together.
	admin := valkeytest.NewClient(t, own.Addr)
	if err := admin.Do(ctx, admin.B().ClientPause().Timeout(400).Write().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	resetStats(t, c)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if _, err := batchedEngine.Allow(ctx, enginetest.NewKey(t), engine.PerMinute(1)); err != nil {
			t.Error(err)
		}
	}()
	time.Sleep(50 * time.Millisecond)
	got := make([]engine.Result, len(jobs))
	errs := make([]error, len(jobs))
	var poisonErr error
	for i, j := range jobs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = do(batchedEngine, "", j)
		}()
		if i == 30 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, poisonErr = batchedEngine.Allow(ctx, poisoned, engine.PerMinute(1))
			}()
		}
		time.Sleep(time.Millisecond) // queued in order behind the call in flight
	}
	wg.Wait()
	if poisonErr == nil || errors.Is(poisonErr, engine.ErrUnavailable) {
		t.Fatalf("the poisoned key: %v, want the server's WRONGTYPE", poisonErr)
	}
	for i := range jobs {
		if errs[i] != nil {
			t.Fatalf("job %d: %v", i, errs[i])
		}
		g, w := got[i], wantResults[i]
		g.Entry, w.Entry = engine.EntryID{}, engine.EntryID{} // seqs depend on the microsecond shared
		if g != w {
			t.Fatalf("job %d (%+v):\n batched %+v\n    want %+v (alone)", i, jobs[i], g, w)
		}
	}
	// The call in flight, then the 61 queued requests in one call (at most 128 go together).
	if calls := scriptCalls(t, c); calls > 3 {
		t.Fatalf("%d requests in %d script calls: they were not batched", len(jobs)+2, calls)
	}
}

// A caller whose context ends while its decision waits for the call in flight takes it out:
// it is never sent, and the log never sees it.
func TestBatchedCancelledCallersAreNeverSent(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	admin := valkeytest.NewClient(t, own.Addr)
	ctx := context.Background()
	e := enginetest.New(t, c, engine.WithBatching(true))
	key, l := enginetest.NewKey(t), engine.PerHour(100)

	// The server takes no writes for a while: the first decision is the call in flight, the
	// others queue behind it.
	if err := admin.Do(ctx, admin.B().ClientPause().Timeout(700).Write().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	first := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, err := e.Allow(ctx, key, l) // no deadline: applied once the pause ends
		first <- err
	}()
	time.Sleep(50 * time.Millisecond)
	var cancelled atomic.Int64
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			if _, err := e.Allow(cctx, key, l); errors.Is(err, context.DeadlineExceeded) {
				cancelled.Add(1)
			}
		}()
	}
	wg.Wait()
	if err := <-first; err != nil {
		t.Fatalf("the decision in flight: %v", err)
	}
	enginetest.Want(t, "queued callers that gave up", cancelled.Load(), int64(20))
	enginetest.Want(t, "events: only the one in flight", enginetest.StoredEvents(t, c, key), int64(1))
}

// A server that goes away under a batch fails every caller in it with ErrUnavailable, and the
// same engine batches again once the server is back.
func TestBatchedServerRestartFailsCallersThenBatchesAgain(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	e := enginetest.New(t, c, engine.WithBatching(true))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := engine.PerMinute(1000)
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var unavailable atomic.Int64
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if _, err := e.Allow(tctx, fmt.Sprint("restart-", i), l); errors.Is(err, engine.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
				unavailable.Add(1)
			}
		}()
	}
	wg.Wait()
	enginetest.Want(t, "callers told the server is unavailable", unavailable.Load(), int64(16))
	if err := own.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := valkeytest.WaitFor(ctx, 10*time.Second, "decisions to succeed again", func() (bool, error) {
		_, err := e.Allow(ctx, "after-restart", l)
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	results := enginetest.RunConcurrently(t, []*engine.Engine{e}, 32, 200, func(e *engine.Engine) (engine.Result, error) {
		return e.Allow(ctx, "after-restart-burst", engine.PerMinute(150))
	})
	admitted := 0
	for _, r := range results {
		if r.Allowed {
			admitted++
		}
	}
	enginetest.Want(t, "admitted after the restart", admitted, 150)
}

// Peeks batch apart from decisions, read-only, and answer as a peek alone does.
func TestBatchedPeeksAnswerAsAPeekAlone(t *testing.T) {
	c := exampleServer.Client(t)
	e, _ := enginetest.Clocked(t, c, engine.WithBatching(true))
	key, l := enginetest.NewKey(t), engine.PerMinute(10)
	enginetest.MustAllowN(t, e, key, l, 4)
	results := enginetest.RunConcurrently(t, []*engine.Engine{e}, 32, 200, func(e *engine.Engine) (engine.Result, error) {
		return e.Peek(context.Background(), key, l)
	})
	for _, r := range results {
		if !r.Allowed || r.Remaining != 6 || r.ResetAfter != time.Minute || !r.Entry.IsZero() {
			t.Fatalf("batched peek: %+v, want allowed, 6 remaining, reset after a minute, no entry", r)
		}
	}
	enginetest.Want(t, "events after 200 peeks", enginetest.StoredEvents(t, c, key), int64(4))
}

// A paused server yields a timeout when the caller's deadline passes, never a hang. The
// request the caller gave up on may still run once the server resumes (the caller was not told
// yes, so that can only deny early), and is never applied twice.
func TestPausedServerTimesOutAtTheCallersDeadline(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	admin := valkeytest.NewClient(t, own.Addr)
	e := enginetest.New(t, c)
	open := enginetest.New(t, c, engine.WithFailOpen(true))
	key, l := enginetest.NewKey(t), engine.PerMinute(5)
	ctx := context.Background()

	// The pauses last far longer than a call may take to honour its 200 ms deadline (bound),
	// however busy the machine, and end when the test says: a call that waited for the server
	// would take the whole pause.
	const deadline, bound = 200 * time.Millisecond, 10 * time.Second
	// CLIENT PAUSE answers once the pause is in force; CLIENT UNPAUSE, not a write, is not held.
	run := func(cmd valkey.Completed) {
		t.Helper()
		if err := admin.Do(ctx, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	run(admin.B().ClientPause().Timeout(time.Minute.Milliseconds()).Write().Build())
	tctx, cancel := context.WithTimeout(ctx, deadline)
	start := time.Now()
	_, err := e.Allow(tctx, key, l)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Allow on a paused server: %v, want context.DeadlineExceeded", err)
	}
	if waited := time.Since(start); waited > bound {
		t.Fatalf("Allow took %s to honour a %s deadline, want well under %s: it waited for the server", waited, deadline, bound)
	}
	// Fail-open: the caller's own deadline is no admission; a bound set on the server's answer
	// (its cause ErrUnavailable) is the server's failure, and admits.
	tctx, cancel = context.WithTimeout(ctx, deadline)
	r, err := open.Allow(tctx, key, l)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || r.Allowed {
		t.Fatalf("fail-open Allow on a paused server, the caller's deadline: %+v, %v; want context.DeadlineExceeded", r, err)
	}
	tctx, cancel = context.WithTimeoutCause(ctx, deadline, engine.ErrUnavailable)
	r, err = open.Allow(tctx, key, l)
	cancel()
	if err != nil || !r.Allowed || !errors.Is(r.BackendErr, engine.ErrUnavailable) {
		t.Fatalf("fail-open Allow on a paused server, a bound on its answer: %+v, %v; want admitted with BackendErr ErrUnavailable", r, err)
	}
	// The paused server holds the three abandoned requests, each as a blocked client, and runs
	// them when the pause ends (or drops one whose connection was closed). Once the pause is
	// over and no client is blocked any more, no abandoned request can still land.
	run(admin.B().ClientUnpause().Build())
	if err := valkeytest.WaitFor(ctx, 10*time.Second, "every held request to be released", func() (bool, error) {
		info, err := valkeytest.ReadInfo(ctx, admin, "clients")
		return info["blocked_clients"] == "0", err
	}); err != nil {
		t.Fatal(err)
	}

	// The three abandoned requests ran after the pause, or not: never more than once each.
	phantom := enginetest.StoredEvents(t, c, key)
	if phantom > 3 {
		t.Fatalf("log holds %d events after three abandoned requests, want at most 3", phantom)
	}
	told := 0
	for {
		r := enginetest.MustAllowN(t, e, key, l, 1)
		if !r.Allowed {
			break
		}
		told++
	}
	enginetest.Want(t, "told yes plus abandoned", int64(told)+phantom, int64(l.Max))
	enginetest.Want(t, "log size", enginetest.StoredEvents(t, c, key), int64(l.Max))

	// A server that runs no command at all (stopped: SIGSTOP; CLIENT PAUSE ALL would hold
	// CLIENT UNPAUSE too) times out a read just the same.
	if err := own.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = own.Resume() })
	tctx, cancel = context.WithTimeout(ctx, deadline)
	defer cancel()
	start = time.Now()
	if _, err := e.Peek(tctx, key, l); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Peek on a paused server: %v, want context.DeadlineExceeded", err)
	}
	if waited := time.Since(start); waited > bound {
		t.Fatalf("Peek on a paused server took %s to honour a %s deadline, want well under %s: it waited for the server", waited, deadline, bound)
	}
	if err := own.Resume(); err != nil {
		t.Fatal(err)
	}
}

// A caller whose context is live gets its decision whatever another caller's deadline does on
// the same connection: never ErrUnavailable, and under fail-open never an admission without a
// decision. The short-deadline caller's call is in flight alone on a fresh connection (one per
// client here, so that both calls share it) while the server is stopped; its deadline passes;
// the victim's call, queued behind it, must still be answered once the server runs again. Each
// victim takes another path than the short-deadline caller's decision: a peek, AllowAll, a
// lease, a refund, and a decision of another engine on the same client.
func TestAnotherCallersDeadlineNeverFailsMine(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	setup := enginetest.New(t, own.Client(t))
	usedUp, l := enginetest.NewKey(t), engine.PerHour(1)
	enginetest.MustAllowN(t, setup, usedUp, l, 1)
	refundedKey := enginetest.NewKey(t)
	refunded := enginetest.MustAllowN(t, setup, refundedKey, engine.PerHour(5), 1)

	victims := map[string]func(ctx context.Context, e *engine.Engine) error{
		"Peek": func(ctx context.Context, e *engine.Engine) error {
			r, err := e.Peek(ctx, usedUp, l)
			return wantDenial(r, err)
		},
		"AllowAll": func(ctx context.Context, e *engine.Engine) error {
			allowed, rs, err := e.AllowAll(ctx, []engine.Request{
				{Key: usedUp, Policy: engine.Policy{l}, N: 1}, {Key: enginetest.NewKey(t), Policy: engine.Policy{l}, N: 1}})
			if err == nil && (allowed || rs[0].Allowed || rs[0].BackendErr != nil) {
				return errors.New("AllowAll admitted a used-up key")
			}
			return err
		},
		"Acquire": func(ctx context.Context, e *engine.Engine) error {
			lease, err := e.Acquire(ctx, enginetest.NewKey(t), 1, time.Minute)
			if err == nil && lease.BackendErr != nil {
				return lease.BackendErr
			}
			return err
		},
		"Refund": func(ctx context.Context, e *engine.Engine) error {
			return e.Refund(ctx, refundedKey, refunded)
		},
		"Allow on another engine": func(ctx context.Context, e *engine.Engine) error {
			r, err := e.Allow(ctx, usedUp, l)
			return wantDenial(r, err)
		},
	}
	for name, victim := range victims {
		t.Run(name, func(t *testing.T) {
			// A fresh client: valkey-go sends a call alone, on its caller's deadline, only on a
			// connection that has not yet seen two calls at once. One connection, so that both
			// calls share it.
			c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{own.Addr}, PipelineMultiplex: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			short := enginetest.New(t, c)
			other := enginetest.New(t, c, engine.WithFailOpen(true))
			if err := own.Pause(); err != nil {
				t.Fatal(err)
			}
			resumed := false
			defer func() {
				if !resumed {
					_ = own.Resume()
				}
			}()
			shortDone := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				_, err := short.Allow(ctx, enginetest.NewKey(t), l)
				shortDone <- err
			}()
			// Only the order matters here, and only to show the failure before the fix: the
			// victim's call should queue behind the short one, which is then in flight.
			time.Sleep(20 * time.Millisecond)
			victimDone := make(chan error, 1)
			go func() { victimDone <- victim(context.Background(), other) }()
			if err := <-shortDone; !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("the short-deadline caller: %v, want its own deadline", err)
			}
			if err := own.Resume(); err != nil {
				t.Fatal(err)
			}
			resumed = true
			if err := <-victimDone; err != nil {
				t.Fatalf("the victim, whose context is live, failed: %v", err)
			}
		})
	}
}

// wantDenial returns nil for a decision that denied, else what was wrong with it.
func wantDenial(r engine.Result, err error) error {
	switch {
	case err != nil:
		return err
	case r.BackendErr != nil:
		return r.BackendErr
	case r.Allowed:
		return errors.New("a used-up key was admitted")
	}
	return nil
}

// After SCRIPT FLUSH the next call still succeeds: EVALSHA answers NOSCRIPT and the source
// goes with EVAL, once.
func TestScriptFlushFallsBackToEval(t *testing.T) {
	c := exampleServer.Client(t)
	e := enginetest.New(t, c)
	key, l := enginetest.NewKey(t), engine.PerMinute(3)
	ctx := context.Background()
	enginetest.MustAllowN(t, e, key, l, 1)
	for i := 0; i < 2; i++ {
		if err := c.Do(ctx, c.B().ScriptFlush().Build()).Error(); err != nil {
			t.Fatal(err)
		}
		r := enginetest.MustAllowN(t, e, key, l, 1)
		enginetest.Want(t, fmt.Sprintf("allow after flush %d", i+1), r.Remaining, 1-i)
		enginetest.Want(t, fmt.Sprintf("peek after flush %d", i+1), enginetest.MustPeek(t, e, key, l).Remaining, 1-i)
	}
	enginetest.Want(t, "log size", enginetest.StoredEvents(t, c, key), int64(3))
}

// Group commit in a cluster: a batch goes to the primary that serves its keys' slots and may
// hold keys of all of them; a node that does not hold a key (a slot that moved or is moving,
// a failover) makes that decision go again alone, through the cluster client. These tests run
// real clusters and audit every decision: per key, what callers were told against what the
// log holds.

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
func TestClusterBatchesSpanTheSlotsOfANode(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
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
func TestClusterBatchDuringSlotMigrationDecidesEachRequestOnce(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
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
			t.Errorf("key %d (%s, moving slot %v): the log holds %d, want the %d admissions callers were told of", i, k, i < moving, entries[i], allowed)
		case allowed > max:
			t.Errorf("key %d: %d admitted, above Max %d", i, allowed, max)
		case denied > 0 && allowed < max:
			t.Errorf("key %d: %d denied with %d of %d admitted, want no denial under Max", i, denied, allowed, max)
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
func TestClusterBatchFailoverLosesNoAcknowledgedDecision(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
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

// A caller's deadline bounds its call while the connection the call needs is being made: a
// server that accepts connections and does not answer (stopped here) holds valkey-go's
// greeting of a new connection for the client's dial and write timeouts (a minute each here),
// whatever the call's context. Each kind of call, on a client whose connection the server has just closed,
// must come back with an error long before that, with the server still stopped. (Before the
// engine sent such a call on a goroutine of its own, the one that made the connection waited
// for the dial timeout.)
func TestDeadlineHoldsWhileTheConnectionIsMade(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	admin := own.Client(t)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{own.Addr}, PipelineMultiplex: -1,
		Dialer: net.Dialer{Timeout: time.Minute}, ConnWriteTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := enginetest.New(t, c)
	pe, err := pipelined.New(c)
	if err != nil {
		t.Fatal(err)
	}
	l := engine.PerHour(10)
	refundKey := enginetest.NewKey(t)
	admitted := enginetest.MustAllowN(t, e, refundKey, l, 1)
	calls := map[string]func(ctx context.Context) error{
		"Allow": func(ctx context.Context) error { _, err := e.Allow(ctx, enginetest.NewKey(t), l); return err },
		"Peek":  func(ctx context.Context) error { _, err := e.Peek(ctx, enginetest.NewKey(t), l); return err },
		"AllowAll": func(ctx context.Context) error {
			_, _, err := e.AllowAll(ctx, []engine.Request{{Key: enginetest.NewKey(t), Policy: engine.Policy{l}, N: 1}})
			return err
		},
		"Acquire": func(ctx context.Context) error {
			_, err := e.Acquire(ctx, enginetest.NewKey(t), 1, time.Minute)
			return err
		},
		"Refund":          func(ctx context.Context) error { return e.Refund(ctx, refundKey, admitted) },
		"Reset":           func(ctx context.Context) error { return e.Reset(ctx, enginetest.NewKey(t)) },
		"pipelined.Allow": func(ctx context.Context) error { _, err := pe.Allow(ctx, enginetest.NewKey(t), l); return err },
		"pipelined.Reset": func(ctx context.Context) error { return pe.Reset(ctx, enginetest.NewKey(t)) },
	}
	const deadline, bound = 200 * time.Millisecond, 10 * time.Second
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			// The server closes the client's connection, and stops: the client notices on its
			// next call (an error at once, or a new connection), and makes a new one on the
			// call after at the latest, which the server never greets.
			if err := admin.Do(context.Background(), admin.B().ClientKill().TypeNormal().SkipmeYes().Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if err := own.Pause(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := own.Resume(); err != nil {
					t.Fatal(err)
				}
			}()
			for i := range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				began := time.Now()
				err := call(ctx)
				took := time.Since(began)
				cancel()
				if err == nil || took > bound {
					t.Fatalf("call %d with the server stopped: %v after %s; want an error well before the dial timeout (a minute)", i+1, err, took)
				}
			}
		})
	}
}
