package engine

import (
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// limitSet is limits as the scripts read them: the sliding limits, windows ascending, then
// the calendar limits; and their values (decide.lua documents them: the resolution first when
// there is one, the (window, max) pairs, each calendar limit's max and boundaries), formatted
// once: as decimal strings (the batch scripts' arguments), as numbers (for the single
// scripts' one argument), and as that argument for a request of one event on the server's
// clock, the most common. A set with calendar limits has boundaries that depend on the time:
// its requests take the set at (at), made once per period.
//
// The engine makes a set once per limit, or policy, it is asked about (oneLimit, policySet),
// so that a decision on a limit seen before formats nothing.
type limitSet struct {
	limits    []Limit
	windows   []int64 // each limit's window in µs (0 for a calendar limit), for decoding
	nums      []string
	pairs     []int64
	oneNow    string
	maxCost   int   // the smallest Max of limits: the largest cost a request may have
	res       int64 // the resolution entries are recorded at, in µs; 0: exact
	hold      int64 // for a reservation, how long after the decision its entry is recorded, in µs
	calendars int   // how many of limits are calendar limits (the last ones)
	charge    bool  // a charge's set (forCharge): recorded whatever the limits say
	// charged is this set's charge set, made once (forCharge).
	charged atomic.Pointer[limitSet]
	// current is, for a set with calendar limits, the set with the boundaries around the
	// latest time asked (at), and the span of times it serves.
	current atomic.Pointer[datedSet]
}

// datedSet is a set with calendar boundaries, and the times [from, to) they are right for.
type datedSet struct {
	set      *limitSet
	from, to time.Time
}

// newLimitSet makes the set of limits, which must be in the scripts' order (compareLimits):
// sliding ones, windows ascending, then calendar ones.
func newLimitSet(limits []Limit) *limitSet {
	s := &limitSet{limits: limits, res: -1, maxCost: MaxEvents}
	for _, l := range limits {
		s.maxCost = min(s.maxCost, l.Max)
		switch {
		case l.IsCalendar():
			s.calendars++
		case l.Resolution == 0:
			s.res = 0
		case s.res < 0 || ceilMicros(l.Resolution) < s.res:
			s.res = ceilMicros(l.Resolution)
		}
	}
	if s.res < 0 {
		s.res = 0
	}
	values := make([]int64, 0, 2+2*len(limits))
	if s.res > 0 {
		values = append(values, -1, s.res)
	}
	s.windows = make([]int64, len(limits))
	for i, l := range limits {
		if !l.IsCalendar() {
			s.windows[i] = l.windowMicros()
			values = append(values, s.windows[i], int64(l.Max))
		}
	}
	s.setValues(values)
	return s
}

// withHold is s for a reservation held for hold (local quota): its entry is recorded hold
// after the decision (decide.lua's -3), so that it counts in every window that holds an
// admission made from it. s holds no calendar limit (a reservation counts in its decision's
// period alone, while admissions made from it may fall in the next).
func (s *limitSet) withHold(hold time.Duration) *limitSet {
	h := &limitSet{limits: s.limits, windows: s.windows, maxCost: s.maxCost, res: s.res, hold: ceilMicros(hold)}
	h.setValues(append([]int64{-3, h.hold}, s.pairs...))
	return h
}

// forCharge is s for a charge (Charge, ChargePolicy): its events are recorded whatever the
// limits say (decide.lua's -4), made once per set. A set with calendar limits takes its
// boundaries first (at), then this.
func (s *limitSet) forCharge() *limitSet {
	if c := s.charged.Load(); c != nil {
		return c
	}
	c := &limitSet{limits: s.limits, windows: s.windows, maxCost: s.maxCost, res: s.res, calendars: s.calendars, charge: true}
	c.setValues(append([]int64{-4, 0}, s.pairs...))
	if !s.charged.CompareAndSwap(nil, c) {
		return s.charged.Load()
	}
	return c
}

// setValues formats values as the scripts read them.
func (s *limitSet) setValues(values []int64) {
	s.pairs = values
	s.nums = make([]string, len(values))
	for i, v := range values {
		s.nums[i] = strconv.FormatInt(v, 10)
	}
	s.oneNow = string(appendRequest(nil, serverClock, 1, values))
}

// at is s for a request decided near t: s itself when it holds no calendar limit, else s with
// every calendar limit's boundaries around t (the period before t's, t's, and the next), the
// server picking the one that holds its own time.
func (s *limitSet) at(t time.Time) *limitSet {
	if s == nil || s.calendars == 0 {
		return s
	}
	if d := s.current.Load(); d != nil && !t.Before(d.from) && t.Before(d.to) {
		return d.set
	}
	d := &datedSet{set: &limitSet{limits: s.limits, windows: s.windows, maxCost: s.maxCost, res: s.res, calendars: s.calendars}}
	values := slices.Clone(s.pairs)
	for i, l := range s.limits[len(s.limits)-s.calendars:] {
		b := l.boundariesAround(t)
		values = append(values, -2, int64(l.Max), b[0].UnixMicro(), b[1].UnixMicro(), b[2].UnixMicro(), b[3].UnixMicro())
		if i == 0 || b[1].After(d.from) {
			d.from = b[1]
		}
		if i == 0 || b[2].Before(d.to) {
			d.to = b[2]
		}
	}
	d.set.setValues(values)
	s.current.Store(d)
	return d.set
}

// shared reports whether an entry recorded against s may hold other requests' events too (a
// Resolution slot), or the request is counted by calendar counters: Settle then gives back
// on every call.
func (s *limitSet) shared() bool { return s.res > 0 || s.calendars > 0 }

// sliding reports whether s holds a sliding limit: only then is an admission an entry.
func (s *limitSet) sliding() bool { return s.calendars < len(s.limits) }

// sameLimits reports whether two sets count the same limits.
func (s *limitSet) sameLimits(o *limitSet) bool {
	return s == o || slices.Equal(s.nums, o.nums)
}

// longest is the longest sliding window of s in microseconds (0 when it has none): the default
// reset_after of a decision.
func (s *limitSet) longest() int64 {
	if !s.sliding() {
		return 0
	}
	return s.windows[len(s.limits)-1-s.calendars]
}

// result is the Result of d, a decision the wire read (and checked: decision.check) for a
// request on the full key key against s, which recorded cost events when admitted (0: a
// peek, or a request its group did not record); a charge recorded them denied too.
func (s *limitSet) result(d decision, key string, cost int) Result {
	limits := s.limits
	r := Result{
		Allowed:    d.retryAfter == 0,
		Remaining:  int(d.remaining),
		RetryAfter: time.Duration(d.retryAfter) * time.Microsecond,
		ResetAfter: time.Duration(d.resetAfter) * time.Microsecond,
		QuotaAfter: time.Duration(d.quotaAfter) * time.Microsecond,
		At:         time.UnixMicro(d.now),
		Window:     limits[d.tightest-1].Window,
	}
	if int(d.tightest) > len(limits)-s.calendars { // a calendar limit: its period's length
		start, end := limits[d.tightest-1].PeriodAt(r.At)
		r.Window = end.Sub(start)
	}
	if (r.Allowed || s.charge) && cost > 0 {
		r.Entry = EntryID{Key: key, At: r.At, Seq: int(d.seq), Cost: cost}
		if s.shared() {
			r.Entry.Shared, r.Entry.Decided = true, r.At
		}
		if at := d.now + s.hold; s.res > 0 && d.seq > 0 {
			// Recorded at the end of its slot: the decision's time (plus a reservation's
			// hold) rounded up.
			r.Entry.At = time.UnixMicro(slotEnd(at, s.res))
		} else if s.hold > 0 {
			r.Entry.At = time.UnixMicro(at)
		}
	}
	return r
}

// slotEnd is the end of t's slot of width res: t rounded up to a multiple of res, as the
// scripts round it (Lua's % is floored, so times before 1970 round up too).
func slotEnd(t, res int64) int64 {
	m := t % res
	if m < 0 {
		m += res
	}
	if m == 0 {
		return t
	}
	return t - m + res
}

// maxCachedSets bounds the engine's cache of limit sets (of single limits and of policies
// together): a program that makes limits without end (a Max per tenant, say) formats the rest
// each time.
const maxCachedSets = 1024

// policyKey names a policy of several limits in the engine's cache: its limits in the order
// given (a policy given in another order is cached apart, and decided alike). An array, so
// that finding a policy's set allocates nothing.
type policyKey struct {
	n      int
	limits [MaxPolicyLimits]Limit
}

// cachedLimit returns the cached set of l alone; nil when l is not cached. A cached limit was
// valid when it went in.
func (e *Engine) cachedLimit(l Limit) *limitSet {
	if s, ok := e.limitSets.Load(l); ok {
		return s.(*limitSet)
	}
	return nil
}

// oneLimit returns the limit set of l alone, a valid limit, formatted once per engine.
func (e *Engine) oneLimit(l Limit) *limitSet {
	if s := e.cachedLimit(l); s != nil {
		return s
	}
	s := newLimitSet([]Limit{l})
	if e.limitSetCount.Load() < maxCachedSets {
		if prev, loaded := e.limitSets.LoadOrStore(l, s); loaded {
			return prev.(*limitSet)
		}
		e.limitSetCount.Add(1)
	}
	return s
}

// cachedPolicy returns the cached set of p, a policy of several limits; nil when p is not
// cached. A cached policy was valid when it went in.
func (e *Engine) cachedPolicy(p Policy) *limitSet {
	if len(p) > MaxPolicyLimits {
		return nil
	}
	k := policyKey{n: len(p)}
	copy(k.limits[:], p)
	if s, ok := e.policySets.Load(k); ok {
		return s.(*limitSet)
	}
	return nil
}

// policySet is the limit set of p, a valid policy, as the scripts want it (sliding windows
// ascending, the last the longest, then calendar limits), made once per engine: a single
// limit's is oneLimit's.
func (e *Engine) policySet(p Policy) *limitSet {
	if len(p) == 1 {
		return e.oneLimit(p[0])
	}
	if s := e.cachedPolicy(p); s != nil {
		return s
	}
	sorted := slices.Clone(p)
	slices.SortFunc(sorted, compareLimits)
	s := newLimitSet(sorted)
	if e.limitSetCount.Load() < maxCachedSets {
		k := policyKey{n: len(p)}
		copy(k.limits[:], p)
		if prev, loaded := e.policySets.LoadOrStore(k, s); loaded {
			return prev.(*limitSet)
		}
		e.limitSetCount.Add(1)
	}
	return s
}
