// Package engine is strictrate's sliding-window-log rate limiter on Valkey.
//
// Every admitted request is one entry in the key's log, carrying its time in integer
// microseconds and its cost in events. A request for n events is admitted when the events in
// the trailing window plus n are at most the limit's Max. In Atomic mode (the default) one Lua
// script trims, counts, adds only when admitted and sets the expiry in a single EVALSHA, so
// the count is exact under any concurrency, and its work does not grow with n. Pipelined mode
// is the common non-atomic design (a sorted set, one member per event), kept for comparison:
// it offers the seed article's operations on its own keys, and returns ErrUnsupported for what
// only the atomic log can do. Each mode refuses the other's keys, and any key it did not
// write, with ErrUnknownLayout.
//
// Limits that share a key each hold on every event of the key, whichever limit admitted it: a
// key keeps its events for the longest window ever asked of it (its horizon). A limit asked of
// a key for the first time counts only what the key kept until then, so give a key all of its
// limits from its first request (one Policy), or keys of their own.
//
// Beside rate limits, the engine keeps in-flight limits: Acquire takes one of max slots of a
// key as a lease that expires unless extended (Extend) and is given back with Release, so at
// most max holders run at once and a crashed holder's slot returns at its lease's expiry.
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/nodes"
	"github.com/strictrate/strictrate/internal/sendctx"
	"github.com/strictrate/strictrate/loader"
	"github.com/strictrate/strictrate/scripts"
)

// Result is the outcome of one decision.
type Result struct {
	// Allowed reports whether the request was admitted (Allow, AllowN) or would be (Peek).
	Allowed bool
	// Remaining is how many events would still be admitted now, after this decision.
	Remaining int
	// RetryAfter is, when denied, how long to wait until the same request is admitted if
	// nobody else takes the room; 0 when allowed. The decision reads at most 32 entries from
	// each end of the window to find it, so that no request buys server time with its cost:
	// when the events that must leave end deeper in a long log, it is the wait until the 32nd
	// oldest entry leaves, before which the request is not admitted (ask again then).
	RetryAfter time.Duration
	// ResetAfter is how long until the log holds no event; 0 when it is empty.
	ResetAfter time.Duration
	// QuotaAfter is how long until the limit Window names next gets quota back: until the
	// oldest event in that window (this decision's included) leaves it, exact to the
	// microsecond. Admitted, it is at most Window: Window itself when the request is the only
	// event in it. 0 when that window holds no event (a Peek) and when fail-open admitted
	// without a decision. It is draft-ietf-httpapi-ratelimit-headers-10's "t" of an allowed
	// request. Pipelined mode cannot know it without more reads: it reports the window.
	QuotaAfter time.Duration
	// At is the instant the decision was taken at, to the microsecond, on the clock that took
	// it: the server's by default, else the caller's. An admitted event is recorded at At.
	At time.Time
	// Window is the window of the limit Remaining speaks for: the Limit's own for Allow,
	// AllowN and Peek; for AllowPolicy, the limit with the least room (the shortest window
	// among equals). 0 when fail-open admitted without a decision.
	Window time.Duration
	// BackendErr is set only under WithFailOpen(true), when the server could not decide and
	// the request was admitted anyway: it holds the error, for logs and metrics. Remaining,
	// RetryAfter, ResetAfter and QuotaAfter are then 0, and At is the caller's clock.
	BackendErr error
	// Entry identifies the log entry an admitted request wrote, for Refund and Settle. It is
	// the zero EntryID when nothing was recorded: a denial, a Peek, a fail-open admission, a
	// shadow admission, or Pipelined mode (whose log is the article's, one member per event).
	Entry EntryID
	// ShadowDenied is set under WithShadow(true) when the limit denied the request and shadow
	// mode admitted it anyway: Allowed is true, the other fields are the denial's (Remaining,
	// RetryAfter), and nothing was recorded.
	ShadowDenied bool
	// FromCache is set when the engine's deny cache (WithDenyCache) refused the request
	// without asking the server: RetryAfter is the cached denial's, counted down, and At the
	// denial's moved on by the time since it came back.
	FromCache bool
}

// EntryID identifies one admitted request's entry in its key's log: the log's name, the
// entry's time and its position among the key's entries of that microsecond. It is a plain
// value: copy it, store it, send it to another process, and Refund or Settle there.
//
// It carries the log's name (Key) so that a Refund or Settle given the wrong key, or run by an
// engine of another prefix, is refused (ErrUnknownEntry) instead of refunding nothing, or
// another request, in silence: a time and a seq alone are valid in any key's log.
type EntryID struct {
	// Key is the name of the log the entry is in, in Valkey: the engine's prefix, then the key
	// the request was decided on.
	Key string
	// At is the entry's time, to the microsecond: the decision's Result.At.
	At time.Time
	// Seq is the entry's position among the key's entries of that microsecond, from 1; 0 when
	// there is no entry.
	Seq int
	// Cost is the cost in events the entry was admitted with.
	Cost int
	// Shared is set when the request's events are held with other requests': in a slot's entry
	// (a limit with a Resolution: At is the slot's end) or in calendar counters (Calendar
	// limits; a policy of calendar limits alone records no entry, and Seq is 0). Settle and
	// Refund of a shared request give back on every call: call them once per request.
	Shared bool
	// Decided is the decision's time (Result.At), set for a shared request: its calendar
	// periods are the ones that hold it, and a slot's end (At) may lie in the next one.
	Decided time.Time
}

// IsZero reports whether id names no entry.
func (id EntryID) IsZero() bool { return id.Seq == 0 && !id.Shared }

// Limiter is the interface of the classic sliding-window-log article, so code written against
// it can switch to Engine. Check and Record return ErrRateLimitExceeded (as a *DeniedError)
// when denied.
type Limiter interface {
	Check(ctx context.Context, key string, limit int, window time.Duration, now time.Time) error
	Record(ctx context.Context, key string, limit int, window time.Duration, now time.Time) error
	Clear(ctx context.Context, key string) error
}

var _ Limiter = (*Engine)(nil)

// Engine takes rate-limit decisions against one Valkey deployment (standalone or cluster).
// It is safe for concurrent use; share one per client. Make one with New: the zero Engine has
// no client and no scripts, and using it panics.
type Engine struct {
	client valkey.Client
	mode   Mode
	prefix string
	clock  func() time.Time // nil: the server's clock (Atomic) or time.Now (Pipelined)

	// The group commit of each kind of script call (commit.go).
	decides  *commit[request]   // decide.lua, decide_batch.lua: Allow, AllowN, AllowPolicy, reservations
	peeks    *commit[request]   // peek.lua, peek_batch.lua: Peek, PeekPolicy, Check
	groups   *commit[*allCall]  // decide_all.lua: AllowAll
	settles  *commit[settleReq] // settle.lua: Refund, Settle
	acquires *commit[leaseReq]  // lease_acquire.lua: Acquire
	extends  *commit[leaseReq]  // lease_extend.lua: Extend
	releases *commit[leaseReq]  // lease_release.lua: Release
	inspect  *loader.Script     // inspect.lua: Inspect
	batching bool               // WithBatching: decisions go through the committers' queues
	shadow   bool               // WithShadow: denials are admitted, marked ShadowDenied
	denials  *denyCache         // WithDenyCache; nil when off
	local    *localQuotas       // WithLocalQuota, in Atomic mode; nil when off
	logger   *slog.Logger       // WithLogger; nil: silent
	metrics  *metrics

	// limitSets caches the formatted arguments of single limits (oneLimit).
	limitSets     sync.Map // Limit -> *limitSet
	limitSetCount atomic.Int64

	failOpen  bool
	ackPolicy ackPolicy // WithReplicaAck, WithDurableAck

	// Pipelined mode makes its members on the client: an id random per engine, then a counter.
	memberID [8]byte
	seq      atomic.Uint64
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
	if o.mode != Atomic && o.mode != Pipelined {
		return nil, fmt.Errorf("%w: unknown mode %d", ErrInvalidArgument, int(o.mode))
	}
	if err := o.validateDurableAck(); err != nil {
		return nil, err
	}
	if o.writeLayout != 2 && o.writeLayout != 3 {
		return nil, fmt.Errorf("%w: WithWriteLayout(%d): this release writes layout 2 or 3", ErrInvalidArgument, o.writeLayout)
	}
	e := &Engine{
		client:   client,
		mode:     o.mode,
		prefix:   o.prefix,
		clock:    o.clock,
		inspect:  loader.NewReadOnly("inspect", scripts.Inspect()),
		batching: o.batching,
		shadow:   o.shadow,

		failOpen:  o.failOpen,
		ackPolicy: o.ack,
		logger:    o.logger,
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
	e.newCommits(o.writeLayout)
	if o.localQuota != nil && o.mode == Atomic {
		if e.local, err = newLocalQuotas(e, *o.localQuota); err != nil {
			return nil, err
		}
	}
	id := uuid.New()
	copy(e.memberID[:], id[:8])
	needAOF := o.ack.aofLocal > 0
	if o.evictionCheck != EvictionIgnore || o.persistenceCheck != PersistenceIgnore || needAOF || o.preload {
		ctx, cancel := context.WithTimeout(context.Background(), o.preloadTimeout)
		defer cancel()
		if err := checkEviction(ctx, client, o.evictionCheck, o.logger); err != nil {
			return nil, err
		}
		if err := checkPersistence(ctx, client, o.persistenceCheck, needAOF, o.logger); err != nil {
			return nil, err
		}
		if o.preload {
			src := scripts.Probe()
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

// newCommits makes the group commit of every kind of script call, the decisions' scripts
// composed to write layout.
func (e *Engine) newCommits(layout int) {
	var slots *slotMap // decisions and AllowAll groups go to their keys' primaries in a cluster
	if e.client.Mode() == valkey.ClientModeCluster {
		slots = newSlotMap(e.client)
	}
	e.decides = newCommit(e, kind[request]{op: opAllow, acked: true,
		single: loader.New("decide", scripts.DecideWriting(layout)), batch: loader.New("decide_batch", scripts.DecideBatchWriting(layout)),
		encode: encodeDecisions, decode: decodeDecisions, size: decisionSize, retry: retryNotTaken[request]}, slots)
	e.peeks = newCommit(e, kind[request]{op: opPeek,
		single: loader.NewReadOnly("peek", scripts.Peek()), batch: loader.NewReadOnly("peek_batch", scripts.PeekBatch()),
		encode: encodeDecisions, decode: decodeDecisions, size: decisionSize, retry: retryNotTaken[request]}, nil)
	all := loader.New("decide_all", scripts.DecideAllWriting(layout))
	e.groups = newCommit(e, kind[*allCall]{op: opPolicy, acked: true, single: all, batch: all,
		encode: encodeGroups, decode: decodeGroups, size: groupSize}, slots)
	e.settles = newCommit(e, kind[settleReq]{op: opAllow, single: loader.New("settle", scripts.Settle()),
		encode: encodeSettle, decode: decodeSettle}, nil)
	e.acquires = newCommit(e, kind[leaseReq]{op: opAcquire, acked: true, single: loader.New("lease_acquire", scripts.LeaseAcquire()),
		encode: encodeLease, decode: decodeLease}, nil)
	e.extends = newCommit(e, kind[leaseReq]{op: opExtend, acked: true, single: loader.New("lease_extend", scripts.LeaseExtend()),
		encode: encodeLease, decode: decodeLease}, nil)
	e.releases = newCommit(e, kind[leaseReq]{op: opRelease, single: loader.New("lease_release", scripts.LeaseRelease()),
		encode: encodeLease, decode: decodeRelease}, nil)
}

// scripts lists every script the engine runs, for Preload.
func (e *Engine) scripts() []*loader.Script {
	return []*loader.Script{e.decides.kind.single, e.decides.kind.batch, e.peeks.kind.single, e.peeks.kind.batch,
		e.groups.kind.single, e.settles.kind.single, e.inspect, e.acquires.kind.single, e.extends.kind.single,
		e.releases.kind.single}
}

// Mode returns the engine's mode: for code handed an Engine that must know whether it offers
// what only Atomic mode does (a Policy of several limits, Refund, Settle, Inspect, leases;
// ErrUnsupported in Pipelined mode).
func (e *Engine) Mode() Mode { return e.mode }

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
	e.forgetDenials(full)
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
	return e.classic(ctx, opPeek, key, Limit{Max: limit, Window: window}, now)
}

// Record records one event for key at now if the limit admits it: nil when admitted, a
// *DeniedError (ErrRateLimitExceeded) when not.
func (e *Engine) Record(ctx context.Context, key string, limit int, window time.Duration, now time.Time) error {
	return e.classic(ctx, opAllow, key, Limit{Max: limit, Window: window}, now)
}

// classic takes the article's Check (op peek) or Record (op allow) of one event for key at
// now, and returns its verdict as the article's interface does.
func (e *Engine) classic(ctx context.Context, op operation, key string, l Limit, now time.Time) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	if err := validate(key, l, 1); err != nil {
		return err
	}
	started := time.Now()
	decide := e.allowAt
	if op == opPeek {
		decide = e.peekAt
	}
	r, err := decide(ctx, key, l, 1, clockReading{t: now, set: true})
	r, err = e.finish(ctx, op, started, r, err)
	return deniedOrErr(key, r, err)
}

// Clear forgets every event of key; it is Reset.
func (e *Engine) Clear(ctx context.Context, key string) error { return e.Reset(ctx, key) }

func deniedOrErr(key string, r Result, err error) error {
	if err != nil {
		return err
	}
	if !r.Allowed {
		return &DeniedError{Key: key, Result: r}
	}
	return nil
}

// do sends the command build makes through the engine's client, on ctx without its deadline
// (package sendctx: a deadline that passes never closes a connection other calls share), and
// again while nothing was written and ctx is live. build is called for each send: a command
// is sent once.
func (e *Engine) do(ctx context.Context, build func(valkey.Builder) valkey.Completed) valkey.ValkeyResult {
	return sendctx.Send(ctx, func(ctx context.Context) valkey.ValkeyResult {
		return e.client.Do(ctx, build(e.client.B()))
	}, valkey.ValkeyResult.Error)
}

// classify wraps err with what was being done; with ErrUnknownLayout when a script refused
// the key's contents (BADLAYOUT); and with ErrUnavailable when the server was
// not reached or could not answer (a connection error, a timeout of the client's own, LOADING,
// CLUSTERDOWN, TRYAGAIN, MASTERDOWN, BUSY, READONLY, OOM). The error of ctx, the caller's
// context, once it is done, and other server errors are wrapped as they are.
//
// A context error while ctx is not done is the client's own timeout (a connection's dial or
// handshake that did not finish in valkey-go's dial timeout, or cut short by other callers
// each time it was tried: package sendctx): the server could not answer, and the caller did
// not give up. It is wrapped as ErrUnavailable and no longer
// matches the context errors, so that nobody mistakes it for the caller's deadline. The other
// way round, a dial that the caller's passed deadline cut short ("i/o timeout") matches
// context.DeadlineExceeded: the caller gave up, the server was not found wanting.
func classify(ctx context.Context, what string, err error) error {
	deadline, hasDeadline := ctx.Deadline()
	callerDone := ctx.Err() != nil || hasDeadline && !time.Now().Before(deadline)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The client stops at the caller's deadline by its own timer, which may fire a moment
		// before the context's: a deadline that has passed is the caller's too.
		if callerDone {
			return fmt.Errorf("%s: %w", what, err)
		}
		return fmt.Errorf("%s: %w: the client timed out waiting for the server (%v)", what, ErrUnavailable, err)
	}
	if callerDone && errors.Is(err, os.ErrDeadlineExceeded) {
		// A connection dialed on the caller's context gets the caller's deadline as its own, and
		// a dial cut short by it reports "i/o timeout" (os.ErrDeadlineExceeded), not the
		// context's error: it is the caller's deadline all the same.
		return fmt.Errorf("%s: %w (%w)", what, context.DeadlineExceeded, err)
	}
	var verr *valkey.ValkeyError
	if errors.As(err, &verr) && !valkey.IsValkeyNil(verr) {
		if found, ok := strings.CutPrefix(verr.Error(), layoutReply); ok {
			// The server appends where in which script the error was raised.
			found, _, _ = strings.Cut(found, " script: ")
			return fmt.Errorf("%s: %w: %s", what, ErrUnknownLayout, found)
		}
		if !serverCannotAnswer(verr.Error()) {
			return fmt.Errorf("%s: server error: %w", what, err)
		}
	}
	return fmt.Errorf("%s: %w: %w", what, ErrUnavailable, err)
}

// layoutReply starts the error reply of a script that found a key holding something other
// than its layout (lib_log.lua, lib_lease.lua); the rest says what the key holds.
const layoutReply = "BADLAYOUT "

// unavailableReplies are the error replies of a server that is there but cannot decide now:
// loading its data, its cluster down, a slot migrating, its primary lost, a script running
// too long, or a replica that takes no writes (a failover in progress).
//
// OOM (maxmemory reached under noeviction) is one of them: the server refuses every write
// until memory is freed, which is the server being unable to decide, not a verdict on the
// request. So a fail-closed engine refuses, and a fail-open engine admits as it does for an
// outage (WithFailOpen says what that costs).
var unavailableReplies = []string{"LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "BUSY ", "READONLY", "OOM "}

// serverCannotAnswer reports whether an error reply means unavailable rather than refused.
func serverCannotAnswer(reply string) bool {
	for _, prefix := range unavailableReplies {
		if strings.HasPrefix(reply, prefix) {
			return true
		}
	}
	return false
}
