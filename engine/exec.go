package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/loader"
)

// scripts lists every script the engine runs, for Preload.
func (e *Engine) scripts() []*loader.Script {
	return []*loader.Script{e.decides.single, e.decides.batch, e.peeks.single, e.peeks.batch, e.settle, e.inspect,
		e.acquire, e.extend, e.release}
}

// runDecision takes one decision (or peek) through c and turns the server's answer into a
// Result. Every scripted decision goes through here, batched or not, so the acknowledgement
// (WithReplicaAck, WithDurableAck) and fail-open policies apply to all of them. A denial
// ignores what its call's WAIT answered (a call that only denied sends no WAITAOF): only an
// admission is refused for it. The reply is the shape decide.lua documents; its limit position
// and default reset_after refer to req.limits (ascending windows).
func (e *Engine) runDecision(ctx context.Context, c *committer, op string, req request) (Result, error) {
	// Built only on failure: a successful decision allocates nothing for its error context.
	what := func() string {
		return "strictrate: " + op + " " + quoteKey(strings.TrimPrefix(req.key, e.prefix))
	}
	cached := e.denials != nil && c == e.decides
	var sent time.Time
	if cached {
		sent = e.callerNow()
		if r, ok := e.denials.lookup(req.key, req.set, req.n, sent); ok {
			return r, nil
		}
	}
	var out outcome
	if e.batching {
		out = c.do(ctx, req)
	} else {
		cl := call{ctx: ctx, req: req}
		c.sendOne(ctx, &cl)
		out = cl.out
	}
	if out.err != nil {
		return e.backendFailure(ctx, classify(ctx, what(), out.err))
	}
	if out.replyErr != nil {
		return e.backendFailure(ctx, fmt.Errorf("%s: %w", what(), out.replyErr))
	}
	r, err := decodeReply(out.vals[:out.nvals], req.n, req.set.limits)
	if err != nil {
		return e.backendFailure(ctx, fmt.Errorf("%s: %w", what(), err))
	}
	if c.ack && r.Allowed {
		if err := e.acking.check(ctx, out.ack); err != nil {
			return e.backendFailure(ctx, fmt.Errorf("%s: %w", what(), err))
		}
	}
	if cached && !r.Allowed {
		e.denials.store(req.key, req.set, req.n, r, sent, e.callerNow())
	}
	return r, nil
}

// finish applies shadow mode to a decision taken through op since started, and counts it.
func (e *Engine) finish(ctx context.Context, op operation, started time.Time, r Result, err error) (Result, error) {
	oc := outcomeAllowed
	switch {
	case err != nil:
		oc = outcomeError
	case r.BackendErr != nil:
		oc = outcomeFailOpen
	case r.Allowed:
	case e.shadow:
		r.Allowed, r.ShadowDenied = true, true
		oc = outcomeShadowDenied
	case r.FromCache:
		oc = outcomeCacheDenied
	default:
		oc = outcomeDenied
	}
	e.metrics.record(ctx, op, oc, time.Since(started))
	return r, err
}

// forgetDenials drops the deny cache's denials of the full key, whose room may have come back.
func (e *Engine) forgetDenials(fullKey string) {
	if e.denials != nil {
		e.denials.forget(fullKey)
	}
}

// runAcked sends script s for the full key fullKey and hands its reply to read, which decodes
// it and reports whether the call granted something (a lease, an extension). With
// WithReplicaAck or WithDurableAck, a writing script goes with WAIT in its round trip and is
// followed by WAITAOF when it granted, and a grant not held where it was asked to be is an
// error wrapping ErrUnavailable. Errors are wrapped with what() and classified; the fail-open
// policy is the caller's to apply.
func (e *Engine) runAcked(ctx context.Context, s *loader.Script, what func() string, fullKey string, args []string, read func(valkey.ValkeyResult) (granted bool, err error)) error {
	ack := e.acking.on() && !s.ReadOnly()
	var granted bool
	var replyErr, readErr error
	got := e.execAcked(ctx, s, ack, []string{fullKey}, args, func(reply valkey.ValkeyResult) bool {
		if replyErr = reply.Error(); replyErr != nil {
			return false
		}
		granted, readErr = read(reply)
		return granted && readErr == nil
	})
	if replyErr != nil {
		return classify(ctx, what(), replyErr)
	}
	if readErr != nil {
		return fmt.Errorf("%s: %w", what(), readErr)
	}
	if ack && granted {
		if err := e.acking.check(ctx, got); err != nil {
			return fmt.Errorf("%s: %w", what(), err)
		}
	}
	return nil
}

// execAcked runs s with keys and args, hands the script's reply to read (once, error replies
// included), and returns what the acknowledgements the engine asks for answered, when ack is
// set: WAIT in the same round trip; and with WithDurableAck, on a connection held for the
// call, WAITAOF right after the reply when read reports that the call admitted something.
func (e *Engine) execAcked(ctx context.Context, s *loader.Script, ack bool, keys, args []string, read func(valkey.ValkeyResult) (admits bool)) acks {
	if !ack {
		read(s.Exec(ctx, e.client, keys, args))
		return acks{}
	}
	if !e.acking.waitAOF() {
		reply, after := s.ExecThen(ctx, e.client, keys, args, func(cmds []valkey.Completed) []valkey.Completed {
			return e.acking.inline(e.client.B(), cmds)
		})
		read(reply)
		return e.acking.readInline(after)
	}
	// WAITAOF waits for the writes of the connection it is sent on: the call's own, so both go
	// on one connection held for the call.
	var got acks
	_ = e.client.Dedicated(func(dc valkey.DedicatedClient) error {
		reply, after := s.ExecThen(ctx, dc, keys, args, func(cmds []valkey.Completed) []valkey.Completed {
			return e.acking.inline(dc.B(), cmds)
		})
		got = e.acking.readInline(after)
		if read(reply) && reply.Error() == nil {
			got = e.acking.readAfter(got, dc.Do(ctx, e.acking.afterAdmission(dc.B())))
		}
		return nil
	})
	return got
}

// backendFailure applies the fail-open policy to a decision the server could not take. Closed
// (the default): a denying Result and the error. Open: an admitting Result that carries the
// error, and no error; except when the caller cancelled, which is returned as it is.
func (e *Engine) backendFailure(ctx context.Context, err error) (Result, error) {
	if !e.failOpen || errors.Is(ctx.Err(), context.Canceled) {
		return Result{}, err
	}
	return Result{Allowed: true, BackendErr: err, At: e.callerNow()}, nil
}
