package engine_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// A user whose ACL lets it load scripts but not run them, or not run a command the scripts
// need, is refused by New with ErrPreload naming what is missing, not by the first decision.
func TestNewChecksTheUsersPermissions(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	for _, tc := range []struct {
		user  string
		rules []string
		names string // what the error must name
	}{
		{"noevalsha", []string{"+@all", "-evalsha"}, "EVALSHA"},
		{"noevalsharo", []string{"+@all", "-evalsha_ro"}, "EVALSHA_RO"},
		{"nopexpire", []string{"+@all", "-pexpire"}, "PEXPIRE"},
		{"nolset", []string{"+@all", "-lset"}, "LSET"},
		{"nozadd", []string{"+@all", "-zadd"}, "ZADD"},
	} {
		t.Run(tc.user, func(t *testing.T) {
			c := own.NewUser(t, tc.user, "pw", tc.rules...)
			_, err := engine.New(c, engine.WithPersistenceCheck(engine.Ignore))
			if !errors.Is(err, engine.ErrPreload) || errors.Is(err, engine.ErrUnavailable) || !strings.Contains(err.Error(), tc.names) {
				t.Fatalf("New as a user without %s: %v; want ErrPreload naming it", tc.names, err)
			}
		})
	}
	// A user allowed only the engine's keys, and everything the engine runs, passes.
	c := own.NewUser(t, "keysonly", "pw", "+@all", "resetkeys", "~strictrate:*")
	if _, err := engine.New(c, engine.WithPersistenceCheck(engine.Ignore)); err != nil {
		t.Fatalf("New as a user limited to the engine's keys: %v", err)
	}
	d := own.NewUser(t, "otherkeys", "pw", "+@all", "resetkeys", "~other:*")
	if _, err := engine.New(d, engine.WithPersistenceCheck(engine.Ignore)); !errors.Is(err, engine.ErrPreload) {
		t.Fatalf("New as a user that may not touch the engine's keys: %v; want ErrPreload", err)
	}
}

// A decision the server refuses midway (the user lost PEXPIRE and PEXPIREAT after New)
// records nothing and leaves no key without an expiry: on a new key and on one that holds
// entries.
func TestRefusedDecisionLeavesNoTrace(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	admin := own.Client(t)
	c := own.NewUser(t, "loses", "pw", "+@all")
	e := enginetest.New(t, c)
	ctx := context.Background()
	old, fresh := enginetest.NewKey(t), enginetest.NewKey(t)
	for _, l := range []engine.Limit{engine.PerHour(10), {Max: 10, Window: time.Minute}} {
		enginetest.MustAllowN(t, e, old, l, 1) // one limit, then a second: the general path too
	}
	before := enginetest.Log(t, admin, enginetest.Prefix, old)
	// Take the expiry away: every later decision must fail without writing.
	if err := admin.Do(ctx, admin.B().AclSetuser().Username("loses").Rule("-pexpire", "-pexpireat").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		key    string
		policy engine.Policy
	}{
		{fresh, engine.Policy{engine.PerHour(10)}},
		{fresh, engine.Policy{{Max: 10, Window: time.Minute}, engine.PerHour(10)}},
		{old, engine.Policy{engine.PerHour(10)}},
		{old, engine.Policy{{Max: 10, Window: time.Minute}, engine.PerHour(10)}},
	} {
		for _, batching := range []bool{false, true} {
			e := enginetest.New(t, c, engine.WithPreload(false), engine.WithBatching(batching))
			if r, err := e.AllowPolicy(ctx, tc.key, tc.policy, 1); err == nil {
				t.Fatalf("AllowPolicy(%v) without PEXPIRE: %+v, no error", tc.policy, r)
			}
		}
	}
	if n := valkeytest.Must(t, "EXISTS", admin.Do(ctx, admin.B().Exists().Key(enginetest.Prefix+fresh).Build()), valkey.ValkeyResult.AsInt64); n != 0 {
		t.Fatalf("a refused decision left the new key %q behind", fresh)
	}
	after := enginetest.Log(t, admin, enginetest.Prefix, old)
	if after.Count != before.Count || after.Events != before.Events {
		t.Fatalf("refused decisions changed the log: %d entries, %d events; before %d, %d", after.Count, after.Events, before.Count, before.Events)
	}
	if ms := enginetest.PTTL(t, admin, enginetest.Prefix+old); ms <= 0 {
		t.Fatalf("PTTL %d: the key lost its expiry", ms)
	}
}

// Under maxmemory with noeviction the server refuses the writes that grow memory (a new key's
// RPUSH), and lets the others through (LSET, PEXPIRE): a key whose log fits its header is still
// decided exactly; a new key cannot be, which is ErrUnavailable (OOM): fail-closed refuses,
// fail-open admits with the error in BackendErr, and nothing is recorded.
func TestOutOfMemoryIsUnavailable(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	ctx := context.Background()
	e := enginetest.New(t, c)
	open := enginetest.New(t, c, engine.WithFailOpen(true))
	key := enginetest.NewKey(t)
	enginetest.MustAllowN(t, e, key, engine.PerMinute(5), 1)
	for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
		if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue(kv[0], kv[1]).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = c.Do(context.Background(), c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "0").Build()).Error()
	})
	// The existing key is still decided, exactly.
	for i := 2; i <= 6; i++ {
		r := enginetest.MustAllowN(t, e, key, engine.PerMinute(5), 1)
		enginetest.Want(t, "admitted while under 5", r.Allowed, i <= 5)
	}
	fresh := enginetest.NewKey(t)
	_, err := e.Allow(ctx, fresh, engine.PerMinute(5))
	if !errors.Is(err, engine.ErrUnavailable) || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("Allow of a new key on a server out of memory: %v; want ErrUnavailable (OOM)", err)
	}
	r, err := open.Allow(ctx, fresh, engine.PerMinute(5))
	if err != nil || !r.Allowed || !errors.Is(r.BackendErr, engine.ErrUnavailable) {
		t.Fatalf("fail-open Allow out of memory: %+v, %v; want admitted with BackendErr ErrUnavailable", r, err)
	}
	if got := enginetest.StoredEvents(t, c, fresh); got != 0 {
		t.Fatalf("the new key holds %d events after refused writes, want 0", got)
	}
}

// A client's own timeout (valkey-go gives up on a connection that stops answering) is the
// server not answering: ErrUnavailable, not the caller's context.DeadlineExceeded, so that
// fail-open and callers tell it from their own deadline.
func TestClientTimeoutIsUnavailable(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{own.Addr}, ConnWriteTimeout: 300 * time.Millisecond,
		Dialer: net.Dialer{Timeout: 300 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	e := enginetest.New(t, c, engine.WithBatching(false))
	key := enginetest.NewKey(t)
	enginetest.MustAllowN(t, e, key, engine.PerMinute(5), 1)
	ctx := context.Background()
	// Stopped for as long as the calls below take, and let run again once they are done.
	if err := own.Pause(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := own.Resume(); err != nil {
			t.Error(err)
		}
	}()
	// The first call times out reading; the next ones time out dialling anew (the connection's
	// handshake, under the client's own deadline).
	for i := 0; i < 3; i++ {
		_, err = e.Allow(ctx, key, engine.PerMinute(5))
		if !errors.Is(err, engine.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("call %d: Allow with context.Background() while the client timed out: %v; want ErrUnavailable, not context.DeadlineExceeded", i+1, err)
		}
	}
}

// A nil context is refused with ErrInvalidArgument by every method, before anything is counted
// or queued: the engine goes on deciding for everyone else, with its batch queue busy at the
// time, and no background goroutine ever sees the nil context.
func TestNilContextIsRefused(t *testing.T) {
	e := enginetest.New(t, exampleServer.Client(t))
	key, l := enginetest.NewKey(t), engine.PerHour(1000)
	ctx := context.Background()
	admitted := enginetest.MustAllowN(t, e, key, l, 1)
	lease, err := e.Acquire(ctx, key, 5, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	// Keep the queue busy, so that a nil-context call would have been queued behind others.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := e.Allow(ctx, key, l); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	var nilCtx context.Context
	calls := map[string]func() error{
		"Allow":       func() error { _, err := e.Allow(nilCtx, key, l); return err },
		"AllowN":      func() error { _, err := e.AllowN(nilCtx, key, l, 2); return err },
		"AllowPolicy": func() error { _, err := e.AllowPolicy(nilCtx, key, engine.Policy{l}, 1); return err },
		"Peek":        func() error { _, err := e.Peek(nilCtx, key, l); return err },
		"PeekPolicy":  func() error { _, err := e.PeekPolicy(nilCtx, key, engine.Policy{l}, 1); return err },
		"Wait":        func() error { _, err := e.Wait(nilCtx, key, l); return err },
		"Check":       func() error { return e.Check(nilCtx, key, 5, time.Minute, time.Now()) },
		"Record":      func() error { return e.Record(nilCtx, key, 5, time.Minute, time.Now()) },
		"Reset":       func() error { return e.Reset(nilCtx, key) },
		"Clear":       func() error { return e.Clear(nilCtx, key) },
		"Refund":      func() error { return e.Refund(nilCtx, key, admitted) },
		"Settle":      func() error { return e.Settle(nilCtx, key, admitted, 0) },
		"Acquire":     func() error { _, err := e.Acquire(nilCtx, key, 5, time.Minute); return err },
		"Extend":      func() error { _, err := e.Extend(nilCtx, lease, time.Minute); return err },
		"Release":     func() error { return e.Release(nilCtx, lease) },
	}
	for name, call := range calls {
		for i := 0; i < 20; i++ {
			if err := call(); !errors.Is(err, engine.ErrInvalidArgument) {
				t.Fatalf("%s(nil context): %v; want ErrInvalidArgument", name, err)
			}
		}
	}
	close(stop)
	wg.Wait()
	// The engine still decides at once: nothing was left counted in flight.
	tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := e.Allow(tctx, key, l); err != nil {
		t.Fatalf("Allow after the nil-context calls: %v", err)
	}
	if got := enginetest.Log(t, exampleServer.Client(t), enginetest.Prefix, key); got.Events < 1 {
		t.Fatalf("the log lost its entries: %+v", got)
	}
}

// A huge key costs an error message no more than a short one: errors quote at most a few
// hundred bytes of it and say how long it was.
func TestErrorsCutLongKeys(t *testing.T) {
	e := enginetest.New(t, exampleServer.Client(t), engine.WithBatching(false))
	key := strings.Repeat("k", 1<<20)
	l := engine.PerHour(1)
	if err := e.Record(context.Background(), key, 1, time.Hour, time.Now()); err != nil {
		t.Fatal(err)
	}
	err := e.Record(context.Background(), key, 1, time.Hour, time.Now())
	var denied *engine.DeniedError
	if !errors.As(err, &denied) || denied.Key != key {
		t.Fatalf("the second Record: %v; want a DeniedError carrying the whole key", err)
	}
	if n := len(err.Error()); n > 512 || !strings.Contains(err.Error(), "1048576 bytes") {
		t.Fatalf("the DeniedError's message is %d bytes: %.200s", n, err.Error())
	}
	// A server error names the key too: a key that holds a string.
	c := exampleServer.Client(t)
	if err := c.Do(context.Background(), c.B().Set().Key(enginetest.Prefix+key).Value("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	_, err = e.Allow(context.Background(), key, l)
	if err == nil || len(err.Error()) > 1024 {
		t.Fatalf("Allow on a string key: an error of %d bytes (%v)", len(errString(err)), err != nil)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
