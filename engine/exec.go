package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
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
// Result. Every scripted decision goes through here, batched or not, so the replica-ack and
// fail-open policies apply to all of them. The reply is the shape decide.lua documents; its
// limit position and default reset_after refer to req.limits (ascending windows).
func (e *Engine) runDecision(ctx context.Context, c *committer, op string, req request) (Result, error) {
	// Built only on failure: a successful decision allocates nothing for its error context.
	what := func() string {
		return "strictrate: " + op + " " + strconv.Quote(strings.TrimPrefix(req.key, e.prefix))
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
		return e.backendFailure(ctx, classify(what(), out.err))
	}
	if out.replyErr != nil {
		return e.backendFailure(ctx, fmt.Errorf("%s: %w", what(), out.replyErr))
	}
	r, err := decodeReply(out.vals[:out.nvals], req.n, req.set.limits)
	if err != nil {
		return e.backendFailure(ctx, fmt.Errorf("%s: %w", what(), err))
	}
	if c.ack && r.Allowed {
		if err := e.checkAck(what, out.acked, out.ackErr); err != nil {
			return e.backendFailure(ctx, err)
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
// WithReplicaAck, a writing script goes with WAIT behind it, and a grant that fewer replicas
// acknowledged is an error wrapping ErrUnavailable. Errors are wrapped with what() and
// classified; the fail-open policy is the caller's to apply.
func (e *Engine) runAcked(ctx context.Context, s *loader.Script, what func() string, fullKey string, args []string, read func(valkey.ValkeyResult) (granted bool, err error)) error {
	keys := []string{fullKey}
	ack := e.ackReplicas > 0 && !s.ReadOnly()
	var reply, waited valkey.ValkeyResult
	if ack {
		reply, waited = s.ExecThen(ctx, e.client, keys, args, e.waitCommand)
	} else {
		reply = s.Exec(ctx, e.client, keys, args)
	}
	if err := reply.Error(); err != nil {
		return classify(what(), err)
	}
	granted, err := read(reply)
	if err != nil {
		return fmt.Errorf("%s: %w", what(), err)
	}
	if ack && granted {
		acked, err := waited.AsInt64()
		return e.checkAck(what, acked, err)
	}
	return nil
}

// checkAck judges a write's WAIT reply: nil when enough replicas acknowledged it, else an
// error wrapping ErrUnavailable (the write stays on the primary: it can only under-admit).
func (e *Engine) checkAck(what func() string, acked int64, err error) error {
	if err != nil {
		return classify(what()+": WAIT", err)
	}
	if acked < int64(e.ackReplicas) {
		return fmt.Errorf("%s: %w: admitted on the primary, but %d of %d replicas acknowledged it within %s",
			what(), ErrUnavailable, acked, e.ackReplicas, e.ackTimeout)
	}
	return nil
}

// waitCommand is WAIT for the configured replicas and timeout.
func (e *Engine) waitCommand() valkey.Completed {
	ms := int64(e.ackTimeout / time.Millisecond)
	if e.ackTimeout%time.Millisecond != 0 {
		ms++
	}
	return e.client.B().Wait().Numreplicas(int64(e.ackReplicas)).Timeout(ms).Build()
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
