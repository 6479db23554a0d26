package engine_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/tcpproxy"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// Under 64 goroutines on one key, 200 decisions each and for 5 windows at least, the deny
// cache answers some requests locally, the audit on the decisions' timestamps (a cached
// denial's is the real denial's, moved on by the time since) finds no overshoot and no false
// denial, and once a window has room the server admits again at once (no cached denial
// outlives the real one). Reset through the engine clears the key's denials. (How much of the
// load the cache sheds is measured by the bench's exactness scenario, not asserted here: it
// depends on how many requests a busy machine makes in each denial's RetryAfter.)
func TestDenyCacheExactUnderLoad(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	var es []*engine.Engine
	for i := 0; i < 4; i++ {
		es = append(es, enginetest.New(t, own.Client(t), engine.WithDenyCache(64)))
	}
	key, l := enginetest.NewKey(t), engine.Limit{Max: 20, Window: 100 * time.Millisecond}
	resetStats(t, c)
	ds, cached := hammer(t, es, 64, 200, 5*l.Window, func(_ *rand.Rand, e *engine.Engine) (engine.Result, int, error) {
		r, err := e.Allow(context.Background(), key, l)
		return r, 1, err
	})
	wantLimitReached(t, ds, auditWeighted(t, ds, l), l.Max)
	t.Logf("%d decisions by the cache, the rest in %d server calls", cached, scriptCalls(t, c))
	if cached == 0 {
		t.Fatal("the cache answered no request: its denials were never audited")
	}

	// A cached denial ends exactly when the real one does: the first request after its
	// RetryAfter goes to the server and is admitted.
	clocked, clock := enginetest.Clocked(t, c, engine.WithDenyCache(8))
	key = enginetest.NewKey(t)
	enginetest.MustAllowN(t, clocked, key, engine.PerSecond(1), 1)
	clock.Set(enginetest.T0.Add(300 * time.Millisecond))
	r := enginetest.MustAllowN(t, clocked, key, engine.PerSecond(1), 1)
	enginetest.Want(t, "denied by the server", r.FromCache, false)
	enginetest.Want(t, "retry after", r.RetryAfter, 700*time.Millisecond)
	clock.Set(enginetest.T0.Add(999 * time.Millisecond))
	r = enginetest.MustAllowN(t, clocked, key, engine.PerSecond(1), 1)
	enginetest.Want(t, "1 ms before: cached", r.FromCache, true)
	enginetest.Want(t, "1 ms before: retry after counted down", r.RetryAfter, time.Millisecond)
	clock.Set(enginetest.T0.Add(time.Second))
	enginetest.Want(t, "at RetryAfter: allowed", enginetest.MustAllowN(t, clocked, key, engine.PerSecond(1), 1).Allowed, true)

	// Reset clears the key's cached denials; a cheaper request than the one denied asks the
	// server.
	clock.Set(enginetest.T0.Add(1100 * time.Millisecond))
	enginetest.Want(t, "denied again", enginetest.MustAllowN(t, clocked, key, engine.PerSecond(1), 1).Allowed, false)
	enginetest.Want(t, "cached", enginetest.MustAllowN(t, clocked, key, engine.PerSecond(1), 1).FromCache, true)
	if err := clocked.Reset(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "after Reset: allowed", enginetest.MustAllowN(t, clocked, key, engine.PerSecond(1), 1).Allowed, true)
	big := engine.Limit{Max: 5, Window: time.Minute}
	enginetest.MustAllowN(t, clocked, key+":big", big, 4)
	enginetest.Want(t, "cost 2 denied", enginetest.MustAllowN(t, clocked, key+":big", big, 2).Allowed, false)
	r = enginetest.MustAllowN(t, clocked, key+":big", big, 1)
	enginetest.Want(t, "cost 1 after a cost-2 denial: asks the server, admitted", r.Allowed && !r.FromCache, true)
}

// A denial whose reply lands after a Refund or a Reset of its key (sent once the denial was
// decided) is not kept: the key's next request is decided by the server, which admits it.
// The replies are held in a proxy between the engine and the server, so the order is the one
// the test sets: the denial decided, the give-back applied, then both replies.
func TestDenyCacheKeepsNoDenialDecidedBeforeAGiveBack(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer()) // its script calls are this test's alone
	admin := own.Client(t)
	for _, giveBack := range []string{"refund", "reset"} {
		t.Run(giveBack, func(t *testing.T) {
			proxy, err := tcpproxy.Start(own.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer proxy.Close()
			// The replies wait in the proxy as long as the test says: the client pipelines every
			// command (so the give-back goes out while the denial's reply waits) and gives a
			// connection that long to answer.
			client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{proxy.Addr}, AlwaysPipelining: true,
				ConnWriteTimeout: 5 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			e := enginetest.New(t, client, engine.WithDenyCache(1000))
			key, l := enginetest.NewKey(t), engine.PerHour(5)
			first := enginetest.MustAllowN(t, e, key, l, 1)
			for range l.Max - 1 {
				enginetest.MustAllowN(t, e, key, l, 1)
			}
			ctx := context.Background()
			before := scriptCalls(t, admin)
			proxy.Hold(tcpproxy.ToClient)
			denied := make(chan engine.Result, 1)
			go func() { denied <- enginetest.MustAllowN(t, e, key, l, 1) }()
			// The denial is decided (the server ran its script) before the give-back is sent.
			if err := valkeytest.WaitFor(ctx, time.Minute, "the denial to be decided", func() (bool, error) {
				return scriptCalls(t, admin) > before, nil
			}); err != nil {
				t.Fatal(err)
			}
			gave := make(chan error, 1)
			go func() {
				if giveBack == "refund" {
					gave <- e.Refund(ctx, key, first)
				} else {
					gave <- e.Reset(ctx, key)
				}
			}()
			want := int64(l.Max - 1)
			if giveBack == "reset" {
				want = 0
			}
			if err := valkeytest.WaitFor(ctx, time.Minute, "the give-back to be applied", func() (bool, error) {
				return enginetest.StoredEvents(t, admin, key) == want, nil
			}); err != nil {
				t.Fatal(err)
			}
			proxy.Release(tcpproxy.ToClient)
			if r := <-denied; r.Allowed {
				t.Fatalf("the request decided on a used-up key: %+v, want a denial", r)
			}
			if err := <-gave; err != nil {
				t.Fatal(err)
			}
			r := enginetest.MustAllowN(t, e, key, l, 1)
			if !r.Allowed || r.FromCache {
				t.Fatalf("after the %s returned: %+v; want admitted by the server, not a cached denial", giveBack, r)
			}
		})
	}
}

// Eight Allows and a Refund started together on a used-up key, 200 rounds: whenever the
// server says the key has room once all have returned, the next request is not refused from
// the cache.
func TestDenyCacheRefundRacingDenials(t *testing.T) {
	c := exampleServer.Client(t)
	e := enginetest.New(t, c, engine.WithDenyCache(1000))
	peeker := enginetest.New(t, c)
	l := engine.PerHour(5)
	stale := 0
	for round := range 200 {
		key := enginetest.NewKey(t)
		first := enginetest.MustAllowN(t, e, key, l, 1)
		for range l.Max - 1 {
			enginetest.MustAllowN(t, e, key, l, 1)
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { enginetest.MustAllowN(t, e, key, l, 1) })
		}
		wg.Go(func() {
			if err := e.Refund(context.Background(), key, first); err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		if enginetest.MustPeek(t, peeker, key, l).Remaining == 0 {
			continue // one of the eight took the refunded event
		}
		if r := enginetest.MustAllowN(t, e, key, l, 1); !r.Allowed {
			stale++
			t.Logf("round %d: refused with %s to wait (from the cache: %v) while the server has room", round, r.RetryAfter, r.FromCache)
		}
	}
	if stale > 0 {
		t.Fatalf("%d of 200 rounds kept a stale denial after the refund returned; want 0", stale)
	}
}
