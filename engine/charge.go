package engine

import (
	"context"
	"fmt"
)

// Charge records n events of key that were already used, whatever l says: usage known only
// after the work (the tokens a response used, the bytes it sent). The entry is added even when
// the window then holds more than l.Max, and every later decision on the key denies until
// enough of those events have left the window, so a client whose every response costs more
// than its budget is charged and stopped, not let through because nothing remained.
//
//   - Allowed says whether the charge fit within l (the window held at most l.Max with it);
//     Remaining is 0 when it did not. Either way the events are recorded, and Entry names
//     them: Refund and Settle work on a charge as on any admission.
//   - RetryAfter is, when the charge did not fit, the wait until one event is admitted again
//     (if nobody else takes the events first): until enough of the window's events, this
//     charge's included, have left it. It is 0 when the charge fit.
//   - Admissions stay exact: the events Allow admits in any window never exceed Max, and every
//     decision denies while the window, charges included, holds Max or more.
//   - Validation is AllowN's except that n may exceed l.Max (1 <= n <= MaxEvents): a bad
//     limit or cost is ErrInvalidArgument before anything is sent.
//   - A charge is batched by the group commit and never answered from the deny cache. Under
//     WithLocalQuota it first ends this process's reservations of key, giving back what they
//     did not use, so this process's local admissions stop at once; another process's
//     reservations run on until their hold ends (LocalQuota.Hold). Under WithFailOpen a
//     server that cannot answer gives a Result with BackendErr set, and the events are not
//     recorded. Shadow mode leaves a charge's Result as it is. The metrics count it as
//     operation "charge" (outcome denied: it did not fit).
//
// docs/limits.md, "Usage known after the fact", has the patterns: charge what a response used,
// or reserve an estimate and Settle it to what was used, above the estimate included.
func (e *Engine) Charge(ctx context.Context, key string, l Limit, n int) (Result, error) {
	return e.ChargePolicy(ctx, key, Policy{l}, n)
}

// ChargePolicy is Charge against every limit of p at once: the n events are one entry, counted
// by every window of the key, and Allowed says whether every limit had room for them. A Policy
// of one limit is exactly Charge with that limit. It validates as AllowPolicy does, except that
// n may exceed the limits' Max (1 <= n <= MaxEvents).
func (e *Engine) ChargePolicy(ctx context.Context, key string, p Policy, n int) (Result, error) {
	if err := checkContext(ctx); err != nil {
		return Result{}, err
	}
	if err := validateKey(key); err != nil {
		return Result{}, err
	}
	if n < 1 || n > MaxEvents {
		return Result{}, fmt.Errorf("%w: charge of %d events, outside 1 to %d", ErrInvalidArgument, n, MaxEvents)
	}
	set, err := e.checkedPolicy(p, 1)
	if err != nil {
		return Result{}, err
	}
	return e.take(ctx, ask{op: opCharge, charge: true, key: key, set: set, n: n, at: e.clockReading()})
}
