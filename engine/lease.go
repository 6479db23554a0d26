package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/sendctx"
)

// In-flight limits: at most max requests of a key running at once.
//
// A rate limit caps how often requests arrive; an in-flight limit caps how many run at the same
// time. Each holder takes a lease with Acquire, gives it back with Release, and extends it with
// Extend while it runs longer than its ttl. A lease that is neither released nor extended
// expires and frees its slot by itself, so a holder that crashes (or loses its network) holds
// its slot for at most one ttl: no slot can leak for good.
//
// A caller that gives up holds nothing either. The path of one Acquire: the lease's id is made
// before the call (acquireLease); the script call runs to its reply on a context the caller
// cannot cut short (runAcquire, on outliving's context), on one goroutine of its own while the
// caller waits for the reply or its own context's end, whichever comes first; once the reply
// (or the call's failure) is back, a lease that no caller took, or that the call may have left
// without saying so, is released by its id (releaseAbandoned). The release comes after the acquire's reply, never
// before: a release the server took before the acquire would remove nothing.

const (
	// LeaseNamespace is put between the engine's prefix and a key to name the key's leases: the
	// leases of key live in the sorted set prefix + LeaseNamespace + key, apart from the key's
	// rate-limit log, prefix + key (a list), so a key may carry both. A rate-limit key that
	// itself starts with LeaseNamespace names the leases of another key: avoid such names.
	LeaseNamespace = "lease:"
	// MinLeaseTTL is the shortest ttl a lease may have: the key's expiry is set in milliseconds.
	MinLeaseTTL = time.Millisecond
	// MaxLeaseTTL is the longest ttl a lease may have, as for a limit's window (MaxWindow): an
	// expiry must stay exact in a sorted-set score.
	MaxLeaseTTL = MaxWindow
)

// leaseCleanupTimeout bounds what an Acquire does once its caller has left: the wait for the
// script's reply, then the release of the lease nobody took. Neither is bounded by the
// caller's context any more. A release sent when the wait ran out may reach the server before
// the acquire; a lease granted after it expires at its ttl, as a crashed holder's.
const leaseCleanupTimeout = 5 * time.Second

// Lease is one holder's slot of a key's in-flight limit, granted by Acquire. It is a plain
// value: copy it, store it, hand it to another goroutine or process, and Release or Extend it
// there.
type Lease struct {
	// Key is the key the lease holds a slot of, as given to Acquire.
	Key string
	// ID names the lease among every lease of every key, across processes: a random
	// (version 4) UUID the acquiring process made. It is the lease's member in the key's sorted
	// set, as its 16 bytes. The zero UUID holds no slot (see BackendErr).
	ID uuid.UUID
	// At is the instant the lease was granted or last extended, to the microsecond, on the clock
	// that took the decision: the server's unless WithClock.
	At time.Time
	// Expires is when the lease frees its slot by itself unless extended, on the same clock as
	// At: At plus the ttl asked for (rounded up to a microsecond).
	Expires time.Time
	// Remaining is how many more leases the key admitted when this one was granted: max minus
	// the leases held then, this one included. Extend leaves it as Acquire set it.
	Remaining int
	// BackendErr is set only under WithFailOpen(true), when the server could not decide and the
	// lease was granted anyway: it holds the error. Such a lease holds no slot (its ID is the
	// zero UUID); Release of it does nothing, and Expires is on the caller's clock.
	BackendErr error
}

// Acquire takes one of maxHolders slots of key's in-flight limit for ttl: granted while fewer
// than maxHolders unexpired leases of key exist, in one atomic script call, exact under any
// concurrency and from any number of processes. Release the lease when the work is done, and
// Extend it before it expires while the work runs on.
//
//   - A full key is a *LeaseDeniedError (errors.Is(err, ErrRateLimitExceeded)): how many hold
//     it, and when the soonest and the last of their leases expire.
//   - Invalid arguments (an empty key, maxHolders < 1, ttl outside MinLeaseTTL to MaxLeaseTTL)
//     are ErrInvalidArgument, before anything is sent; a key that holds something other than
//     leases is ErrUnknownLayout.
//   - Clock, failures and acknowledgements are as for decisions: the server's clock unless
//     WithClock; ErrUnavailable, or under WithFailOpen(true) a Lease that holds no slot, with
//     BackendErr set; under WithReplicaAck or WithDurableAck a lease counts only once held where
//     they ask. The metrics count the call as operation "acquire".
//   - Only a returned Lease holds a slot. When ctx ends first (cancelled, or its deadline
//     passed), Acquire returns at once with its error under either policy, never a fail-open
//     Lease: fail-open is for a server that could not answer, not for a caller that stopped
//     waiting. A lease the server grants anyway is released once the reply is back; so is one
//     whose call failed without saying whether it was granted, or not acknowledged as asked
//     (docs/leases.md).
func (e *Engine) Acquire(ctx context.Context, key string, maxHolders int, ttl time.Duration) (Lease, error) {
	if err := checkContext(ctx); err != nil {
		return Lease{}, err
	}
	if err := validateLease(key, maxHolders, ttl); err != nil {
		return Lease{}, err
	}
	what := func() string { return "strictrate: acquire " + quoteKey(key) }
	started := time.Now()
	l, err := e.acquireLease(ctx, key, maxHolders, ttl, what)
	e.metrics.record(ctx, opAcquire, leaseOutcome(l.BackendErr, err), time.Since(started))
	return l, err
}

// acquireLease is Acquire on validated arguments: it makes the lease's id, runs the script
// call (runAcquire) and reads what it answered.
func (e *Engine) acquireLease(ctx context.Context, key string, maxHolders int, ttl time.Duration, what func() string) (Lease, error) {
	nowArg, err := e.clockReading().arg()
	if err != nil {
		return Lease{}, err
	}
	id, err := uuid.NewRandom()
	if err != nil {
		return Lease{}, fmt.Errorf("%s: make a lease id: %w", what(), err)
	}
	req := leaseReq{key: e.leaseKey(key), args: acquireArgs(nowArg, maxHolders, ceilMicros(ttl), id)}
	d, err := e.runAcquire(ctx, key, id, req, maxHolders, what)
	if err != nil {
		return e.leaseFailure(ctx, Lease{Key: key}, ttl, err)
	}
	if !d.granted {
		return Lease{}, &LeaseDeniedError{Key: key, Max: maxHolders, Holders: int(d.holders), At: time.UnixMicro(d.now),
			NextExpiry: time.UnixMicro(d.soonest), LastExpiry: time.UnixMicro(d.latest)}
	}
	return Lease{Key: key, ID: id, At: time.UnixMicro(d.now), Expires: time.UnixMicro(d.expires), Remaining: maxHolders - int(d.holders)}, nil
}

// acquireCall is what one lease_acquire.lua call came back with: its decoded reply (granted
// even when err says the grant was not acknowledged as asked) and its error.
type acquireCall struct {
	d   leaseReply
	err error
}

// mayHold reports whether the call may have left its lease on the server: it granted it, or it
// failed other than by an error reply. The server gives an error reply instead of running the
// script (LOADING, BUSY, NOSCRIPT...), and lease_acquire.lua gives one only before it writes
// (BADLAYOUT, an id already in use); a timeout or a lost connection says nothing of whether the
// script ran.
func (c acquireCall) mayHold() bool {
	if c.d.granted {
		return true
	}
	var reply *valkey.ValkeyError
	return c.err != nil && !errors.As(c.err, &reply) && !errors.Is(c.err, ErrUnknownLayout)
}

// runAcquire runs req, the acquire of lease id of key (of at most maxHolders), so that no
// lease of that id outlives it unless returned to the caller: the call runs to its reply on a
// context ctx cannot cut short (outliving), on one goroutine of its own while the caller waits
// for the reply or ctx's end, whichever comes first (sendctx.Promptly); once the reply is
// back, a lease no caller took, or that the call may have left while it failed, is released
// (releaseAbandoned). A ctx that has ended already sends nothing.
func (e *Engine) runAcquire(ctx context.Context, key string, id uuid.UUID, req leaseReq, maxHolders int, what func() string) (leaseReply, error) {
	if err := ctx.Err(); err != nil {
		return leaseReply{}, classify(ctx, what(), err)
	}
	c, _ := sendctx.Promptly(ctx, func() acquireCall {
		callCtx, stop := outliving(ctx)
		defer stop()
		o := e.acquires.Send(callCtx, req, e.acquires.Route(req.key, false))
		c := acquireCall{d: o.Reply, err: o.Failure(callCtx, what)}
		if c.err == nil && (c.d.holders < 1 || c.d.holders > int64(maxHolders) && c.d.granted) {
			c.err = fmt.Errorf("%s: script reply: %d holders of at most %d", what(), c.d.holders, maxHolders)
		}
		return c
	}, func(err error) acquireCall {
		return acquireCall{err: classify(ctx, what(), err)}
	}, func(c acquireCall, taken bool) {
		if !c.mayHold() || taken && c.err == nil {
			return
		}
		if ctx.Done() == nil {
			// On the caller's goroutine (ctx never ends): the caller does not wait for it.
			go e.releaseAbandoned(ctx, key, id)
			return
		}
		e.releaseAbandoned(ctx, key, id)
	})
	return c.d, c.err
}

// outliving returns a context for a call that must run to its reply though its caller may
// leave: it keeps ctx's values but neither its deadline nor its cancellation, and ends
// leaseCleanupTimeout after ctx does, so that a server that never answers does not hold the
// call for good. stop ends it once the call is over.
func outliving(ctx context.Context) (callCtx context.Context, stop func()) {
	callCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	unwatch := context.AfterFunc(ctx, func() {
		if callCtx.Err() == nil {
			time.AfterFunc(leaseCleanupTimeout, cancel)
		}
	})
	return callCtx, func() { unwatch(); cancel() }
}

// releaseAbandoned releases lease id of key, which an Acquire may have left on the server with
// no caller holding it, bounded by leaseCleanupTimeout. It is not counted in the metrics (they
// count callers' calls) but logged at debug level; when it fails, the lease expires at its ttl.
func (e *Engine) releaseAbandoned(ctx context.Context, key string, id uuid.UUID) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseCleanupTimeout)
	defer cancel()
	removed, err := e.removeLease(ctx, key, id, "strictrate: release the abandoned lease "+id.String()+" of "+quoteKey(key))
	if e.logger != nil {
		e.logger.LogAttrs(ctx, slog.LevelDebug, "strictrate: released a lease no caller holds (its acquire's caller left, or the acquire failed)",
			slog.String("key", quoteKey(key)), slog.String("lease", id.String()), slog.Bool("removed", removed), slog.Any("error", err))
	}
}

// Extend moves a held lease's expiry to ttl from now: the heartbeat of a holder that runs
// longer than its lease. It returns the lease with its new At and Expires. ttl may be shorter
// than what was left; the key's other leases are not touched.
//
// A lease that has expired, or was released, cannot be extended: its slot may be another
// holder's by now. Extend then returns an error wrapping ErrLeaseExpired, and the holder must
// stop its work or Acquire anew. Extend before Expires, leaving time for the round trip.
//
// Clock, validation (a lease with no key or no ID, ttl out of range: ErrInvalidArgument),
// fail-open and acknowledgements are as for Acquire; under fail-open a server that cannot
// answer gives the lease back with BackendErr set and Expires moved on the caller's clock,
// though the server's copy was not extended. Fail-closed, the error wraps ErrUnavailable and
// the lease keeps the expiry it had: try again before it passes. Each call is counted in the
// metrics as operation "extend" (outcome denied: the lease had expired).
//
// On any error, keep the lease you passed: the returned one is empty. An Extend whose ctx ended
// before the reply may still reach the server, and then moves the expiry as asked, from when
// it lands: harmless, as the lease is still the caller's. It never revives an expired lease
// nor removes one, and nothing is released on its account.
func (e *Engine) Extend(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	if err := checkContext(ctx); err != nil {
		return Lease{}, err
	}
	if err := validateHeld(l); err != nil {
		return Lease{}, err
	}
	if err := validateTTL(ttl); err != nil {
		return Lease{}, err
	}
	what := func() string { return "strictrate: extend lease " + l.ID.String() + " of " + quoteKey(l.Key) }
	started := time.Now()
	l, err := e.extendLease(ctx, l, ttl, what)
	e.metrics.record(ctx, opExtend, leaseOutcome(l.BackendErr, err), time.Since(started))
	return l, err
}

func (e *Engine) extendLease(ctx context.Context, l Lease, ttl time.Duration, what func() string) (Lease, error) {
	nowArg, err := e.clockReading().arg()
	if err != nil {
		return Lease{}, err
	}
	full := e.leaseKey(l.Key)
	o := e.extends.Do(ctx, leaseReq{key: full, args: extendArgs(nowArg, ceilMicros(ttl), l.ID)}, e.extends.Route(full, false))
	d, err := o.Reply, o.Failure(ctx, what)
	if err != nil {
		return e.leaseFailure(ctx, l, ttl, err)
	}
	if !d.granted {
		return Lease{}, fmt.Errorf("%s: %w", what(), ErrLeaseExpired)
	}
	l.At, l.Expires, l.BackendErr = time.UnixMicro(d.now), time.UnixMicro(d.expires), nil
	return l, nil
}

// Release gives a lease's slot back at once. It removes that lease and nothing else: lease
// ids are unique, so a release never frees another holder's slot, even after the lease
// expired and its slot was taken again. It is idempotent: releasing again, or releasing a
// lease that expired, is a no-op and returns nil. A lease that holds no slot (granted by
// fail-open) is a no-op too; a lease without a Key is ErrInvalidArgument.
//
// An error (wrapping ErrUnavailable when the server could not be reached) means the release
// may not have happened; the slot then frees itself at the lease's expiry. Release has no
// fail-open policy and waits for no acknowledgement: a release lost in a failover only keeps
// the slot until the lease expires. Each call is counted in the metrics as operation
// "release" (outcome allowed when it removed a lease, denied when there was none to remove).
func (e *Engine) Release(ctx context.Context, l Lease) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	if err := validateKey(l.Key); err != nil {
		return err
	}
	what := "strictrate: release lease " + l.ID.String() + " of " + quoteKey(l.Key)
	if l.ID == uuid.Nil {
		return nil
	}
	started := time.Now()
	removed, err := e.removeLease(ctx, l.Key, l.ID, what)
	oc := outcomeAllowed
	switch {
	case err != nil:
		oc = outcomeError
	case !removed:
		oc = outcomeDenied
	}
	e.metrics.record(ctx, opRelease, oc, time.Since(started))
	return err
}

// removeLease runs lease_release.lua for lease id of key: removed reports whether the lease
// was there to remove. Its error is wrapped with what.
func (e *Engine) removeLease(ctx context.Context, key string, id uuid.UUID, what string) (removed bool, err error) {
	full := e.leaseKey(key)
	o := e.releases.Do(ctx, leaseReq{key: full, args: releaseArgs(id)}, e.releases.Route(full, false))
	return o.Reply.granted, o.Failure(ctx, func() string { return what })
}

// leaseKey is the name of key's lease set.
func (e *Engine) leaseKey(key string) string { return e.prefix + LeaseNamespace + key }

// leaseFailure applies the fail-open policy to a lease call the server could not take, as
// backendFailure does for decisions. Open, it returns l as a lease that holds no slot, with
// BackendErr set and an expiry ttl from the caller's now.
func (e *Engine) leaseFailure(ctx context.Context, l Lease, ttl time.Duration, err error) (Lease, error) {
	r, err := e.backendFailure(ctx, err)
	if err != nil {
		return Lease{}, err
	}
	l.ID, l.At, l.Expires, l.BackendErr = uuid.Nil, r.At, r.At.Add(ttl), r.BackendErr
	return l, nil
}

// validateLease checks Acquire's arguments.
func validateLease(key string, maxHolders int, ttl time.Duration) error {
	if err := validateKey(key); err != nil {
		return err
	}
	switch {
	case maxHolders < 1:
		return fmt.Errorf("%w: lease max %d is below 1", ErrInvalidArgument, maxHolders)
	case maxHolders > MaxEvents:
		return fmt.Errorf("%w: lease max %d is above %d", ErrInvalidArgument, maxHolders, MaxEvents)
	}
	return validateTTL(ttl)
}

// validateTTL checks a lease's ttl.
func validateTTL(ttl time.Duration) error {
	switch {
	case ttl < MinLeaseTTL:
		return fmt.Errorf("%w: lease ttl %s is below %s", ErrInvalidArgument, ttl, MinLeaseTTL)
	case ttl > MaxLeaseTTL:
		return fmt.Errorf("%w: lease ttl %s is above %s", ErrInvalidArgument, ttl, MaxLeaseTTL)
	}
	return nil
}

// validateHeld checks that l names a lease that can hold a slot: a key and an id.
func validateHeld(l Lease) error {
	if err := validateKey(l.Key); err != nil {
		return err
	}
	if l.ID == uuid.Nil {
		return fmt.Errorf("%w: lease of %q has no id: it holds no slot (fail-open granted it, or it is not from Acquire)", ErrInvalidArgument, l.Key)
	}
	return nil
}

// leaseOutcome is how the metrics count a lease call that returned err, or a lease whose
// BackendErr is set (fail-open).
func leaseOutcome(backendErr, err error) metricOutcome {
	switch {
	case backendErr != nil:
		return outcomeFailOpen
	case errors.Is(err, ErrRateLimitExceeded) || errors.Is(err, ErrLeaseExpired):
		return outcomeDenied
	case err != nil:
		return outcomeError
	}
	return outcomeAllowed
}
