// Package transport is how strictrate's engine reaches its servers: the group commit, the
// routing of a cluster's slots, the retry rule, and the one function that calls a script, with
// the acknowledgements an admission waits for and the caller's deadline. Its API is values: a
// request in (Commit.Do), its reply, its acknowledgement and its error out (Outcome). What it
// pools and queues never leaves it.
//
// The path of one request, top-down:
//
//  1. Commit.Route names where a request goes: in a cluster, the primary that serves its key's
//     slot by the slot map (slots.go), or the slot itself, through the engine's client; on a
//     standalone server, the server.
//  2. Commit.Do (commit.go) sends it at once when nothing of its kind is in flight there, on
//     its caller's goroutine, or on one goroutine of its own when the caller's context can end
//     (sendctx.Promptly: the caller returns when its context ends, the call goes on); else it
//     queues, and a committer goroutine sends it with the requests queued beside it in one call
//     of the kind's batch script (gather, take, sendBatch), while its caller waits for it or for
//     its context's end.
//  3. exec (exec.go) lays the call out (the kind's Encode), runs it with the acknowledgements
//     asked for (ack.go), and reads its reply into each request's Outcome (the kind's Decode).
//  4. The retry rule (retry.go): a request that a call to a node, or a batch, did not take,
//     because nothing of it ran, goes again once, alone, through the engine's client, which
//     follows MOVED and ASK.
//  5. Back in Do, the request's Outcome is copied out, its acknowledgement checked, and its call
//     pooled again.
//
// A kind (Kind) is one script's requests: a decision, a peek, an AllowAll group, a settle, a
// lease call. It brings its scripts and its wire functions; everything else is the same for
// every kind.
package transport

import (
	"cmp"
	"errors"
	"strings"

	"github.com/valkey-io/valkey-go"
)

// Transport is one engine's way to its servers: its client, in a cluster the slot map its
// batches are routed by, whether requests are batched (group commit), and the acknowledgements
// an admission waits for. Its kinds of request each have a Commit (NewCommit). It is safe for
// concurrent use.
type Transport struct {
	client   valkey.Client
	slots    *slotMap // in a cluster; nil on a standalone server
	batching bool
	ack      Ack
}

// New returns the transport of client: batching turns the group commit on, ack names the
// acknowledgements every recorded request waits for.
func New(client valkey.Client, batching bool, ack Ack) *Transport {
	t := &Transport{client: client, batching: batching, ack: ack}
	if client.Mode() == valkey.ClientModeCluster {
		t.slots = newSlotMap(client)
	}
	return t
}

// Dest is where a request goes (Commit.Route): a cluster's primary, reached on its own
// connection with the keys undeclared; or a slot (a cluster whose slot map has not landed, a
// slot no primary serves, a kind whose batches go through the client) or, on a standalone
// server, the server, reached through the engine's client with the keys declared. each says
// its requests take their own clock, not the server's: a batch reads the server's clock once
// for all its requests, or takes each one's.
type Dest struct {
	node string
	slot uint16
	each bool
}

// Node is the address of the primary d names; "" for the engine's client.
func (d Dest) Node() string { return d.node }

// CompareDests orders destinations as a request over several of them takes them (AllowAll):
// primaries first, by address, then slots, ascending.
func CompareDests(a, b Dest) int {
	if (a.node == "") != (b.node == "") {
		if a.node == "" {
			return 1
		}
		return -1
	}
	return cmp.Or(strings.Compare(a.node, b.node), cmp.Compare(a.slot, b.slot), compareBools(a.each, b.each))
}

// compareBools orders false before true.
func compareBools(a, b bool) int {
	switch {
	case a == b:
		return 0
	case a:
		return 1
	}
	return -1
}

// slotOf is the cluster hash slot of key.
func slotOf(key string) uint16 {
	cmd := valkey.Completed{}.SetSlot(key)
	return cmd.Slot()
}

// ErrNotTaken is the error of a request that the node it was sent to did not take (its key's
// slot moved, the node left the cluster: the retry rule), and that cannot go again alone
// through the engine's client, because its keys are of several slots (an AllowAll group).
// Nothing of it ran: send its keys again, one slot at a time (Commit.BySlot).
var ErrNotTaken = errors.New("strictrate: the node did not take the request, whose keys are of several slots: send them again by slot")

// errNodeGone is the error of a call for a node the engine's client no longer knows: nothing
// was sent.
var errNodeGone = errors.New("strictrate: the node is no longer in the cluster client's topology")
