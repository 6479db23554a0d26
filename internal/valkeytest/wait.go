package valkeytest

import (
	"context"
	"fmt"
	"time"
)

// pollInterval is how long WaitFor sleeps between two tries of its condition.
const pollInterval = 20 * time.Millisecond

// WaitFor calls cond every 20ms until cond reports done, and then returns nil. It stops with an
// error that names what was awaited when cond returns an error, when limit has passed since
// the first try, or when ctx ends. Tests use it for whatever becomes true on its own (a
// replica's copy, a failover, a restarted server) instead of sleeping a guessed time.
func WaitFor(ctx context.Context, limit time.Duration, what string, cond func() (done bool, err error)) error {
	deadline := time.Now().Add(limit)
	for {
		done, err := cond()
		if err != nil {
			return fmt.Errorf("valkeytest: waiting for %s: %w", what, err)
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("valkeytest: %s did not happen within %s", what, limit)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("valkeytest: waiting for %s: %w", what, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}
