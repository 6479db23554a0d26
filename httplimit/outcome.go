package httplimit

// Outcomes: a request is admitted, and counted, before its handler runs, so that parallel
// requests never pass the limit; once the handler has answered, WithRefundOn gives the event
// back and WithResetOn clears the key, by the status it answered with. The path of one such
// request: serve (httplimit.go) admits it and hands it to serveCounted, which runs the handler
// through an outcomeWriter (the status it wrote, whether it hijacked the connection), then
// applyOutcome calls the engine's Refund or Reset.

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/strictrate/strictrate/engine"
)

// ErrRefund is wrapped, with the engine's error, by the error the WithOutcomeErrorHook
// function gets when a refund WithRefundOn asked for failed: the request goes on counting
// against its limits until it leaves their windows. Its response is the handler's, unchanged.
var ErrRefund = errors.New("httplimit: could not refund an admitted request")

// ErrReset is wrapped, with the engine's error, by the error the WithOutcomeErrorHook function
// gets when a reset WithResetOn asked for failed: the key's log keeps its events until they
// leave its windows. The response is the handler's, unchanged.
var ErrReset = errors.New("httplimit: could not reset a key")

// OutcomeTimeout bounds each refund or reset the middleware makes after a handler returns.
// It runs on the request's context without its cancellation (context.WithoutCancel), so that
// a client that hung up still gets its refund, and no longer than this, so that a Valkey that
// does not answer holds the response for at most OutcomeTimeout.
const OutcomeTimeout = 2 * time.Second

// WithRefundOn refunds an admitted request (engine.Engine.Refund of its Result) whose handler
// answered with a status for which match is true: the request was counted when admitted, so
// parallel requests never pass the limit, and is given back once its answer shows it should
// not count. Counting only failed logins is WithRefundOn(func(s int) bool { return s < 400 }).
//
// A handler that writes nothing answers 200, and so does one that writes a body or flushes
// without WriteHeader; WriteHeader's first final (not 1xx) status is the answer. Never
// refunded: a request whose handler hijacked the connection (it has no status) or panicked,
// one a fail-open engine admitted without deciding, one shadow mode admitted over the limit,
// and one whose decision recorded nothing. When WithResetOn matches the status too, the key
// is reset instead. The refund runs before the response is complete, for at most
// OutcomeTimeout; a failed one goes to the WithOutcomeErrorHook function, and never changes
// the response. NewConcurrent ignores it: a lease is given back whatever the answer.
func WithRefundOn(match func(status int) bool) Option {
	return func(c *config) { c.refundOn = match }
}

// WithResetOn clears the key's log (engine.Engine.Reset) when an admitted request's handler
// answered with a status for which match is true: every event of the key is forgotten, this
// request's included, as when a successful login clears an account's failed attempts. Reset
// only a key one client owns (an account's), never one many share (an address's): anyone with
// one valid login could clear, between two guesses, the count of the address they guess from.
//
// The status, the requests that are never reset and the failures are WithRefundOn's; a status
// both match is reset, as a reset forgets the refund's event too. NewConcurrent ignores it.
func WithResetOn(match func(status int) bool) Option {
	return func(c *config) { c.resetOn = match }
}

// WithOutcomeErrorHook sets the function called when a refund (the error wraps ErrRefund) or
// a reset (ErrReset) failed, with the request and an error that wraps the engine's as well:
// for logs and metrics, as the response is the handler's whatever happens. By default the
// failure is logged at warning level through slog.Default.
func WithOutcomeErrorHook(f func(r *http.Request, err error)) Option {
	return func(c *config) { c.onOutcomeError = f }
}

// settles reports whether the request res admitted needs its answer's status: an outcome is
// configured, and res recorded an entry this middleware decided on.
func (c *config) settles(res engine.Result) bool {
	return (c.refundOn != nil || c.resetOn != nil) &&
		res.Allowed && res.BackendErr == nil && !res.ShadowDenied && !res.Entry.IsZero()
}

// serveCounted runs next for a request res admitted on key, then refunds or resets the key by
// the status next answered with. A panic in next goes on, with the request still counted.
func (l *limiter) serveCounted(w http.ResponseWriter, r *http.Request, next http.Handler, key string, res engine.Result) {
	ow := &outcomeWriter{ResponseWriter: w}
	next.ServeHTTP(ow.wrapped(), r)
	if ow.hijacked {
		return
	}
	l.applyOutcome(r, key, res, cmp.Or(ow.status, http.StatusOK))
}

// applyOutcome resets key when the reset option matches status, else refunds res when the
// refund option matches; a failure goes to the hook.
func (l *limiter) applyOutcome(r *http.Request, key string, res engine.Result, status int) {
	reset := l.cfg.resetOn != nil && l.cfg.resetOn(status)
	if !reset && (l.cfg.refundOn == nil || !l.cfg.refundOn(status)) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), OutcomeTimeout)
	defer cancel()
	var err error
	if reset {
		if err = l.engine.Reset(ctx, key); err != nil {
			err = fmt.Errorf("%w after status %d, its events stay until they leave the windows: %w", ErrReset, status, err)
		}
	} else if err = l.engine.Refund(ctx, key, res); err != nil {
		err = fmt.Errorf("%w after status %d, it counts until it leaves the windows: %w", ErrRefund, status, err)
	}
	if err == nil {
		return
	}
	if l.cfg.onOutcomeError != nil {
		l.cfg.onOutcomeError(r, err)
		return
	}
	slog.Default().LogAttrs(ctx, slog.LevelWarn, "httplimit: outcome not applied",
		slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
}

// outcomeWriter records the status a handler answers with, and whether it hijacked the
// connection. wrapped gives the handler a writer with the optional interfaces of the one it
// wraps.
type outcomeWriter struct {
	http.ResponseWriter
	status   int // the final status written; 0 until then
	hijacked bool
}

// wrapped returns ow as the handler sees it: an http.Flusher and an http.Hijacker when
// http.NewResponseController could flush or hijack the writer ow wraps (itself or one it
// unwraps to), so that a handler that asserts either interface finds it, and one that goes
// through a ResponseController reaches ow's Hijack, and ow knows.
func (ow *outcomeWriter) wrapped() http.ResponseWriter {
	flush, hijack := capabilities(ow.ResponseWriter)
	switch {
	case flush && hijack:
		return flushHijackWriter{ow}
	case flush:
		return flushWriter{ow}
	case hijack:
		return hijackWriter{ow}
	}
	return ow
}

// capabilities reports whether w, or a writer its Unwrap chain leads to, flushes and hijacks,
// as http.ResponseController looks for them.
func capabilities(w http.ResponseWriter) (flush, hijack bool) {
	for {
		switch w.(type) {
		case http.Flusher, interface{ FlushError() error }:
			flush = true
		}
		if _, ok := w.(http.Hijacker); ok {
			hijack = true
		}
		u, ok := w.(interface{ Unwrap() http.ResponseWriter })
		if !ok || flush && hijack {
			return flush, hijack
		}
		w = u.Unwrap()
	}
}

// WriteHeader records the first final status (an informational 1xx other than 101 Switching
// Protocols comes before the final one).
func (ow *outcomeWriter) WriteHeader(code int) {
	if ow.status == 0 && (code < 100 || code > 199 || code == http.StatusSwitchingProtocols) {
		ow.status = code
	}
	ow.ResponseWriter.WriteHeader(code)
}

// Write answers 200 when nothing was written before, as net/http does.
func (ow *outcomeWriter) Write(b []byte) (int, error) {
	ow.wrote()
	return ow.ResponseWriter.Write(b)
}

// ReadFrom keeps the writer's io.ReaderFrom (net/http's sends a file with sendfile); it
// answers 200 when it wrote something and nothing was written before.
func (ow *outcomeWriter) ReadFrom(src io.Reader) (int64, error) {
	rf, ok := ow.ResponseWriter.(io.ReaderFrom)
	if !ok {
		return io.Copy(writerOnly{ow}, src)
	}
	n, err := rf.ReadFrom(src)
	if n > 0 {
		ow.wrote()
	}
	return n, err
}

// Unwrap returns the writer ow wraps, for http.ResponseController.
func (ow *outcomeWriter) Unwrap() http.ResponseWriter { return ow.ResponseWriter }

func (ow *outcomeWriter) wrote() {
	if ow.status == 0 {
		ow.status = http.StatusOK
	}
}

// flushError flushes the writer ow wraps, which answers 200 when nothing was written before.
func (ow *outcomeWriter) flushError() error {
	ow.wrote()
	return http.NewResponseController(ow.ResponseWriter).Flush()
}

// hijack hijacks the connection of the writer ow wraps; once it did, the request has no status.
func (ow *outcomeWriter) hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, rw, err := http.NewResponseController(ow.ResponseWriter).Hijack()
	if err == nil {
		ow.hijacked = true
	}
	return c, rw, err
}

// writerOnly hides a writer's ReadFrom from io.Copy.
type writerOnly struct{ io.Writer }

type flushWriter struct{ *outcomeWriter }

func (w flushWriter) Flush()            { _ = w.flushError() }
func (w flushWriter) FlushError() error { return w.flushError() }

type hijackWriter struct{ *outcomeWriter }

func (w hijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) { return w.hijack() }

type flushHijackWriter struct{ *outcomeWriter }

func (w flushHijackWriter) Flush()            { _ = w.flushError() }
func (w flushHijackWriter) FlushError() error { return w.flushError() }
func (w flushHijackWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return w.hijack()
}
