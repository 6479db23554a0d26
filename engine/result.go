package engine

import "time"

// Result is the outcome of one decision.
type Result struct {
	// Allowed reports whether the request was admitted (Allow, AllowN) or would be (Peek).
	Allowed bool
	// Remaining is how many events would still be admitted now, after this decision.
	Remaining int
	// RetryAfter is, when denied, how long to wait until the same request is admitted if
	// nobody else takes the events first; 0 when allowed. The decision reads at most 32 entries from
	// each end of the window to find it, so that no request buys server time with its cost:
	// when the events that must leave end deeper in a long log, it is the wait until the 32nd
	// oldest entry leaves, before which the request is not admitted (ask again then). On a long
	// log whose live entries all cost 1, it is exact at any depth: the entry is found by its
	// number.
	RetryAfter time.Duration
	// ResetAfter is how long until the log holds no event; 0 when it is empty.
	ResetAfter time.Duration
	// QuotaAfter is how long until the limit Window names next gets quota back: until the
	// oldest event in that window (this decision's included) leaves it, exact to the
	// microsecond. Admitted, it is at most Window: Window itself when the request is the only
	// event in it. 0 when that window holds no event (a Peek) and when fail-open admitted
	// without a decision. It is draft-ietf-httpapi-ratelimit-headers-10's "t" of an allowed
	// request.
	QuotaAfter time.Duration
	// At is the instant the decision was taken at, to the microsecond, on the clock that took
	// it: the server's by default, else the caller's. An admitted event is recorded at At.
	At time.Time
	// Window is the window of the limit Remaining speaks for: the Limit's own for Allow,
	// AllowN and Peek; for AllowPolicy, the limit with the least remaining (the shortest
	// window among equals). 0 when fail-open admitted without a decision.
	Window time.Duration
	// BackendErr is set only under WithFailOpen(true), when the server could not decide and
	// the request was admitted anyway: it holds the error, for logs and metrics. Remaining,
	// RetryAfter, ResetAfter and QuotaAfter are then 0, and At is the caller's clock.
	BackendErr error
	// Entry identifies the log entry an admitted request wrote, for Refund and Settle. It is
	// the zero EntryID when nothing was recorded: a denial (but a Charge's, which records its
	// events all the same), a Peek, a fail-open admission or a shadow admission.
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
