package engine_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// Fail-closed (the default) denies and returns the error; fail-open admits, says so in
// BackendErr, and returns no error. Bad input and a cancelled caller are errors either way.
func TestFailOpenAndFailClosed(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	closed := enginetest.New(t, c)
	open := enginetest.New(t, c, engine.WithFailOpen(true))
	key, l := enginetest.NewKey(t), engine.PerMinute(3)
	ctx := context.Background()

	r := enginetest.MustAllowN(t, open, key, l, 1)
	if !r.Allowed || r.BackendErr != nil || r.Remaining != 2 {
		t.Fatalf("fail-open engine with the server up: %+v", r)
	}
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	// Reads are retried by the client until the context ends: keep it short.
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()

	r, err := closed.Allow(tctx, key, l)
	if !errors.Is(err, engine.ErrUnavailable) || r.Allowed {
		t.Fatalf("fail-closed, server down: %+v, %v; want denied and ErrUnavailable", r, err)
	}
	r, err = open.Allow(tctx, key, l)
	if err != nil || !r.Allowed || !errors.Is(r.BackendErr, engine.ErrUnavailable) || r.Remaining != 0 {
		t.Fatalf("fail-open Allow, server down: %+v, %v; want admitted with BackendErr ErrUnavailable", r, err)
	}
	// A read is retried by the client until its caller's context ends (its deadline is not the
	// connection's: package sendctx), so its BackendErr is the server's failure or that deadline.
	r, err = open.Peek(tctx, key, l)
	if err != nil || !r.Allowed || r.Remaining != 0 ||
		!errors.Is(r.BackendErr, engine.ErrUnavailable) && !errors.Is(r.BackendErr, context.DeadlineExceeded) {
		t.Fatalf("fail-open Peek, server down: %+v, %v; want admitted with BackendErr ErrUnavailable or the deadline", r, err)
	}
	if _, err := open.Allow(tctx, "", l); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Fatalf("fail-open with an empty key: %v, want ErrInvalidArgument", err)
	}
	cancelled, cancelNow := context.WithCancel(ctx)
	cancelNow()
	if r, err := open.Allow(cancelled, key, l); !errors.Is(err, context.Canceled) || r.Allowed {
		t.Fatalf("fail-open with a cancelled context: %+v, %v; want context.Canceled", r, err)
	}
}

// A paused server yields a timeout when the caller's deadline passes, never a hang. The
// request the caller gave up on may still run once the server resumes (the caller was not told
// yes, so that can only deny early), and is never applied twice.
func TestTimeoutOnAPausedServer(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	admin := valkeytest.NewClient(t, own.Addr)
	e := enginetest.New(t, c)
	open := enginetest.New(t, c, engine.WithFailOpen(true))
	key, l := enginetest.NewKey(t), engine.PerMinute(5)
	ctx := context.Background()

	// CLIENT PAUSE answers once the pause is in force.
	pause := func(cmd valkey.Completed) {
		t.Helper()
		if err := admin.Do(ctx, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	pause(admin.B().ClientPause().Timeout(1500).Write().Build())
	until := time.Now().Add(1500 * time.Millisecond)
	tctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	start := time.Now()
	_, err := e.Allow(tctx, key, l)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Allow on a paused server: %v, want context.DeadlineExceeded", err)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Fatalf("Allow took %s to honour a 200ms deadline", waited)
	}
	tctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
	r, err := open.Allow(tctx, key, l)
	cancel()
	if err != nil || !r.Allowed || !errors.Is(r.BackendErr, context.DeadlineExceeded) {
		t.Fatalf("fail-open Allow on a paused server: %+v, %v; want admitted with a deadline BackendErr", r, err)
	}
	// The paused server holds the two abandoned requests, each as a blocked client, and runs
	// them when the pause ends (or drops one whose connection was closed). Once the pause is
	// over and no client is blocked any more, no abandoned request can still land.
	if err := valkeytest.WaitFor(ctx, 10*time.Second, "the pause to end and release every held request", func() (bool, error) {
		if time.Now().Before(until) {
			return false, nil
		}
		info, err := valkeytest.ReadInfo(ctx, admin, "clients")
		return info["blocked_clients"] == "0", err
	}); err != nil {
		t.Fatal(err)
	}

	// The two abandoned requests ran after the pause, or not: never more than once each.
	phantom := enginetest.StoredEvents(t, c, key)
	if phantom > 2 {
		t.Fatalf("log holds %d events after two abandoned requests", phantom)
	}
	told := 0
	for {
		r := enginetest.MustAllowN(t, e, key, l, 1)
		if !r.Allowed {
			break
		}
		told++
	}
	enginetest.Want(t, "told yes plus abandoned", int64(told)+phantom, int64(l.Max))
	enginetest.Want(t, "log size", enginetest.StoredEvents(t, c, key), int64(l.Max))

	// A server that runs no command at all (CLIENT PAUSE ALL, in force once it answers) times
	// out a read just the same.
	pause(admin.B().ClientPause().Timeout(1000).All().Build())
	tctx, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err := e.Peek(tctx, key, l); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Peek on a paused server: %v, want context.DeadlineExceeded", err)
	}
	if waited := time.Since(start); waited > 900*time.Millisecond {
		t.Fatalf("Peek on a paused server took %s to honour a 200ms deadline", waited)
	}
}

// New refuses a server that may evict any key, unless told to only warn or not to check.
func TestEvictionPolicyCheck(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	ctx := context.Background()
	setPolicy := func(p string) {
		t.Helper()
		if err := c.Do(ctx, c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", p).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}

	setPolicy("allkeys-lru")
	if _, err := engine.New(c); !errors.Is(err, engine.ErrEvictionPolicy) || !strings.Contains(err.Error(), "allkeys-lru") {
		t.Fatalf("New with allkeys-lru: %v, want ErrEvictionPolicy naming the policy", err)
	}
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	if _, err := engine.New(c, engine.WithEvictionCheck(engine.Warn), engine.WithLogger(logger)); err != nil {
		t.Fatalf("New with Warn: %v", err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "allkeys-lru") {
		t.Fatalf("Warn logged %q", logs.String())
	}
	logs.Reset()
	if _, err := engine.New(c, engine.WithEvictionCheck(engine.Ignore), engine.WithPersistenceCheck(engine.Ignore),
		engine.WithLogger(logger)); err != nil || logs.Len() != 0 {
		t.Fatalf("New with Ignore: %v, logged %q", err, logs.String())
	}

	setPolicy("volatile-lru")
	if _, err := engine.New(c); err != nil {
		t.Fatalf("New with volatile-lru: %v", err)
	}

	// A user that may not run CONFIG (as on many managed services) is not checked.
	setPolicy("allkeys-lru")
	limited := own.NewUser(t, "noconfig", "pw", "+@all", "-config")
	if _, err := engine.New(limited); err != nil {
		t.Fatalf("New without CONFIG permission: %v", err)
	}
}
