package grpclimit

// Outcomes: a call is admitted, and counted, before its handler runs, so that parallel calls
// never pass the limit; once the handler has returned, WithRefundOn gives the event back and
// WithResetOn clears the key, by the code it ended the call with. The interceptors
// (grpclimit.go) decide, run the handler, then applyOutcome calls the engine's Refund or
// Reset.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strictrate/strictrate/engine"
)

// ErrRefund is wrapped, with the engine's error, by the error the WithOutcomeErrorHook
// function gets when a refund WithRefundOn asked for failed: the call goes on counting against
// its limits until it leaves their windows. The call ends as its handler said, unchanged.
var ErrRefund = errors.New("grpclimit: could not refund an admitted call")

// ErrReset is wrapped, with the engine's error, by the error the WithOutcomeErrorHook function
// gets when a reset WithResetOn asked for failed: the key's log keeps its events until they
// leave its windows. The call ends as its handler said, unchanged.
var ErrReset = errors.New("grpclimit: could not reset a key")

// OutcomeTimeout bounds each refund or reset the interceptors make after a handler returns.
// It runs on the call's context without its cancellation (context.WithoutCancel), so that a
// client that went away or whose deadline passed still gets its refund, and no longer than
// this, so that a Valkey that does not answer holds the call's end for at most OutcomeTimeout.
const OutcomeTimeout = 2 * time.Second

// WithRefundOn refunds an admitted call (engine.Engine.Refund of its Result) whose handler
// ended it with a code for which match is true: the call was counted when admitted, so
// parallel calls never pass the limit, and is given back once its end shows it should not
// count. Counting only failed logins is WithRefundOn(func(c codes.Code) bool { return c ==
// codes.OK }).
//
// The code is the one the client gets: OK for a nil error, a status error's code, Canceled or
// DeadlineExceeded for a context's error, else Unknown. A stream is settled when its handler
// returns. Never refunded: a call whose handler panicked, one a fail-open engine admitted
// without deciding, one shadow mode admitted over the limit, and one whose decision recorded
// nothing. When WithResetOn matches the code too, the key is reset instead. The refund runs
// before the call ends, for at most OutcomeTimeout; a failed one goes to the
// WithOutcomeErrorHook function, and never changes how the call ends.
func WithRefundOn(match func(codes.Code) bool) Option {
	return func(c *config) { c.refundOn = match }
}

// WithResetOn clears the key's log (engine.Engine.Reset) when an admitted call's handler ended
// it with a code for which match is true: every event of the key is forgotten, this call's
// included, as when a successful login clears an account's failed attempts. Reset only a key
// one client owns (an account's), never one many share (an address's): anyone with one valid
// login could clear, between two guesses, the count of the address they guess from.
//
// The code, the calls that are never reset and the failures are WithRefundOn's; a code both
// match is reset, as a reset forgets the refund's event too.
func WithResetOn(match func(codes.Code) bool) Option {
	return func(c *config) { c.resetOn = match }
}

// WithOutcomeErrorHook sets the function called when a refund (the error wraps ErrRefund) or a
// reset (ErrReset) failed, with the call's context and full method name and an error that
// wraps the engine's as well: for logs and metrics, as the call ends as its handler said
// whatever happens. By default the failure is logged at warning level through slog.Default.
func WithOutcomeErrorHook(f func(ctx context.Context, method string, err error)) Option {
	return func(c *config) { c.onOutcomeError = f }
}

// settles reports whether the call res admitted needs its handler's code: an outcome is
// configured, and res recorded an entry this interceptor decided on.
func (c *config) settles(res engine.Result) bool {
	return (c.refundOn != nil || c.resetOn != nil) &&
		res.Allowed && res.BackendErr == nil && !res.ShadowDenied && !res.Entry.IsZero()
}

// applyOutcome resets d's key when the reset option matches the code of handlerErr, else
// refunds d's admission when the refund option matches; a failure goes to the hook.
func (l *Limiter) applyOutcome(ctx context.Context, method string, d decision, handlerErr error) {
	code := endCode(handlerErr)
	reset := l.cfg.resetOn != nil && l.cfg.resetOn(code)
	if !reset && (l.cfg.refundOn == nil || !l.cfg.refundOn(code)) {
		return
	}
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), OutcomeTimeout)
	defer cancel()
	var err error
	if reset {
		if err = l.engine.Reset(octx, d.key); err != nil {
			err = fmt.Errorf("%w after %s %s, its events stay until they leave the windows: %w", ErrReset, method, code, err)
		}
	} else if err = l.engine.Refund(octx, d.key, d.res); err != nil {
		err = fmt.Errorf("%w after %s %s, it counts until it leaves the windows: %w", ErrRefund, method, code, err)
	}
	if err == nil {
		return
	}
	if l.cfg.onOutcomeError != nil {
		l.cfg.onOutcomeError(ctx, method, err)
		return
	}
	slog.Default().LogAttrs(octx, slog.LevelWarn, "grpclimit: outcome not applied",
		slog.String("method", method), slog.Any("error", err))
}

// endCode is the code a call whose handler returned err ends with, as grpc-go's server sends
// it: a status error's code, a context error's, else Unknown.
func endCode(err error) codes.Code {
	if err == nil {
		return codes.OK
	}
	if st, ok := status.FromError(err); ok {
		return st.Code()
	}
	return status.FromContextError(err).Code()
}
