package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The path of one decision, top-down, in three files:
//
//  1. decide.go (this file): an exported method (Allow, AllowN, AllowPolicy, Peek, PeekPolicy,
//     Check, Record; Wait and local quota's reservations come here too) validates its
//     arguments, makes its request, asks the deny cache and local quota, and hands the request
//     to the group commit of its kind (decide).
//  2. commit.go: the group commit sends it, alone or with others in one call of the batch
//     script, and exec, the one function that calls a script, runs the call with the
//     acknowledgements asked for, on the caller's context without its deadline.
//  3. wire.go: the call's keys and arguments, and its reply, decoded into each request's
//     decision.
//
// Back here, decide turns the decision into a Result and applies the acknowledgement check,
// the fail-open policy and the deny cache; finish applies shadow mode and counts the call.
// Every other kind of script call (AllowAll's groups, settles, leases) takes the same group
// commit and the same exec, with its own wire functions.

// Allow records one event for key if l admits it now.
func (e *Engine) Allow(ctx context.Context, key string, l Limit) (Result, error) {
	return e.AllowN(ctx, key, l, 1)
}

// AllowN records n events for key if l admits all n now, and none otherwise.
func (e *Engine) AllowN(ctx context.Context, key string, l Limit, n int) (Result, error) {
	if err := checkContext(ctx); err != nil {
		return Result{}, err
	}
	if err := validate(key, l, n); err != nil {
		return Result{}, err
	}
	started := time.Now()
	r, err := e.allowAt(ctx, key, l, n, e.decisionClock())
	return e.finish(ctx, opAllow, started, r, err)
}

// Peek returns the decision Allow would take for key now, and records nothing. It runs as a
// read-only script, so it may be served where only reads are allowed.
func (e *Engine) Peek(ctx context.Context, key string, l Limit) (Result, error) {
	if err := checkContext(ctx); err != nil {
		return Result{}, err
	}
	if err := validate(key, l, 1); err != nil {
		return Result{}, err
	}
	started := time.Now()
	r, err := e.peekAt(ctx, key, l, 1, e.decisionClock())
	return e.finish(ctx, opPeek, started, r, err)
}

// AllowPolicy records n events for key if every limit of p admits all n now, and none
// otherwise: the decision is one atomic script call, exact under any concurrency.
//
// The Result speaks for the tightest limit: Remaining is the fewest events any window still
// admits after this decision; when denied, RetryAfter is the wait until every limit admits n (if nobody else
// takes the events first); ResetAfter is the wait until the log holds no event, that is its
// newest event plus the longest window. The key expires then.
//
// A Policy of one limit is exactly AllowN with that limit.
//
// The admitted request is one entry of the key's log, whatever the number of limits: Refund
// and Settle give its cost back to every window at once.
func (e *Engine) AllowPolicy(ctx context.Context, key string, p Policy, n int) (Result, error) {
	if err := e.checkPolicyCall(ctx, "allow_policy", key, p, n); err != nil {
		return Result{}, err
	}
	started := time.Now()
	r, err := e.allowPolicyAt(ctx, key, p, n, e.decisionClock())
	return e.finish(ctx, opPolicy, started, r, err)
}

// PeekPolicy returns the decision AllowPolicy would take for n events of key now, and records
// nothing: the same Result (Remaining the fewest events any window admits now, RetryAfter the
// wait until every limit admits n, QuotaAfter and Window for the tightest limit), with no Entry, and a
// ResetAfter of 0 when the log holds no event. Like Peek it runs as a read-only script, so it
// may be served where only reads are allowed. It validates as AllowPolicy does.
func (e *Engine) PeekPolicy(ctx context.Context, key string, p Policy, n int) (Result, error) {
	if err := e.checkPolicyCall(ctx, "peek_policy", key, p, n); err != nil {
		return Result{}, err
	}
	started := time.Now()
	if len(p) == 1 {
		r, err := e.peekAt(ctx, key, p[0], n, e.decisionClock())
		return e.finish(ctx, opPeek, started, r, err)
	}
	req, err := newRequest(e.prefix+key, e.decisionClock(), n, false, e.policySet(p))
	if err != nil {
		return Result{}, err
	}
	r, err := e.decide(ctx, e.peeks, "peek_policy", req)
	return e.finish(ctx, opPeek, started, r, err)
}

// allowAt and peekAt take a validated request of one limit; the exported methods validate.
func (e *Engine) allowAt(ctx context.Context, key string, l Limit, n int, at clockReading) (Result, error) {
	return e.allowSet(ctx, "allow", key, e.oneLimit(l), n, at)
}

func (e *Engine) peekAt(ctx context.Context, key string, l Limit, n int, at clockReading) (Result, error) {
	req, err := newRequest(e.prefix+key, at, n, false, e.oneLimit(l))
	if err != nil {
		return Result{}, err
	}
	return e.decide(ctx, e.peeks, "peek", req)
}

// allowPolicyAt takes a validated AllowPolicy.
func (e *Engine) allowPolicyAt(ctx context.Context, key string, p Policy, n int, now clockReading) (Result, error) {
	if len(p) == 1 {
		return e.allowAt(ctx, key, p[0], n, now)
	}
	return e.allowSet(ctx, "allow_policy", key, e.policySet(p), n, now)
}

// allowSet decides n events of key against set, from this process's local quota when its
// reservation covers n (WithLocalQuota, on the server's clock), else on the server, telling local
// quota what the server said.
func (e *Engine) allowSet(ctx context.Context, op, key string, set *limitSet, n int, at clockReading) (Result, error) {
	var h *holder
	if e.local != nil && !at.set {
		var r Result
		var ok bool
		if r, ok, h = e.local.allow(ctx, key, set, n); ok {
			return r, nil
		}
	}
	req, err := newRequest(e.prefix+key, at, n, true, set)
	if err != nil {
		return Result{}, err
	}
	r, err := e.decide(ctx, e.decides, op, req)
	if err == nil {
		h.observe(r)
	}
	return r, err
}

// decide takes one decision (or peek) through c and turns the server's answer into a Result.
// Every scripted decision goes through here, batched or not, so the acknowledgement
// (WithReplicaAck, WithDurableAck) and fail-open policies apply to all of them. A denial
// ignores what its call's WAIT answered (a call that only denied sends no WAITAOF): only an
// admission is refused for it.
func (e *Engine) decide(ctx context.Context, c *commit[request], op string, req request) (Result, error) {
	// Built only on failure: a successful decision allocates nothing for its error context.
	what := func() string {
		return "strictrate: " + op + " " + quoteKey(strings.TrimPrefix(req.key, e.prefix))
	}
	cached := e.denials != nil && c == e.decides
	var sent time.Time
	if cached {
		sent = e.localNow()
		if r, ok := e.denials.lookup(req.key, req.set, req.record, sent); ok {
			return r, nil
		}
	}
	cl := c.do(ctx, req, c.route(req.key, req.now != ""))
	out, callErr, ack := cl.req, cl.err, cl.ack
	c.release(cl)
	switch {
	case callErr != nil:
		return e.backendFailure(ctx, classify(ctx, what(), callErr))
	case out.replyErr != nil:
		return e.backendFailure(ctx, fmt.Errorf("%s: %w", what(), out.replyErr))
	}
	r, err := out.d.result(&out)
	if err != nil {
		return e.backendFailure(ctx, fmt.Errorf("%s: %w", what(), err))
	}
	if c.ack && r.Allowed {
		if err := e.ackPolicy.check(ctx, ack); err != nil {
			return e.backendFailure(ctx, fmt.Errorf("%s: %w", what(), err))
		}
	}
	if cached && !r.Allowed {
		e.denials.store(req.key, req.set, req.record, r, sent, e.localNow())
	}
	return r, nil
}

// finish applies shadow mode to a decision taken through op since started, and counts it.
func (e *Engine) finish(ctx context.Context, op operation, started time.Time, r Result, err error) (Result, error) {
	oc := outcomeAllowed
	switch {
	case err != nil:
		oc = outcomeError
	case r.BackendErr != nil:
		oc = outcomeFailOpen
	case r.Allowed:
	case e.shadow:
		r.Allowed, r.ShadowDenied = true, true
		oc = outcomeShadowDenied
	case r.FromCache:
		oc = outcomeCacheDenied
	default:
		oc = outcomeDenied
	}
	e.metrics.record(ctx, op, oc, time.Since(started))
	return r, err
}

// backendFailure applies the fail-open policy to a decision the server could not take. Closed
// (the default): a denying Result and the error. Open: an admitting Result that carries the
// error, and no error; except when the caller cancelled, which is returned as it is, and for
// a key the engine cannot read (ErrUnknownLayout), which no policy admits on.
func (e *Engine) backendFailure(ctx context.Context, err error) (Result, error) {
	if !e.failOpen || errors.Is(ctx.Err(), context.Canceled) || errors.Is(err, ErrUnknownLayout) {
		return Result{}, err
	}
	return Result{Allowed: true, BackendErr: err, At: e.localNow()}, nil
}

// maxCachedLimits bounds the engine's cache of formatted single limits: a program that makes
// limits without end (a Max per tenant, say) formats the rest each time.
const maxCachedLimits = 1024

// oneLimit returns the limit set of l alone, formatted once per engine.
func (e *Engine) oneLimit(l Limit) *limitSet {
	if s, ok := e.limitSets.Load(l); ok {
		return s.(*limitSet)
	}
	s := newLimitSet([]Limit{l})
	if e.limitSetCount.Load() < maxCachedLimits {
		if _, loaded := e.limitSets.LoadOrStore(l, s); !loaded {
			e.limitSetCount.Add(1)
		}
	}
	return s
}

// decisionClock is the clock a decision is taken on: the caller's (WithClock), else unset,
// and the script reads the server's. A Result nobody decided is stamped with localNow.
func (e *Engine) decisionClock() clockReading {
	if e.clock != nil {
		return clockReading{t: e.clock(), set: true}
	}
	return clockReading{}
}

// localNow is the caller's idea of now, for a Result the server did not decide: the
// engine's clock when it has one, else time.Now.
func (e *Engine) localNow() time.Time {
	if e.clock != nil {
		return e.clock()
	}
	return time.Now()
}

// validate checks a request for n events of key against l; every exported method checks its
// arguments once, before anything is sent.
func validate(key string, l Limit, n int) error {
	if err := validateKey(key); err != nil {
		return err
	}
	return l.validate(n)
}

// checkContext refuses a nil context before anything is counted, queued or sent: every call
// hands its context to the server round trip and, when batched, to the goroutine that sends
// its batch, and neither can use a nil one.
func checkContext(ctx context.Context) error {
	if ctx == nil {
		return fmt.Errorf("%w: nil context; pass context.Background() or a request's context", ErrInvalidArgument)
	}
	return nil
}

func validateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidArgument)
	}
	return nil
}
