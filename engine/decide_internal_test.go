package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// Fail-open admits with the error in BackendErr, stamped by the engine's own clock when it has
// one; fail-closed returns the error; a caller's cancellation or passed deadline is returned
// either way, unless that deadline was a bound on the server's answer (its cause
// ErrUnavailable).
func TestBackendFailureFollowsFailOpen(t *testing.T) {
	at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	boom := errors.New("boom")
	open := &Engine{failOpen: true, clock: func() time.Time { return at }}
	r, err := open.backendFailure(context.Background(), boom)
	if err != nil || !r.Allowed || r.BackendErr != boom || !r.At.Equal(at) {
		t.Fatalf("fail-open with a clock: %+v, %v; want admitted at %s carrying the error", r, err, at)
	}
	r, err = (&Engine{failOpen: true}).backendFailure(context.Background(), boom)
	if err != nil || !r.Allowed || time.Since(r.At) > time.Minute {
		t.Fatalf("fail-open without a clock: %+v, %v; want admitted at about now", r, err)
	}
	if r, err := (&Engine{}).backendFailure(context.Background(), boom); err != boom || r.Allowed {
		t.Fatalf("fail-closed: %+v, %v; want the error and a denial", r, err)
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	if r, err := open.backendFailure(cancelled, boom); err != boom || r.Allowed {
		t.Fatalf("fail-open, caller cancelled: %+v, %v; want the error", r, err)
	}
	expired, cancelExpired := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelExpired()
	if r, err := open.backendFailure(expired, boom); err != boom || r.Allowed {
		t.Fatalf("fail-open, caller's deadline passed: %+v, %v; want the error", r, err)
	}
	deadline := fmt.Errorf("allow: %w", context.DeadlineExceeded)
	if r, err := open.backendFailure(context.Background(), deadline); err != deadline || r.Allowed {
		t.Fatalf("fail-open, an error that says the caller's deadline passed: %+v, %v; want the error", r, err)
	}
	bounded, cancelBounded := context.WithDeadlineCause(context.Background(), time.Now().Add(-time.Second), ErrUnavailable)
	defer cancelBounded()
	if r, err := open.backendFailure(bounded, deadline); err != nil || !r.Allowed {
		t.Fatalf("fail-open, a bound on the server's answer passed: %+v, %v; want an admission", r, err)
	}
	layout := fmt.Errorf("allow: %w: the key holds a hash", ErrUnknownLayout)
	if r, err := open.backendFailure(context.Background(), layout); err != layout || r.Allowed {
		t.Fatalf("fail-open, a key of another layout: %+v, %v; want the error, not an admission", r, err)
	}
}
