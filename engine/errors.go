package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/strictrate/strictrate/internal/callerr"
	"github.com/strictrate/strictrate/loader"
)

var (
	// ErrRateLimitExceeded is returned by Check and Record when the request is denied (the
	// error is a *DeniedError, which carries the full Result), and by Acquire when the key's
	// in-flight limit is full (a *LeaseDeniedError, which says who holds it and until when).
	ErrRateLimitExceeded = errors.New("strictrate: rate limit exceeded")

	// ErrInvalidArgument is wrapped by every validation error: an empty key, a Limit out of
	// range, a cost out of range, a nil client or an unusable clock. Nothing is
	// sent to the server when it is returned.
	ErrInvalidArgument = errors.New("strictrate: invalid argument")

	// ErrUnavailable is wrapped by errors that mean the server could not be reached or did not
	// answer: connection refused or lost, client closed. The decision was not taken, or its
	// outcome is unknown; the error also wraps the client's own error.
	ErrUnavailable = callerr.ErrUnavailable

	// ErrPreload is wrapped by the error New returns when a script cannot be loaded on a node
	// (scripting disabled or not permitted for the client's user, say). It is the loader's
	// sentinel, named here so callers need not import the loader.
	ErrPreload = loader.ErrPreload

	// ErrUnknownLayout is wrapped by the error of a call on a key that holds something this
	// release cannot read as its own: another type (another program's key, or package
	// pipelined's sorted set), or a log whose header names a layout version this release does not know (a
	// later release's). The message names the key and what it holds. Nothing is read as a
	// count, nothing is converted or written, and fail-open never admits on it: it is a key
	// to fix (Reset it, or give the engine another prefix), not an outage.
	ErrUnknownLayout = callerr.ErrUnknownLayout

	// ErrUnknownEntry is wrapped by the error of a Refund or Settle whose Result names an
	// entry of another key: the key given is not the one the Result's request was decided
	// on, or the Result came from an engine of another prefix. It also matches
	// ErrInvalidArgument, and nothing is sent.
	ErrUnknownEntry = fmt.Errorf("%w: the entry is not one of this key's", ErrInvalidArgument)

	// ErrLeaseExpired is wrapped by the error Extend returns for a lease that no longer holds
	// its slot: it expired (its holder did not extend it in time, or a failover lost it) or it
	// was released. Another holder may have the slot by now, so the holder must stop or
	// acquire anew; extending cannot bring the old lease back. errors.Is matches it.
	ErrLeaseExpired = errors.New("strictrate: lease expired")

	// ErrEvictionPolicy is returned by New when a node's maxmemory-policy may evict limiter
	// keys (allkeys-*) and WithEvictionCheck is Refuse, the default.
	ErrEvictionPolicy = errors.New("strictrate: the server may evict limiter keys")

	// ErrPersistence is returned by New when the servers do not keep the logs as asked: a
	// primary under appendonly no or appendfsync no while WithDurableAck asks for a local fsync
	// (or under everysec, with WithPersistenceCheck(Refuse)), or a primary with
	// neither an append-only file nor a replica under WithPersistenceCheck(Refuse).
	ErrPersistence = errors.New("strictrate: the server does not persist limiter logs as asked")
)

// DeniedError is the error Check, Record and Wait return when denied. It matches
// ErrRateLimitExceeded with errors.Is and gives the decision with errors.As.
type DeniedError struct {
	Key    string
	Result Result
}

// Error says which key was denied and when to retry.
func (e *DeniedError) Error() string {
	return fmt.Sprintf("%s: key %s: retry after %s", ErrRateLimitExceeded, quoteKey(e.Key), e.Result.RetryAfter.Round(time.Microsecond))
}

// maxQuotedKey is the most bytes of a key an error message quotes: enough to tell keys apart
// in a log line, while a huge key (a client's header, say) costs no more than that per error.
const maxQuotedKey = 128

// quoteKey writes key quoted for an error message, cut to maxQuotedKey bytes (at a character
// boundary) with its full length said when longer.
func quoteKey(key string) string {
	if len(key) <= maxQuotedKey {
		return strconv.Quote(key)
	}
	cut := maxQuotedKey
	for cut > 0 && !utf8.RuneStart(key[cut]) {
		cut--
	}
	return strconv.Quote(key[:cut]) + fmt.Sprintf("... (%d bytes)", len(key))
}

// Unwrap makes errors.Is(err, ErrRateLimitExceeded) true.
func (e *DeniedError) Unwrap() error { return ErrRateLimitExceeded }

// LeaseDeniedError is the error Acquire returns when key's in-flight limit is full: what a
// holder-to-be needs to decide whether to wait. It matches ErrRateLimitExceeded with
// errors.Is and gives the details with errors.As.
type LeaseDeniedError struct {
	// Key is the key as given to Acquire.
	Key string
	// Max is the most leases of Key held at once, as given to Acquire.
	Max int
	// Holders is how many unexpired leases of Key were held at the decision (at least Max).
	Holders int
	// At is the instant the decision was taken at, on the clock that took it.
	At time.Time
	// NextExpiry is when the soonest held lease expires unless extended: a slot is free by
	// then at the latest, if nobody else takes it; a Release may free one sooner.
	NextExpiry time.Time
	// LastExpiry is when the last held lease expires unless extended: the key holds none then.
	LastExpiry time.Time
}

// RetryAfter is the wait from the decision until the soonest lease expires.
func (e *LeaseDeniedError) RetryAfter() time.Duration { return e.NextExpiry.Sub(e.At) }

// Error says which key is full, by how many holders, and when a slot frees at the latest.
func (e *LeaseDeniedError) Error() string {
	return fmt.Sprintf("%s: key %s: %d of %d leases held; the first expires in %s", ErrRateLimitExceeded, quoteKey(e.Key),
		e.Holders, e.Max, e.RetryAfter().Round(time.Microsecond))
}

// Unwrap makes errors.Is(err, ErrRateLimitExceeded) true.
func (e *LeaseDeniedError) Unwrap() error { return ErrRateLimitExceeded }

// classify wraps err, a call's failure, with what was being done (callerr.Classify): the
// caller's own cancellation or deadline, ErrUnavailable, ErrUnknownLayout, or the server's
// reply.
func classify(ctx context.Context, what string, err error) error {
	return callerr.Classify(ctx, what, err)
}
