package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// scriptCalls reads how many times each decision script ran on c's server (INFO commandstats
// counts EVALSHA and EVAL together per name; the batch script and the single one share it),
// and the decisions they carried are what the test counts itself.
func scriptCalls(t *testing.T, c valkey.Client) int64 {
	t.Helper()
	info, err := valkeytest.ReadInfo(context.Background(), c, "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	stats := info.CommandStats()
	return stats["evalsha"].Calls + stats["eval"].Calls
}

func resetStats(t *testing.T, c valkey.Client) {
	t.Helper()
	if err := c.Do(context.Background(), c.B().ConfigResetstat().Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

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
		t.Fatalf("2000 decisions took %d script calls: hardly batched", calls)
	}
	seen := map[int]bool{}
	for _, r := range results {
		if !r.Allowed {
			continue
		}
		if seen[r.Remaining] {
			t.Fatalf("two admissions saw remaining %d", r.Remaining)
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
			t.Fatalf("job %d (%+v):\n batched %+v\n alone   %+v", i, jobs[i], g, w)
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
func TestBatchedServerRestart(t *testing.T) {
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
func TestBatchedPeeks(t *testing.T) {
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

// With replica acknowledgement, one WAIT follows each call, not each decision: a batch of
// decisions shares it, and every admitted decision is on the replica when its caller hears yes.
func TestBatchedReplicaAckOneWaitPerCall(t *testing.T) {
	primary := valkeytest.New(t, valkeytest.OwnServer())
	rc := replicaOf(t, primary)
	var es []*engine.Engine
	for i := 0; i < 4; i++ {
		es = append(es, enginetest.New(t, primary.Client(t), engine.WithBatching(true), engine.WithReplicaAck(1, time.Second)))
	}
	key, l := oneFollowerPerCall(t, primary.Client(t), es, "wait", engine.PerHour(200))
	enginetest.Want(t, "events on the replica", enginetest.StoredEvents(t, rc, key), int64(l.Max))
}

// oneFollowerPerCall has 64 goroutines take 400 decisions on one key at limit l through es,
// and checks that follower (the command sent with each call: "wait", "waitaof") ran once per
// script call, that the calls were batched, and that min(400, l.Max) were admitted. It returns
// the key and its limit.
func oneFollowerPerCall(t *testing.T, c valkey.Client, es []*engine.Engine, follower string, l engine.Limit) (string, engine.Limit) {
	t.Helper()
	ctx := context.Background()
	key := enginetest.NewKey(t)
	resetStats(t, c)
	results := enginetest.RunConcurrently(t, es, 64, 400, func(e *engine.Engine) (engine.Result, error) {
		return e.Allow(ctx, key, l)
	})
	info, err := valkeytest.ReadInfo(ctx, c, "commandstats")
	if err != nil {
		t.Fatal(err)
	}
	follows, calls := info.CommandStats()[follower].Calls, scriptCalls(t, c)
	t.Logf("400 decisions in %d script calls, %d %s", calls, follows, follower)
	if follows != calls || follows >= 300 {
		t.Fatalf("%d %s for %d script calls and 400 decisions: want one per call, shared", follows, follower, calls)
	}
	admitted := 0
	for _, r := range results {
		if r.Allowed {
			admitted++
		}
	}
	enginetest.Want(t, "admitted", admitted, min(400, l.Max))
	return key, l
}

func mustAtoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}
