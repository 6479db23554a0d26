package engine

import (
	"context"
	"fmt"
	"time"
)

// Refund gives an admitted request's cost back at once: its entry's cost becomes 0, and every
// window of the key counts that much less. Use it for a request that turned out not to count
// (it failed before doing any work, say). r is the Result that admitted the request; a copy
// does as well, here or in another process.
//
// Refund is atomic and idempotent: refunding again, or after a Settle, changes nothing more,
// and never touches another request's entry (except for a shared request: see Settle). It is a no-op once the entry has left the key's
// longest window. A Result that recorded nothing (a denial, a Peek, a fail-open admission) is
// ErrInvalidArgument; a Result of another key, or of an engine of another prefix, is
// ErrUnknownEntry (r.Entry.Key names the log it was recorded in); both before anything is
// sent. Reset forgets every entry; a Result
// from before a Reset then names nothing, except under a caller's clock frozen at that
// Result's microsecond.
func (e *Engine) Refund(ctx context.Context, key string, r Result) error {
	return e.settle(ctx, opRefund, key, r, 0)
}

// Settle sets an admitted request's cost to actual, the events it ended up using: reserve what
// a request will likely use, then settle it to what it used. Below r.Entry.Cost, the
// difference is given back at once to every window of the key. Above it, the entry is raised
// to actual, whatever the limits say, as Charge records usage: the request used more than it
// was admitted with, and every later decision counts it (the window may then hold more than
// Max, and denies until it drains). 0 <= actual <= MaxEvents, else ErrInvalidArgument.
//
// A retried Settle is harmless. Lowering never raises again: settling again to a higher cost
// than the entry holds, up to r.Entry.Cost, changes nothing. Raising happens once, and only
// while the entry still holds r.Entry.Cost: a retried raise, or a raise after a Settle or a
// Refund, changes nothing; and once raised, the entry is no longer lowered by r (its cost is
// no longer the one r was admitted with). A shared request (below) cannot be raised: that is
// ErrInvalidArgument before anything is sent, and Charge records the excess instead.
// Otherwise it is Refund, which is Settle to 0, with the same atomicity, idempotence and
// no-ops.
//
// A shared request (r.Entry.Shared: a limit with a Resolution, whose slot's entry holds other
// requests' events too, or a Calendar limit, whose period's counter does) cannot be told
// apart from the others it is held with: Settle gives r.Entry.Cost - actual back to its slot's
// entry and to the counters of the period that holds the decision's time (r.Entry.Decided)
// on every call, never more than they
// hold, so call it once per request. A calendar counter gets its give-back until its period
// ends, even after the request's entry left every sliding window.
func (e *Engine) Settle(ctx context.Context, key string, r Result, actual int) error {
	return e.settle(ctx, opSettle, key, r, actual)
}

// uncounted is the operation of a give-back the engine makes on its own (AllowAll's refunds,
// local quota's settles): the metrics count callers' calls, not those.
const uncounted operation = -1

// settle is Refund (op opRefund) and Settle (opSettle), and the engine's own give-backs (op
// uncounted). Its arguments are checked before anything is sent, and not counted when wrong.
func (e *Engine) settle(ctx context.Context, op operation, key string, r Result, actual int) error {
	if err := checkContext(ctx); err != nil {
		return err
	}
	if err := validateKey(key); err != nil {
		return err
	}
	what := "strictrate: settle " + quoteKey(key)
	id, full := r.Entry, e.prefix+key
	switch {
	case id.IsZero():
		return fmt.Errorf("%s: %w: the Result recorded no entry (a denial, a Peek or fail-open)", what, ErrInvalidArgument)
	case id.Key != full:
		return fmt.Errorf("%s: %w: the Result's entry is in the log %s, and this key's is %s", what, ErrUnknownEntry,
			quoteKey(id.Key), quoteKey(full))
	case id.Seq < 0 || id.Seq == 0 && !id.Shared || id.Cost < 1 || id.Cost > MaxEvents:
		return fmt.Errorf("%w: entry %+v is not one this engine made", ErrInvalidArgument, id)
	case actual < 0 || actual > MaxEvents:
		return fmt.Errorf("%w: settle to %d events, outside 0 to %d", ErrInvalidArgument, actual, MaxEvents)
	case actual > id.Cost && id.Shared:
		return fmt.Errorf("%w: settle to %d events, above the shared entry's cost %d (a Resolution slot, a Calendar "+
			"counter or a local reservation cannot tell its requests apart): Charge the excess", ErrInvalidArgument, actual, id.Cost)
	}
	at, err := clockReading{t: id.At, set: true}.micros()
	if err != nil {
		return err
	}
	var decidedUS int64
	if id.Shared {
		// A slot's entry or calendar counters: the periods are those of the decision's time.
		decided := id.Decided
		if decided.IsZero() {
			decided = r.At
		}
		if decided.IsZero() {
			decided = id.At
		}
		if decidedUS, err = (clockReading{t: decided, set: true}).micros(); err != nil {
			return err
		}
	}
	started := time.Now()
	err = e.giveBack(ctx, what, id, actual, settleArgs(at, id, actual, decidedUS))
	if op != uncounted {
		oc := outcomeAllowed
		if err != nil {
			oc = outcomeError
		}
		e.metrics.record(ctx, op, oc, time.Since(started))
	}
	return err
}

// giveBack lowers the entry id of its key's log to actual events: to the local reservation it
// was admitted from while that is held (WithLocalQuota), else through settle.lua, with args.
func (e *Engine) giveBack(ctx context.Context, what string, id EntryID, actual int, args []string) error {
	if e.local != nil && id.Shared && e.local.settleLocal(id, actual) {
		return nil // a local admission, given back to the reservation it came from
	}
	full := id.Key
	defer e.givingBack(full)()
	o := e.settles.Do(ctx, settleReq{key: full, args: args}, e.settles.Route(full, false))
	if err := o.Failure(ctx, func() string { return what }); err != nil {
		return err
	}
	if back, low, high := o.Reply, min(int64(id.Cost-actual), 0), max(int64(id.Cost-actual), 0); back < low || back > high {
		return fmt.Errorf("%s: script reply: %d events given back, outside %d to %d", what, back, low, high)
	}
	return nil
}
