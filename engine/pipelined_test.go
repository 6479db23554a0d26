package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// keyState is what a key holds, as the server serializes it (DUMP; "" for no key), and its
// expiry in milliseconds (PTTL): enough to tell whether a call touched it.
type keyState struct {
	dump string
	pttl int64
}

func stateOf(t *testing.T, c valkey.Client, full string) keyState {
	t.Helper()
	ctx := context.Background()
	dump, err := c.Do(ctx, c.B().Dump().Key(full).Build()).ToString()
	if valkey.IsValkeyNil(err) {
		dump, err = "", nil
	}
	if err != nil {
		t.Fatalf("DUMP %s: %v", full, err)
	}
	return keyState{dump: dump, pttl: enginetest.PTTL(t, c, full)}
}

// wantUntouched fails t unless full holds what it held (before), with the expiry it had: no
// later than before (a write would have set it anew) and within a second of it.
func wantUntouched(t *testing.T, c valkey.Client, what, full string, before keyState) {
	t.Helper()
	after := stateOf(t, c, full)
	if after.dump != before.dump {
		t.Errorf("%s changed what %s holds", what, full)
	}
	if after.pttl > before.pttl || before.pttl >= 0 && after.pttl < before.pttl-1000 || (before.pttl < 0) != (after.pttl < 0) {
		t.Errorf("%s moved %s's expiry: PTTL %d, then %d", what, full, before.pttl, after.pttl)
	}
}

// The seed article's own sequence, in Pipelined mode, on its own layout: Record until the
// limit, then Check and Peek deny without recording, Clear empties the key, and Check admits
// again. Fail-open changes none of it: a full key is a denial, not a failure to admit on.
func TestPipelinedArticleSequence(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	for _, failOpen := range []bool{false, true} {
		e := enginetest.New(t, c, engine.WithMode(engine.Pipelined), engine.WithFailOpen(failOpen))
		key, l := enginetest.NewKey(t), engine.PerMinute(3)
		now := time.Now()
		for i := range l.Max {
			if err := e.Check(ctx, key, l.Max, l.Window, now); err != nil {
				t.Fatalf("fail-open %v: Check before event %d: %v", failOpen, i+1, err)
			}
			if err := e.Record(ctx, key, l.Max, l.Window, now); err != nil {
				t.Fatalf("fail-open %v: Record %d: %v", failOpen, i+1, err)
			}
		}
		var denied *engine.DeniedError
		if err := e.Check(ctx, key, l.Max, l.Window, now); !errors.As(err, &denied) || denied.Result.Remaining != 0 {
			t.Fatalf("fail-open %v: Check of a full key: %v, want a *DeniedError with 0 remaining", failOpen, err)
		}
		r, err := e.Peek(ctx, key, l)
		if err != nil || r.Allowed || r.Remaining != 0 || r.RetryAfter != l.Window || r.BackendErr != nil {
			t.Fatalf("fail-open %v: Peek of a full key: %+v, %v; want denied, retry after the window", failOpen, r, err)
		}
		enginetest.Want(t, "events after Check and Peek", enginetest.StoredEvents(t, c, key), int64(l.Max))
		if err := e.Clear(ctx, key); err != nil {
			t.Fatal(err)
		}
		if err := e.Check(ctx, key, l.Max, l.Window, now); err != nil {
			t.Fatalf("fail-open %v: Check after Clear: %v", failOpen, err)
		}
		if r, err := e.Peek(ctx, key, l); err != nil || !r.Allowed || r.Remaining != l.Max || r.ResetAfter != 0 {
			t.Fatalf("fail-open %v: Peek of an empty key: %+v, %v; want admitted, %d remaining", failOpen, r, err, l.Max)
		}
		// A Policy of one limit is the pipeline too.
		if r := enginetest.MustAllowPolicy(t, e, key, engine.Policy{l}, 2); !r.Allowed || r.Remaining != 1 {
			t.Fatalf("fail-open %v: AllowPolicy of one limit: %+v", failOpen, r)
		}
		if r, err := e.PeekPolicy(ctx, key, engine.Policy{l}, 2); err != nil || r.Allowed || r.Remaining != 1 {
			t.Fatalf("fail-open %v: PeekPolicy of one limit, 2 more: %+v, %v; want denied with 1 remaining", failOpen, r, err)
		}
		if typ := valkeytest.Must(t, "TYPE", c.Do(ctx, c.B().Type().Key(enginetest.Prefix+key).Build()), valkey.ValkeyResult.ToString); typ != "zset" {
			t.Fatalf("fail-open %v: the key holds a %s, want Pipelined mode's sorted set", failOpen, typ)
		}
	}
}

// What Pipelined mode does not offer returns ErrUnsupported (and errors.ErrUnsupported), under
// fail-open too, and touches neither the key's log nor its leases.
func TestPipelinedUnsupportedTouchesNothing(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	atomic := enginetest.New(t, c)
	for _, failOpen := range []bool{false, true} {
		e := enginetest.New(t, c, engine.WithMode(engine.Pipelined), engine.WithFailOpen(failOpen))
		key, l := enginetest.NewKey(t), engine.PerMinute(5)
		enginetest.MustAllowN(t, e, key, l, 2)
		full := enginetest.Prefix + key
		leases := enginetest.Prefix + engine.LeaseNamespace + key
		before := stateOf(t, c, full)
		// A Result with an entry, as an Atomic engine's admission makes, and a held lease.
		other := enginetest.NewKey(t)
		admitted := enginetest.MustAllowN(t, atomic, other, l, 1)
		admitted.Entry.Key = full
		lease := engine.Lease{Key: key, ID: uuid.New()}
		two := engine.Policy{engine.PerSecond(1), l}
		calls := map[string]func() error{
			"AllowPolicy of two limits": func() error { _, err := e.AllowPolicy(ctx, key, two, 1); return err },
			"PeekPolicy of two limits":  func() error { _, err := e.PeekPolicy(ctx, key, two, 1); return err },
			"Refund":                    func() error { return e.Refund(ctx, key, admitted) },
			"Settle":                    func() error { return e.Settle(ctx, key, admitted, 0) },
			"Inspect":                   func() error { _, err := e.Inspect(ctx, key, 0); return err },
			"Acquire":                   func() error { _, err := e.Acquire(ctx, key, 2, time.Minute); return err },
			"Extend":                    func() error { _, err := e.Extend(ctx, lease, time.Minute); return err },
			"Release":                   func() error { return e.Release(ctx, lease) },
		}
		for name, call := range calls {
			err := call()
			if !errors.Is(err, engine.ErrUnsupported) || !errors.Is(err, errors.ErrUnsupported) {
				t.Errorf("fail-open %v: %s: %v, want ErrUnsupported", failOpen, name, err)
			}
			wantUntouched(t, c, name, full, before)
			if n := valkeytest.Must(t, "EXISTS", c.Do(ctx, c.B().Exists().Key(leases).Build()), valkey.ValkeyResult.AsInt64); n != 0 {
				t.Errorf("fail-open %v: %s made the key's lease set", failOpen, name)
			}
		}
	}
}

// Each mode keeps to its own layout: an Atomic engine refuses Pipelined mode's sorted set, and
// a Pipelined engine an Atomic engine's log, with ErrUnknownLayout naming what the key holds;
// neither reads the other's as a count, converts it or admits on it under fail-open.
func TestModesKeepToTheirOwnKeys(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	for _, failOpen := range []bool{false, true} {
		atomic := enginetest.New(t, c, engine.WithFailOpen(failOpen))
		pipelined := enginetest.New(t, c, engine.WithMode(engine.Pipelined), engine.WithFailOpen(failOpen))
		l := engine.PerMinute(5)

		zsetKey := enginetest.NewKey(t)
		enginetest.MustAllowN(t, pipelined, zsetKey, l, 2)
		before := stateOf(t, c, enginetest.Prefix+zsetKey)
		for name, call := range map[string]func() (engine.Result, error){
			"Allow": func() (engine.Result, error) { return atomic.Allow(ctx, zsetKey, l) },
			"AllowPolicy": func() (engine.Result, error) {
				return atomic.AllowPolicy(ctx, zsetKey, engine.Policy{engine.PerSecond(2), l}, 1)
			},
			"Peek": func() (engine.Result, error) { return atomic.Peek(ctx, zsetKey, l) },
		} {
			r, err := call()
			if !errors.Is(err, engine.ErrUnknownLayout) || r.Allowed || !containsAll(err.Error(), zsetKey, "zset") {
				t.Errorf("fail-open %v: Atomic %s of Pipelined mode's key: %+v, %v; want ErrUnknownLayout naming the key and a zset", failOpen, name, r, err)
			}
			wantUntouched(t, c, "Atomic "+name, enginetest.Prefix+zsetKey, before)
		}

		listKey := enginetest.NewKey(t)
		enginetest.MustAllowN(t, atomic, listKey, l, 2)
		before = stateOf(t, c, enginetest.Prefix+listKey)
		for name, call := range map[string]func() (engine.Result, error){
			"Allow": func() (engine.Result, error) { return pipelined.Allow(ctx, listKey, l) },
			"Peek":  func() (engine.Result, error) { return pipelined.Peek(ctx, listKey, l) },
		} {
			r, err := call()
			if !errors.Is(err, engine.ErrUnknownLayout) || r.Allowed || !containsAll(err.Error(), listKey, "list") {
				t.Errorf("fail-open %v: Pipelined %s of an Atomic log: %+v, %v; want ErrUnknownLayout naming the key and a list", failOpen, name, r, err)
			}
		}
		// The pipeline cannot look before it writes: its PEXPIRE sets the key's expiry (the
		// package doc says so), but the log itself is left as it was.
		if after := stateOf(t, c, enginetest.Prefix+listKey); after.dump != before.dump {
			t.Errorf("fail-open %v: a Pipelined call changed an Atomic log", failOpen)
		}
		if got := enginetest.StoredEvents(t, c, listKey); got != 2 {
			t.Errorf("fail-open %v: the Atomic log holds %d events, want 2", failOpen, got)
		}
	}
}
