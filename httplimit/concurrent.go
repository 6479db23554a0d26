package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/fields"
)

// ConcurrentPolicyName is the name the header fields give a NewConcurrent middleware's limit.
const ConcurrentPolicyName = "concurrency"

// concurrent is one configured in-flight middleware.
type concurrent struct {
	cfg    config
	engine *engine.Engine
	max    int
	ttl    time.Duration

	policyField string // RateLimit-Policy, the same on every response
	limitField  string // X-RateLimit-Limit
}

// NewConcurrent returns middleware that lets at most max requests of one key run at once: an
// in-flight limit, for endpoints whose cost is the time they run (reports, exports, model
// calls). Keys, options and backend failures are New's; the leases live apart from the rate
// limits' logs ([engine.LeaseNamespace]), so both middlewares may share an engine and a prefix.
//
//   - Each request holds a lease ([engine.Engine.Acquire]) while its handler runs, released when
//     the handler returns or panics. A client that hangs up while it waits gets no handler (the
//     error handler sees the context's error) and holds no slot.
//   - A handler that runs longer than ttl/2 has its lease extended every ttl/2, so ttl bounds
//     only how long a request whose server died keeps its slot: choose it well above a round
//     trip to Valkey. Should an extension find the lease lost, the handler's context is
//     cancelled with cause [engine.ErrLeaseExpired].
//   - A full key gets 429 (or the WithDeniedHandler function) with Retry-After, the wait until
//     the soonest lease expires, and the fields name [ConcurrentPolicyName] in the draft's unit
//     for in-flight limits: RateLimit-Policy "concurrency";q=5;qu="concurrent-requests" and
//     RateLimit "concurrency";r=2, r the requests that may start now (a denial adds t).
//
// It panics if e is nil, max is outside 1 to engine.MaxEvents, or ttl is outside
// engine.MinLeaseTTL to engine.MaxLeaseTTL. docs/leases.md has the details.
func NewConcurrent(e *engine.Engine, max int, ttl time.Duration, opts ...Option) func(http.Handler) http.Handler {
	switch {
	case e == nil:
		panic("httplimit: NewConcurrent with a nil engine")
	case max < 1 || max > engine.MaxEvents:
		panic(fmt.Sprintf("httplimit: NewConcurrent: max %d is outside 1 to %d", max, engine.MaxEvents))
	case ttl < engine.MinLeaseTTL || ttl > engine.MaxLeaseTTL:
		panic(fmt.Sprintf("httplimit: NewConcurrent: ttl %s is outside %s to %s", ttl, engine.MinLeaseTTL, engine.MaxLeaseTTL))
	}
	cfg, err := newConfig(opts)
	if err != nil {
		panic(fmt.Sprintf("httplimit: NewConcurrent: %v", err))
	}
	c := &concurrent{
		cfg: cfg, engine: e, max: max, ttl: ttl,
		policyField: fmt.Sprintf("%q;q=%d;qu=\"concurrent-requests\"", ConcurrentPolicyName, max),
		limitField:  strconv.Itoa(max),
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { c.serve(w, r, next) })
	}
}

// concurrentItem is the start of the RateLimit field's item.
var concurrentItem = strconv.Quote(ConcurrentPolicyName) + ";r="

func (c *concurrent) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, err := c.cfg.key(r)
	if err != nil {
		c.cfg.onError(w, r, err)
		return
	}
	lease, err := c.engine.Acquire(r.Context(), c.cfg.keyPrefix+key, c.max, c.ttl)
	var denied *engine.LeaseDeniedError
	if err != nil && !errors.As(err, &denied) {
		c.cfg.onError(w, r, err)
		return
	}
	h := w.Header()
	h["Ratelimit-Policy"] = []string{c.policyField}
	if denied != nil {
		// The denial handler takes a Result: the wait until the soonest lease frees its slot,
		// and until the last one does.
		res := engine.Result{At: denied.At, RetryAfter: denied.RetryAfter(), ResetAfter: denied.LastExpiry.Sub(denied.At)}
		c.cfg.setRateLimit(h, concurrentItem, c.limitField, 0, fields.Seconds(res.RetryAfter))
		c.cfg.deny(w, r, res)
		return
	}
	if lease.BackendErr != nil {
		c.cfg.failedOpen(w, r, next, lease.BackendErr) // the lease holds no slot: nothing to release
		return
	}
	c.cfg.setRateLimit(h, concurrentItem, c.limitField, lease.Remaining, -1)

	ctx, lost := context.WithCancelCause(r.Context())
	k := c.keep(r.Context(), lease, lost)
	defer func() {
		// Also while the handler panics: the panic goes on once the slot is given back.
		k.stop()
		lost(nil)
		// The client may be gone; the slot must still be given back, and after ttl the lease
		// has expired anyway. A failed release leaves the slot to free itself then.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), c.ttl)
		_ = c.engine.Release(rctx, lease)
		cancel()
	}()
	next.ServeHTTP(w, r.WithContext(ctx))
}

// keeper extends one request's lease every ttl/2 while its handler runs. Nothing runs until
// the first half ttl has passed, so short requests cost only a timer.
type keeper struct {
	c     *concurrent
	lease engine.Lease
	lost  context.CancelCauseFunc // ends the handler's context when the lease is lost
	ctx   context.Context         // the extensions' context, ended by stop
	end   context.CancelFunc
	timer *time.Timer
	done  chan struct{} // closed when run returns
}

// keep starts extending lease; the extensions outlive a cancelled request (ctx's values only).
func (c *concurrent) keep(ctx context.Context, lease engine.Lease, lost context.CancelCauseFunc) *keeper {
	k := &keeper{c: c, lease: lease, lost: lost, done: make(chan struct{})}
	k.ctx, k.end = context.WithCancel(context.WithoutCancel(ctx))
	k.timer = time.AfterFunc(c.ttl/2, k.run)
	return k
}

func (k *keeper) run() {
	defer close(k.done)
	tick := time.NewTicker(k.c.ttl / 2)
	defer tick.Stop()
	for {
		// An extension is worth waiting for only until the next one is due.
		ctx, cancel := context.WithTimeout(k.ctx, k.c.ttl/2)
		l, err := k.c.engine.Extend(ctx, k.lease, k.c.ttl)
		cancel()
		switch {
		case errors.Is(err, engine.ErrLeaseExpired):
			k.lost(err)
			return
		case err == nil && l.BackendErr == nil:
			k.lease = l
		}
		// Any other failure leaves the lease as it was: try again at the next tick.
		select {
		case <-k.ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// stop ends the extensions and waits until none is under way, so that the release comes last.
func (k *keeper) stop() {
	k.end()
	if !k.timer.Stop() {
		<-k.done // run had started
	}
}
