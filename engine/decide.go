package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/strictrate/strictrate/internal/callerr"
	"github.com/strictrate/strictrate/internal/transport"
)

// The path of one decision, top-down: decide.go, then package transport, then wire.go, and
// back. It is the same whichever way the request goes (alone, in a batch, sent again alone
// after its batch did not take it, answered by local quota or the deny cache before any call).
//
//  1. decide.go (this file): Allow, AllowN, AllowPolicy, Peek and PeekPolicy (and Check,
//     Record, Wait, an AllowAll of one request, local quota's reservations) check their
//     arguments (a limit or policy the engine has seen was checked once, and its limit set
//     made once: checkedLimit, checkedPolicy), and hand one ask to take, the one way in. take
//     asks local quota (localquota.go), makes the request (newRequest), and decide asks the
//     deny cache and hands the request to the group commit of its kind (transport.Commit.Do).
//  2. package transport: the group commit sends the request alone, or with others in one call
//     of the batch script, routed by the cluster's slots; the retry rule sends again what a
//     call did not take; the one function that calls a script runs the call with the
//     acknowledgements asked for, on the caller's context without its deadline, and the
//     caller's own end returns it at once. A request in, its Outcome out.
//  3. wire.go: the transport has the call laid out (encodeDecisions: keys and arguments) and its
//     reply read into each request's decision, checked (decodeDecisions, readBatch). wire.go
//     calls nothing of the engine's.
//
// Back in decide.go, decide turns the Outcome into an error (its call's, its reply's, its
// acknowledgement's) or a Result (limitSet.result), applies the fail-open policy and fills the
// deny cache, and take applies shadow mode and counts the decision (finish). No file is
// entered again from one below it. Every other kind of script call (AllowAll's groups,
// settles, leases) takes the same transport, with wire functions of its own (wire_kinds.go).

// Allow records one event for key if l admits it now.
func (e *Engine) Allow(ctx context.Context, key string, l Limit) (Result, error) {
	return e.AllowN(ctx, key, l, 1)
}

// AllowN records n events for key if l admits all n now, and none otherwise.
func (e *Engine) AllowN(ctx context.Context, key string, l Limit, n int) (Result, error) {
	if err := checkContext(ctx); err != nil {
		return Result{}, err
	}
	set, err := e.checkedLimit(key, l, n)
	if err != nil {
		return Result{}, err
	}
	return e.take(ctx, ask{op: opAllow, key: key, set: set, n: n, at: e.clockReading()})
}

// Peek returns the decision Allow would take for key now, and records nothing. It runs as a
// read-only script, so it may be served where only reads are allowed.
func (e *Engine) Peek(ctx context.Context, key string, l Limit) (Result, error) {
	if err := checkContext(ctx); err != nil {
		return Result{}, err
	}
	set, err := e.checkedLimit(key, l, 1)
	if err != nil {
		return Result{}, err
	}
	return e.take(ctx, ask{op: opPeek, peek: true, key: key, set: set, n: 1, at: e.clockReading()})
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
	set, err := e.checkPolicyCall(ctx, key, p, n)
	if err != nil {
		return Result{}, err
	}
	return e.take(ctx, ask{op: opPolicy, key: key, set: set, n: n, at: e.clockReading()})
}

// PeekPolicy returns the decision AllowPolicy would take for n events of key now, and records
// nothing: the same Result (Remaining the fewest events any window admits now, RetryAfter the
// wait until every limit admits n, QuotaAfter and Window for the tightest limit), with no Entry, and a
// ResetAfter of 0 when the log holds no event. Like Peek it runs as a read-only script, so it
// may be served where only reads are allowed. It validates as AllowPolicy does.
func (e *Engine) PeekPolicy(ctx context.Context, key string, p Policy, n int) (Result, error) {
	set, err := e.checkPolicyCall(ctx, key, p, n)
	if err != nil {
		return Result{}, err
	}
	return e.take(ctx, ask{op: opPeek, peek: true, key: key, set: set, n: n, at: e.clockReading()})
}

// ask is one decision or peek, its arguments checked: what every operation that decides
// (Allow, AllowN, AllowPolicy, Peek, PeekPolicy, Check, Record, Wait, an AllowAll of one
// request, local quota's reservations) hands to take, the one way in.
type ask struct {
	op   operation // what the metrics count it as
	peek bool      // judged only, recorded never
	key  string    // as the caller gave it
	set  *limitSet // its limits (oneLimit, policySet)
	n    int       // its cost
	at   clockReading
	// hold, for a reservation (local quota), is how long it is held: neither local quota,
	// shadow mode nor the metrics apply to it.
	hold time.Duration
	// charge says the request's events were used already (Charge): recorded whatever the
	// limits say, never answered from the deny cache, and ending this process's reservations
	// of the key first.
	charge bool
	// detached says the caller runs on a goroutine of its own already, which nobody waits on
	// past its context (local quota's reservation): the call is sent on it.
	detached bool
}

// name is a's operation as its errors name it.
func (a *ask) name() string {
	switch {
	case a.charge:
		return "charge"
	case a.hold > 0:
		return "reserve"
	case a.peek && len(a.set.limits) > 1:
		return "peek_policy"
	case a.peek:
		return "peek"
	case len(a.set.limits) > 1:
		return "allow_policy"
	}
	return "allow"
}

// take decides a: from this process's local quota when its reservation covers the request
// (WithLocalQuota, on the server's clock), else on the server, telling local quota what the
// server said; then applies shadow mode and counts the decision (finish).
func (e *Engine) take(ctx context.Context, a ask) (Result, error) {
	started := time.Now()
	var h *holder
	if e.local != nil && a.charge {
		e.local.cut(a.key)
	} else if e.local != nil && !a.peek && a.hold == 0 && !a.at.set {
		var r Result
		var ok bool
		if r, ok, h = e.local.allow(ctx, a.key, a.set, a.n); ok {
			return e.finish(ctx, a.op, started, r, nil)
		}
	}
	set := a.set
	if a.hold > 0 {
		set = set.withHold(a.hold)
	}
	req, err := newRequest(e.prefix+a.key, a.at, a.n, !a.peek, set)
	if err == nil && a.charge {
		req.set = req.set.forCharge()
	}
	var r Result
	if err == nil {
		r, err = e.decide(ctx, &a, req)
	}
	if err == nil {
		h.observe(r)
	}
	if a.hold > 0 {
		return r, err
	}
	return e.finish(ctx, a.op, started, r, err)
}

// decide takes req, the request of a, through its group commit (transport.Commit.Do) and
// turns the server's answer into a Result. Every scripted decision goes through here, batched
// or not, so the acknowledgement (WithReplicaAck, WithDurableAck), fail-open and deny-cache
// policies apply to all of them. A denial ignores what its call's WAIT answered (a call that
// only denied sends no WAITAOF): only an admission is refused for it.
func (e *Engine) decide(ctx context.Context, a *ask, req request) (Result, error) {
	// Built only on failure: a successful decision allocates nothing for its error context.
	what := func() string { return "strictrate: " + a.name() + " " + quoteKey(a.key) }
	c := e.decides
	if a.peek {
		c = e.peeks
	}
	cached := e.denials != nil && !a.peek && !a.charge
	var sent time.Time
	var epoch uint64
	if cached {
		sent, epoch = e.localNow(), e.denials.epoch(req.key)
		if r, ok := e.denials.lookup(req.key, req.set, req.record, sent); ok {
			return r, nil
		}
	}
	dest := c.Route(req.key, req.now != "")
	var o transport.Outcome[decision]
	if a.detached {
		o = c.Send(ctx, req, dest)
	} else {
		o = c.Do(ctx, req, dest)
	}
	if err := o.Failure(ctx, what); err != nil {
		return e.backendFailure(ctx, err)
	}
	r := req.set.result(o.Reply, req.key, req.record)
	if cached && !r.Allowed {
		e.denials.store(req.key, req.set, req.record, r, sent, e.localNow(), epoch)
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
	case op == opCharge:
		// Recorded all the same: shadow mode has nothing to admit.
		oc = outcomeDenied
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

// record counts one decision and its duration.
func (m *metrics) record(ctx context.Context, op operation, oc metricOutcome, took time.Duration) {
	m.decisions.Add(ctx, 1, m.added[op][oc]...)
	m.duration.Record(ctx, took.Seconds(), m.recorded[op][oc]...)
}

// backendFailure applies the fail-open policy to a decision the server could not take. Closed
// (the default): a denying Result and the error. Open: an admitting Result that carries the
// error, and no error; except when the call ended with its caller (callerEnded), which is
// returned as it is, and for a key the engine cannot read (ErrUnknownLayout), which no policy
// admits on.
func (e *Engine) backendFailure(ctx context.Context, err error) (Result, error) {
	if !e.failOpen || callerEnded(ctx, err) || errors.Is(err, ErrUnknownLayout) {
		return Result{}, err
	}
	return Result{Allowed: true, BackendErr: err, At: e.localNow()}, nil
}

// callerEnded reports whether a call that failed with err ended with its caller rather than
// with the server: ctx was cancelled or its deadline passed, or err says so. Fail-open is for
// a decision the server could not take, and a caller's own deadline is the caller's to set:
// were it an admission, a client that sets a short deadline (a gRPC client's grpc-timeout)
// would run the handler past a used-up limit. A ctx that ended with a cause wrapping
// ErrUnavailable (context.WithTimeoutCause) is a bound on the server's answer that its caller
// set for the server's sake, not the caller's own end (strictrate-rls bounds a request that
// carries no deadline so): its expiry is the server's failure.
func callerEnded(ctx context.Context, err error) bool {
	if callerr.CallerEnded(ctx) {
		return true
	}
	return ctx.Err() == nil && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded))
}

// newRequest is a request for n events of key at at against set: recorded when admitted
// with record, else judged only (a peek). A caller's time out of the scripts' range is
// ErrInvalidArgument; a set with calendar limits takes the boundaries around that time.
func newRequest(key string, at clockReading, n int, record bool, set *limitSet) (request, error) {
	req := request{key: key, n: n, set: set}
	near := time.Now
	if at.set {
		us, err := at.micros()
		if err != nil {
			return request{}, err
		}
		req.now, req.nowUS = strconv.FormatInt(us, 10), us
		near = func() time.Time { return at.t }
	}
	if set.calendars > 0 {
		req.set = set.at(near())
	}
	if record {
		req.record = n
	}
	return req, nil
}

// clockReading is the time a decision is taken at; set is false when the server's clock is used.
type clockReading struct {
	t   time.Time
	set bool
}

// Caller-supplied times must stay exact as float64 scores after the window is subtracted.
const maxAbsMicros = 1 << 52

func (c clockReading) micros() (int64, error) {
	us := c.t.UnixMicro()
	if us <= -maxAbsMicros || us >= maxAbsMicros {
		return 0, fmt.Errorf("%w: time %s is outside the years 1827 to 2112", ErrInvalidArgument, c.t.Format(time.RFC3339Nano))
	}
	return us, nil
}

// arg is the reading as the scripts' "now" argument: integer microseconds, or "" for the
// server's clock.
func (c clockReading) arg() (string, error) {
	if !c.set {
		return "", nil
	}
	us, err := c.micros()
	if err != nil {
		return "", err
	}
	return strconv.FormatInt(us, 10), nil
}

// checkedLimit checks a request for n events of key against l, and returns l's limit set. A
// limit in the engine's cache was valid when it went in: only n is checked against it.
func (e *Engine) checkedLimit(key string, l Limit, n int) (*limitSet, error) {
	if err := validateKey(key); err != nil {
		return nil, err
	}
	if s := e.cachedLimit(l); s != nil {
		if n < 1 || n > l.Max {
			return nil, l.validate(n)
		}
		return s, nil
	}
	if err := l.validate(n); err != nil {
		return nil, err
	}
	return e.oneLimit(l), nil
}

// clockReading is the clock a decision (or a lease call) is taken on: the caller's
// (WithClock), else unset, and the script reads the server's. A Result nobody decided is
// stamped with localNow.
func (e *Engine) clockReading() clockReading {
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
