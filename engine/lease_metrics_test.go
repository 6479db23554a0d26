package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// Lease calls are counted as decisions are: operation acquire, extend or release, with their
// outcome, a duration each; fail-open and errors as for decisions.
func TestLeaseMetrics(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	ctx := context.Background()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(ctx)
	e, clock := enginetest.Clocked(t, c, engine.WithMeterProvider(mp))
	open := enginetest.New(t, c, engine.WithMeterProvider(mp), engine.WithFailOpen(true))
	key := enginetest.NewKey(t)

	held, err := e.Acquire(ctx, key, 1, time.Second) // acquire/allowed
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Acquire(ctx, key, 1, time.Second); !errors.Is(err, engine.ErrRateLimitExceeded) { // acquire/denied
		t.Fatalf("second holder of one slot: %v", err)
	}
	if held, err = e.Extend(ctx, held, time.Second); err != nil { // extend/allowed
		t.Fatal(err)
	}
	if err := e.Release(ctx, held); err != nil { // release/allowed
		t.Fatal(err)
	}
	if err := e.Release(ctx, held); err != nil { // release/denied: nothing to release
		t.Fatal(err)
	}
	clock.Set(clock.Now().Add(time.Hour))
	if _, err := e.Extend(ctx, held, time.Second); !errors.Is(err, engine.ErrLeaseExpired) { // extend/denied
		t.Fatalf("extend of a released lease: %v", err)
	}
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if l, err := open.Acquire(tctx, key, 1, time.Second); err != nil || l.BackendErr == nil { // acquire/fail_open
		t.Fatalf("fail-open with the server down: %+v, %v", l, err)
	}
	if err := e.Release(tctx, held); err == nil { // release/error
		t.Fatal("release with the server down: no error")
	}

	got := collected(t, reader)
	want := map[string]int64{
		"acquire/allowed": 1, "acquire/denied": 1, "acquire/fail_open": 1,
		"extend/allowed": 1, "extend/denied": 1,
		"release/allowed": 1, "release/denied": 1, "release/error": 1,
	}
	for _, name := range []string{"strictrate.decisions", "strictrate.decision.duration"} {
		for attrs, n := range want {
			if got[name][attrs] != n {
				t.Errorf("%s{%s} = %d, want %d (all: %v)", name, attrs, got[name][attrs], n, got[name])
			}
		}
		if len(got[name]) != len(want) {
			t.Errorf("%s has points %v, want exactly %v", name, got[name], want)
		}
	}
}
