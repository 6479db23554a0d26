package engine

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/strictrate/strictrate/loader"
)

// scripts lists every script the engine runs, for Preload.
func (e *Engine) scripts() []*loader.Script {
	return []*loader.Script{e.decides.single, e.decides.batch, e.peeks.single, e.peeks.batch, e.settle, e.inspect}
}

// runDecision takes one decision (or peek) through c and turns the server's answer into a
// Result. Every scripted decision goes through here, batched or not, so the acknowledgement
// (WithReplicaAck, WithDurableAck) and fail-open policies apply to all of them. A denial
// ignores what its call's WAIT or WAITAOF answered: only an admission is refused for it. The reply is the shape decide.lua documents; its
// limit position and default reset_after refer to req.limits (ascending windows).
func (e *Engine) runDecision(ctx context.Context, c *committer, op string, req request) (Result, error) {
	// Built only on failure: a successful decision allocates nothing for its error context.
	what := func() string {
		return "strictrate: " + op + " " + strconv.Quote(strings.TrimPrefix(req.key, e.prefix))
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
		if err := e.acking.check(out.ack); err != nil {
			return e.backendFailure(ctx, fmt.Errorf("%s: %w", what(), err))
		}
	}
	return r, nil
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
