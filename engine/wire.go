package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"
)

// The wire: what every script call sends and what its reply says, for each kind of request
// (commit.go's kind: encode and decode). Each script's header documents its KEYS, ARGV and
// reply; this file (decisions and peeks) and wire_kinds.go (AllowAll groups, settles, leases)
// are the one place on the Go side that knows those shapes. They lay out arguments and decode
// replies, and do nothing else: the group commit calls them, and they call nothing of the
// engine's.

// request is one decision or peek to take: the scripts' arguments for it, and, once its call
// came back, what the server answered for it.
type request struct {
	key    string    // with the engine's prefix
	now    string    // integer microseconds, or "" for the server's clock
	nowUS  int64     // now as a number; 0 for the server's clock
	record int       // the cost recorded when admitted; 0 for a peek, which records nothing
	n      int       // the request's cost (a peek's too)
	set    *limitSet // the limits

	d        decision // the decision, once decoded
	result   Result   // d as a Result (decodeDecisions; AllowAll's groups make theirs)
	replyErr error    // the reply was not one the scripts give
}

// limitSet is limits as the scripts read them: the sliding limits, windows ascending, then
// the calendar limits; and their values (decide.lua documents them: the resolution first when
// there is one, the (window, max) pairs, each calendar limit's max and boundaries), formatted
// once: as decimal strings (the batch scripts' arguments), as numbers (for the single
// scripts' one argument), and as that argument for a request of one event on the server's
// clock, the most common. A set with calendar limits has boundaries that depend on the time:
// its requests take the set at (at), made once per period.
type limitSet struct {
	limits    []Limit
	windows   []int64 // each limit's window in µs (0 for a calendar limit), for decoding
	nums      []string
	pairs     []int64
	oneNow    string
	res       int64 // the resolution entries are recorded at, in µs; 0: exact
	hold      int64 // for a reservation, how long after the decision its entry is recorded, in µs
	calendars int   // how many of limits are calendar limits (the last ones)
	// current is, for a set with calendar limits, the set with the boundaries around the
	// latest time asked (at), and the span of times it serves.
	current atomic.Pointer[datedSet]
}

// datedSet is a set with calendar boundaries, and the times [from, to) they are right for.
type datedSet struct {
	set      *limitSet
	from, to time.Time
}

// newLimitSet makes the set of limits: sliding ones, windows ascending, then calendar ones.
func newLimitSet(limits []Limit) *limitSet {
	s := &limitSet{limits: limits, res: -1}
	for _, l := range limits {
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
	h := &limitSet{limits: s.limits, windows: s.windows, res: s.res, hold: ceilMicros(hold)}
	h.setValues(append([]int64{-3, h.hold}, s.pairs...))
	return h
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
	d := &datedSet{set: &limitSet{limits: s.limits, windows: s.windows, res: s.res, calendars: s.calendars}}
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

// singleArg is decide.lua's (and peek.lua's) one argument for r: made once per limit set for
// the common request, else here.
func (r *request) singleArg() string {
	now := r.nowUS
	if r.now == "" {
		if r.n == 1 {
			return r.set.oneNow
		}
		now = serverClock
	}
	return string(appendRequest(make([]byte, 0, 16+8*len(r.set.pairs)), now, r.n, r.set.pairs))
}

// serverClock stands for "the server's clock" in place of now in a single decision script's
// argument (decide.lua's SERVER_CLOCK, which a test ties to it): outside the years any
// caller's time may name.
const serverClock = 1 << 60

// appendRequest appends the one argument of decide.lua and peek.lua (decide.lua documents it)
// for a request of n events at now, in integer microseconds (or serverClock), against limits,
// flat (window in microseconds, max) pairs with windows ascending: 8-byte big-endian integers.
func appendRequest(b []byte, now int64, n int, limits []int64) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(now))
	b = binary.BigEndian.AppendUint64(b, uint64(n))
	for _, v := range limits {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return b
}

// decisionSize is the size rule of decisions and peeks: one request, and the bytes of its key
// and arguments.
func decisionSize(cl *call[request]) (int, int) {
	r := &cl.req
	return 1, len(r.key) + len(r.now) + 20
}

// encodeDecisions lays out a call of decide.lua or peek.lua (one request: its key, its one
// argument), or of decide_batch.lua or peek_batch.lua (several: their limit sets once each,
// then each request's cost, set and clock; lib_batch.lua documents it).
func encodeDecisions(calls []*call[request], keys, args []string) ([]string, []string) {
	if len(calls) == 1 {
		return append(keys, calls[0].req.key), append(args, calls[0].req.singleArg())
	}
	// The limit sets of the batch, each once; requests name theirs by its position.
	var sets [maxBatch]*limitSet
	var setOf [maxBatch]int
	nsets := 0
	for i, cl := range calls {
		setOf[i] = -1
		for j, s := range sets[:nsets] {
			if s.sameLimits(cl.req.set) {
				setOf[i] = j
				break
			}
		}
		if setOf[i] < 0 {
			setOf[i] = nsets
			sets[nsets] = cl.req.set
			nsets++
		}
	}
	clock := ""
	if calls[0].req.now != "" {
		clock = "each"
	}
	args = append(args, clock, itoa(nsets))
	for _, s := range sets[:nsets] {
		args = append(args, itoa(len(s.nums)))
		args = append(args, s.nums...)
	}
	for i, cl := range calls {
		keys = append(keys, cl.req.key)
		args = append(args, itoa(cl.req.n), itoa(setOf[i]+1))
		if clock != "" {
			args = append(args, cl.req.now)
		}
	}
	return keys, args
}

// decodeDecisions reads a decision script's reply into calls, in KEYS order (lib_reply.lua):
// a single script's string, the server's now (0 when unread) then one decision; or a batch
// script's array, the server's now, then per request its decision or an error reply. A
// decision is a count c and c values, with trailing defaults left out; each becomes its
// request's Result. It reports whether any request was admitted.
func decodeDecisions(reply valkey.ValkeyResult, calls []*call[request]) (admitted bool) {
	fail := func(err error, isReply bool) bool {
		for _, cl := range calls {
			if isReply {
				cl.req.replyErr = err
			} else {
				cl.err = err
			}
		}
		return false
	}
	for _, cl := range calls {
		cl.req.d, cl.req.result, cl.req.replyErr = decision{}, Result{}, nil
	}
	if err := reply.Error(); err != nil {
		return fail(err, false)
	}
	msg, err := reply.ToMessage()
	if err != nil {
		return fail(err, true)
	}
	if msg.IsString() {
		s, _ := msg.ToString()
		if len(calls) != 1 || len(s) < 8 {
			return fail(fmt.Errorf("script reply: a string of %d bytes for %d requests", len(s), len(calls)), true)
		}
		r := &calls[0].req
		if err := r.read(s[8:], int64At(s, 0)); err != nil {
			return fail(err, true)
		}
		if r.result, err = r.d.result(r); err != nil {
			return fail(err, true)
		}
		return r.result.Allowed
	}
	vals, err := msg.ToArray()
	if err != nil {
		return fail(err, true)
	}
	if len(vals) != 1+len(calls) {
		return fail(fmt.Errorf("script reply has %d values for %d requests", len(vals), len(calls)), true)
	}
	serverNow, err := vals[0].AsInt64()
	if err != nil {
		return fail(fmt.Errorf("script reply: the server's now: %w", err), true)
	}
	for i, cl := range calls {
		v := &vals[1+i]
		if err := v.Error(); err != nil {
			cl.err = err
			continue
		}
		s, err := v.ToString()
		if err == nil {
			err = cl.req.read(s, serverNow)
		}
		if err != nil {
			return fail(fmt.Errorf("script reply value %d: %w", 1+i, err), true)
		}
		if cl.req.result, err = cl.req.d.result(&cl.req); err != nil {
			cl.req.replyErr = fmt.Errorf("script reply value %d: %w", 1+i, err)
			continue
		}
		admitted = admitted || cl.req.result.Allowed
	}
	return admitted
}

// decision is one decision as a script replied it (lib_reply.lua), its defaults filled in:
// times in microseconds, tightest the 1-based position of the limit remaining speaks for.
type decision struct {
	remaining  int64
	now        int64
	retryAfter int64
	quotaAfter int64
	resetAfter int64
	tightest   int64
	seq        int64
}

// read reads r's decision, s (lib_reply.lua: a count c, then c values of 8 bytes), into r.d.
func (r *request) read(s string, serverNow int64) error {
	if len(s) == 0 || s[0] < 1 || s[0] > 6 || len(s) != 1+8*int(s[0]) {
		return fmt.Errorf("script reply: a decision of %d bytes is none the scripts give", len(s))
	}
	c := int(s[0])
	// The values in reply order, each left out one at its default: remaining (never left out),
	// retry_after 0, quota_after (below: it depends on tightest), reset_after the longest
	// window, tightest 1, seq 1.
	v := [6]int64{3: r.set.longest(), 4: 1, 5: 1}
	for i := range c {
		v[i] = int64At(s, 1+8*i)
	}
	r.d = decision{remaining: v[0], now: serverNow, retryAfter: v[1], quotaAfter: v[2], resetAfter: v[3], tightest: v[4], seq: v[5]}
	if r.now != "" {
		r.d.now = r.nowUS
	} else if serverNow == 0 {
		return errors.New("script reply: the server's now is missing")
	}
	if c < 3 && r.d.tightest >= 1 && r.d.tightest <= int64(len(r.set.limits)) {
		r.d.quotaAfter = r.set.windows[r.d.tightest-1]
	}
	return nil
}

// result turns d, decided for req, into a Result, and refuses values no script gives. A
// denial always has retry_after > 0.
func (d decision) result(req *request) (Result, error) {
	limits := req.set.limits
	switch {
	case d.remaining < 0:
		return Result{}, fmt.Errorf("script reply: remaining %d is negative", d.remaining)
	case d.retryAfter < 0 || d.resetAfter < 0:
		return Result{}, fmt.Errorf("script reply: retry_after %d or reset_after %d is negative", d.retryAfter, d.resetAfter)
	case d.tightest < 1 || d.tightest > int64(len(limits)):
		return Result{}, fmt.Errorf("script reply: limit position %d is outside 1 to %d", d.tightest, len(limits))
	case d.seq < 1 && (req.set.sliding() || d.seq < 0):
		// Calendar limits alone record no entry: seq 0.
		return Result{}, fmt.Errorf("script reply: entry seq %d is below 1", d.seq)
	case d.quotaAfter < 0 || d.quotaAfter > d.resetAfter:
		// The tightest window's first event is no newer than the log's newest entry, and that
		// window no longer than the key's horizon.
		return Result{}, fmt.Errorf("script reply: quota_after %d is outside 0 to reset_after %d", d.quotaAfter, d.resetAfter)
	}
	r := Result{
		Allowed:    d.retryAfter == 0,
		Remaining:  int(d.remaining),
		RetryAfter: time.Duration(d.retryAfter) * time.Microsecond,
		ResetAfter: time.Duration(d.resetAfter) * time.Microsecond,
		QuotaAfter: time.Duration(d.quotaAfter) * time.Microsecond,
		At:         time.UnixMicro(d.now),
		Window:     limits[d.tightest-1].Window,
	}
	if int(d.tightest) > len(limits)-req.set.calendars { // a calendar limit: its period's length
		start, end := limits[d.tightest-1].PeriodAt(r.At)
		r.Window = end.Sub(start)
	}
	if r.Allowed && req.record > 0 {
		r.Entry = EntryID{Key: req.key, At: r.At, Seq: int(d.seq), Cost: req.record}
		if req.set.shared() {
			r.Entry.Shared, r.Entry.Decided = true, r.At
		}
		if at := d.now + req.set.hold; req.set.res > 0 && d.seq > 0 {
			// Recorded at the end of its slot: the decision's time (plus a reservation's
			// hold) rounded up.
			r.Entry.At = time.UnixMicro(slotEnd(at, req.set.res))
		} else if req.set.hold > 0 {
			r.Entry.At = time.UnixMicro(at)
		}
	}
	return r, nil
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

// int64At reads the 8-byte big-endian two's complement integer at s[i:].
func int64At(s string, i int) int64 {
	var v uint64
	for _, b := range []byte(s[i : i+8]) {
		v = v<<8 | uint64(b)
	}
	return int64(v)
}

// smallInts are the numbers a batch's arguments count with (sets, limits, positions), formatted.
var smallInts = func() (s [maxBatch + 1]string) {
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return s
}()

// itoa formats n, without allocating when it is at most maxBatch.
func itoa(n int) string {
	if n >= 0 && n < len(smallInts) {
		return smallInts[n]
	}
	return strconv.Itoa(n)
}
