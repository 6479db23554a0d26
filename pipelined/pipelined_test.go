package pipelined_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/pipelined"
)

// server is the one Valkey every test in this package shares; tests keep apart by key.
var server *valkeytest.Server

func TestMain(m *testing.M) { valkeytest.Main(m, &server) }

// newEngine is a pipelined engine on c, failing t when New does.
func newEngine(t *testing.T, c valkey.Client, opts ...pipelined.Option) *pipelined.Engine {
	t.Helper()
	e, err := pipelined.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// The classic design's own sequence, on its own layout: Record until the limit, then Check and
// Peek deny without recording, Clear empties the key, and Check admits again.
func TestClassicSequence(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	e := newEngine(t, c)
	key, l := enginetest.NewKey(t), engine.PerMinute(3)
	now := time.Now()
	for i := range l.Max {
		if err := e.Check(ctx, key, l.Max, l.Window, now); err != nil {
			t.Fatalf("Check before event %d: %v", i+1, err)
		}
		if err := e.Record(ctx, key, l.Max, l.Window, now); err != nil {
			t.Fatalf("Record %d: %v", i+1, err)
		}
	}
	var denied *engine.DeniedError
	if err := e.Check(ctx, key, l.Max, l.Window, now); !errors.As(err, &denied) || denied.Result.Remaining != 0 {
		t.Fatalf("Check of a full key: %v, want a *DeniedError with 0 remaining", err)
	}
	r, err := e.Peek(ctx, key, l)
	if err != nil || r.Allowed || r.Remaining != 0 || r.RetryAfter != l.Window {
		t.Fatalf("Peek of a full key: %+v, %v; want denied, retry after the window", r, err)
	}
	if n := valkeytest.Must(t, "ZCARD", c.Do(ctx, c.B().Zcard().Key(enginetest.Prefix+key).Build()), valkey.ValkeyResult.AsInt64); n != int64(l.Max) {
		t.Fatalf("%d events after Check and Peek, want %d", n, l.Max)
	}
	if err := e.Clear(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := e.Check(ctx, key, l.Max, l.Window, now); err != nil {
		t.Fatalf("Check after Clear: %v", err)
	}
	if r, err := e.Peek(ctx, key, l); err != nil || !r.Allowed || r.Remaining != l.Max || r.ResetAfter != 0 {
		t.Fatalf("Peek of an empty key: %+v, %v; want admitted, %d remaining", r, err, l.Max)
	}
	if r, err := e.AllowN(ctx, key, l, 2); err != nil || !r.Allowed || r.Remaining != 1 {
		t.Fatalf("AllowN(2): %+v, %v; want admitted, 1 remaining", r, err)
	}
	if typ := valkeytest.Must(t, "TYPE", c.Do(ctx, c.B().Type().Key(enginetest.Prefix+key).Build()), valkey.ValkeyResult.ToString); typ != "zset" {
		t.Fatalf("the key holds a %s, want the pipelined log's sorted set", typ)
	}
}

// Its log keeps every attempt, the denied ones too: a key asked more than its limit within a
// window stays denied while the attempts stay in the window, where the engine admits again as
// soon as the admitted events leave.
func TestDeniedAttemptsStayInTheLog(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	clock := enginetest.NewClock(enginetest.T0)
	p := newEngine(t, c, pipelined.WithClock(clock.Now), pipelined.WithPrefix("pipelined:"))
	exact := enginetest.New(t, c, engine.WithClock(clock.Now))
	key, l := enginetest.NewKey(t), engine.PerSecond(3)
	for i := range 6 { // 3 admitted, 3 denied, 100 ms apart
		clock.Set(enginetest.T0.Add(time.Duration(i) * 100 * time.Millisecond))
		for name, allow := range map[string]func() (engine.Result, error){
			"pipelined": func() (engine.Result, error) { return p.Allow(ctx, key, l) },
			"engine":    func() (engine.Result, error) { return exact.Allow(ctx, key, l) },
		} {
			if r, err := allow(); err != nil || r.Allowed != (i < 3) {
				t.Fatalf("%s, request %d: %+v, %v", name, i, r, err)
			}
		}
	}
	// A second after the first: the admitted events left, the denied attempts did not.
	clock.Set(enginetest.T0.Add(time.Second + 150*time.Millisecond))
	if r, err := exact.Allow(ctx, key, l); err != nil || !r.Allowed {
		t.Fatalf("engine after the admitted events left: %+v, %v; want admitted", r, err)
	}
	if r, err := p.Allow(ctx, key, l); err != nil || r.Allowed {
		t.Fatalf("pipelined after the admitted events left: %+v, %v; want denied by the attempts it kept", r, err)
	}
}

// What the pipelined log cannot count (a Resolution, a calendar limit) is ErrUnsupported, and
// invalid input ErrInvalidArgument, before anything is sent.
func TestRefusedBeforeAnythingIsSent(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	e := newEngine(t, c)
	key := enginetest.NewKey(t)
	for name, l := range map[string]engine.Limit{
		"a resolution":     {Max: 10, Window: time.Minute, Resolution: time.Second},
		"a calendar month": engine.Calendar(3, engine.Month, time.UTC),
	} {
		for call, f := range map[string]func() error{
			"Allow":  func() error { _, err := e.Allow(ctx, key, l); return err },
			"AllowN": func() error { _, err := e.AllowN(ctx, key, l, 2); return err },
			"Peek":   func() error { _, err := e.Peek(ctx, key, l); return err },
		} {
			if err := f(); !errors.Is(err, pipelined.ErrUnsupported) || !errors.Is(err, errors.ErrUnsupported) {
				t.Errorf("%s with %s: %v, want ErrUnsupported", call, name, err)
			}
		}
	}
	for name, f := range map[string]func() error{
		"a negative resolution": func() error {
			_, err := e.Allow(ctx, key, engine.Limit{Max: 1, Window: time.Second, Resolution: -1})
			return err
		},
		"Max 0":            func() error { _, err := e.Allow(ctx, key, engine.Limit{Window: time.Second}); return err },
		"cost above Max":   func() error { _, err := e.AllowN(ctx, key, engine.PerSecond(2), 3); return err },
		"an empty key":     func() error { _, err := e.Allow(ctx, "", engine.PerSecond(2)); return err },
		"Record window 0":  func() error { return e.Record(ctx, key, 3, 0, time.Now()) },
		"Check zero time":  func() error { return e.Check(ctx, key, 3, time.Second, time.Time{}) },
		"a nil client New": func() error { _, err := pipelined.New(nil); return err },
	} {
		if err := f(); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	if n := valkeytest.Must(t, "EXISTS", c.Do(ctx, c.B().Exists().Key(enginetest.Prefix+key).Build()), valkey.ValkeyResult.AsInt64); n != 0 {
		t.Fatal("a refused call made the key")
	}
}

// Each keeps to its own layout: the engine refuses the pipelined log's sorted set, and the
// pipelined engine the engine's log, with ErrUnknownLayout naming what the key holds; neither
// reads the other's as a count.
func TestEachKeepsToItsOwnKeys(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	exact, p := enginetest.New(t, c), newEngine(t, c)
	l := engine.PerMinute(5)

	zsetKey := enginetest.NewKey(t)
	if _, err := p.AllowN(ctx, zsetKey, l, 2); err != nil {
		t.Fatal(err)
	}
	for name, call := range map[string]func() (engine.Result, error){
		"Allow": func() (engine.Result, error) { return exact.Allow(ctx, zsetKey, l) },
		"Peek":  func() (engine.Result, error) { return exact.Peek(ctx, zsetKey, l) },
	} {
		r, err := call()
		if !errors.Is(err, engine.ErrUnknownLayout) || r.Allowed || !strings.Contains(err.Error(), "zset") {
			t.Errorf("the engine's %s of a pipelined log: %+v, %v; want ErrUnknownLayout naming a zset", name, r, err)
		}
	}
	listKey := enginetest.NewKey(t)
	enginetest.MustAllowN(t, exact, listKey, l, 2)
	for name, call := range map[string]func() (engine.Result, error){
		"Allow": func() (engine.Result, error) { return p.Allow(ctx, listKey, l) },
		"Peek":  func() (engine.Result, error) { return p.Peek(ctx, listKey, l) },
	} {
		r, err := call()
		if !errors.Is(err, engine.ErrUnknownLayout) || r.Allowed || !strings.Contains(err.Error(), "list") {
			t.Errorf("the pipelined %s of an engine's log: %+v, %v; want ErrUnknownLayout naming a list", name, r, err)
		}
	}
	if got := enginetest.StoredEvents(t, c, listKey); got != 2 {
		t.Errorf("the engine's log holds %d events, want 2", got)
	}
}

// The classic interface is both engines': the same story through it.
func TestLimiterInterface(t *testing.T) {
	c := server.Client(t)
	for name, lim := range map[string]pipelined.Limiter{"engine": enginetest.New(t, c), "pipelined": newEngine(t, c)} {
		ctx, key := context.Background(), enginetest.NewKey(t)
		for i := range 3 {
			if err := lim.Record(ctx, key, 3, time.Second, enginetest.T0.Add(time.Duration(i)*100*time.Millisecond)); err != nil {
				t.Fatalf("%s: Record %d: %v", name, i, err)
			}
		}
		err := lim.Check(ctx, key, 3, time.Second, enginetest.T0.Add(500*time.Millisecond))
		if !errors.Is(err, engine.ErrRateLimitExceeded) {
			t.Fatalf("%s: Check when full: %v, want ErrRateLimitExceeded", name, err)
		}
		if err := lim.Clear(ctx, key); err != nil {
			t.Fatalf("%s: Clear: %v", name, err)
		}
		if err := lim.Check(ctx, key, 3, time.Second, enginetest.T0.Add(500*time.Millisecond)); err != nil {
			t.Fatalf("%s: Check after Clear: %v", name, err)
		}
	}
}
