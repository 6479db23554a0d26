package engine_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
	"github.com/strictrate/strictrate/internal/enginetest"
)

// containsAll reports whether s contains every one of subs.
func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

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

// A key that holds what this release cannot read as a log (another program's value, or a log
// in a layout of a later release) is refused by every operation with ErrUnknownLayout, naming
// the key and what it holds; it is never counted, converted or written, and fail-open does not
// admit on it: batched or not, single limit or policy.
func TestUnknownLayoutIsRefused(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	// A header of a kind no release so far writes, as a later layout version's would be.
	later := "W" + strings.Repeat("\x00", 48)
	contents := map[string]struct {
		fill  func(full string) valkey.Completed
		found string // what the error must say the key holds
	}{
		"a string":               {func(k string) valkey.Completed { return c.B().Set().Key(k).Value("42").Build() }, "a string"},
		"a hash":                 {func(k string) valkey.Completed { return c.B().Hset().Key(k).FieldValue().FieldValue("f", "v").Build() }, "a hash"},
		"another program's zset": {func(k string) valkey.Completed { return c.B().Zadd().Key(k).ScoreMember().ScoreMember(1, "m").Build() }, "a zset"},
		"another program's list": {func(k string) valkey.Completed { return c.B().Rpush().Key(k).Element("hello", "world").Build() }, "0x68"},
		"a later release's log":  {func(k string) valkey.Completed { return c.B().Rpush().Key(k).Element(later).Build() }, "0x57"},
	}
	l := engine.PerMinute(5)
	policy := engine.Policy{engine.PerSecond(2), l}
	for _, failOpen := range []bool{false, true} {
		engines := map[string]*engine.Engine{
			"batched":     enginetest.New(t, c, engine.WithFailOpen(failOpen)),
			"not batched": enginetest.New(t, c, engine.WithFailOpen(failOpen), engine.WithBatching(false)),
		}
		for what, content := range contents {
			for how, e := range engines {
				key := enginetest.NewKey(t)
				full := enginetest.Prefix + key
				if err := c.Do(ctx, content.fill(full)).Error(); err != nil {
					t.Fatal(err)
				}
				before := stateOf(t, c, full)
				entry := engine.Result{Allowed: true, Entry: engine.EntryID{Key: full, At: time.Now(), Seq: 1, Cost: 1}}
				calls := map[string]func() (engine.Result, error){
					"Allow":       func() (engine.Result, error) { return e.Allow(ctx, key, l) },
					"AllowPolicy": func() (engine.Result, error) { return e.AllowPolicy(ctx, key, policy, 1) },
					"Peek":        func() (engine.Result, error) { return e.Peek(ctx, key, l) },
					"PeekPolicy":  func() (engine.Result, error) { return e.PeekPolicy(ctx, key, policy, 1) },
					"Record":      func() (engine.Result, error) { return engine.Result{}, e.Record(ctx, key, 5, time.Minute, time.Now()) },
					"Inspect": func() (engine.Result, error) {
						_, err := inspect.Read(ctx, c, enginetest.Prefix+key, 0)
						return engine.Result{}, err
					},
					"Refund": func() (engine.Result, error) { return engine.Result{}, e.Refund(ctx, key, entry) },
				}
				for name, call := range calls {
					r, err := call()
					if !errors.Is(err, engine.ErrUnknownLayout) || r.Allowed || r.BackendErr != nil {
						t.Errorf("%s, %s, fail-open %v: %s: %+v, %v; want ErrUnknownLayout", what, how, failOpen, name, r, err)
						continue
					}
					if !containsAll(err.Error(), key, content.found) {
						t.Errorf("%s: %s: %q does not name the key and %q", what, name, err, content.found)
					}
					wantUntouched(t, c, what+": "+name, full, before)
				}
			}
		}
	}
}

// The leases of a key are a sorted set: a lease key that holds anything else is refused by
// Acquire, Extend and Release with ErrUnknownLayout, and left as it was.
func TestLeaseKeyOfAnotherTypeIsRefused(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	e := enginetest.New(t, c, engine.WithFailOpen(true))
	key := enginetest.NewKey(t)
	full := enginetest.Prefix + engine.LeaseNamespace + key
	if err := c.Do(ctx, c.B().Set().Key(full).Value("not leases").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	before := stateOf(t, c, full)
	lease := engine.Lease{Key: key, ID: uuid.New()}
	for name, call := range map[string]func() error{
		"Acquire": func() error { _, err := e.Acquire(ctx, key, 2, time.Minute); return err },
		"Extend":  func() error { _, err := e.Extend(ctx, lease, time.Minute); return err },
		"Release": func() error { return e.Release(ctx, lease) },
	} {
		if err := call(); !errors.Is(err, engine.ErrUnknownLayout) || !containsAll(err.Error(), key, "a string") {
			t.Errorf("%s of a lease key holding a string: %v; want ErrUnknownLayout naming the key and a string", name, err)
		}
		wantUntouched(t, c, name, full, before)
	}
}

// Inspect says which layout version a log is stored in: this release's (2) once written, 0
// for a key that does not exist.
func TestInspectReportsTheLayout(t *testing.T) {
	c := exampleServer.Client(t)
	e := enginetest.New(t, c)
	key := enginetest.NewKey(t)
	enginetest.Want(t, "layout of no key", enginetest.Log(t, c, enginetest.Prefix, key).Layout, 0)
	enginetest.MustAllowN(t, e, key, engine.PerMinute(3), 1)
	enginetest.Want(t, "layout of a log this release wrote", enginetest.Log(t, c, enginetest.Prefix, key).Layout, 2)
}
