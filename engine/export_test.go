package engine

import (
	"context"
	"time"
)

// Reserve is reserve, for the tests of package engine_test: reservations are local quota's
// ground, not yet part of the API.
func (e *Engine) Reserve(ctx context.Context, key string, p Policy, k int, hold time.Duration) (Result, error) {
	return e.reserve(ctx, key, p, k, hold)
}
