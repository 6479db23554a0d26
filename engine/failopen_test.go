package engine_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// endedCall is one kind of call a fail-open engine takes, made on ctx: whether it admitted
// (or granted), the BackendErr it carried, and its error.
type endedCall struct {
	name string
	call func(ctx context.Context) (admitted bool, backendErr, err error)
}

// endedCalls are every kind of call that can admit, on full (a key used up under l), lease (a
// lease key whose one slot is held by held) and a fresh key of AllowAll's.
func endedCalls(t *testing.T, e *engine.Engine, full string, l engine.Limit, leaseKey string, held engine.Lease) []endedCall {
	p := engine.Policy{l, engine.PerMinute(1000)}
	result := func(r engine.Result, err error) (bool, error, error) { return r.Allowed, r.BackendErr, err }
	return []endedCall{
		{"Allow", func(ctx context.Context) (bool, error, error) { return result(e.Allow(ctx, full, l)) }},
		{"AllowN", func(ctx context.Context) (bool, error, error) { return result(e.AllowN(ctx, full, l, 2)) }},
		{"AllowPolicy", func(ctx context.Context) (bool, error, error) { return result(e.AllowPolicy(ctx, full, p, 1)) }},
		{"Peek", func(ctx context.Context) (bool, error, error) { return result(e.Peek(ctx, full, l)) }},
		{"PeekPolicy", func(ctx context.Context) (bool, error, error) { return result(e.PeekPolicy(ctx, full, p, 1)) }},
		{"Wait", func(ctx context.Context) (bool, error, error) { return result(e.Wait(ctx, full, l)) }},
		{"Record", func(ctx context.Context) (bool, error, error) {
			err := e.Record(ctx, full, l.Max, l.Window, time.Now())
			return err == nil, nil, err
		}},
		{"Check", func(ctx context.Context) (bool, error, error) {
			err := e.Check(ctx, full, l.Max, l.Window, time.Now())
			return err == nil, nil, err
		}},
		{"AllowAll", func(ctx context.Context) (bool, error, error) {
			ok, rs, err := e.AllowAll(ctx, []engine.Request{{Key: full, Policy: engine.Policy{l}, N: 1},
				{Key: enginetest.NewKey(t), Policy: engine.Policy{l}, N: 1}})
			var backendErr error
			if len(rs) > 0 {
				backendErr = rs[0].BackendErr
			}
			return ok, backendErr, err
		}},
		{"Acquire", func(ctx context.Context) (bool, error, error) {
			got, err := e.Acquire(ctx, leaseKey, 1, time.Minute)
			return err == nil, got.BackendErr, err
		}},
		{"Extend", func(ctx context.Context) (bool, error, error) {
			got, err := e.Extend(ctx, held, time.Minute)
			return err == nil, got.BackendErr, err
		}},
	}
}

// Under fail-open, a caller's own end is never an admission, on any kind of call: a context
// that ended before the call (what grpc-go hands an interceptor once a stream's grpc-timeout
// has run out), one cancelled, and one whose deadline passes while the server does not answer
// (stopped with SIGSTOP) each get the context's error, and nothing is admitted or recorded.
// A bound on the server's answer that the caller sets for the server's sake (a context that
// ends with a cause wrapping ErrUnavailable) is the server's failure, and fails open.
func TestFailOpenNeverAdmitsOnTheCallersEnd(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	ctx := context.Background()
	l := engine.PerHour(3)
	for _, batching := range []bool{true, false} {
		t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) {
			open := enginetest.New(t, c, engine.WithFailOpen(true), engine.WithBatching(batching))
			full, leaseKey := enginetest.NewKey(t), enginetest.NewKey(t)
			enginetest.MustAllowN(t, open, full, l, l.Max)
			held := mustAcquire(t, open, leaseKey, 1, time.Hour)
			calls := endedCalls(t, open, full, l, leaseKey, held)

			expired, cancelExpired := context.WithDeadline(ctx, time.Now().Add(-time.Millisecond))
			defer cancelExpired()
			cancelled, cancelNow := context.WithCancel(ctx)
			cancelNow()
			for _, ended := range []struct {
				name string
				ctx  context.Context
				want error
			}{{"deadline passed", expired, context.DeadlineExceeded}, {"cancelled", cancelled, context.Canceled}} {
				for _, k := range calls {
					admitted, backendErr, err := k.call(ended.ctx)
					if admitted || backendErr != nil || !errors.Is(err, ended.want) {
						t.Errorf("%s, %s: admitted %v, BackendErr %v, error %v; want %v and no admission", k.name, ended.name, admitted, backendErr, err, ended.want)
					}
				}
			}

			// The server stops answering; each call's 20 ms deadline passes while it waits.
			if err := own.Pause(); err != nil {
				t.Fatal(err)
			}
			resumed := false
			defer func() {
				if !resumed {
					_ = own.Resume()
				}
			}()
			for _, k := range calls {
				tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
				admitted, backendErr, err := k.call(tctx)
				cancel()
				if admitted || backendErr != nil || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s, deadline passed while the server was stopped: admitted %v, BackendErr %v, error %v; want DeadlineExceeded and no admission",
						k.name, admitted, backendErr, err)
				}
			}
			// The same wait, bounded for the server's sake, is the server's failure: fail-open.
			for _, k := range calls[:1] {
				bctx, cancel := context.WithTimeoutCause(ctx, 20*time.Millisecond, engine.ErrUnavailable)
				admitted, backendErr, err := k.call(bctx)
				cancel()
				if !admitted || !errors.Is(backendErr, engine.ErrUnavailable) || err != nil {
					t.Errorf("%s, a bound on the server's answer passed: admitted %v, BackendErr %v, error %v; want a fail-open admission",
						k.name, admitted, backendErr, err)
				}
			}
			bctx, cancel := context.WithTimeoutCause(ctx, 20*time.Millisecond, engine.ErrUnavailable)
			lease, err := open.Acquire(bctx, leaseKey, 1, time.Minute)
			cancel()
			if err != nil || !errors.Is(lease.BackendErr, engine.ErrUnavailable) {
				t.Errorf("Acquire, a bound on the server's answer passed: %+v, %v; want a fail-open lease", lease, err)
			}
			if err := own.Resume(); err != nil {
				t.Fatal(err)
			}
			resumed = true
			// Whatever the server runs of the abandoned calls once it resumes (each denies),
			// the key still holds its 3 events, and its lease key its one holder.
			enginetest.Want(t, "events of the used-up key", enginetest.StoredEvents(t, c, full), int64(l.Max))
			if _, err := open.Acquire(ctx, leaseKey, 1, time.Minute); !errors.Is(err, engine.ErrRateLimitExceeded) {
				t.Errorf("Acquire of the full lease key after the storm: %v, want it still full", err)
			}
		})
	}
}
