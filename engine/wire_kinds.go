package engine

import (
	"fmt"
	"slices"
	"strconv"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/transport"
)

// The wire of the kinds of request besides decisions and peeks (wire.go): AllowAll's groups
// (decide_all.lua), settles (settle.lua) and leases (lease_*.lua). Like wire.go, it lays out
// arguments and decodes replies, and does nothing else.

// group is one group of decide_all.lua: the requests of an AllowAll whose keys one node holds,
// decided all or nothing in one call, alone or with other AllowAlls' groups for the same node.
type group struct {
	parts []groupPart // in KEYS order
	check bool        // peek only: the AllowAll is already denied on another node
}

// groupPart is one request of a group.
type groupPart struct {
	req      request // its record is unused: the script records a part's cost when admitted
	advisory bool
}

// partReply is what decide_all.lua answered for one request of a group.
type partReply struct {
	d        decision
	recorded bool
	err      error // the server's error reply for it (BADLAYOUT, a key not on the node)
	invalid  error // a reply the script does not give
}

// groupSize is the size rule of AllowAll groups: its keys (a group goes whole into one call).
func groupSize(g *group) (int, int) { return len(g.parts), 0 }

// encodeGroups lays out a call of decide_all.lua (its header documents it): the limit sets of
// the call once each, then each group (its clock, whether it decides or only checks, its
// requests: cost, set, advisory), the requests' keys in order.
func encodeGroups(groups []group, keys, args []string) ([]string, []string) {
	var sets []*limitSet
	var setOf []int
	for _, g := range groups {
		for _, p := range g.parts {
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
	args = append(args, itoa(len(groups)))
	for _, g := range groups {
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

// decodeGroups reads a reply of decide_all.lua (its header documents it; readBatch) into each
// group's Outcome: its requests' replies; Recorded when it recorded any of them; and, when
// one failed, Err, the error reply of its first request that failed.
func decodeGroups(reply valkey.ValkeyResult, groups []group, outs []transport.Outcome[[]partReply]) {
	if reply.Error() != nil {
		return // the call's error, which the transport hands each group
	}
	width := func(i int) int { return 1 + len(groups[i].parts) }
	readBatch(reply, outs, width, func(i int, serverNow int64, vals []valkey.ValkeyMessage, o *transport.Outcome[[]partReply]) {
		parts := groups[i].parts
		flags, err := vals[0].ToString()
		if err != nil || len(flags) != len(parts) {
			o.Invalid = fmt.Errorf("script reply: the recorded flags %q for %d requests (%v)", flags, len(parts), err)
			return
		}
		replies := make([]partReply, len(parts))
		for j := range parts {
			r := &replies[j]
			r.recorded = flags[j] == '1'
			o.Recorded = o.Recorded || r.recorded
			v := &vals[1+j]
			if r.err = v.Error(); r.err != nil {
				if o.Err == nil {
					o.Err = r.err
				}
				continue
			}
			s, err := v.ToString()
			if err == nil {
				r.d, err = parts[j].req.read(s, serverNow)
			}
			if err != nil {
				r.invalid = fmt.Errorf("script reply: request %d of its group: %w", 1+j, err)
			}
		}
		o.Reply = replies
	})
}

// settleReq is a call of settle.lua (its header documents it); its reply is the events given
// back.
type settleReq struct {
	key  string
	args []string
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

// encodeSettle lays out a call of settle.lua: its key, its arguments (settleArgs).
func encodeSettle(reqs []settleReq, keys, args []string) ([]string, []string) {
	return append(keys, reqs[0].key), append(args, reqs[0].args...)
}

// decodeSettle reads settle.lua's reply, the events it gave back: nothing to acknowledge,
// except a raise (a negative reply), which recorded events.
func decodeSettle(reply valkey.ValkeyResult, _ []settleReq, outs []transport.Outcome[int64]) {
	if reply.Error() != nil {
		return
	}
	back, err := reply.AsInt64()
	if err != nil {
		outs[0].Invalid = fmt.Errorf("script reply: %w", err)
		return
	}
	outs[0].Reply = back
	outs[0].Recorded = back < 0
}

// leaseReq is a call of a lease script (lease_acquire.lua, lease_extend.lua,
// lease_release.lua: their headers document them); its reply is a leaseReply.
type leaseReq struct {
	key  string // the lease set's full key
	args []string
}

// acquireArgs are lease_acquire.lua's arguments: now, max, the ttl in microseconds, the id.
func acquireArgs(now string, maxHolders int, ttlUS int64, id uuid.UUID) []string {
	return []string{now, strconv.Itoa(maxHolders), strconv.FormatInt(ttlUS, 10), string(id[:])}
}

// extendArgs are lease_extend.lua's arguments: now, the ttl in microseconds, the id.
func extendArgs(now string, ttlUS int64, id uuid.UUID) []string {
	return []string{now, strconv.FormatInt(ttlUS, 10), string(id[:])}
}

// releaseArgs are lease_release.lua's argument: the id.
func releaseArgs(id uuid.UUID) []string { return []string{string(id[:])} }

// encodeLease lays out a call of a lease script: the lease set's key, its arguments.
func encodeLease(reqs []leaseReq, keys, args []string) ([]string, []string) {
	return append(keys, reqs[0].key), append(args, reqs[0].args...)
}

// decodeLease reads the reply of lease_acquire.lua or lease_extend.lua: Recorded when it
// granted (which WithReplicaAck and WithDurableAck then confirm).
func decodeLease(reply valkey.ValkeyResult, _ []leaseReq, outs []transport.Outcome[leaseReply]) {
	if reply.Error() != nil {
		return
	}
	o := &outs[0]
	if o.Reply, o.Invalid = readLeaseReply(reply); o.Invalid == nil {
		o.Recorded = o.Reply.granted
	}
}

// decodeRelease reads the reply of lease_release.lua, the leases it removed: granted says one
// was. A release writes nothing to acknowledge.
func decodeRelease(reply valkey.ValkeyResult, _ []leaseReq, outs []transport.Outcome[leaseReply]) {
	n, err := reply.AsInt64()
	switch {
	case reply.Error() != nil:
	case err != nil || n < 0 || n > 1:
		outs[0].Invalid = fmt.Errorf("script reply: %d leases removed (%v)", n, err)
	default:
		outs[0].Reply.granted = n == 1
	}
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
