package engine_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/pipelined"
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

// A caller's deadline bounds its call while the connection the call needs is being made: a
// server that accepts connections and does not answer (stopped here) holds valkey-go's
// greeting of a new connection for the client's dial and write timeouts (a minute each here),
// whatever the call's context. Each kind of call, on a client whose connection the server has just closed,
// must come back with an error long before that, with the server still stopped. (Before the
// engine sent such a call on a goroutine of its own, the one that made the connection waited
// for the dial timeout.)
func TestDeadlineHoldsWhileTheConnectionIsMade(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	admin := own.Client(t)
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{own.Addr}, PipelineMultiplex: -1,
		Dialer: net.Dialer{Timeout: time.Minute}, ConnWriteTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := enginetest.New(t, c)
	pe, err := pipelined.New(c)
	if err != nil {
		t.Fatal(err)
	}
	l := engine.PerHour(10)
	refundKey := enginetest.NewKey(t)
	admitted := enginetest.MustAllowN(t, e, refundKey, l, 1)
	calls := map[string]func(ctx context.Context) error{
		"Allow": func(ctx context.Context) error { _, err := e.Allow(ctx, enginetest.NewKey(t), l); return err },
		"Peek":  func(ctx context.Context) error { _, err := e.Peek(ctx, enginetest.NewKey(t), l); return err },
		"AllowAll": func(ctx context.Context) error {
			_, _, err := e.AllowAll(ctx, []engine.Request{{Key: enginetest.NewKey(t), Policy: engine.Policy{l}, N: 1}})
			return err
		},
		"Acquire": func(ctx context.Context) error {
			_, err := e.Acquire(ctx, enginetest.NewKey(t), 1, time.Minute)
			return err
		},
		"Refund":          func(ctx context.Context) error { return e.Refund(ctx, refundKey, admitted) },
		"Reset":           func(ctx context.Context) error { return e.Reset(ctx, enginetest.NewKey(t)) },
		"pipelined.Allow": func(ctx context.Context) error { _, err := pe.Allow(ctx, enginetest.NewKey(t), l); return err },
		"pipelined.Reset": func(ctx context.Context) error { return pe.Reset(ctx, enginetest.NewKey(t)) },
	}
	const deadline, bound = 200 * time.Millisecond, 10 * time.Second
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			// The server closes the client's connection, and stops: the client notices on its
			// next call (an error at once, or a new connection), and makes a new one on the
			// call after at the latest, which the server never greets.
			if err := admin.Do(context.Background(), admin.B().ClientKill().TypeNormal().SkipmeYes().Build()).Error(); err != nil {
				t.Fatal(err)
			}
			if err := own.Pause(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := own.Resume(); err != nil {
					t.Fatal(err)
				}
			}()
			for i := range 2 {
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				began := time.Now()
				err := call(ctx)
				took := time.Since(began)
				cancel()
				if err == nil || took > bound {
					t.Fatalf("call %d with the server stopped: %v after %s; want an error well before the dial timeout (a minute)", i+1, err, took)
				}
			}
		})
	}
}
