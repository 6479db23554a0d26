// Package callerr classifies the failure of a call to the server, for every package that calls
// it (engine, pipelined, inspect): the caller's own cancellation or deadline, the server
// unable to answer (ErrUnavailable), a key that holds no log of this release's (ErrUnknownLayout),
// or another reply of the server's. Package engine exports the two errors under the same
// names, with their documentation; these are the same values.
package callerr

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"
)

var (
	// ErrUnavailable is engine.ErrUnavailable.
	ErrUnavailable = errors.New("strictrate: server unavailable")
	// ErrUnknownLayout is engine.ErrUnknownLayout.
	ErrUnknownLayout = errors.New("strictrate: the key holds no log this release can read")
)

// Classify wraps err, a call's failure, with what was being done; with ErrUnknownLayout when a script refused
// the key's contents (BADLAYOUT); and with ErrUnavailable when the server was
// not reached or could not answer (a connection error, a timeout of the client's own, LOADING,
// CLUSTERDOWN, TRYAGAIN, MASTERDOWN, BUSY, READONLY, OOM). The error of ctx, the caller's
// context, once it is done, and other server errors are wrapped as they are.
//
// A context error while ctx is not done, or done with a cause wrapping ErrUnavailable (a
// bound on the server's answer, set for the server's sake), is the client's own timeout (a
// connection's dial or handshake that did not finish in valkey-go's dial timeout, or cut
// short by other callers each time it was tried: package sendctx): the server could not
// answer, and the caller did not give up. It is wrapped as ErrUnavailable and no longer
// matches the context errors, so that nobody mistakes it for the caller's deadline. The other
// way round, a dial that the caller's passed deadline cut short ("i/o timeout") matches
// context.DeadlineExceeded: the caller gave up, the server was not found wanting.
func Classify(ctx context.Context, what string, err error) error {
	callerDone := CallerEnded(ctx)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		// The client stops at the caller's deadline by its own timer, which may fire a moment
		// before the context's: a deadline that has passed is the caller's too.
		if callerDone {
			return fmt.Errorf("%s: %w", what, err)
		}
		return fmt.Errorf("%s: %w: the client timed out waiting for the server (%v)", what, ErrUnavailable, err)
	}
	if callerDone && errors.Is(err, os.ErrDeadlineExceeded) {
		// A connection dialed on the caller's context gets the caller's deadline as its own, and
		// a dial cut short by it reports "i/o timeout" (os.ErrDeadlineExceeded), not the
		// context's error: it is the caller's deadline all the same.
		return fmt.Errorf("%s: %w (%w)", what, context.DeadlineExceeded, err)
	}
	var verr *valkey.ValkeyError
	if errors.As(err, &verr) && !valkey.IsValkeyNil(verr) {
		if found, ok := strings.CutPrefix(verr.Error(), layoutReply); ok {
			// The server appends where in which script the error was raised.
			found, _, _ = strings.Cut(found, " script: ")
			return fmt.Errorf("%s: %w: %s", what, ErrUnknownLayout, found)
		}
		if !serverCannotAnswer(verr.Error()) {
			return fmt.Errorf("%s: server error: %w", what, err)
		}
	}
	return fmt.Errorf("%s: %w: %w", what, ErrUnavailable, err)
}

// CallerEnded reports whether ctx has ended as its caller's own end: cancelled, or its
// deadline passed, unless it ended with a cause wrapping ErrUnavailable
// (context.WithTimeoutCause), a bound its caller set on the server's answer, whose expiry is
// the server's failure. A deadline that has passed is waited for until its timer ends ctx (at
// once: the client's own timer may fire a moment before the context's), so that its cause is
// known.
func CallerEnded(ctx context.Context) bool {
	if deadline, ok := ctx.Deadline(); ok && ctx.Err() == nil && !time.Now().Before(deadline) {
		<-ctx.Done()
	}
	return ctx.Err() != nil && !errors.Is(context.Cause(ctx), ErrUnavailable)
}

// layoutReply starts the error reply of a script that found a key holding something other
// than its layout (lib_log.lua, lib_lease.lua); the rest says what the key holds.
const layoutReply = "BADLAYOUT "

// unavailableReplies are the error replies of a server that is there but cannot decide now:
// loading its data, its cluster down, a slot migrating, its primary lost, a script running
// too long, or a replica that takes no writes (a failover in progress).
//
// OOM (maxmemory reached under noeviction) is one of them: the server refuses every write
// until memory is freed, which is the server being unable to decide, not a verdict on the
// request. So a fail-closed engine refuses, and a fail-open engine admits as it does for an
// outage (WithFailOpen says what that costs).
var unavailableReplies = []string{"LOADING", "CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "BUSY ", "READONLY", "OOM "}

// serverCannotAnswer reports whether an error reply means unavailable rather than refused.
func serverCannotAnswer(reply string) bool {
	for _, prefix := range unavailableReplies {
		if strings.HasPrefix(reply, prefix) {
			return true
		}
	}
	return false
}
