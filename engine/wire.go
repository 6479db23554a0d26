package engine

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/transport"
)

// The wire: what every script call sends and what its reply says, for each kind of request
// (transport.Kind: Encode and Decode). Each script's header documents its KEYS, ARGV and
// reply; this file (decisions and peeks, and the one reader of a batch script's reply,
// readBatch) and wire_kinds.go (AllowAll groups, settles, leases) are the one place on the Go
// side that knows those shapes. They lay out arguments and decode replies, and do nothing
// else: whichever path a request takes (alone, in a batch, sent again alone after its batch
// did not take it), the transport calls them, and they call nothing of the engine's but the
// limit sets' own fields (limitset.go).

// request is one decision or peek to take: the scripts' arguments for it.
type request struct {
	key    string    // with the engine's prefix
	now    string    // integer microseconds, or "" for the server's clock
	nowUS  int64     // now as a number; 0 for the server's clock
	record int       // the cost recorded when admitted; 0 for a peek, which records nothing
	n      int       // the request's cost (a peek's too)
	set    *limitSet // the limits
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
func decisionSize(r *request) (int, int) {
	return 1, len(r.key) + len(r.now) + 20
}

// encodeDecisions lays out a call of decide.lua or peek.lua (one request: its key, its one
// argument), or of decide_batch.lua or peek_batch.lua (several: their limit sets once each,
// then each request's cost, set and clock; lib_batch.lua documents it).
func encodeDecisions(reqs []request, keys, args []string) ([]string, []string) {
	if len(reqs) == 1 {
		return append(keys, reqs[0].key), append(args, reqs[0].singleArg())
	}
	// The limit sets of the batch, each once; requests name theirs by its position.
	var sets [transport.MaxBatch]*limitSet
	var setOf [transport.MaxBatch]int
	nsets := 0
	for i := range reqs {
		setOf[i] = -1
		for j, s := range sets[:nsets] {
			if s.sameLimits(reqs[i].set) {
				setOf[i] = j
				break
			}
		}
		if setOf[i] < 0 {
			setOf[i] = nsets
			sets[nsets] = reqs[i].set
			nsets++
		}
	}
	clock := ""
	if reqs[0].now != "" {
		clock = "each"
	}
	args = append(args, clock, itoa(nsets))
	for _, s := range sets[:nsets] {
		args = append(args, itoa(len(s.nums)))
		args = append(args, s.nums...)
	}
	for i := range reqs {
		keys = append(keys, reqs[i].key)
		args = append(args, itoa(reqs[i].n), itoa(setOf[i]+1))
		if clock != "" {
			args = append(args, reqs[i].now)
		}
	}
	return keys, args
}

// decodeDecisions reads a decision script's reply into outs, in KEYS order (lib_reply.lua):
// a single script's string, the server's now (0 when unread) then one decision; or a batch
// script's array (readBatch), the server's now, then per request its decision or an error
// reply. A decision is a count c and c values, with trailing defaults left out, checked
// against its request's limits; one that admitted is Recorded, and so is every charge.
func decodeDecisions(reply valkey.ValkeyResult, reqs []request, outs []transport.Outcome[decision]) {
	if reply.Error() != nil {
		return // the call's error, which the transport hands each request
	}
	msg, err := reply.ToMessage()
	if err != nil {
		invalidAll(outs, fmt.Errorf("script reply: %w", err))
		return
	}
	if !msg.IsString() {
		readBatch(reply, outs, func(int) int { return 1 }, func(i int, serverNow int64, vals []valkey.ValkeyMessage, o *transport.Outcome[decision]) {
			if err := vals[0].Error(); err != nil {
				o.Err = err
				return
			}
			s, err := vals[0].ToString()
			if err == nil {
				o.Reply, err = reqs[i].read(s, serverNow)
			}
			if err != nil {
				o.Invalid = fmt.Errorf("script reply value %d: %w", 2+i, err)
				return
			}
			o.Recorded = o.Reply.retryAfter == 0 || reqs[i].set.charge
		})
		return
	}
	s, _ := msg.ToString()
	if len(reqs) != 1 || len(s) < 8 {
		invalidAll(outs, fmt.Errorf("script reply: a string of %d bytes for %d requests", len(s), len(reqs)))
		return
	}
	o := &outs[0]
	if o.Reply, err = reqs[0].read(s[8:], int64At(s, 0)); err != nil {
		o.Invalid = err
		return
	}
	o.Recorded = o.Reply.retryAfter == 0 || reqs[0].set.charge
}

// readBatch reads a batch script's reply into outs (lib_reply.lua, decide_all.lua): an array
// of the server's now, then each request's values in order, width(i) of request i. A reply of
// another shape (not an array, another number of values, no now) answers no request: each
// gets it as Invalid. Inside it, one failure rule: a part that is wrong fails only its own
// request, whatever the others say. part reads request i's values into outs[i].
func readBatch[Rep any](reply valkey.ValkeyResult, outs []transport.Outcome[Rep], width func(i int) int,
	part func(i int, serverNow int64, vals []valkey.ValkeyMessage, o *transport.Outcome[Rep])) {
	vals, err := reply.ToArray()
	if err != nil {
		invalidAll(outs, fmt.Errorf("script reply: %w", err))
		return
	}
	want := 1
	for i := range outs {
		want += width(i)
	}
	if len(vals) != want {
		invalidAll(outs, fmt.Errorf("script reply has %d values for %d requests of %d values", len(vals), len(outs), want-1))
		return
	}
	serverNow, err := vals[0].AsInt64()
	if err != nil {
		invalidAll(outs, fmt.Errorf("script reply: the server's now: %w", err))
		return
	}
	at := 1
	for i := range outs {
		w := width(i)
		part(i, serverNow, vals[at:at+w], &outs[i])
		at += w
	}
}

// invalidAll makes err every one of outs' Invalid: a reply that answers none of them.
func invalidAll[Rep any](outs []transport.Outcome[Rep], err error) {
	for i := range outs {
		outs[i] = transport.Outcome[Rep]{Invalid: err}
	}
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

// read reads r's decision, s (lib_reply.lua: a count c, then c values of 8 bytes), and checks
// it against r's limits.
func (r *request) read(s string, serverNow int64) (decision, error) {
	if len(s) == 0 || s[0] < 1 || s[0] > 6 || len(s) != 1+8*int(s[0]) {
		return decision{}, fmt.Errorf("script reply: a decision of %d bytes is none the scripts give", len(s))
	}
	c := int(s[0])
	// The values in reply order, each left out one at its default: remaining (never left out),
	// retry_after 0, quota_after (below: it depends on tightest), reset_after the longest
	// window, tightest 1, seq 1.
	v := [6]int64{3: r.set.longest(), 4: 1, 5: 1}
	for i := range c {
		v[i] = int64At(s, 1+8*i)
	}
	d := decision{remaining: v[0], now: serverNow, retryAfter: v[1], quotaAfter: v[2], resetAfter: v[3], tightest: v[4], seq: v[5]}
	if r.now != "" {
		d.now = r.nowUS
	} else if serverNow == 0 {
		return decision{}, errors.New("script reply: the server's now is missing")
	}
	if c < 3 && d.tightest >= 1 && d.tightest <= int64(len(r.set.limits)) {
		d.quotaAfter = r.set.windows[d.tightest-1]
	}
	if err := d.check(r.set); err != nil {
		return decision{}, err
	}
	return d, nil
}

// check refuses a decision no script gives for a request against set. A denial always has
// retry_after > 0.
func (d decision) check(set *limitSet) error {
	switch {
	case d.remaining < 0:
		return fmt.Errorf("script reply: remaining %d is negative", d.remaining)
	case d.retryAfter < 0 || d.resetAfter < 0:
		return fmt.Errorf("script reply: retry_after %d or reset_after %d is negative", d.retryAfter, d.resetAfter)
	case d.tightest < 1 || d.tightest > int64(len(set.limits)):
		return fmt.Errorf("script reply: limit position %d is outside 1 to %d", d.tightest, len(set.limits))
	case d.seq < 1 && (set.sliding() || d.seq < 0):
		// Calendar limits alone record no entry: seq 0.
		return fmt.Errorf("script reply: entry seq %d is below 1", d.seq)
	case d.quotaAfter < 0 || d.quotaAfter > d.resetAfter:
		// The tightest window's first event is no newer than the log's newest entry, and that
		// window no longer than the key's horizon.
		return fmt.Errorf("script reply: quota_after %d is outside 0 to reset_after %d", d.quotaAfter, d.resetAfter)
	}
	return nil
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
var smallInts = func() (s [transport.MaxBatch + 1]string) {
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return s
}()

// itoa formats n, without allocating when it is at most transport.MaxBatch.
func itoa(n int) string {
	if n >= 0 && n < len(smallInts) {
		return smallInts[n]
	}
	return strconv.Itoa(n)
}
