package engine_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
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
