package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/strictrate/strictrate/internal/transport"
)

// The path of one AllowAll, top-down:
//
//  1. AllowAll validates every request once (checkAllowAll), which gives its limit set, and
//     makes its scripts' arguments (newRequest), all on one clock reading. One request with a
//     cost is take's decision, as AllowPolicy's.
//  2. allCalls groups the requests by where their keys go, by the rule every request is routed
//     by (transport.Commit.Route): one group on a standalone server; in a cluster, one per
//     primary, or per slot while the slot map names none, in a fixed order
//     (transport.CompareDests). A group of more than MaxAllowAllRequests is cut into calls of
//     at most that many, in request order.
//  3. Each call is a request of the group commit (e.groups.Do), which runs decide_all.lua: it
//     peeks every request of the call and records those its limits admit only when every one
//     that is not advisory is admitted. decodeGroups (wire_kinds.go) decodes its reply, each
//     decision with request.read, the one decoder of decisions. A call its node did not take
//     is sent again by the transport's retry rule; one whose keys are of several slots comes
//     back ErrNotTaken, and its requests go again, one slot at a time (bySlot).
//  4. The calls run one after the other. Once a call denies, the calls after it only peek
//     (check); what earlier calls recorded is given back (refundAll) before AllowAll returns.
//     allowAll applies the fail-open policy and shadow mode, and AllowAll counts the call.

// MaxAllowAllRequests is the most requests one script call of AllowAll carries: the server
// runs a call alone, so a bound keeps any one call short. An AllowAll of more requests (any
// number) is decided in several calls of at most this many, as one across cluster primaries
// is (see AllowAll).
const MaxAllowAllRequests = 64

// allRefundTimeout bounds the refunds of a decision that did not admit: they run whether or
// not the caller's context has ended, since the events they give back are other requests'.
const allRefundTimeout = 5 * time.Second

// Request is one key's part of a decision over several keys (AllowAll).
//
// A request with N == 0 is a check: its limits are judged with a cost of 0 (they admit it
// unless its key already holds more than a limit's Max, which a key shared by several policies
// can), and nothing is ever recorded for it. An Advisory request (a shadow rule) is decided and
// recorded with the others when its limits admit it, but its denial denies nothing: its Result
// says its limits denied it, and nothing is recorded for it.
type Request struct {
	Key      string // the key, as for AllowPolicy (the engine's prefix is added)
	Policy   Policy // its limits
	N        int    // its cost in events; 0 checks without recording
	Advisory bool   // decided and recorded when its limits admit it, but its denial does not deny the others (a shadow rule)
}

// AllowAll decides reqs together, all or nothing: each is recorded only if every non-advisory
// request's limits admit its cost, and otherwise none is. It is what a request carrying limits
// on several keys needs (the descriptors of an Envoy rate limit request): a denied request
// consumes nothing on any key. results[i] is reqs[i]'s.
//
//   - Allowed says whether reqs[i]'s own limits admit it. A recorded request's Result is
//     AllowPolicy's, with its Entry for Refund and Settle; every other Result is PeekPolicy's.
//   - Validation is AllowPolicy's for each request (cost N >= 0), with at least one request and
//     no key twice: ErrInvalidArgument, naming the request, before anything is sent.
//   - Up to MaxAllowAllRequests keys on one server (in a cluster, on one primary) are one
//     atomic script call. More keys, or keys on several primaries, take several atomic calls
//     in a fixed order; when one denies, what earlier calls recorded is refunded before
//     AllowAll returns. That never admits more than the limits allow, but a concurrent request
//     may be denied meanwhile; a refunded request's Result has Entry zero.
//   - Failures and shadow mode are as for AllowPolicy: fail-closed returns the error and nil
//     results, fail-open admits every request with BackendErr set. One request with N > 0 is
//     exactly AllowPolicy's decision. The metrics count each call as operation "allow_all".
//
// docs/limits.md, "Several keys at once", has the rest: the order of calls, refunds that fail,
// clusters, the deny cache, group commit and the clock.
func (e *Engine) AllowAll(ctx context.Context, reqs []Request) (allowed bool, results []Result, err error) {
	sets, err := e.checkAllowAll(ctx, reqs)
	if err != nil {
		return false, nil, err
	}
	at := e.clockReading()
	if len(reqs) == 1 && reqs[0].N > 0 {
		// One key alone is AllowPolicy's decision, which shares the group commit and the deny
		// cache with every other decision.
		r := reqs[0]
		res, err := e.take(ctx, ask{op: opAllowAll, key: r.Key, set: sets[0], n: r.N, at: at})
		if err != nil {
			return false, nil, err
		}
		return res.Allowed || r.Advisory, []Result{res}, nil
	}
	started := time.Now()
	allowed, results, shadowed, err := e.allowAll(ctx, reqs, sets, at)
	oc := outcomeAllowed
	switch {
	case err != nil:
		oc = outcomeError
	case len(results) > 0 && results[0].BackendErr != nil:
		oc = outcomeFailOpen
	case shadowed:
		oc = outcomeShadowDenied
	case !allowed:
		oc = outcomeDenied
	}
	e.metrics.record(ctx, opAllowAll, oc, time.Since(started))
	return allowed, results, err
}

// checkAllowAll checks an AllowAll of reqs before anything is sent, and returns each
// request's limit set.
func (e *Engine) checkAllowAll(ctx context.Context, reqs []Request) ([]*limitSet, error) {
	if err := checkContext(ctx); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%w: allow_all of no request", ErrInvalidArgument)
	}
	sets := make([]*limitSet, len(reqs))
	seen := make(map[string]int, len(reqs))
	for i, r := range reqs {
		if err := validateKey(r.Key); err != nil {
			return nil, fmt.Errorf("strictrate: allow_all request %d: %w", i, err)
		}
		if j, dup := seen[r.Key]; dup {
			return nil, fmt.Errorf("%w: allow_all requests %d and %d have the same key %s; merge them into one", ErrInvalidArgument, j, i, quoteKey(r.Key))
		}
		seen[r.Key] = i
		if r.N < 0 {
			return nil, fmt.Errorf("%w: allow_all request %d (key %s): cost N %d is negative", ErrInvalidArgument, i, quoteKey(r.Key), r.N)
		}
		set, err := e.checkedPolicy(r.Policy, max(r.N, 1))
		if err != nil {
			return nil, fmt.Errorf("strictrate: allow_all request %d (key %s): %w", i, quoteKey(r.Key), err)
		}
		sets[i] = set
	}
	return sets, nil
}

// allPart is one request of an AllowAll in the engine's hands.
type allPart struct {
	key      string  // as the caller gave it
	req      request // its scripts' arguments
	advisory bool
	result   Result
	kept     bool // its entry is in its key's log
}

// allCall is one call of an AllowAll: its requests whose keys go to one destination, decided
// all or nothing in one group of decide_all.lua, alone or with other AllowAlls' groups for the
// same destination (the group commit, e.groups).
type allCall struct {
	dest  transport.Dest
	parts []*allPart // in KEYS order
}

// group is c as the script's group, checking only when check.
func (c *allCall) group(check bool) group {
	g := group{parts: make([]groupPart, len(c.parts)), check: check}
	for i, p := range c.parts {
		g.parts[i] = groupPart{req: p.req, advisory: p.advisory}
	}
	return g
}

// allowAll takes the decision of AllowAll on validated requests, of limit sets sets, at at;
// shadowed reports that shadow mode admitted a group that was denied.
func (e *Engine) allowAll(ctx context.Context, reqs []Request, sets []*limitSet, at clockReading) (allowed bool, results []Result, shadowed bool, err error) {
	parts := make([]allPart, len(reqs))
	for i, r := range reqs {
		req, err := newRequest(e.prefix+r.Key, at, r.N, false, sets[i])
		if err != nil {
			return false, nil, false, fmt.Errorf("strictrate: allow_all request %d (key %s): %w", i, quoteKey(r.Key), err)
		}
		parts[i] = allPart{key: r.Key, req: req, advisory: r.Advisory}
	}
	admitted, failure := true, error(nil)
	calls := e.allCalls(parts)
	for len(calls) > 0 {
		c := calls[0]
		calls = calls[1:]
		check := !admitted
		o := e.groups.Do(ctx, c.group(check), c.dest)
		if errors.Is(o.Err, transport.ErrNotTaken) {
			// The node does not serve every key (a slot moved), and the keys are of several
			// slots: nothing was recorded there, and they go again, a slot at a time.
			calls = append(e.bySlot(c.parts), calls...)
			continue
		}
		if err := e.readAllCall(ctx, c, o, check); err != nil {
			if check {
				continue // the denial stands; these requests' Results stay zero
			}
			failure = err
			break
		}
		for _, p := range c.parts {
			if !p.advisory && !p.result.Allowed {
				admitted = false
			}
		}
	}
	if failure != nil || !admitted {
		refundErr := e.refundAll(ctx, parts)
		if failure != nil {
			if refundErr != nil {
				failure = errors.Join(failure, refundErr)
			}
			r, err := e.backendFailure(ctx, failure)
			if err != nil {
				return false, nil, false, err
			}
			results = make([]Result, len(parts))
			for i := range results {
				results[i] = r
			}
			return true, results, false, nil
		}
		err = refundErr
	}
	results = make([]Result, len(parts))
	for i := range parts {
		results[i] = parts[i].result
	}
	if !admitted && e.shadow {
		for i := range results {
			if !results[i].Allowed {
				results[i].Allowed, results[i].ShadowDenied = true, true
			}
		}
		return true, results, true, err
	}
	return admitted, results, false, err
}

// allCalls groups parts by where their keys go (e.groups.Route), in the order they are
// decided (transport.CompareDests): one group on a standalone server; in a cluster, one per
// primary by address, then, for the keys whose slot has no primary known (the slot map has
// not landed yet), one per slot, through the engine's client. Each group is cut into calls of
// at most MaxAllowAllRequests (capped).
func (e *Engine) allCalls(parts []allPart) []*allCall {
	ps := make([]*allPart, len(parts))
	for i := range parts {
		ps[i] = &parts[i]
	}
	return groupBy(ps, func(p *allPart) transport.Dest { return e.groups.Route(p.req.key, false) })
}

// bySlot groups parts into calls of one slot each (capped), through the engine's client (which
// routes them by their declared keys, following MOVED and ASK), by ascending slot.
func (e *Engine) bySlot(parts []*allPart) []*allCall {
	return groupBy(parts, func(p *allPart) transport.Dest { return e.groups.BySlot(p.req.key) })
}

// groupBy groups parts by their destination dest, in the order of destinations, each
// group's parts in their order, and cuts each group into calls of at most MaxAllowAllRequests.
func groupBy(parts []*allPart, dest func(*allPart) transport.Dest) []*allCall {
	groups := map[transport.Dest]*allCall{}
	var calls []*allCall
	for _, p := range parts {
		d := dest(p)
		if groups[d] == nil {
			groups[d] = &allCall{dest: d}
			calls = append(calls, groups[d])
		}
		groups[d].parts = append(groups[d].parts, p)
	}
	slices.SortStableFunc(calls, func(a, b *allCall) int { return transport.CompareDests(a.dest, b.dest) })
	return capped(calls)
}

// capped cuts each call of more than MaxAllowAllRequests into consecutive calls of at most
// that many, for the same destination, its requests in their order: the server runs a call
// alone, so no call may grow with what a caller asks.
func capped(calls []*allCall) []*allCall {
	out := make([]*allCall, 0, len(calls))
	for _, c := range calls {
		for len(c.parts) > MaxAllowAllRequests {
			out = append(out, &allCall{dest: c.dest, parts: c.parts[:MaxAllowAllRequests:MaxAllowAllRequests]})
			c.parts = c.parts[MaxAllowAllRequests:]
		}
		out = append(out, c)
	}
	return out
}

// readAllCall reads o, the outcome of c's call (a group that only checks when check), into
// its requests' Results, and returns the first error among them (the call's, or a request's):
// the decision cannot go on. What c recorded is marked, so that it is refunded whatever the
// outcome. The acknowledgements asked for (WithReplicaAck, WithDurableAck) must hold for a
// call that recorded something.
func (e *Engine) readAllCall(ctx context.Context, c *allCall, o transport.Outcome[[]partReply], check bool) error {
	if o.Reply == nil {
		// The call failed whole, or its reply for the group is none the script gives.
		if err := o.Failure(ctx, func() string { return "strictrate: allow_all on " + c.describe() }); err != nil {
			return err
		}
		return fmt.Errorf("strictrate: allow_all on %s: script reply: no reply for the group", c.describe())
	}
	var first error
	what := func(p *allPart) string { return "strictrate: allow_all " + quoteKey(p.key) }
	for i, p := range c.parts {
		r := &o.Reply[i]
		switch {
		case r.err != nil:
			first = cmpErr(first, classify(ctx, what(p), r.err))
			continue
		case r.invalid != nil:
			first = cmpErr(first, fmt.Errorf("%s: %w", what(p), r.invalid))
			continue
		}
		cost := 0
		if r.recorded {
			cost = p.req.n
		}
		res := p.req.set.result(r.d, p.req.key, cost)
		if r.recorded && res.Entry.IsZero() {
			first = cmpErr(first, fmt.Errorf("%s: script reply: recorded, but the decision denied", what(p)))
			continue
		}
		p.result, p.kept = res, r.recorded
	}
	if first == nil && o.Ack != nil {
		first = fmt.Errorf("strictrate: allow_all on %s: %w", c.describe(), o.Ack)
	}
	return first
}

// cmpErr keeps the first error.
func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// describe names c's keys for an error: the first, and how many more.
func (c *allCall) describe() string {
	s := "key " + quoteKey(c.parts[0].key)
	if len(c.parts) > 1 {
		s += fmt.Sprintf(" and %d more", len(c.parts)-1)
	}
	if node := c.dest.Node(); node != "" {
		s += " (node " + node + ")"
	}
	return s
}

// refundAll gives back every entry parts recorded, at once, and makes each refunded Result
// say so: Entry zero, Remaining raised by the events given back. It returns an error naming the
// keys whose refund failed, whose events stay counted.
func (e *Engine) refundAll(ctx context.Context, parts []allPart) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), allRefundTimeout)
	defer cancel()
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		errs   []error
		failed []string
	)
	for i := range parts {
		p := &parts[i]
		if !p.kept {
			continue
		}
		wg.Go(func() {
			if err := e.settle(ctx, uncounted, p.key, p.result, 0); err != nil {
				mu.Lock()
				errs = append(errs, err)
				failed = append(failed, quoteKey(p.key))
				mu.Unlock()
				return
			}
			p.kept = false
			p.result.Entry = EntryID{}
			p.result.Remaining += p.req.n
		})
	}
	wg.Wait()
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("strictrate: allow_all was not admitted, but giving back what it recorded on %s failed; those events stay counted until they leave their windows: %w",
		strings.Join(failed, ", "), errors.Join(errs...))
}
