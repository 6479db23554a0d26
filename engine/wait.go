package engine

import (
	"context"
	"fmt"
	"time"
)

// Wait blocks until one event for key is admitted by l, and returns that admission: WaitN
// with n = 1.
func (e *Engine) Wait(ctx context.Context, key string, l Limit) (Result, error) {
	return e.WaitN(ctx, key, l, 1)
}

// WaitN blocks until n events for key are admitted by l, all at once, and returns that admission.
// After each denial it sleeps exactly the denial's RetryAfter and asks again (so a waiter that
// others beat to the remaining events waits again, and every admission is taken once). It returns
// at once, with a *DeniedError that also matches context.DeadlineExceeded, when the next wait would
// pass the context's deadline, as rate.Limiter.Wait does; it returns the context's error if the
// context ends while it sleeps. n above l.Max could never be admitted: ErrInvalidArgument, as for
// AllowN. Under WithFailOpen a backend failure admits, and under WithShadow every request is
// admitted at once. A caller's clock (WithClock) must move for a wait to end: the sleeps are real
// time.
func (e *Engine) WaitN(ctx context.Context, key string, l Limit, n int) (Result, error) {
	if err := checkContext(ctx); err != nil {
		return Result{}, err
	}
	if err := validate(key, l, n); err != nil {
		return Result{}, err
	}
	for {
		r, err := e.AllowN(ctx, key, l, n)
		if err != nil || r.Allowed {
			return r, err
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < r.RetryAfter {
			return r, fmt.Errorf("strictrate: wait %q for %d: retry after %s would pass the context's deadline: %w: %w",
				key, n, r.RetryAfter, &DeniedError{Key: key, Result: r}, context.DeadlineExceeded)
		}
		timer := time.NewTimer(r.RetryAfter)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return r, fmt.Errorf("strictrate: wait %s for %d: %w", quoteKey(key), n, ctx.Err())
		}
	}
}
