package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// A caller whose context is live gets its decision whatever another caller's deadline does on
// the same connection: never ErrUnavailable, and under fail-open never an admission without a
// decision. The short-deadline caller's call is in flight alone on a fresh connection (one per
// client here, so that both calls share it) while the server is stopped; its deadline passes;
// the victim's call, queued behind it, must still be answered once the server runs again. Each
// victim takes another path than the short-deadline caller's decision: a peek, AllowAll, a
// lease, a refund, and a decision of another engine on the same client.
func TestAnotherCallersDeadlineNeverFailsMine(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	setup := enginetest.New(t, own.Client(t))
	usedUp, l := enginetest.NewKey(t), engine.PerHour(1)
	enginetest.MustAllowN(t, setup, usedUp, l, 1)
	refundedKey := enginetest.NewKey(t)
	refunded := enginetest.MustAllowN(t, setup, refundedKey, engine.PerHour(5), 1)

	victims := map[string]func(ctx context.Context, e *engine.Engine) error{
		"Peek": func(ctx context.Context, e *engine.Engine) error {
			r, err := e.Peek(ctx, usedUp, l)
			return wantDenial(r, err)
		},
		"AllowAll": func(ctx context.Context, e *engine.Engine) error {
			allowed, rs, err := e.AllowAll(ctx, []engine.Request{
				{Key: usedUp, Policy: engine.Policy{l}, N: 1}, {Key: enginetest.NewKey(t), Policy: engine.Policy{l}, N: 1}})
			if err == nil && (allowed || rs[0].Allowed || rs[0].BackendErr != nil) {
				return errors.New("AllowAll admitted a used-up key")
			}
			return err
		},
		"Acquire": func(ctx context.Context, e *engine.Engine) error {
			lease, err := e.Acquire(ctx, enginetest.NewKey(t), 1, time.Minute)
			if err == nil && lease.BackendErr != nil {
				return lease.BackendErr
			}
			return err
		},
		"Refund": func(ctx context.Context, e *engine.Engine) error {
			return e.Refund(ctx, refundedKey, refunded)
		},
		"Allow on another engine": func(ctx context.Context, e *engine.Engine) error {
			r, err := e.Allow(ctx, usedUp, l)
			return wantDenial(r, err)
		},
	}
	for name, victim := range victims {
		t.Run(name, func(t *testing.T) {
			// A fresh client: valkey-go sends a call alone, on its caller's deadline, only on a
			// connection that has not yet seen two calls at once. One connection, so that both
			// calls share it.
			c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{own.Addr}, PipelineMultiplex: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			short := enginetest.New(t, c)
			other := enginetest.New(t, c, engine.WithFailOpen(true))
			if err := own.Pause(); err != nil {
				t.Fatal(err)
			}
			resumed := false
			defer func() {
				if !resumed {
					_ = own.Resume()
				}
			}()
			shortDone := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				_, err := short.Allow(ctx, enginetest.NewKey(t), l)
				shortDone <- err
			}()
			// Only the order matters here, and only to show the failure before the fix: the
			// victim's call should queue behind the short one, which is then in flight.
			time.Sleep(20 * time.Millisecond)
			victimDone := make(chan error, 1)
			go func() { victimDone <- victim(context.Background(), other) }()
			if err := <-shortDone; !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("the short-deadline caller: %v, want its own deadline", err)
			}
			if err := own.Resume(); err != nil {
				t.Fatal(err)
			}
			resumed = true
			if err := <-victimDone; err != nil {
				t.Fatalf("the victim, whose context is live, failed: %v", err)
			}
		})
	}
}

// wantDenial returns nil for a decision that denied, else what was wrong with it.
func wantDenial(r engine.Result, err error) error {
	switch {
	case err != nil:
		return err
	case r.BackendErr != nil:
		return r.BackendErr
	case r.Allowed:
		return errors.New("a used-up key was admitted")
	}
	return nil
}
