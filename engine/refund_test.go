package engine_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
)

// memoryUsage is MEMORY USAGE of key's log, in bytes.
func memoryUsage(t *testing.T, c valkey.Client, key string) int64 {
	t.Helper()
	size, err := c.Do(context.Background(), c.B().MemoryUsage().Key(enginetest.Prefix+key).Samples(0).Build()).AsInt64()
	if err != nil {
		t.Fatalf("MEMORY USAGE: %v", err)
	}
	return size
}

// Refunded requests leave no trace that grows with their number: after thousands of
// Allow+Refund pairs against 5 per hour, on their own, behind a live entry, and under a
// caller's clock frozen on one microsecond, the log holds at most one refunded entry beside
// each live one (plus one), and stays a few hundred bytes. Before, every refunded entry stayed
// until it left the hour: 20,000 pairs made a 206 KB key, every decision walking them.
func TestRefundsKeepTheLogBounded(t *testing.T) {
	const pairs = 3000
	for _, tc := range []struct {
		name   string
		frozen bool // a caller's clock that never moves
		live   int  // admitted requests kept before the pairs
	}{
		{"alone", false, 0},
		{"behind a live entry", false, 1},
		{"behind four live entries", false, 4},
		{"frozen clock", true, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := exampleServer.Client(t)
			var e *engine.Engine
			if tc.frozen {
				e, _ = enginetest.Clocked(t, c)
			} else {
				e = enginetest.New(t, c)
			}
			key, l := enginetest.NewKey(t), engine.PerHour(5)
			var kept []engine.Result
			for i := 0; i < tc.live; i++ {
				kept = append(kept, enginetest.MustAllowN(t, e, key, l, 1))
			}
			for i := 0; i < pairs; i++ {
				r := enginetest.MustAllowN(t, e, key, l, 1)
				if !r.Allowed {
					t.Fatalf("pair %d: denied with %d live events of 5: %+v", i, tc.live, r)
				}
				if err := e.Refund(context.Background(), key, r); err != nil {
					t.Fatal(err)
				}
			}
			log := enginetest.Log(t, c, enginetest.Prefix, key)
			if log.Events != tc.live || log.Count > 2*tc.live+1 {
				t.Fatalf("after %d refunded pairs: %d events in %d entries; want %d events in at most %d entries", pairs, log.Events, log.Count, tc.live, 2*tc.live+1)
			}
			if size := memoryUsage(t, c, key); size > 512 {
				t.Fatalf("MEMORY USAGE %d bytes after %d refunded pairs, want under 512", size, pairs)
			}
			// The live entries keep their identities: refunding them still gives their room back.
			for _, r := range kept {
				if err := e.Refund(context.Background(), key, r); err != nil {
					t.Fatal(err)
				}
			}
			if got := enginetest.MustPeek(t, e, key, l); got.Remaining != 5 {
				t.Fatalf("after refunding the live entries: %d remaining, want 5", got.Remaining)
			}
		})
	}
}

// 16 goroutines over 4 clients, batched (so that many entries share a microsecond), admit,
// refund most of what they admit and retry refunds of earlier ones: no identity ever names
// another request's entry (the events the log holds are exactly those admitted and not
// refunded), and the log keeps no more refunded entries than live ones, plus one.
func TestRefundsBoundedAndExactUnderConcurrency(t *testing.T) {
	es, c := enginetest.Engines(t, exampleServer, 4)
	key, l := enginetest.NewKey(t), engine.Limit{Max: 1_000_000, Window: time.Hour}
	var mu sync.Mutex
	kept := 0
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := 0; g < 16; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			e := es[g%len(es)]
			var refunded []engine.Result
			for i := 0; i < 300; i++ {
				n := 1 + rng.IntN(3)
				r, err := e.AllowN(context.Background(), key, l, n)
				if err == nil && !r.Allowed {
					err = fmt.Errorf("denied far below Max: %+v", r)
				}
				if err != nil {
					errs <- err
					return
				}
				if rng.IntN(10) == 0 {
					mu.Lock()
					kept += n
					mu.Unlock()
					continue
				}
				refunded = append(refunded, r)
				// Refund it, and now and then retry the refund of an earlier one.
				for _, x := range []engine.Result{r, refunded[rng.IntN(len(refunded))]} {
					if err := e.Refund(context.Background(), key, x); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	log := enginetest.Log(t, c, enginetest.Prefix, key)
	live := 0
	for _, le := range log.Entries {
		if le.Cost > 0 {
			live++
		}
	}
	t.Logf("%d events kept in %d live entries; the log holds %d entries", kept, live, log.Count)
	if log.Events != kept {
		t.Fatalf("the log holds %d events, want %d: a refund took another request's events", log.Events, kept)
	}
	if log.Count > 2*live+1 {
		t.Fatalf("the log holds %d entries for %d live ones: refunded entries pile up", log.Count, live)
	}
}
