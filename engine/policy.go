package engine

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// MaxPolicyLimits is the most limits a Policy may hold. The log keeps a cursor per window
// shorter than its longest, which each decision moves (amortized O(1)) and the header stores;
// a handful covers every sensible stacking (per second, minute, hour, day).
const MaxPolicyLimits = 16

// Policy is a set of limits on one key that must all hold at once, such as "5 per second and
// 100 per hour": a request is admitted only when every limit has room for it, and then it
// counts against all of them. A sliding window log answers every window from the same entries,
// so a Policy costs one log and one script call, however many limits it holds.
//
// A valid Policy has 1 to MaxPolicyLimits valid limits, no two with the same Window. The key's
// log holds at most the Max of the longest window in events (a shorter window with a larger
// Max than a longer one never binds, and is allowed).
type Policy []Limit

// Validate reports whether p is a valid Policy; the error wraps ErrInvalidArgument and names
// the bad value. Use it to check a Policy once at start-up (the httplimit middleware does).
func (p Policy) Validate() error {
	return p.validate(1)
}

// validate checks the policy and the cost n of a request against every limit.
func (p Policy) validate(n int) error {
	switch {
	case len(p) == 0:
		return fmt.Errorf("%w: empty policy", ErrInvalidArgument)
	case len(p) > MaxPolicyLimits:
		return fmt.Errorf("%w: policy has %d limits, more than %d", ErrInvalidArgument, len(p), MaxPolicyLimits)
	}
	for i, l := range p {
		if err := l.validate(n); err != nil {
			return fmt.Errorf("policy limit %d (%s): %w", i, l, err)
		}
		for j := range i {
			switch {
			case l.IsCalendar() != p[j].IsCalendar():
			case l.IsCalendar() && p[j].calendarTag() == l.calendarTag():
				return fmt.Errorf("%w: policy limits %d (%s) and %d (%s) have the same period",
					ErrInvalidArgument, j, p[j], i, l)
			case !l.IsCalendar() && p[j].windowMicros() == l.windowMicros():
				return fmt.Errorf("%w: policy limits %d (%s) and %d (%s) have the same window",
					ErrInvalidArgument, j, p[j], i, l)
			}
		}
	}
	return nil
}

// String returns the limits joined by " and ", for logs and errors: "5/1s and 100/1h0m0s".
func (p Policy) String() string {
	parts := make([]string, len(p))
	for i, l := range p {
		parts[i] = l.String()
	}
	return strings.Join(parts, " and ")
}

// Tag returns a compact name of p's limits, the same for the same limits in any order, for
// keys: each limit as max/window in microseconds, by ascending window, joined by commas
// ("5/3600000000,100/60000000"); a Resolution follows its window after "~" (in
// microseconds), and calendar limits come last, named by period and zone
// ("1000000/month@UTC"). The middlewares put it in their keys, so that requests judged
// by different policies never share a log (see "Limits that share a key" in docs/limits.md).
func (p Policy) Tag() string {
	sorted := slices.Clone(p)
	slices.SortFunc(sorted, compareLimits)
	parts := make([]string, len(sorted))
	for i, l := range sorted {
		switch {
		case l.IsCalendar():
			parts[i] = strconv.Itoa(l.Max) + "/" + l.calendarTag()
		case l.Resolution > 0:
			parts[i] = strconv.Itoa(l.Max) + "/" + strconv.FormatInt(l.windowMicros(), 10) + "~" + strconv.FormatInt(ceilMicros(l.Resolution), 10)
		default:
			parts[i] = strconv.Itoa(l.Max) + "/" + strconv.FormatInt(l.windowMicros(), 10)
		}
	}
	return strings.Join(parts, ",")
}

// Longest returns the sliding limit of p with the longest window; the zero Limit when p holds
// none. Its window is how long a key of p keeps its entries: size what a caller keeps beside
// the key (a cache of its Results, the TTL of a record of who hit it) by it. A calendar limit
// keeps its key until its period ends (Limit.PeriodAt).
func (p Policy) Longest() Limit {
	var longest Limit
	for _, l := range p {
		if l.Window > longest.Window {
			longest = l
		}
	}
	return longest
}

// AllowPolicy records n events for key if every limit of p admits all n now, and none
// otherwise: the decision is one atomic script call, exact under any concurrency.
//
// The Result speaks for the tightest limit: Remaining is the least room left in any window
// after this decision; when denied, RetryAfter is the wait until every limit has room for n
// (if nobody else takes it); ResetAfter is the wait until the log holds no event, that is its
// newest event plus the longest window. The key expires then.
//
// A Policy of one limit is exactly AllowN with that limit, in either Mode. A Policy of several
// limits needs the atomic log: in Pipelined mode it returns an error wrapping ErrUnsupported,
// and nothing is sent.
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

func (e *Engine) allowPolicyAt(ctx context.Context, key string, p Policy, n int, now clockReading) (Result, error) {
	if len(p) == 1 {
		return e.allowAt(ctx, key, p[0], n, now)
	}
	set := e.policySet(p)
	var h *holder
	if e.local != nil && !now.set {
		var r Result
		var ok bool
		if r, ok, h = e.local.allow(ctx, key, set, n); ok {
			return r, nil
		}
	}
	req, err := newRequest(e.prefix+key, now, n, true, set)
	if err != nil {
		return Result{}, err
	}
	r, err := e.runDecision(ctx, e.decides, "allow_policy", req)
	if err == nil {
		h.observe(r)
	}
	return r, err
}

// PeekPolicy returns the decision AllowPolicy would take for n events of key now, and records
// nothing: the same Result (Remaining the least room now, RetryAfter the wait until every
// limit has room for n, QuotaAfter and Window for the tightest limit), with no Entry, and a
// ResetAfter of 0 when the log holds no event. Like Peek it runs as a read-only script, so it
// may be served where only reads are allowed. It validates as AllowPolicy does, and, as
// AllowPolicy, offers a Policy of several limits only in Atomic mode.
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
	r, err := e.runDecision(ctx, e.peeks, "peek_policy", req)
	return e.finish(ctx, opPeek, started, r, err)
}

// checkPolicyCall checks a call of op for n events of key against p before anything is sent:
// its arguments, and that the engine's mode offers it (several limits need the atomic log).
func (e *Engine) checkPolicyCall(ctx context.Context, op, key string, p Policy, n int) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	if err := validateKey(key); err != nil {
		return err
	}
	if err := p.validate(n); err != nil {
		return err
	}
	if e.mode == Pipelined && len(p) > 1 {
		return unsupported(op + " " + quoteKey(key) + " of several limits")
	}
	return nil
}

// policySet is p's limits as the scripts want them, sliding windows ascending (the last is
// the longest), then calendar limits; a single limit's set is the engine's cached one.
func (e *Engine) policySet(p Policy) *limitSet {
	if len(p) == 1 {
		return e.oneLimit(p[0])
	}
	sorted := slices.Clone(p)
	slices.SortFunc(sorted, compareLimits)
	return newLimitSet(sorted)
}

// compareLimits orders limits as the scripts take them: sliding ones by window (then max,
// then resolution), then calendar ones by their tag (then max).
func compareLimits(a, b Limit) int {
	switch {
	case a.IsCalendar() != b.IsCalendar():
		if a.IsCalendar() {
			return 1
		}
		return -1
	case a.IsCalendar():
		return cmp.Or(cmp.Compare(a.calendarTag(), b.calendarTag()), cmp.Compare(a.Max, b.Max))
	}
	return cmp.Or(cmp.Compare(a.Window, b.Window), cmp.Compare(a.Max, b.Max), cmp.Compare(a.Resolution, b.Resolution))
}
