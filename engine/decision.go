package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/scripts"
)

// The path of one scripted decision, top-down:
//
//  1. An exported method (Allow, AllowN, AllowPolicy, Peek, PeekPolicy, Check, Record, Wait)
//     validates its arguments, makes a request (newRequest) and calls runDecision.
//  2. runDecision asks the deny cache, then hands the request to a committer (batch.go), which
//     sends it alone or with others in one call of the batch script, through execAckedTo
//     (ack.go: the script and the acknowledgements asked for, in one round trip).
//  3. readDecisions, the one decoder of the scripts' decision replies (lib_reply.lua encodes
//     them), fills each request's outcome with a decision; decision.result makes the Result.
//  4. runDecision applies the acknowledgement check and the fail-open policy, and stores a
//     denial in the deny cache; finish applies shadow mode and counts the decision.
//
// Pipelined mode (pipelined.go) takes its decisions apart from all this.

// request is one decision (or peek) to take: the scripts' arguments for it.
type request struct {
	key    string    // with the engine's prefix
	now    string    // integer microseconds, or "" for the server's clock
	nowUS  int64     // now as a number; 0 for the server's clock
	record int       // the cost recorded when admitted; 0 for a peek, which records nothing
	n      int       // the request's cost (a peek's too)
	cost   string    // n as the batch scripts read it
	set    *limitSet // the limits
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
	for _, l := range limits {
		if !l.IsCalendar() {
			values = append(values, l.windowMicros(), int64(l.Max))
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
	h := &limitSet{limits: s.limits, res: s.res, hold: ceilMicros(hold)}
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
	s.oneNow = string(scripts.AppendRequest(nil, scripts.ServerClock, 1, values))
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
	d := &datedSet{set: &limitSet{limits: s.limits, res: s.res, calendars: s.calendars}}
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

// maxCachedLimits bounds the engine's cache of formatted single limits: a program that makes
// limits without end (a Max per tenant, say) formats the rest each time.
const maxCachedLimits = 1024

// oneLimit returns the limit set of l alone, formatted once per engine.
func (e *Engine) oneLimit(l Limit) *limitSet {
	if s, ok := e.limitSets.Load(l); ok {
		return s.(*limitSet)
	}
	s := newLimitSet([]Limit{l})
	if e.limitSetCount.Load() < maxCachedLimits {
		if _, loaded := e.limitSets.LoadOrStore(l, s); !loaded {
			e.limitSetCount.Add(1)
		}
	}
	return s
}

// newRequest is a request for n events of key at at against set: recorded when admitted
// with record, else judged only (a peek).
func newRequest(key string, at clockReading, n int, record bool, set *limitSet) (request, error) {
	now, err := at.arg()
	if err != nil {
		return request{}, err
	}
	var nowUS int64
	near := time.Now()
	if at.set {
		nowUS = at.t.UnixMicro()
		near = at.t
	}
	set = set.at(near)
	req := request{key: key, now: now, nowUS: nowUS, n: n, cost: itoa(n), set: set}
	if record {
		req.record = n
	}
	return req, nil
}

// singleArg is decide.lua's (and peek.lua's) one argument for r: made once per limit set for
// the common request, else here.
func (r *request) singleArg() string {
	now := r.nowUS
	if r.now == "" {
		if r.n == 1 {
			return r.set.oneNow
		}
		now = scripts.ServerClock
	}
	return string(scripts.AppendRequest(make([]byte, 0, 16+8*len(r.set.pairs)), now, r.n, r.set.pairs))
}

// size is what r adds to a batch call, in bytes of keys and arguments.
func (r *request) size() int {
	return len(r.key) + len(r.now) + len(r.cost) + 8
}

// runDecision takes one decision (or peek) through c and turns the server's answer into a
// Result. Every scripted decision goes through here, batched or not, so the acknowledgement
// (WithReplicaAck, WithDurableAck) and fail-open policies apply to all of them. A denial
// ignores what its call's WAIT answered (a call that only denied sends no WAITAOF): only an
// admission is refused for it.
func (e *Engine) runDecision(ctx context.Context, c *committer, op string, req request) (Result, error) {
	// Built only on failure: a successful decision allocates nothing for its error context.
	what := func() string {
		return "strictrate: " + op + " " + quoteKey(strings.TrimPrefix(req.key, e.prefix))
	}
	cached := e.denials != nil && c == e.decides
	var sent time.Time
	if cached {
		sent = e.localNow()
		if r, ok := e.denials.lookup(req.key, req.set, req.record, sent); ok {
			return r, nil
		}
	}
	out := c.do(ctx, req)
	if out.err != nil {
		return e.backendFailure(ctx, classify(ctx, what(), out.err))
	}
	if out.replyErr != nil {
		return e.backendFailure(ctx, fmt.Errorf("%s: %w", what(), out.replyErr))
	}
	r, err := out.d.result(&req)
	if err != nil {
		return e.backendFailure(ctx, fmt.Errorf("%s: %w", what(), err))
	}
	if c.ack && r.Allowed {
		if err := e.ackPolicy.check(ctx, out.ack); err != nil {
			return e.backendFailure(ctx, fmt.Errorf("%s: %w", what(), err))
		}
	}
	if cached && !r.Allowed {
		e.denials.store(req.key, req.set, req.record, r, sent, e.localNow())
	}
	return r, nil
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

// outcome is what the server answered for one request.
type outcome struct {
	d        decision
	err      error      // the request failed: its call, or this request alone (an error reply)
	replyErr error      // the reply was not one the scripts give
	ack      ackReplies // with acknowledgement: what the WAIT and WAITAOF with its call answered
}

// admits reports whether o holds a decision that admitted.
func (o *outcome) admits() bool {
	return o.err == nil && o.replyErr == nil && o.d.retryAfter == 0
}

// readDecisions reads a decision script's reply into the outcomes of calls, in KEYS order
// (lib_reply.lua): a single script's string, the server's now (0 when unread) then one
// decision; or a batch script's array, the server's now, then per request its decision or an
// error reply. A decision is a count c and c values, with trailing defaults left out.
func readDecisions(reply valkey.ValkeyResult, calls []*call) {
	fail := func(err error, reply bool) {
		for _, cl := range calls {
			if reply {
				cl.out.replyErr = err
			} else {
				cl.out.err = err
			}
		}
	}
	if err := reply.Error(); err != nil {
		fail(err, false)
		return
	}
	msg, err := reply.ToMessage()
	if err != nil {
		fail(err, true)
		return
	}
	if msg.IsString() {
		s, _ := msg.ToString()
		if len(calls) != 1 || len(s) < 8 {
			fail(fmt.Errorf("script reply: a string of %d bytes for %d requests", len(s), len(calls)), true)
			return
		}
		if err := calls[0].out.read(s[8:], int64At(s, 0), &calls[0].req); err != nil {
			fail(err, true)
		}
		return
	}
	vals, err := msg.ToArray()
	if err != nil {
		fail(err, true)
		return
	}
	if len(vals) != 1+len(calls) {
		fail(fmt.Errorf("script reply has %d values for %d requests", len(vals), len(calls)), true)
		return
	}
	serverNow, err := vals[0].AsInt64()
	if err != nil {
		fail(fmt.Errorf("script reply: the server's now: %w", err), true)
		return
	}
	for i, cl := range calls {
		v := &vals[1+i]
		if err := v.Error(); err != nil {
			cl.out.err = err
			continue
		}
		s, err := v.ToString()
		if err == nil {
			err = cl.out.read(s, serverNow, &cl.req)
		}
		if err != nil {
			fail(fmt.Errorf("script reply value %d: %w", 1+i, err), true)
			return
		}
	}
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

// read reads req's decision, s (lib_reply.lua: a count c, then c values of 8 bytes), into o.
func (o *outcome) read(s string, serverNow int64, req *request) error {
	if len(s) == 0 || s[0] < 1 || s[0] > 6 || len(s) != 1+8*int(s[0]) {
		return fmt.Errorf("script reply: a decision of %d bytes is none the scripts give", len(s))
	}
	c := int(s[0])
	// The values in reply order, each left out one at its default: remaining (never left out),
	// retry_after 0, quota_after (below: it depends on tightest), reset_after the longest
	// window, tightest 1, seq 1.
	v := [6]int64{3: req.set.longest(), 4: 1, 5: 1}
	for i := range c {
		v[i] = int64At(s, 1+8*i)
	}
	o.d = decision{remaining: v[0], now: serverNow, retryAfter: v[1], quotaAfter: v[2], resetAfter: v[3], tightest: v[4], seq: v[5]}
	if req.now != "" {
		o.d.now = req.nowUS
	} else if serverNow == 0 {
		return errors.New("script reply: the server's now is missing")
	}
	if c < 3 && o.d.tightest >= 1 && o.d.tightest <= int64(len(req.set.limits)) {
		o.d.quotaAfter = req.set.limits[o.d.tightest-1].windowMicros()
	}
	return nil
}

// longest is the longest sliding window of s in microseconds (0 when it has none): the default
// reset_after of a decision.
func (s *limitSet) longest() int64 {
	if !s.sliding() {
		return 0
	}
	return s.limits[len(s.limits)-1-s.calendars].windowMicros()
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
	if l := limits[d.tightest-1]; l.IsCalendar() {
		start, end := l.PeriodAt(r.At)
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

// finish applies shadow mode to a decision taken through op since started, and counts it.
func (e *Engine) finish(ctx context.Context, op operation, started time.Time, r Result, err error) (Result, error) {
	oc := outcomeAllowed
	switch {
	case err != nil:
		oc = outcomeError
	case r.BackendErr != nil:
		oc = outcomeFailOpen
	case r.Allowed:
	case e.shadow:
		r.Allowed, r.ShadowDenied = true, true
		oc = outcomeShadowDenied
	case r.FromCache:
		oc = outcomeCacheDenied
	default:
		oc = outcomeDenied
	}
	e.metrics.record(ctx, op, oc, time.Since(started))
	return r, err
}

// backendFailure applies the fail-open policy to a decision the server could not take. Closed
// (the default): a denying Result and the error. Open: an admitting Result that carries the
// error, and no error; except when the caller cancelled, which is returned as it is, and for
// a key the engine cannot read (ErrUnknownLayout), which no policy admits on.
func (e *Engine) backendFailure(ctx context.Context, err error) (Result, error) {
	if !e.failOpen || errors.Is(ctx.Err(), context.Canceled) || errors.Is(err, ErrUnknownLayout) {
		return Result{}, err
	}
	return Result{Allowed: true, BackendErr: err, At: e.localNow()}, nil
}
