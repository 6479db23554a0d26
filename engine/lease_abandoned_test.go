package engine_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// abandonedTTL is the ttl of the leases these tests abandon: far beyond any bound they wait
// for, so that a lease left behind is found held, not expired.
const abandonedTTL = time.Hour

// waitNoLeases waits, with a generous bound, until none of keys holds a lease.
func waitNoLeases(t *testing.T, c valkey.Client, what string, keys ...string) {
	t.Helper()
	if err := valkeytest.WaitFor(context.Background(), 30*time.Second, what, func() (bool, error) {
		for _, key := range keys {
			if leaseCount(t, c, key) != 0 {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		for _, key := range keys {
			t.Logf("key %q holds %d leases", key, leaseCount(t, c, key))
		}
		t.Fatal(err)
	}
}

// An Acquire whose caller gives up while the server does not answer (its deadline passes, or
// it is cancelled; fail-closed or fail-open) holds nothing once the server answers again: the
// lease the script grants then, to nobody, is released. A fail-open caller whose deadline
// passed gets a lease without a slot; a cancelled one its context's error. An Extend whose
// caller gave up leaves the lease to its holder, who then releases it.
func TestAcquireAbandonedHoldsNoSlot(t *testing.T) {
	srv := valkeytest.New(t, valkeytest.OwnServer())
	t.Cleanup(func() { _ = srv.Resume() })
	admin := srv.Client(t)
	// Each engine on a client of its own: a call that a deadline cuts short may close its
	// connection, and must not take another engine's calls with it.
	closed := enginetest.New(t, srv.Client(t))
	open := enginetest.New(t, srv.Client(t), engine.WithFailOpen(true))
	extender := enginetest.New(t, srv.Client(t))
	ctx := context.Background()
	held := mustAcquire(t, extender, enginetest.NewKey(t), 1, abandonedTTL)
	deadlineKey, cancelledKey, openKey := enginetest.NewKey(t), enginetest.NewKey(t), enginetest.NewKey(t)
	// Each engine's connection is up before the pause: a dial would wait for the server, and
	// nothing would be sent.
	mustRelease(t, closed, mustAcquire(t, closed, deadlineKey, 1, abandonedTTL))
	mustRelease(t, open, mustAcquire(t, open, openKey, 1, abandonedTTL))
	before := scriptCalls(t, admin)

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	short := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 20*time.Millisecond) }
	// The Extend first: should it wait for a connection's dial, the Acquires' callers have not
	// left yet, and the server answers well within leaseCleanupTimeout (5 s) of their leaving.
	dctx, cancel := short()
	_, err := extender.Extend(dctx, held, abandonedTTL)
	cancel()
	if err == nil {
		t.Fatal("Extend past its deadline, server paused: no error")
	}
	dctx, cancel = short()
	l, err := closed.Acquire(dctx, deadlineKey, 1, abandonedTTL)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || l != (engine.Lease{}) {
		t.Fatalf("fail-closed Acquire past its deadline, server paused: %+v, %v; want no lease and the deadline's error", l, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	stop := time.AfterFunc(20*time.Millisecond, cancel)
	l, err = open.Acquire(cctx, cancelledKey, 1, abandonedTTL)
	stop.Stop()
	cancel()
	if !errors.Is(err, context.Canceled) || l != (engine.Lease{}) {
		t.Fatalf("fail-open Acquire cancelled, server paused: %+v, %v; want no lease and context.Canceled", l, err)
	}
	dctx, cancel = short()
	l, err = open.Acquire(dctx, openKey, 1, abandonedTTL)
	cancel()
	if err != nil || l.BackendErr == nil || l.ID != uuid.Nil {
		t.Fatalf("fail-open Acquire past its deadline, server paused: %+v, %v; want a lease without a slot, carrying the error", l, err)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}

	// The four scripts sent during the pause run once the server does (some of those that ran
	// may be the releases that follow them).
	if err := valkeytest.WaitFor(ctx, 30*time.Second, "the scripts sent during the pause to run", func() (bool, error) {
		return scriptCalls(t, admin) >= before+4, nil
	}); err != nil {
		t.Fatal(err)
	}
	waitNoLeases(t, admin, "the abandoned leases to be released", deadlineKey, cancelledKey, openKey)
	// The abandoned Extend may have landed: the lease is still its holder's, to release.
	enginetest.Want(t, "leases of the extended key", leaseCount(t, admin, held.Key), int64(1))
	mustRelease(t, extender, held)
	enginetest.Want(t, "leases of the extended key after its release", leaseCount(t, admin, held.Key), int64(0))
	// Every key has its one slot: nothing is held by a caller that left.
	for _, key := range []string{deadlineKey, cancelledKey, openKey} {
		mustRelease(t, closed, mustAcquire(t, closed, key, 1, time.Minute))
	}
}

// A storm of Acquires with tiny deadlines (20 µs to 5 ms) on one key, max 4, from 32
// goroutines over 4 clients: whoever got a lease releases it, and then the key holds none;
// the holders that got a lease were never more than max at once.
func TestAcquireStormOfDeadlinesHoldsNoSlot(t *testing.T) {
	es, c := enginetest.Engines(t, exampleServer, 4)
	key, max := enginetest.NewKey(t), 4
	var (
		holders, peak, granted, gaveUp atomic.Int64
		wg                             sync.WaitGroup
		errs                           = make(chan error, 32)
	)
	for g := range 32 {
		e := es[g%len(es)]
		rng := rand.New(rand.NewPCG(uint64(g), 4))
		wg.Go(func() {
			for range 80 {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Microsecond+time.Duration(rng.Int64N(int64(5*time.Millisecond-20*time.Microsecond))))
				l, err := e.Acquire(ctx, key, max, abandonedTTL)
				cancel()
				switch {
				case err == nil:
					granted.Add(1)
					n := holders.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
					holders.Add(-1)
					if err := e.Release(context.Background(), l); err != nil {
						errs <- err
						return
					}
				case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, engine.ErrUnavailable):
					// The caller gave up, or its call failed without saying whether it
					// granted (its deadline cut a dial short, say): either way no lease
					// may outlive it.
					gaveUp.Add(1)
				case !errors.Is(err, engine.ErrRateLimitExceeded):
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d leases granted and released, %d callers gave up, at most %d holders at once (max %d)",
		granted.Load(), gaveUp.Load(), peak.Load(), max)
	if peak.Load() > int64(max) {
		t.Fatalf("%d holders at once, above max %d", peak.Load(), max)
	}
	if gaveUp.Load() == 0 {
		t.Fatal("no caller gave up before its reply: nothing was tested")
	}
	waitNoLeases(t, c, "every lease of the storm to be released", key)
}

// A lease the server granted but no replica acknowledged (WithReplicaAck, a server without
// replicas) is an error wrapping ErrUnavailable, and it holds no slot: the caller did not
// get it, so it is released.
func TestAcquireNotAcknowledgedHoldsNoSlot(t *testing.T) {
	c := exampleServer.Client(t)
	e := enginetest.New(t, c, engine.WithReplicaAck(1, 20*time.Millisecond))
	key := enginetest.NewKey(t)
	if l, err := e.Acquire(context.Background(), key, 1, abandonedTTL); !errors.Is(err, engine.ErrUnavailable) || l != (engine.Lease{}) {
		t.Fatalf("Acquire that no replica acknowledged: %+v, %v; want no lease and ErrUnavailable", l, err)
	}
	waitNoLeases(t, c, "the lease no replica acknowledged to be released", key)
}
