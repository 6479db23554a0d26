package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/valkey-io/valkey-go"
)

// The retry rule, one for every kind: a request that its call did not take, because nothing
// of it ran, goes again once, alone, through the engine's client, which follows MOVED and ASK.
// It applies to a call sent to a node (its keys undeclared: no client redirects it) and to a
// batch; a lone request through the engine's client is the client's to redirect, and is taken
// or failed as it comes back. A request over keys of several slots cannot go through the
// client: it comes back with ErrNotTaken, for its caller to send again by slot.
//
// Nothing ran when:
//
//   - the node is gone from the engine's client's topology: nothing was sent;
//   - the call failed before the script ran: MOVED, ASK, TRYAGAIN, CROSSSLOT, CLUSTERDOWN (the
//     server refused the call for its keys' slots: a slot moved or is moving, the cluster is
//     down); READONLY (the node is a replica now, a failover, and refuses a script that may
//     write before running it); a connection that could not be opened (a net.OpError of Op
//     "dial": a node that is gone), so nothing was written; and OOM (the server is over
//     maxmemory and refuses the batch script before it runs, its flags lacking allow-oom)
//     when the request alone goes as another script (decide.lua, which still decides a key
//     whose log needs no more memory): the same script alone would be refused alike;
//   - inside the reply, the request's own error says its key is not on the node ("non local
//     key": another node's slot, or a migrating one whose key moved) or that the cluster is
//     down, and it recorded nothing: the server refused the request's first command on its
//     key, and so every command on it (lib_keys.lua says why nothing of it counts).
//
// Everything else is each caller's: a connection dropped or reset after the call was written,
// a timeout, valkey.ErrClosing (a closed connection, which may have taken the call before it
// closed), any other error reply. The call may have run, and a second call could take the
// same request twice.

// notTaken is the retry rule for o, a request of a call that ended with callErr: batch says
// the call carried several requests, in the kind's batch script.
func (c *Commit[Req, Rep]) notTaken(callErr error, o *Outcome[Rep], batch bool) bool {
	switch {
	case callErr == nil:
		return !o.Recorded && o.Err != nil && notTakenOnNode(o.Err)
	case errors.Is(callErr, errNodeGone):
		return true
	case !refusedBeforeRun(callErr):
		return false
	case strings.HasPrefix(callErr.Error(), "OOM "):
		return batch && c.kind.Single != c.kind.Batch
	}
	return true
}

// retryAlone sends each of calls again on its own, through the engine's client, each on a
// goroutine of its own when there are several, and returns once all came back. Each was not
// taken (the retry rule), and is sent once.
func (c *Commit[Req, Rep]) retryAlone(ctx context.Context, calls []*call[Req, Rep]) {
	c.retried.Add(int64(len(calls)))
	again := func(cl *call[Req, Rep]) {
		cl.out[0], cl.ack = Outcome[Rep]{}, ackReplies{}
		cl.ack, _ = c.exec(ctx, nil, cl.req[:], cl.out[:], &cl.built)
	}
	if len(calls) == 1 {
		again(calls[0])
	} else {
		var wg sync.WaitGroup
		for _, cl := range calls {
			wg.Go(func() {
				// Not the committer's goroutine: a panic here is this caller's error.
				defer func() {
					if p := recover(); p != nil {
						cl.out[0] = Outcome[Rep]{Err: fmt.Errorf("strictrate: a request sent again alone failed: panic: %v", p)}
					}
				}()
				again(cl)
			})
		}
		wg.Wait()
	}
	for range calls {
		c.called(context.Background(), 1)
	}
}

// beforeRunReplies are the error replies a server gives a script call before it runs it.
var beforeRunReplies = []string{"MOVED ", "ASK ", "TRYAGAIN", "CROSSSLOT", "CLUSTERDOWN", "READONLY", "OOM "}

// refusedBeforeRun reports whether err, a call's whole reply, says the call never ran: one of
// beforeRunReplies, or a connection that could not be opened.
func refusedBeforeRun(err error) bool {
	if verr, ok := valkey.IsValkeyErr(err); ok {
		for _, prefix := range beforeRunReplies {
			if strings.HasPrefix(verr.Error(), prefix) {
				return true
			}
		}
		return false
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// notLocalReplies are what a script's command on a key answers when the node cannot serve the
// key (scriptVerifyClusterState in the server): inside a batch's reply, the error of a request
// whose key is not on the node.
var notLocalReplies = []string{"Script attempted to access a non local key in a cluster node",
	"Script attempted to execute a command while the cluster is down",
	"Script attempted to execute a write command while the cluster is down"}

// notTakenOnNode reports whether err, one request's error inside a batch's reply, says the
// node could not serve its key (notLocalReplies), so the request was not taken.
func notTakenOnNode(err error) bool {
	if _, ok := valkey.IsValkeyErr(err); !ok {
		return false
	}
	for _, reply := range notLocalReplies {
		if strings.Contains(err.Error(), reply) {
			return true
		}
	}
	return false
}
