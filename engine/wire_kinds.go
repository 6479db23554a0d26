package engine

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"
)

// The wire of the kinds of request besides decisions and peeks (wire.go): AllowAll's groups
// (decide_all.lua), settles (settle.lua) and leases (lease_*.lua). Like wire.go, it lays out
// arguments and decodes replies, and does nothing else.

// groupSize is the size rule of AllowAll groups: its keys (a group goes whole into one call).
func groupSize(cl *call[*allCall]) (int, int) { return len(cl.req.parts), 0 }

// encodeGroups lays out a call of decide_all.lua (its header documents it): the limit sets of
// the call once each, then each group (its clock, whether it decides or only checks, its
// requests: cost, set, advisory), the requests' keys in order.
func encodeGroups(calls []*call[*allCall], keys, args []string) ([]string, []string) {
	var sets []*limitSet
	var setOf []int
	for _, cl := range calls {
		for _, p := range cl.req.parts {
			i := slices.IndexFunc(sets, func(s *limitSet) bool { return s.sameLimits(p.req.set) })
			if i < 0 {
				i = len(sets)
				sets = append(sets, p.req.set)
			}
			setOf = append(setOf, i)
		}
	}
	args = append(args, itoa(len(sets)))
	for _, s := range sets {
		args = append(args, itoa(len(s.nums)))
		args = append(args, s.nums...)
	}
	args = append(args, itoa(len(calls)))
	for _, cl := range calls {
		g := cl.req
		mode := "decide"
		if g.check {
			mode = "check"
		}
		args = append(args, g.parts[0].req.now, mode, itoa(len(g.parts)))
		for _, p := range g.parts {
			keys = append(keys, p.req.key)
			advisory := "0"
			if p.advisory {
				advisory = "1"
			}
			args = append(args, itoa(p.req.n), itoa(setOf[len(keys)-1]+1), advisory)
		}
	}
	return keys, args
}

// decodeGroups reads a reply of decide_all.lua (its header documents it) into the groups'
// requests, and reports whether the call recorded any of them.
func decodeGroups(reply valkey.ValkeyResult, calls []*call[*allCall]) (recorded bool) {
	fail := func(err error) bool {
		for _, cl := range calls {
			for _, p := range cl.req.parts {
				p.req.replyErr = err
			}
		}
		return false
	}
	for _, cl := range calls {
		for _, p := range cl.req.parts {
			p.err, p.recorded, p.req.d, p.req.replyErr = nil, false, decision{}, nil
		}
	}
	if reply.Error() != nil {
		return false // the call's error, which exec hands each group
	}
	vals, err := reply.ToArray()
	if err != nil {
		return fail(fmt.Errorf("script reply: %w", err))
	}
	want := 1
	for _, cl := range calls {
		want += 1 + len(cl.req.parts)
	}
	if len(vals) != want {
		return fail(fmt.Errorf("script reply has %d values for %d groups of %d values", len(vals), len(calls), want-1))
	}
	serverNow, err := vals[0].AsInt64()
	if err != nil {
		return fail(fmt.Errorf("script reply: the server's now: %w", err))
	}
	at := 1
	for _, cl := range calls {
		parts := cl.req.parts
		flags, err := vals[at].ToString()
		if err != nil || len(flags) != len(parts) {
			return fail(fmt.Errorf("script reply: the recorded flags %q for %d requests (%v)", flags, len(parts), err))
		}
		for i, p := range parts {
			p.recorded = flags[i] == '1'
			recorded = recorded || p.recorded
			v := &vals[at+1+i]
			if err := v.Error(); err != nil {
				p.err = err
				continue
			}
			s, err := v.ToString()
			if err == nil {
				err = p.req.read(s, serverNow)
			}
			if err != nil {
				p.req.replyErr = fmt.Errorf("script reply value %d: %w", at+2+i, err)
			}
		}
		at += 1 + len(parts)
	}
	return recorded
}

// settleReq is a call of settle.lua (its header documents it) and what it gave back.
type settleReq struct {
	key      string
	args     []string
	back     int64 // the events given back
	replyErr error // the reply was not one the script gives
}

// settleArgs are settle.lua's arguments for id, settled to actual: the entry's time, seq and
// cost, actual, and for a shared entry "shared" and the decision's time.
func settleArgs(at int64, id EntryID, actual int, decided int64) []string {
	args := []string{strconv.FormatInt(at, 10), strconv.Itoa(id.Seq), strconv.Itoa(id.Cost), strconv.Itoa(actual)}
	if id.Shared {
		args = append(args, "shared", strconv.FormatInt(decided, 10))
	}
	return args
}

func encodeSettle(calls []*call[settleReq], keys, args []string) ([]string, []string) {
	return append(keys, calls[0].req.key), append(args, calls[0].req.args...)
}

func decodeSettle(reply valkey.ValkeyResult, calls []*call[settleReq]) bool {
	r := &calls[0].req
	r.back, r.replyErr = 0, nil
	if reply.Error() != nil {
		return false
	}
	back, err := reply.AsInt64()
	if err != nil {
		r.replyErr = fmt.Errorf("script reply: %w", err)
		return false
	}
	r.back = back
	return false // nothing to acknowledge: it gave back
}

// leaseReq is a call of a lease script (lease_acquire.lua, lease_extend.lua,
// lease_release.lua: their headers document them) and what it answered.
type leaseReq struct {
	key      string // the lease set's full key
	args     []string
	d        leaseReply
	replyErr error // the reply was not one the script gives
}

// acquireArgs are lease_acquire.lua's arguments: now, max, the ttl in microseconds, the id.
func acquireArgs(now string, maxHolders int, ttl time.Duration, id uuid.UUID) []string {
	return []string{now, strconv.Itoa(maxHolders), strconv.FormatInt(ceilMicros(ttl), 10), string(id[:])}
}

// extendArgs are lease_extend.lua's arguments: now, the ttl in microseconds, the id.
func extendArgs(now string, ttl time.Duration, id uuid.UUID) []string {
	return []string{now, strconv.FormatInt(ceilMicros(ttl), 10), string(id[:])}
}

// releaseArgs are lease_release.lua's argument: the id.
func releaseArgs(id uuid.UUID) []string { return []string{string(id[:])} }

func encodeLease(calls []*call[leaseReq], keys, args []string) ([]string, []string) {
	return append(keys, calls[0].req.key), append(args, calls[0].req.args...)
}

// decodeLease reads the reply of lease_acquire.lua or lease_extend.lua, and reports whether it
// granted (which WithDurableAck then confirms with WAITAOF).
func decodeLease(reply valkey.ValkeyResult, calls []*call[leaseReq]) (granted bool) {
	r := &calls[0].req
	r.d, r.replyErr = leaseReply{}, nil
	if reply.Error() != nil {
		return false
	}
	r.d, r.replyErr = readLeaseReply(reply)
	return r.d.granted && r.replyErr == nil
}

// decodeRelease reads the reply of lease_release.lua, the leases it removed: granted says one
// was. A release writes nothing to acknowledge.
func decodeRelease(reply valkey.ValkeyResult, calls []*call[leaseReq]) bool {
	r := &calls[0].req
	r.d, r.replyErr = leaseReply{}, nil
	n, err := reply.AsInt64()
	switch {
	case reply.Error() != nil:
	case err != nil || n < 0 || n > 1:
		r.replyErr = fmt.Errorf("script reply: %d leases removed (%v)", n, err)
	default:
		r.d.granted = n == 1
	}
	return false
}

// leaseReply is a lease script's reply (lease_acquire.lua; lease_extend.lua replies its first
// three values): times in microseconds, 0 where the script left a value out.
type leaseReply struct {
	granted bool
	now     int64
	expires int64 // the lease's expiry, when granted
	holders int64 // unexpired leases after the call (Acquire)
	soonest int64 // when denied: the soonest held lease's expiry (Acquire)
	latest  int64 // when denied: the last held lease's expiry (Acquire)
}

// readLeaseReply decodes a lease script's reply, and refuses one no lease script gives.
func readLeaseReply(reply valkey.ValkeyResult) (leaseReply, error) {
	v, err := reply.AsIntSlice()
	if err != nil {
		return leaseReply{}, err
	}
	if len(v) < 2 || len(v) > 6 || v[0] != 0 && v[0] != 1 {
		return leaseReply{}, fmt.Errorf("script reply %v is not a lease decision", v)
	}
	var full [6]int64
	copy(full[:], v)
	d := leaseReply{granted: full[0] == 1, now: full[1], expires: full[2], holders: full[3], soonest: full[4], latest: full[5]}
	switch {
	case d.granted && d.expires <= d.now:
		return leaseReply{}, fmt.Errorf("script reply %v: the lease expires before it was granted", v)
	case !d.granted && len(v) == 6 && (d.soonest <= d.now || d.latest < d.soonest):
		return leaseReply{}, fmt.Errorf("script reply %v: the held leases' expiries are out of order", v)
	}
	return d, nil
}
