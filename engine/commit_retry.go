package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/valkey-io/valkey-go"
)

// What a batch call's failure means for its requests (the retry rule of decisions): an error
// reply that the server gives before the script runs (nothing was decided), or a connection
// refused before anything was written, sends each request again on its own, once, through the
// engine's client; and so does a request the script could not take because its key is not on
// the node. Any other failure, where the call may have run (a connection dropped once the call
// was written, a timeout), is each caller's error, as it is for a single request: a decision
// is never taken twice.

// retryAlone sends each of calls again on its own, through the engine's client (which follows
// MOVED and ASK), each on a goroutine of its own when there are several, and returns once all
// came back. Each was not taken (the retry rule), and is sent once.
func (c *commit[T]) retryAlone(ctx context.Context, calls []*call[T]) {
	c.retried.Add(int64(len(calls)))
	if len(calls) == 1 {
		c.sendAlone(ctx, calls[0])
	} else {
		var wg sync.WaitGroup
		for _, cl := range calls {
			wg.Go(func() {
				// Not the committer's goroutine: a panic here is this caller's error.
				defer func() {
					if p := recover(); p != nil {
						cl.err = fmt.Errorf("strictrate: a request sent again alone failed: panic: %v", p)
					}
				}()
				c.sendAlone(ctx, cl)
			})
		}
		wg.Wait()
	}
	for range calls {
		c.recordBatch(context.Background(), 1)
	}
}

// The retry rule of decisions and peeks: a request its batch's call did not take, and that is
// safe to send again, because it was not decided:
//
//   - the call failed before the script ran: MOVED, ASK, TRYAGAIN, CROSSSLOT, CLUSTERDOWN (the
//     server refused the call for its keys' slots: a slot moved or is moving, the cluster is
//     down); READONLY (the node is a replica now, a failover, and refuses a script that may
//     write before running it); OOM (the server is over maxmemory and refuses the batch script
//     before it runs, its flags lacking allow-oom; alone, decide.lua still decides a key whose
//     log needs no more memory); or a connection that could not be opened (a net.OpError of
//     Op "dial": a node that is gone), so nothing was written;
//   - inside the reply, the request's own error says its key is not on the node ("non local
//     key": another node's slot, or a migrating one whose key moved) or that the cluster is
//     down: the server refused the request's first command on its key, and so every command
//     on it (lib_keys.lua says why nothing of it counts).
//
// Everything else is each caller's: a connection dropped or reset after the call was written,
// a timeout, valkey.ErrClosing (a closed connection, which may have taken the call before it
// closed), any other error reply. The call may have run, and a second call could decide the
// same request twice.
func retryNotTaken[T any](callErr error, cl *call[T]) bool {
	if callErr != nil {
		return refusedBeforeRun(callErr)
	}
	return cl.err != nil && notTakenOnNode(cl.err)
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
