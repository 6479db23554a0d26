package engine

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Reservations are the ground of local quota (a process admitting a key's requests from
// quota it holds, without a call each): a reservation of k events held for h, decided at the
// server's time t, is one entry of cost k recorded at t + h. Every admission made from it
// happens in [t, t + h], so the entry counts in every trailing window that holds any of them,
// for at least as long as each of them would: the argument that keeps a Resolution slot
// exact keeps a reservation exact. Nothing else changes: the reservation is decided as a
// request of cost k, all or nothing, against every limit of its policy, and Settle to the
// events used gives the rest back at once.
//
// A policy with calendar limits takes no reservation: its counters count the reservation in
// the period of t, while admissions made from it may fall in the next.

// reserve decides a reservation of k events of key under p, held for hold: admitted, its
// Result's Entry is the reservation's (at the decision's time plus hold), to Settle once the
// hold ends with the events used. It validates as AllowPolicy does (k is the cost), and
// refuses a hold that is not positive or a policy with calendar limits (ErrInvalidArgument),
// before anything is sent.
func (e *Engine) reserve(ctx context.Context, key string, p Policy, k int, hold time.Duration) (Result, error) {
	set, err := e.checkPolicyCall(ctx, key, p, k)
	if err != nil {
		return Result{}, err
	}
	switch {
	case hold <= 0:
		return Result{}, fmt.Errorf("%w: reserve %s: hold %s is not positive", ErrInvalidArgument, quoteKey(key), hold)
	case slices.ContainsFunc(p, Limit.IsCalendar):
		return Result{}, fmt.Errorf("%w: reserve %s: a policy with calendar limits takes no reservation", ErrInvalidArgument, quoteKey(key))
	}
	return e.take(ctx, ask{key: key, set: set, n: k, at: e.clockReading(), hold: hold})
}
