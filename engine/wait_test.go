package engine_test

import (
	"context"
	"errors"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
)

// Waiters under contention each get in exactly once, at the rate the limit allows; a wait that
// would pass its deadline returns at once; a cost above Max is refused.
func TestWaitAdmitsEachWaiterAtTheLimitsRate(t *testing.T) {
	es, c := enginetest.Engines(t, exampleServer, 2)
	key, l := enginetest.NewKey(t), engine.Limit{Max: 5, Window: 200 * time.Millisecond}
	start := time.Now()
	var admitted []time.Time
	var mu sync.Mutex
	var wg sync.WaitGroup
	for g := 0; g < 15; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			r, err := es[g%2].Wait(ctx, key, l)
			if err != nil || !r.Allowed {
				t.Errorf("waiter %d: %+v, %v; want an admission", g, r, err)
				return
			}
			mu.Lock()
			admitted = append(admitted, r.At)
			mu.Unlock()
		}()
	}
	wg.Wait()
	enginetest.Want(t, "waiters admitted", len(admitted), 15)
	if n := enginetest.StoredEvents(t, c, key); n > int64(l.Max) {
		t.Fatalf("the log holds %d events, over Max %d", n, l.Max)
	}
	sort.Slice(admitted, func(i, j int) bool { return admitted[i].Before(admitted[j]) })
	for i := l.Max; i < len(admitted); i++ {
		if gap := admitted[i].Sub(admitted[i-l.Max]); gap < l.Window {
			t.Fatalf("admissions %d and %d only %s apart: more than %d in a window", i-l.Max, i, gap, l.Max)
		}
	}
	t.Logf("15 waiters through a limit of 5 per 200ms in %s", time.Since(start).Round(time.Millisecond))

	// A wait of a minute against a deadline of 20 s: it says so at once, not at the deadline
	// (the bound, half the deadline, leaves a busy machine all the time it needs).
	const deadline = 20 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	full := enginetest.NewKey(t)
	enginetest.MustAllowN(t, es[0], full, engine.PerMinute(1), 1)
	began := time.Now()
	_, err := es[0].Wait(ctx, full, engine.PerMinute(1))
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, engine.ErrRateLimitExceeded) {
		t.Fatalf("a wait past the deadline: %v, want DeadlineExceeded and ErrRateLimitExceeded", err)
	}
	if waited := time.Since(began); waited > deadline/2 {
		t.Errorf("a wait that could not end in time took %s to say so, want at once", waited)
	}
	if _, err := es[0].WaitN(context.Background(), full, engine.PerMinute(1), 2); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Fatalf("WaitN above Max: %v, want ErrInvalidArgument", err)
	}
}
