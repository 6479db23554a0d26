// Package sendctx makes the context strictrate hands valkey-go for a call, so that one
// caller's deadline can never fail another caller's call.
//
// valkey-go sends a call alone on a connection that has not yet seen two calls at once, and
// then uses the call's deadline as the connection's: when that deadline passes, it closes the
// connection, and every call queued behind it on that connection fails too, though their
// callers' contexts are live. A call whose context has no deadline, but can be cancelled,
// goes through the connection's queue instead, where a caller that gives up only stops
// waiting for its reply. So strictrate hands valkey-go the caller's context without its
// deadline (Of): the call still ends when the caller's context does (its Done and Err are
// the caller's), and no connection is ever closed for it.
//
// A connection is dialled lazily, on the context of the call that needs it first, and the
// calls that wait for the same dial share its outcome: a dial cut short by its caller's
// context fails them too, before anything of theirs was written. Unsent tells such a failure
// apart, so that the call can be sent again for a caller whose context is live.
//
// What valkey-go does not honour is a context while a connection is being made: the dial's
// greeting (HELLO) waits for its reply up to the dial timeout, whatever the context, and so
// do the calls that wait for that dial. A server that takes connections and does not answer
// (paused, stopped, overloaded) would hold a caller there past its deadline. Promptly runs a
// call on a goroutine of its own and returns when the caller's context ends: the one runner
// of the module's calls that must return so.
package sendctx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/valkey-io/valkey-go"
)

// noDeadline is a context without its parent's deadline: Done, Err and Value are the parent's.
type noDeadline struct{ context.Context }

// Deadline reports none: valkey-go then never sets a connection's deadline from this call.
func (noDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

// Of returns ctx as a call hands it to valkey-go: without its deadline, ending when ctx ends.
// A context without a deadline is returned as it is.
func Of(ctx context.Context) context.Context {
	if _, ok := ctx.Deadline(); !ok {
		return ctx
	}
	return noDeadline{ctx}
}

// Unsent reports whether err, the error of a call made with Of(ctx), says that nothing of
// the call was written while ctx is still live: a connection that could not be dialled (a
// *net.OpError of Op "dial"), or a context error, which valkey-go gives a call made with
// Of(ctx) only when its connection's dial or handshake was cut short by another caller's
// context or by the dial timeout. Such a call may be sent again; any other error may come
// after the call was written, and the call must not be sent twice.
func Unsent(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// maxSends is how many times Send sends a call that was not written: a second dial after one
// that another caller cut short, and a third in case that one was cut short too.
const maxSends = 3

// Send runs send with Of(ctx), and again, up to maxSends times in all, while its reply's error
// (errOf) says that nothing was written (Unsent) and ctx is live.
func Send[T any](ctx context.Context, send func(context.Context) T, errOf func(T) error) T {
	callCtx := Of(ctx)
	reply := send(callCtx)
	for i := 1; i < maxSends && Unsent(ctx, errOf(reply)); i++ {
		reply = send(callCtx)
	}
	return reply
}

// Promptly runs call and returns its reply, or failed(ctx.Err()) as soon as ctx ends, if that
// comes first: it is the one runner of every call that returns when its caller's context
// ends. call then goes on, on a goroutine of its own, and its reply is the caller's only if
// handed over before ctx ended (taken): a writing call whose caller left may still be applied,
// once. after, when not nil, runs on call's goroutine once the reply is handed over or left,
// with taken: what a call whose caller left must still do (release a lease nobody took, say)
// is after's. call must own what it reads: nothing of the caller's may change under it once
// Promptly returns. A panic in call is its reply failed(the panic). A context that cannot end
// (Done is nil) runs call, and after, on the caller's goroutine.
func Promptly[T any](ctx context.Context, call func() T, failed func(error) T, after func(reply T, taken bool)) (reply T, taken bool) {
	if ctx.Done() == nil {
		reply = call()
		if after != nil {
			after(reply, true)
		}
		return reply, true
	}
	// Unbuffered: a reply handed over is the caller's, one not handed over is nobody's.
	handed := make(chan T)
	go func() {
		var r T
		func() {
			defer func() {
				if p := recover(); p != nil {
					r = failed(fmt.Errorf("strictrate: the call failed: panic: %v", p))
				}
			}()
			r = call()
		}()
		took := false
		select {
		case handed <- r:
			took = true
		case <-ctx.Done():
		}
		if after != nil {
			after(r, took)
		}
	}()
	select {
	case r := <-handed:
		return r, true
	case <-ctx.Done():
		return failed(ctx.Err()), false
	}
}

// Do sends the command build makes through client as every call of this module is sent: on ctx
// without its deadline, again while nothing was written and ctx is live (Send), and returns
// when ctx ends, whatever the connection is doing (Promptly). build is called for each send: a
// command is sent once.
func Do(ctx context.Context, client valkey.Client, build func(valkey.Builder) valkey.Completed) valkey.ValkeyResult {
	reply, _ := Promptly(ctx, func() valkey.ValkeyResult {
		return Send(ctx, func(ctx context.Context) valkey.ValkeyResult {
			return client.Do(ctx, build(client.B()))
		}, valkey.ValkeyResult.Error)
	}, valkey.NewErrorResult, nil)
	return reply
}
