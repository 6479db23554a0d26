package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/valkey-io/valkey-go"
)

// The path of one AllowAll, top-down:
//
//  1. AllowAll validates every request (checkAllowAll) and makes its scripts' arguments
//     (newRequest), all on one clock reading.
//  2. allCalls groups the requests by where their keys live: one group on a standalone server;
//     in a cluster, one per primary (the committer's slot map), in a fixed order. A group of
//     more than MaxAllowAllRequests is cut into calls of at most that many, in request order.
//  3. Each call runs decide_all.lua, which peeks every request of the call and records those
//     its limits admit only when every one that is not advisory is admitted. readReply decodes its
//     reply, each decision with outcome.read, the one decoder of decisions.
//  4. The calls run one after the other. Once a call denies, the calls after it only peek
//     (check); what earlier calls recorded is given back (refundAll) before AllowAll returns. allowAll applies the fail-open policy and
//     shadow mode, and AllowAll counts the call.

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
//   - Failures, shadow mode and metrics are as for AllowPolicy: fail-closed returns the error
//     and nil results, fail-open admits every request with BackendErr set. One request with
//     N > 0 is exactly AllowPolicy's decision.
//
// docs/limits.md, "Several keys at once", has the rest: the order of calls, refunds that fail,
// clusters, the deny cache, group commit and the clock.
func (e *Engine) AllowAll(ctx context.Context, reqs []Request) (allowed bool, results []Result, err error) {
	if err := e.checkAllowAll(ctx, reqs); err != nil {
		return false, nil, err
	}
	if len(reqs) == 1 && reqs[0].N > 0 {
		// One key alone is AllowPolicy's decision, which shares the group commit and the deny
		// cache with every other decision.
		r := reqs[0]
		res, err := e.AllowPolicy(ctx, r.Key, r.Policy, r.N)
		if err != nil {
			return false, nil, err
		}
		return res.Allowed || r.Advisory, []Result{res}, nil
	}
	started := time.Now()
	allowed, results, shadowed, err := e.allowAll(ctx, reqs)
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
	e.metrics.record(ctx, opPolicy, oc, time.Since(started))
	return allowed, results, err
}

// checkAllowAll checks an AllowAll of reqs before anything is sent.
func (e *Engine) checkAllowAll(ctx context.Context, reqs []Request) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	if len(reqs) == 0 {
		return fmt.Errorf("%w: allow_all of no request", ErrInvalidArgument)
	}
	seen := make(map[string]int, len(reqs))
	for i, r := range reqs {
		if err := validateKey(r.Key); err != nil {
			return fmt.Errorf("strictrate: allow_all request %d: %w", i, err)
		}
		if j, dup := seen[r.Key]; dup {
			return fmt.Errorf("%w: allow_all requests %d and %d have the same key %s; merge them into one", ErrInvalidArgument, j, i, quoteKey(r.Key))
		}
		seen[r.Key] = i
		if r.N < 0 {
			return fmt.Errorf("%w: allow_all request %d (key %s): cost N %d is negative", ErrInvalidArgument, i, quoteKey(r.Key), r.N)
		}
		if err := r.Policy.validate(max(r.N, 1)); err != nil {
			return fmt.Errorf("strictrate: allow_all request %d (key %s): %w", i, quoteKey(r.Key), err)
		}
	}
	return nil
}

// allPart is one request of an AllowAll in the engine's hands.
type allPart struct {
	key      string  // as the caller gave it
	req      request // its scripts' arguments, and its last call's decision for it
	advisory bool
	err      error // its last call's error reply for it alone
	recorded bool  // its last call recorded it
	result   Result
	kept     bool // its entry is in its key's log
}

// allCall is one group of decide_all.lua: the requests of an AllowAll whose keys one node
// holds, decided all or nothing in one call, alone or with other AllowAlls' groups for the
// same node (the group commit, e.groups).
type allCall struct {
	node  string     // the primary's address, keys undeclared; "" for the engine's client, keys declared
	parts []*allPart // in KEYS order
	check bool       // peek only: the AllowAll is already denied on another node
}

// allowAll takes the decision of AllowAll on validated requests; shadowed reports that shadow
// mode admitted a group that was denied.
func (e *Engine) allowAll(ctx context.Context, reqs []Request) (allowed bool, results []Result, shadowed bool, err error) {
	at := e.decisionClock()
	parts := make([]allPart, len(reqs))
	for i, r := range reqs {
		req, err := newRequest(e.prefix+r.Key, at, r.N, false, e.policySet(r.Policy))
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
		c.check = check
		dest := destination{node: c.node}
		if c.node == "" && e.groups.slots != nil {
			// A cluster whose slot map names no primary for these keys: one slot's keys,
			// through the engine's client. On a single server every group shares one queue.
			dest.slot = slotOf(c.parts[0].req.key)
		}
		cl := e.groups.do(ctx, c, dest)
		callErr, ack := cl.err, cl.ack
		e.groups.release(cl)
		if c.node != "" && c.notTaken(callErr) {
			// The node does not serve every key (a slot moved): nothing was recorded there.
			e.groups.slots.reload()
			calls = append(bySlot(c.parts), calls...)
			continue
		}
		if err := e.readAllCall(ctx, c, callErr, ack, check); err != nil {
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

// allCalls groups parts by where their keys live, in the order they are decided: one group on
// a standalone server; in a cluster, one per primary by the committer's slot map, by address,
// then, for the keys whose slot has no primary known (the map has not landed yet), one per
// slot, through the engine's client. Each group is cut into calls of at most
// MaxAllowAllRequests (capped).
func (e *Engine) allCalls(parts []allPart) []*allCall {
	slots := e.groups.slots
	if slots == nil {
		c := &allCall{parts: make([]*allPart, len(parts))}
		for i := range parts {
			c.parts[i] = &parts[i]
		}
		return capped([]*allCall{c})
	}
	byNode := map[string]*allCall{}
	var unmapped []*allPart
	for i := range parts {
		p := &parts[i]
		addr, ok := slots.primary(slotOf(p.req.key))
		if !ok {
			unmapped = append(unmapped, p)
			continue
		}
		if byNode[addr] == nil {
			byNode[addr] = &allCall{node: addr}
		}
		byNode[addr].parts = append(byNode[addr].parts, p)
	}
	calls := make([]*allCall, 0, len(byNode))
	for _, c := range byNode {
		calls = append(calls, c)
	}
	slices.SortFunc(calls, func(a, b *allCall) int { return strings.Compare(a.node, b.node) })
	return append(capped(calls), bySlot(unmapped)...)
}

// capped cuts each call of more than MaxAllowAllRequests into consecutive calls of at most
// that many, for the same node, its requests in their order: the server runs a call alone, so
// no call may grow with what a caller asks.
func capped(calls []*allCall) []*allCall {
	out := make([]*allCall, 0, len(calls))
	for _, c := range calls {
		for len(c.parts) > MaxAllowAllRequests {
			out = append(out, &allCall{node: c.node, parts: c.parts[:MaxAllowAllRequests:MaxAllowAllRequests]})
			c.parts = c.parts[MaxAllowAllRequests:]
		}
		out = append(out, c)
	}
	return out
}

// bySlot groups parts into calls of one slot each (capped), through the engine's client (which
// routes them by their declared keys, following MOVED and ASK), by ascending slot.
func bySlot(parts []*allPart) []*allCall {
	groups := map[uint16]*allCall{}
	var order []uint16
	for _, p := range parts {
		s := slotOf(p.req.key)
		if groups[s] == nil {
			groups[s] = &allCall{}
			order = append(order, s)
		}
		groups[s].parts = append(groups[s].parts, p)
	}
	slices.Sort(order)
	calls := make([]*allCall, len(order))
	for i, s := range order {
		calls[i] = groups[s]
	}
	return capped(calls)
}

// slotOf is the cluster hash slot of a full key.
func slotOf(key string) uint16 {
	cmd := valkey.Completed{}.SetSlot(key)
	return cmd.Slot()
}

// notTaken reports whether c's node did not take its call, which ended with callErr, so that
// nothing of it was recorded and its requests may go again elsewhere: a node gone from the
// client's topology, a call refused before it ran for its slots (not OOM, which any node would
// answer alike), or a request whose key the node does not serve (its peek failed, so the call
// recorded nothing).
func (c *allCall) notTaken(callErr error) bool {
	if callErr != nil {
		return callErr == errNodeGone || refusedBeforeRun(callErr) && !strings.HasPrefix(callErr.Error(), "OOM ")
	}
	retry := false
	for _, p := range c.parts {
		if p.recorded {
			return false
		}
		retry = retry || p.err != nil && notTakenOnNode(p.err)
	}
	return retry
}

// readAllCall reads c's outcomes, after a call that ended with callErr and whose
// acknowledgements answered ack, into its requests' Results, and returns the first error among
// them (the call's, or a request's): the decision cannot go on. What c recorded is marked, so
// that it is refunded whatever the outcome. The acknowledgements asked for (WithReplicaAck,
// WithDurableAck) must hold for a call that recorded something.
func (e *Engine) readAllCall(ctx context.Context, c *allCall, callErr error, ack ackReplies, check bool) error {
	var first error
	what := func(p *allPart) string { return "strictrate: allow_all " + quoteKey(p.key) }
	if callErr != nil {
		return classify(ctx, "strictrate: allow_all on "+c.describe(), callErr)
	}
	recorded := false
	for _, p := range c.parts {
		switch {
		case p.err != nil:
			first = cmpErr(first, classify(ctx, what(p), p.err))
			continue
		case p.req.replyErr != nil:
			first = cmpErr(first, fmt.Errorf("%s: %w", what(p), p.req.replyErr))
			continue
		}
		p.req.record = 0
		if p.recorded {
			p.req.record = p.req.n
		}
		r, err := p.req.d.result(&p.req)
		if err != nil {
			first = cmpErr(first, fmt.Errorf("%s: %w", what(p), err))
			continue
		}
		if p.recorded && r.Entry.IsZero() {
			first = cmpErr(first, fmt.Errorf("%s: script reply: recorded, but the decision denied", what(p)))
			continue
		}
		p.result, p.kept = r, p.recorded
		recorded = recorded || p.recorded
	}
	if first == nil && recorded && e.groups.ack && !check {
		if err := e.ackPolicy.check(ctx, ack); err != nil {
			first = fmt.Errorf("strictrate: allow_all on %s: %w", c.describe(), err)
		}
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
	if c.node != "" {
		s += " (node " + c.node + ")"
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
			if err := e.Refund(ctx, p.key, p.result); err != nil {
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
