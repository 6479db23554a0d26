package engine

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"
)

// In-flight limits: at most max requests of a key running at once.
//
// A rate limit caps how often requests arrive; an in-flight limit caps how many run at the same
// time. Each holder takes a lease with Acquire, gives it back with Release, and extends it with
// Extend while it runs longer than its ttl. A lease that is neither released nor extended
// expires and frees its slot by itself, so a holder that crashes (or loses its network) holds
// its slot for at most one ttl: no slot can leak for good.

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

// Acquire takes one of max slots of key's in-flight limit for ttl: it is granted while fewer
// than max unexpired leases of key exist, in one atomic script call, exact under any
// concurrency and from any number of processes. Release the lease when the work is done;
// extend it with Extend before it expires when the work runs longer than ttl.
//
// A full key is denied with a *DeniedError (errors.Is(err, ErrRateLimitExceeded)) whose
// Result.RetryAfter is the wait until the soonest lease of key expires: a slot is free by then
// at the latest, if nobody else takes it, and a release may free one sooner. Its ResetAfter is
// the wait until the last lease expires; Remaining is 0.
//
// The decision uses the server's clock (TIME in the script), in either Mode, unless the engine
// was made WithClock. Invalid arguments (an empty key, max < 1, ttl < MinLeaseTTL or above
// MaxLeaseTTL) are ErrInvalidArgument, before anything is sent. A server that cannot decide is
// handled as for decisions: an error wrapping ErrUnavailable (fail-closed, the default), or,
// under WithFailOpen(true), a Lease that holds no slot, with BackendErr set, and no error. With
// WithReplicaAck a lease counts only once a replica holds it.
func (e *Engine) Acquire(ctx context.Context, key string, max int, ttl time.Duration) (Lease, error) {
	if err := checkContext(ctx); err != nil {
		return Lease{}, err
	}
	if err := validateLease(key, max, ttl); err != nil {
		return Lease{}, err
	}
	nowArg, err := e.leaseNow().arg()
	if err != nil {
		return Lease{}, err
	}
	id, err := uuid.NewRandom()
	if err != nil {
		return Lease{}, fmt.Errorf("strictrate: acquire %s: make a lease id: %w", quoteKey(key), err)
	}
	args := []string{nowArg, strconv.Itoa(max), strconv.FormatInt(ceilMicros(ttl), 10), string(id[:])}
	what := func() string { return "strictrate: acquire " + quoteKey(key) }
	var v [4]int64
	err = e.runAcked(ctx, e.acquire, what, e.leaseKey(key), args, func(reply valkey.ValkeyResult) (bool, error) {
		if _, err := readInts(reply, v[:], len(v)); err != nil {
			return false, err
		}
		remaining, now, retry, last := v[0], v[1], v[2], v[3]
		if remaining < 0 || remaining >= int64(max) || retry < 0 || retry == 0 && last <= now || retry > 0 && (remaining != 0 || last < retry) {
			return false, fmt.Errorf("script reply %v is not a lease decision", v)
		}
		return retry == 0, nil
	})
	if err != nil {
		return e.leaseFailure(ctx, Lease{Key: key}, ttl, err)
	}
	remaining, at, retry, last := int(v[0]), time.UnixMicro(v[1]), v[2], v[3]
	if retry > 0 {
		return Lease{}, &DeniedError{Key: key, Result: Result{
			At:         at,
			RetryAfter: time.Duration(retry) * time.Microsecond,
			ResetAfter: time.Duration(last) * time.Microsecond,
		}}
	}
	return Lease{Key: key, ID: id, At: at, Expires: time.UnixMicro(last), Remaining: remaining}, nil
}

// Extend moves a held lease's expiry to ttl from now: the heartbeat of a holder that runs
// longer than its lease. It returns the lease with its new At and Expires. ttl may be shorter
// than what was left; the key's other leases are not touched.
//
// A lease that has expired, or was released, cannot be extended: its slot may be another
// holder's by now. Extend then returns an error wrapping ErrLeaseExpired, and the holder must
// stop its work or Acquire anew. Extend before Expires, with room for the round trip.
//
// Clock, validation (a lease with no key or no ID, ttl out of range: ErrInvalidArgument),
// fail-open and replica acknowledgement are as for Acquire; under fail-open a server that
// cannot answer gives the lease back with BackendErr set and Expires moved on the caller's
// clock, though the server's copy was not extended. Fail-closed, the error wraps
// ErrUnavailable and the lease keeps the expiry it had: try again before it passes.
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
	nowArg, err := e.leaseNow().arg()
	if err != nil {
		return Lease{}, err
	}
	args := []string{nowArg, strconv.FormatInt(ceilMicros(ttl), 10), string(l.ID[:])}
	what := func() string { return "strictrate: extend lease " + l.ID.String() + " of " + quoteKey(l.Key) }
	var v [3]int64
	err = e.runAcked(ctx, e.extend, what, e.leaseKey(l.Key), args, func(reply valkey.ValkeyResult) (bool, error) {
		if _, err := readInts(reply, v[:], 2); err != nil {
			return false, err
		}
		if v[0] != 0 && (v[0] != 1 || v[2] <= v[1]) {
			return false, fmt.Errorf("script reply %v is not an extension", v)
		}
		return v[0] == 1, nil
	})
	if err != nil {
		return e.leaseFailure(ctx, l, ttl, err)
	}
	if v[0] == 0 {
		return Lease{}, fmt.Errorf("%s: %w", what(), ErrLeaseExpired)
	}
	l.At, l.Expires, l.BackendErr = time.UnixMicro(v[1]), time.UnixMicro(v[2]), nil
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
// fail-open policy and no replica acknowledgement: a release lost in a failover only keeps the
// slot until the lease expires.
func (e *Engine) Release(ctx context.Context, l Lease) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	if err := validateKey(l.Key); err != nil {
		return err
	}
	if l.ID == uuid.Nil {
		return nil
	}
	if err := e.release.Exec(ctx, e.client, []string{e.leaseKey(l.Key)}, []string{string(l.ID[:])}).Error(); err != nil {
		return classify(ctx, "strictrate: release lease "+l.ID.String()+" of "+quoteKey(l.Key), err)
	}
	return nil
}

// leaseKey is the name of key's lease set.
func (e *Engine) leaseKey(key string) string { return e.prefix + LeaseNamespace + key }

// leaseNow is the clock leases are decided on: the caller's under WithClock, else the
// server's, in either Mode (the lease scripts always run atomically).
func (e *Engine) leaseNow() clockReading {
	if e.clock != nil {
		return clockReading{t: e.clock(), set: true}
	}
	return clockReading{}
}

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
func validateLease(key string, max int, ttl time.Duration) error {
	if err := validateKey(key); err != nil {
		return err
	}
	switch {
	case max < 1:
		return fmt.Errorf("%w: lease max %d is below 1", ErrInvalidArgument, max)
	case max > MaxEvents:
		return fmt.Errorf("%w: lease max %d is above %d", ErrInvalidArgument, max, MaxEvents)
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
