// Package engine is strictrate's rate limiter: exact sliding window logs on Valkey.
//
// Most programs need these calls: New, once per client; Allow (AllowN for a request that costs
// several events) for each request; AllowPolicy when a key carries several limits at once (5
// per second and 100 per hour); and Peek, which answers as Allow would, recording nothing.
//
//	e, err := engine.New(client)
//	r, err := e.Allow(ctx, "login:"+user, engine.PerMinute(5))
//	if err == nil && !r.Allowed { ... r.RetryAfter ... }
//
// Reach for the rest when the need comes:
//   - Refund and Settle give back what an admitted request did not use (a cost known only
//     after the work, a request that failed before doing any); Settle above the admitted cost
//     charges what it used beyond.
//   - Charge records usage known only after the fact (the tokens a response used), whatever
//     the limit says: later decisions deny until the window drains.
//   - AllowAll decides requests on several keys together, all or nothing (Envoy's rate limit
//     service sends those).
//   - Wait and WaitN block until a request is admitted, as x/time/rate's Wait does.
//   - Acquire, Extend and Release are in-flight limits: at most max holders of a key at once,
//     each slot a lease that frees itself at its expiry if its holder dies.
//   - Limit.Resolution and Calendar make long quotas (a million a month) cheap and exact.
//   - The options tune production use: group commit (WithBatching, on by default), a deny
//     cache (WithDenyCache), local quota (WithLocalQuota), fail-open (WithFailOpen), shadow
//     mode (WithShadow), replica and fsync acknowledgements, metrics, layout rollout.
//
// How a decision counts: every admitted request is one entry in its key's log, carrying its
// time in integer microseconds and its cost in events, and a request for n events is admitted
// when the events in the trailing window plus n are at most the limit's Max. One Lua script
// trims the log, counts every window, adds the entry only when admitted and sets the key's
// expiry in a single EVALSHA, so the count is exact under any concurrency. Limits that share a
// key each hold on every event of the key, whichever limit admitted it: give a key all of its
// limits from its first request (one Policy), or keys of their own. A key the engine did not
// write, or a later release's layout, is refused with ErrUnknownLayout and never read as a
// count.
//
// docs/ in the repository has the rest: limits.md (costs, refunds, policies, quotas),
// production.md (the options), operating.md (failures, upgrades, clusters), design.md (the
// log's layout, and a glossary).
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/nodes"
	"github.com/strictrate/strictrate/internal/sendctx"
	"github.com/strictrate/strictrate/internal/transport"
	"github.com/strictrate/strictrate/loader"
	"github.com/strictrate/strictrate/scripts"
)

// Engine takes rate-limit decisions against one Valkey deployment, standalone or a cluster.
// Make one with New and share it: it is safe for concurrent use, and its group commit works
// best with every caller of a client on one engine. The zero Engine has no client and no
// scripts, and using it panics.
//
// Most callers need New, then Allow (AllowN for a cost), AllowPolicy and Peek, as the package
// doc lists them; it says when to reach for the other methods. Check, Record and Clear are the
// classic sliding-window-log interface (package pipelined's Limiter), for code written
// against it.
type Engine struct {
	client valkey.Client
	prefix string
	clock  func() time.Time // nil: the server's clock

	// The group commit of each kind of script call (package transport: routing, batches,
	// retries, acknowledgements).
	decides  *transport.Commit[request, decision]    // decide.lua, decide_batch.lua: Allow, AllowN, AllowPolicy, reservations
	peeks    *transport.Commit[request, decision]    // peek.lua, peek_batch.lua: Peek, PeekPolicy, Check
	groups   *transport.Commit[group, []partReply]   // decide_all.lua: AllowAll
	settles  *transport.Commit[settleReq, int64]     // settle.lua: Refund, Settle
	acquires *transport.Commit[leaseReq, leaseReply] // lease_acquire.lua: Acquire
	extends  *transport.Commit[leaseReq, leaseReply] // lease_extend.lua: Extend
	releases *transport.Commit[leaseReq, leaseReply] // lease_release.lua: Release
	shadow   bool                                    // WithShadow: denials are admitted, marked ShadowDenied
	denials  *denyCache                              // WithDenyCache; nil when off
	local    *localQuotas                            // WithLocalQuota; nil when off
	logger   *slog.Logger                            // WithLogger; nil: silent
	metrics  *metrics

	// limitSets and policySets cache the limit sets of single limits (oneLimit) and of
	// policies (policySet); limitSetCount counts both, to bound them.
	limitSets     sync.Map // Limit -> *limitSet
	policySets    sync.Map // policyKey -> *limitSet
	limitSetCount atomic.Int64

	failOpen bool
}

// New returns an engine that uses client. Unless WithPreload(false) is given it loads the
// scripts on every node first, so a server without working scripting fails here with an
// error wrapping ErrPreload. A node that cannot be reached gives ErrUnavailable; an eviction
// policy that may drop limiter keys gives ErrEvictionPolicy (see WithEvictionCheck); a server
// that keeps the logs only in memory is logged as a warning (see WithPersistenceCheck), and one
// that cannot fsync what WithDurableAck asks for (appendonly no, or appendfsync no) gives
// ErrPersistence.
func New(client valkey.Client, opts ...Option) (*Engine, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidArgument)
	}
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if err := o.validateDurableAck(); err != nil {
		return nil, err
	}
	e := &Engine{
		client:   client,
		prefix:   o.prefix,
		clock:    o.clock,
		shadow:   o.shadow,
		failOpen: o.failOpen,
		logger:   o.logger,
	}
	var err error
	if e.metrics, err = newMetrics(o.meterProvider); err != nil {
		return nil, fmt.Errorf("strictrate: new engine: metrics: %w", err)
	}
	if o.denyCacheEntries > 0 {
		if e.denials, err = newDenyCache(o.denyCacheEntries); err != nil {
			return nil, fmt.Errorf("%w: deny cache: %w", ErrInvalidArgument, err)
		}
	}
	e.newCommits(transport.New(client, o.batching, o.ack))
	if o.localQuota != nil {
		if e.local, err = newLocalQuotas(e, *o.localQuota); err != nil {
			return nil, err
		}
	}
	needAOF := o.ack.AOFLocal > 0
	if o.evictionCheck != Ignore || o.persistenceCheck != Ignore || needAOF || o.preload {
		ctx, cancel := context.WithTimeout(context.Background(), o.preloadTimeout)
		defer cancel()
		if err := checkEviction(ctx, client, o.evictionCheck, o.logger); err != nil {
			return nil, err
		}
		if err := checkPersistence(ctx, client, o.persistenceCheck, needAOF, o.logger); err != nil {
			return nil, err
		}
		if o.preload {
			src := scripts.Source("probe")
			probe := [...]*loader.Script{loader.New("probe", src), loader.NewReadOnly("probe", src)}
			if err := loader.Preload(ctx, client, append(e.scripts(), probe[0])...); err != nil {
				return nil, classify(ctx, "strictrate: new engine", err)
			}
			for _, p := range probe {
				if err := e.checkPermissions(ctx, p); err != nil {
					return nil, err
				}
			}
		}
	}
	return e, nil
}

// checkPermissions runs the probe script p (EVALSHA, or EVALSHA_RO when read-only) and
// returns an error wrapping ErrPreload that names every command the scripts run with p's kind
// of call that the client's user may not run on the engine's keys, or may not call p itself.
// A refusal found here would otherwise come from the first decision, or midway through one.
func (e *Engine) checkPermissions(ctx context.Context, p *loader.Script) error {
	call := "EVALSHA"
	writes := "1"
	if p.ReadOnly() {
		call, writes = "EVALSHA_RO", ""
	}
	args := []string{e.prefix + "probe", e.prefix + LeaseNamespace + "probe", writes}
	reply, _ := p.Exec(ctx, e.client, loader.Call{Args: args})
	denied, err := reply.AsStrSlice()
	var verr *valkey.ValkeyError
	if err != nil && !errors.As(err, &verr) && ctx.Err() == nil {
		// A keyless call goes to any node the client knows, which in a cluster during a
		// failover may be one that is gone: ask the nodes the preload reached, in turn.
		for _, n := range nodes.Sorted(e.client) {
			reply, _ := p.Exec(ctx, n.Client, loader.Call{Args: args})
			if denied, err = reply.AsStrSlice(); err == nil || errors.As(err, &verr) {
				break
			}
		}
	}
	switch {
	case errors.As(err, &verr) && strings.HasPrefix(verr.Error(), "NOPERM"):
		return fmt.Errorf("%w: the client's user may not run %s, which every decision needs: %w", ErrPreload, call, err)
	case err != nil:
		return classify(ctx, "strictrate: new engine: check the user's permissions", err)
	case len(denied) > 0:
		return fmt.Errorf("%w: the client's user may not run %s, which the engine's scripts run under %s on its keys; grant them (ACL SETUSER)",
			ErrPreload, strings.Join(denied, ", "), call)
	}
	return nil
}

// newCommits makes the group commit of every kind of script call on t.
func (e *Engine) newCommits(t *transport.Transport) {
	e.decides = transport.NewCommit(t, transport.Kind[request, decision]{Acked: true, Routed: true,
		Single: loader.New("decide", scripts.Source("decide")), Batch: loader.New("decide_batch", scripts.Source("decide_batch")),
		Encode: encodeDecisions, Decode: decodeDecisions, Size: decisionSize, Called: e.metrics.called(opAllow)})
	e.peeks = transport.NewCommit(t, transport.Kind[request, decision]{
		Single: loader.NewReadOnly("peek", scripts.Source("peek")), Batch: loader.NewReadOnly("peek_batch", scripts.Source("peek_batch")),
		Encode: encodeDecisions, Decode: decodeDecisions, Size: decisionSize, Called: e.metrics.called(opPeek)})
	all := loader.New("decide_all", scripts.Source("decide_all"))
	e.groups = transport.NewCommit(t, transport.Kind[group, []partReply]{Acked: true, Routed: true, Single: all, Batch: all,
		Encode: encodeGroups, Decode: decodeGroups, Size: groupSize, Called: e.metrics.called(opAllowAll)})
	e.settles = transport.NewCommit(t, transport.Kind[settleReq, int64]{Acked: true, Single: loader.New("settle", scripts.Source("settle")),
		Encode: encodeSettle, Decode: decodeSettle})
	e.acquires = transport.NewCommit(t, transport.Kind[leaseReq, leaseReply]{Acked: true,
		Single: loader.New("lease_acquire", scripts.Source("lease_acquire")), Encode: encodeLease, Decode: decodeLease})
	e.extends = transport.NewCommit(t, transport.Kind[leaseReq, leaseReply]{Acked: true,
		Single: loader.New("lease_extend", scripts.Source("lease_extend")), Encode: encodeLease, Decode: decodeLease})
	e.releases = transport.NewCommit(t, transport.Kind[leaseReq, leaseReply]{
		Single: loader.New("lease_release", scripts.Source("lease_release")), Encode: encodeLease, Decode: decodeRelease})
}

// scripts lists every script the engine runs, for Preload.
func (e *Engine) scripts() []*loader.Script {
	var s []*loader.Script
	s = append(s, e.decides.Scripts()...)
	s = append(s, e.peeks.Scripts()...)
	s = append(s, e.groups.Scripts()...)
	s = append(s, e.settles.Scripts()...)
	s = append(s, e.acquires.Scripts()...)
	s = append(s, e.extends.Scripts()...)
	return append(s, e.releases.Scripts()...)
}

// Reset deletes key's log: every event recorded for it is forgotten. The key's leases
// (Acquire) are another key, and stay. Under WithLocalQuota, this engine's reservations of
// the key end with it; another process's go on until their holds end.
func (e *Engine) Reset(ctx context.Context, key string) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	if err := validateKey(key); err != nil {
		return err
	}
	full := e.prefix + key
	defer e.givingBack(full)()
	if e.local != nil {
		e.local.forget(key) // a reservation of the log deleted admits nothing more
	}
	if err := e.do(ctx, func(b valkey.Builder) valkey.Completed { return b.Del().Key(full).Build() }).Error(); err != nil {
		return classify(ctx, "strictrate: reset "+quoteKey(key), err)
	}
	return nil
}

// Check reports whether one more event for key would be admitted at now, recording nothing:
// nil when it would, a *DeniedError (ErrRateLimitExceeded) when not.
func (e *Engine) Check(ctx context.Context, key string, limit int, window time.Duration, now time.Time) error {
	return e.classic(ctx, true, key, Limit{Max: limit, Window: window}, now)
}

// Record records one event for key at now if the limit admits it: nil when admitted, a
// *DeniedError (ErrRateLimitExceeded) when not.
func (e *Engine) Record(ctx context.Context, key string, limit int, window time.Duration, now time.Time) error {
	return e.classic(ctx, false, key, Limit{Max: limit, Window: window}, now)
}

// classic is Check (peek) or Record: the one decision take makes of them, on the caller's
// time, returned as the classic sliding-window-log design's interface returns its verdict.
func (e *Engine) classic(ctx context.Context, peek bool, key string, l Limit, now time.Time) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	set, err := e.checkedLimit(key, l, 1)
	if err != nil {
		return err
	}
	op := opAllow
	if peek {
		op = opPeek
	}
	r, err := e.take(ctx, ask{op: op, peek: peek, key: key, set: set, n: 1, at: clockReading{t: now, set: true}})
	return deniedOrErr(key, r, err)
}

// Clear forgets every event of key; it is Reset.
func (e *Engine) Clear(ctx context.Context, key string) error { return e.Reset(ctx, key) }

// deniedOrErr is a decision as Check and Record return it: its error, a *DeniedError, or nil.
func deniedOrErr(key string, r Result, err error) error {
	if err != nil {
		return err
	}
	if !r.Allowed {
		return &DeniedError{Key: key, Result: r}
	}
	return nil
}

// do sends the command build makes through the engine's client (sendctx.Do: a deadline that
// passes never closes a connection other calls share, and the call returns when ctx ends).
func (e *Engine) do(ctx context.Context, build func(valkey.Builder) valkey.Completed) valkey.ValkeyResult {
	return sendctx.Do(ctx, e.client, build)
}
