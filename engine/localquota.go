package engine

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/strictrate/strictrate/internal/sendctx"
)

// LocalQuota configures local quota (WithLocalQuota): for a key this process asks about often
// against its limit, the engine reserves a few events with one script call (a reservation,
// reserve.go: an entry of cost k recorded at the server's time plus Hold) and admits the key's
// next requests from it without a call, until it is used up or its hold ends; then the events
// it did not use are given back (a Settle). The reservation counts in every window that could
// hold an admission made from it, so the key never admits more than Max in any trailing
// window, whatever the processes and however long the server takes to answer.
//
// The engine keeps a little state for each key this process asked about lately (dropped two
// to four holds after its last request), for at most 100,000 keys: past that, a new key is
// decided by the server, as without local quota, until some are dropped.
//
// The zero value is a sensible configuration: a hold of a tenth of the key's shortest window
// (at most a second), and keys served locally once this process asks about them 32 times
// within one hold.
type LocalQuota struct {
	// Hold is how long a reservation lives: the longest a process admits from it, and so the
	// longest outage of the server it carries a hot key through. Its price: a reservation's
	// unused events are held from other processes until the hold ends (or the process gives
	// them back sooner, when it takes the next), and its used ones count until one window
	// after the hold ends, up to one hold longer than each would alone. 0 means a tenth of
	// the key's shortest window, at most a second.
	Hold time.Duration
	// MinDemand is how many requests for a key within one hold make this process serve the key
	// locally; below it, every request is decided by the server as without local quota. 0
	// means 32.
	MinDemand int
}

// Defaults of LocalQuota's zero fields; the most keys one engine keeps local state for, and the
// most holders one new key's sweep looks at.
//
// maxLocalKeys is a constant, not an option: it binds only in a flood of keys asked about
// once or twice (a holder is made on a key's first request, and dropped two to four holds
// after its last), since keys in demand are far fewer (at the defaults, 100,000 of them is at
// least 3.2 million requests a second through one process). Past it a new key is decided by the
// server, as without local quota, which is exact; keys already held keep their holders.
const (
	defaultLocalHold      = time.Second
	defaultLocalMinDemand = 32
	maxLocalKeys          = 100_000
	localSweepBudget      = 16
	localSettleTimeout    = 5 * time.Second
)

// WithLocalQuota turns local quota on (see LocalQuota). It applies to Allow, AllowN, Wait,
// Record and AllowPolicy (AllowAll of one request too) on the server's clock,
// for limits without calendar periods; everything else is decided as without it. A locally
// admitted Result has Allowed true and an Entry that names the reservation (Shared, with the
// request's own cost), so that Refund and Settle give its events back: to the reservation
// while it is held, else to its entry in the log. Its Remaining is what this process knows of
// what remains: what remained at the reservation's decision plus what is left of the
// reservation.
func WithLocalQuota(q LocalQuota) Option { return func(o *options) { o.localQuota = &q } }

// localQuotas is an engine's local quota: a holder per key and limit set this process asks
// about, at most maxKeys of them, queued by hold for sweep; and the holders by the entry of
// their current reservation (for Refund and Settle).
type localQuotas struct {
	e         *Engine
	hold      time.Duration
	minDemand int
	maxKeys   int // maxLocalKeys; a test lowers it

	mu      sync.RWMutex
	holders map[holderID]*holder
	queues  map[time.Duration]*holderQueue // every holder of holders, by its hold
	byEntry map[EntryID]*holder            // the reservation's entry, Cost and Decided zero
	swept   int                            // holders the sweeps looked at, for the tests
}

func newLocalQuotas(e *Engine, q LocalQuota) (*localQuotas, error) {
	switch {
	case q.Hold < 0:
		return nil, fmt.Errorf("%w: local quota: Hold %s is negative", ErrInvalidArgument, q.Hold)
	case q.MinDemand < 0:
		return nil, fmt.Errorf("%w: local quota: MinDemand %d is negative", ErrInvalidArgument, q.MinDemand)
	case q.Hold > 0 && q.Hold < time.Millisecond:
		return nil, fmt.Errorf("%w: local quota: Hold %s is below a millisecond", ErrInvalidArgument, q.Hold)
	}
	lq := &localQuotas{e: e, hold: q.Hold, minDemand: q.MinDemand, maxKeys: maxLocalKeys,
		holders: map[holderID]*holder{}, queues: map[time.Duration]*holderQueue{}, byEntry: map[EntryID]*holder{}}
	if lq.minDemand == 0 {
		lq.minDemand = defaultLocalMinDemand
	}
	return lq, nil
}

// holder is one key's local quota under one limit set: its demand in this process, and its
// reservation.
type holder struct {
	key  string // the caller's key
	set  *limitSet
	hold time.Duration // its reservations' hold (localQuotas.holdFor)

	// Its place in its hold's queue, under localQuotas.mu: sweep looks at it from due on.
	prev, next *holder
	due        time.Time

	mu          sync.Mutex
	since       time.Time    // the start of the current demand interval (one hold long)
	count, last int          // requests in the current interval, and in the one before
	room        int          // Remaining as the last decision on the key reported it; -1 unknown
	pending     bool         // a reservation's call is in flight
	cur         *reservation // the current reservation: nil for none yet
	// cutAt is when a charge on the key last ended its reservations (cut): a reservation
	// sent before it is given back whole when it comes back, never admitted from.
	cutAt time.Time
}

// reservation is a holder's reservation, kept apart from the holder: most holders never take
// one (a key asked about once or twice), and within each holder it would be more than half of
// its memory. Under the holder's mu.
type reservation struct {
	res     Result    // as the server decided it
	k       int       // its events
	used    int       // admitted from it, less what Refund and Settle gave back
	until   time.Time // when the process stops admitting from it (monotonic)
	settled bool      // its unused events were given back (or it was retired)
}

// holdFor is the hold of set's reservations: LocalQuota.Hold when set, else a tenth of set's
// shortest window, at most a second and at least a millisecond. A reservation's events count
// until one window after its hold ends, up to one hold longer than each would alone: a tenth
// of the window keeps that price at a tenth.
func (lq *localQuotas) holdFor(set *limitSet) time.Duration {
	if lq.hold > 0 {
		return lq.hold
	}
	hold := defaultLocalHold
	for _, l := range set.limits {
		hold = min(hold, l.Window/10)
	}
	return max(hold, time.Millisecond)
}

// holder returns the holder of key under set, made on first use; nil when the engine keeps
// maxKeys holders and sweep drops none of them: the key is then decided as without local
// quota, until holders are dropped. Making a holder sweeps first, so that the holders kept
// are those of keys asked about lately, at a cost that does not grow with how many are kept.
func (lq *localQuotas) holder(key string, set *limitSet) *holder {
	id := holderIDOf(key, set)
	lq.mu.RLock()
	h := lq.holders[id]
	lq.mu.RUnlock()
	if h != nil {
		return h
	}
	lq.mu.Lock()
	defer lq.mu.Unlock()
	if h = lq.holders[id]; h != nil {
		return h
	}
	now := time.Now()
	if lq.sweep(now); len(lq.holders) >= lq.maxKeys {
		return nil
	}
	h = &holder{key: key, set: set, room: -1, hold: lq.holdFor(set)}
	lq.holders[id] = h
	lq.enqueue(h, now)
	return h
}

// holderID names the holder of a key under a limit set: one per key and limits. A struct, not
// the two joined, so that finding a key's holder, on every local admission, allocates nothing.
type holderID struct{ key, limits string }

// holderIDOf is the holderID of key under set.
func holderIDOf(key string, set *limitSet) holderID { return holderID{key, set.oneNow} }

// sweep drops holders that hold no reservation and were not asked about for two holds (a
// key's demand is only ever counted over the last two), and returns how many. It looks only
// at holders that are due, at most localSweepBudget of them, so that a new key's cost does not
// grow with the holders kept: a holder is due two holds after it was queued, and its hold's
// queue is in that order, so the due ones are at its front. One it cannot drop yet goes to the
// back, due two holds later: each holder is looked at once per two holds at most, and dropped
// two to four holds after its last request. Under lq.mu (written).
func (lq *localQuotas) sweep(now time.Time) int {
	dropped, budget := 0, localSweepBudget
	for _, q := range lq.queues {
		for h := q.head; budget > 0 && h != nil && !now.Before(h.due); h = q.head {
			budget--
			lq.swept++
			h.mu.Lock()
			idle := !h.pending && (h.cur == nil || h.cur.settled) && now.Sub(h.since) >= 2*h.hold
			h.mu.Unlock()
			if idle {
				lq.drop(h)
				dropped++
				continue
			}
			q.remove(h)
			lq.enqueue(h, now)
		}
	}
	return dropped
}

// enqueue puts h, a holder of lq.holders, at the back of its hold's queue, due two holds after
// now. Under lq.mu (written).
func (lq *localQuotas) enqueue(h *holder, now time.Time) {
	q := lq.queues[h.hold]
	if q == nil {
		q = &holderQueue{}
		lq.queues[h.hold] = q
	}
	h.due = now.Add(2 * h.hold)
	q.push(h)
}

// drop removes h from lq.holders and its queue, if it is still there: forget may have removed
// it already, and a holder made since for the same key and limits is another. Under lq.mu
// (written).
func (lq *localQuotas) drop(h *holder) {
	id := holderIDOf(h.key, h.set)
	if lq.holders[id] != h {
		return
	}
	delete(lq.holders, id)
	q := lq.queues[h.hold]
	if q.remove(h); q.head == nil {
		delete(lq.queues, h.hold)
	}
}

// holderQueue is the holders of one hold, in the order they fall due: a list through the
// holders themselves, so that queuing allocates nothing.
type holderQueue struct{ head, tail *holder }

// push puts h, in no queue, at the back.
func (q *holderQueue) push(h *holder) {
	h.prev, h.next = q.tail, nil
	if q.tail == nil {
		q.head = h
	} else {
		q.tail.next = h
	}
	q.tail = h
}

// remove takes h, in q, out of it.
func (q *holderQueue) remove(h *holder) {
	if h.prev == nil {
		q.head = h.next
	} else {
		h.prev.next = h.next
	}
	if h.next == nil {
		q.tail = h.prev
	} else {
		h.next.prev = h.prev
	}
	h.prev, h.next = nil, nil
}

// allow admits n events of key under its limit set set from local quota: from the
// reservation held, or from a new one it takes for a key in demand. It reports false when the
// request is the server's to decide as without local quota (and then h, if not nil, is to be
// told the decision: observe).
func (lq *localQuotas) allow(ctx context.Context, key string, set *limitSet, n int) (r Result, ok bool, h *holder) {
	if set.calendars > 0 {
		return Result{}, false, nil
	}
	if h = lq.holder(key, set); h == nil {
		return Result{}, false, nil
	}
	// The time is read once h is held: a reservation installed while this caller waited for
	// it was decided before this admission, as the rule needs (and as the Result says).
	h.mu.Lock()
	now := time.Now()
	h.noteDemand(now, n, h.hold)
	if c := h.cur; c != nil && !c.settled && now.Before(c.until) && c.k-c.used >= n {
		c.used += n
		r = h.localResult(now, n)
		h.mu.Unlock()
		lq.e.metrics.localEvents.Add(ctx, int64(n), lq.e.metrics.localUsed...)
		return r, true, h
	}
	if h.pending || max(h.count, h.last) < lq.minDemand {
		h.mu.Unlock()
		return Result{}, false, h
	}
	k := h.size(n)
	h.pending = true
	h.mu.Unlock()
	r, ok = lq.take(ctx, h, k, n)
	return r, ok, h
}

// take sends a reservation of k events of h's key, and installs it when it comes back within
// ctx, admitting n of them for the request that took it; false when the request is the
// server's to decide. Apart from allow, whose local admissions it would otherwise slow: the
// call here captures h, which would move allow's h to the heap on every call.
func (lq *localQuotas) take(ctx context.Context, h *holder, k, n int) (Result, bool) {
	// The reservation's call outlives its caller's context: a call the caller gave up on may
	// still be taken by the server (one that stopped answering for a while takes it when it
	// answers again), and its events must then be used or given back, not left held. It runs
	// on one goroutine of its own (sendctx.Promptly), which installs it when its caller left.
	sent := time.Now()
	got, taken := sendctx.Promptly(ctx, func() reserved {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.hold+localSettleTimeout)
		defer cancel()
		res, err := lq.e.take(rctx, ask{key: h.key, set: h.set, n: k, at: lq.e.clockReading(), hold: h.hold, detached: true})
		return reserved{res, err}
	}, func(err error) reserved {
		return reserved{err: err}
	}, func(got reserved, taken bool) {
		if !taken {
			_, _ = lq.install(context.Background(), h, got, k, 0, sent)
		}
	})
	if !taken {
		return Result{}, false
	}
	return lq.install(ctx, h, got, k, n, sent)
}

// reserved is a reservation's call's outcome.
type reserved struct {
	res Result
	err error
}

// install makes got, a reservation of k events sent at sent, h's current one, and admits n of
// them for the request that took it (none for n 0): it returns that admission's Result, and
// false when the reservation was refused or failed. A reservation whose hold ended before it
// came back (its caller gave up, or the answer was slow) admits nothing: it is given back
// whole at once, and the request goes to the server as without local quota.
func (lq *localQuotas) install(ctx context.Context, h *holder, got reserved, k, n int, sent time.Time) (Result, bool) {
	// A fail-open admission (WithFailOpen: the server could not answer) recorded nothing: it
	// is no reservation.
	taken := got.err == nil && got.res.Allowed && got.res.BackendErr == nil && !got.res.Entry.IsZero()
	m := lq.e.metrics
	if taken {
		m.localReservations.Add(ctx, 1)
		m.localEvents.Add(ctx, int64(k), m.localReserved...)
	}
	h.mu.Lock()
	h.pending = false
	if got.err == nil && got.res.BackendErr == nil {
		h.room = got.res.Remaining
	}
	if !taken {
		h.mu.Unlock()
		return Result{}, false
	}
	now, until := time.Now(), sent.Add(h.hold)
	if !now.Before(until) || !h.cutAt.IsZero() && !sent.After(h.cutAt) {
		h.mu.Unlock()
		lq.giveBack(&settlement{key: h.key, entry: sharedEntry(got.res, k)})
		return Result{}, false
	}
	retired := h.retire()
	cur := &reservation{res: got.res, k: k, used: n, until: until}
	h.cur = cur
	var r Result
	if n > 0 {
		r = h.localResult(now, n)
	}
	h.mu.Unlock()

	lq.mu.Lock()
	if retired != nil {
		delete(lq.byEntry, retired.entryKey())
	}
	lq.byEntry[reservationKey(got.res.Entry)] = h
	lq.mu.Unlock()
	if retired != nil {
		go lq.giveBack(retired)
	}
	time.AfterFunc(time.Until(until), func() { lq.expire(h, cur) })
	if n > 0 {
		m.localEvents.Add(ctx, int64(n), m.localUsed...)
	}
	return r, true
}

// observe tells h the Remaining a decision the server took for its key reported.
func (h *holder) observe(r Result) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.room = r.Remaining
	h.mu.Unlock()
}

// noteDemand counts n requests at now in h's demand intervals, each one hold long. Under h.mu.
func (h *holder) noteDemand(now time.Time, n int, hold time.Duration) {
	switch elapsed := now.Sub(h.since); {
	case elapsed >= 2*hold:
		h.since, h.count, h.last = now, 0, 0
	case elapsed >= hold:
		h.since, h.last, h.count = now, h.count, 0
	}
	h.count += n
}

// size is the next reservation's events for a request of n: this process's demand over one
// hold, at most half the Remaining the key last reported (so that what one process holds unused
// stays small beside what the others need), at least n, at most the smallest Max. Under h.mu.
func (h *holder) size(n int) int {
	k := max(h.count, h.last)
	if h.room >= 0 {
		k = min(k, h.room/2)
	}
	for _, l := range h.set.limits {
		k = min(k, l.Max)
	}
	return max(k, n)
}

// localResult is the Result of n events admitted at now from h's reservation. Under h.mu.
func (h *holder) localResult(now time.Time, n int) Result {
	c := h.cur
	r := c.res
	elapsed := now.Sub(r.At)
	r.At = now
	r.Remaining = max(h.room, 0) + c.k - c.used
	r.ResetAfter = max(r.ResetAfter-elapsed, 0)
	r.QuotaAfter = max(r.QuotaAfter-elapsed, 0)
	r.Entry = sharedEntry(c.res, n)
	return r
}

// sharedEntry is the entry of res, a reservation, as a Settle of cost of its events names it:
// Shared, so that the Settle gives back cost - actual and never more than the entry holds (a
// reservation holds several requests' events, as a slot does).
func sharedEntry(res Result, cost int) EntryID {
	id := res.Entry
	id.Cost, id.Shared = cost, true
	if id.Decided.IsZero() {
		id.Decided = res.At
	}
	return id
}

// settlement is a reservation whose unused events are to be given back.
type settlement struct {
	key   string
	entry EntryID // the reservation's, Shared, its Cost the events reserved
	used  int     // events used
}

func (s *settlement) entryKey() EntryID { return reservationKey(s.entry) }

// unused is the events to give back.
func (s *settlement) unused() int { return s.entry.Cost - s.used }

// reservationKey names a reservation's entry whatever the cost and decision time an EntryID
// of it carries.
func reservationKey(id EntryID) EntryID {
	return EntryID{Key: id.Key, At: id.At, Seq: id.Seq}
}

// retire ends h's current reservation, if one is held: it is settled, and what it did not use
// is returned for giveBack (nil when nothing is to be given back). Under h.mu.
func (h *holder) retire() *settlement {
	c := h.cur
	if c == nil || c.settled {
		return nil
	}
	c.settled = true
	return &settlement{key: h.key, entry: sharedEntry(c.res, c.k), used: c.used}
}

// expire ends h's reservation c when its hold is over, and gives its unused events back.
func (lq *localQuotas) expire(h *holder, c *reservation) {
	h.mu.Lock()
	var s *settlement
	if h.cur == c {
		s = h.retire()
	}
	h.noteDemand(time.Now(), 0, h.hold)
	idle := h.cur == c && !h.pending && max(h.count, h.last) == 0
	h.mu.Unlock()
	lq.mu.Lock()
	if s != nil {
		delete(lq.byEntry, s.entryKey())
	}
	if idle {
		lq.drop(h)
	}
	lq.mu.Unlock()
	if s != nil {
		lq.giveBack(s)
	}
}

// giveBack settles a retired reservation to the events it used: the rest counts again for
// every process at once. When the server cannot take it, the events stay held until the entry
// leaves its windows, one hold and one window after the reservation: never too few counted.
func (lq *localQuotas) giveBack(s *settlement) {
	if s.unused() <= 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), localSettleTimeout)
	defer cancel()
	if err := lq.e.settle(ctx, uncounted, s.key, Result{Entry: s.entry}, s.used); err != nil {
		if lq.e.logger == nil {
			return
		}
		lq.e.logger.Warn("strictrate: giving back a local reservation's unused events failed; they stay counted until the reservation leaves its windows",
			"key", quoteKey(s.key), "events", s.unused(), "error", err)
		return
	}
	lq.e.metrics.localEvents.Add(ctx, int64(s.unused()), lq.e.metrics.localReturned...)
}

// settleLocal gives cost - actual of a locally admitted request (id, as localResult made it)
// back to its reservation while the reservation is held, and reports whether it did; false
// leaves the Settle to the log, where the reservation's entry holds the request's events.
func (lq *localQuotas) settleLocal(id EntryID, actual int) bool {
	lq.mu.RLock()
	h := lq.byEntry[reservationKey(id)]
	lq.mu.RUnlock()
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.cur
	if c == nil || c.settled || reservationKey(c.res.Entry) != reservationKey(id) {
		return false
	}
	c.used = max(c.used-(id.Cost-actual), 0)
	return true
}

// forget ends every reservation of key this engine holds, giving nothing back: Reset deleted
// the log that held them.
func (lq *localQuotas) forget(key string) {
	lq.mu.Lock()
	defer lq.mu.Unlock()
	for _, h := range lq.holders {
		if h.key != key {
			continue
		}
		h.mu.Lock()
		if s := h.retire(); s != nil {
			delete(lq.byEntry, s.entryKey())
		}
		h.mu.Unlock()
		lq.drop(h)
	}
}

// cut ends every reservation of key this engine holds and gives back what each did not use,
// before a charge on key is sent: the charge's events are then decided on a log that holds
// only what was used, and this process admits nothing more from a reservation taken before
// them (one still on its way is given back whole when it comes). Other processes' reservations
// on key run on until their hold ends, as their admissions were decided before the charge.
func (lq *localQuotas) cut(key string) {
	var ended []*settlement
	lq.mu.Lock()
	for _, h := range lq.holders {
		if h.key != key {
			continue
		}
		h.mu.Lock()
		h.cutAt = time.Now()
		if s := h.retire(); s != nil {
			delete(lq.byEntry, s.entryKey())
			ended = append(ended, s)
		}
		h.mu.Unlock()
	}
	lq.mu.Unlock()
	for _, s := range ended {
		lq.giveBack(s)
	}
}
