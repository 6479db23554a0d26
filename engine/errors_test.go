package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// A key that holds what this release cannot read as a log (another program's value, or a log
// in a layout of an earlier pre-release or a later release) is refused by every operation with ErrUnknownLayout, naming
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
		"an earlier layout's log": {func(k string) valkey.Completed {
			return c.B().Rpush().Key(k).Element(earlierLayoutLists()[1]...).Build()
		}, "0x54"},
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
		t.Fatalf("the DeniedError's message is %d bytes: %.200s; want at most 512, saying the key's 1048576 bytes", n, err.Error())
	}
	// A server error names the key too: a key that holds a string.
	c := exampleServer.Client(t)
	if err := c.Do(context.Background(), c.B().Set().Key(enginetest.Prefix+key).Value("x").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	_, err = e.Allow(context.Background(), key, l)
	if err == nil || len(err.Error()) > 1024 {
		t.Fatalf("Allow on a string key: an error of %d bytes (%v), want an error of at most 1024", len(errString(err)), err != nil)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// foreignLists are lists another program might keep under the engine's prefix, whose first
// element opens with a byte a log's header opens with: text (a job queue's, an access log's,
// a version notice, 67 bytes, which once looped decide.lua until SCRIPT KILL), and, from a
// fixed seed, random bytes after each kind byte, of lengths around every header's, alone or
// with more elements behind.
func foreignLists() [][]string {
	lists := [][]string{
		{`Task {"id": 17, "queue": "mail", "attempts": 0, "payload": "welcome"}`},
		{"GET /api/v1/users?page=2 HTTP/1.1 200 512 0.004"},
		{"Kubernetes event: pod web-7f9c restarted (OOMKilled)", "Kubernetes event: node ready"},
		{"Version 1.2.3 released with fixes for the importer and the CLI"},
		{"Ledger", "credit 10", "debit 3"},
		{"Hello, world"},
		{"Upload complete: 3 files, 4.2 MB"},
		{"Customer 42 opened ticket 7"},
		{"K8s", "pod"},
		{"Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor"},
		{"Sessions", "s1", "s2", "s3"},
		{"Feature flags: dark_mode=on beta=off"},
	}
	rng := rand.New(rand.NewPCG(37, 3))
	for _, kind := range "TUGHSFVCKL" {
		for _, size := range []int{2, 29, 36, 37, 43, 44, 64, 71, 79, 80, 87, 120, 250} {
			b := make([]byte, size)
			for i := range b {
				b[i] = byte(rng.IntN(256))
			}
			b[0] = byte(kind)
			list := []string{string(b)}
			for range rng.IntN(3) {
				list = append(list, string(b[:rng.IntN(len(b))+1]))
			}
			lists = append(lists, list)
		}
	}
	return append(lists, earlierLayoutLists()...)
}

// earlierLayoutLists are logs as the pre-release layouts 1 to 4 stored them, each well formed
// for its layout (fields in range, the open chunk exactly the entries counted, the elements
// behind it as many as counted): version 1's 'S' and 'F' (no horizon), version 2's 'T', 'U',
// 'G' and 'H', version 4's counters before a version 2 header. This release reads one layout,
// so each is refused like any other program's list, never read and never rewritten.
func earlierLayoutLists() [][]string {
	const t, window = int64(1_790_000_000_000_000), int64(60_000_000)
	field := func(b []byte, vs ...int64) []byte {
		for _, v := range vs {
			b = append(b, byte(v>>48), byte(v>>40), byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
		}
		return b
	}
	entry := func(b []byte, at int64, cost byte) []byte { return append(field(b, at), cost) }
	open := func(kind byte, fields ...int64) string {
		b := field([]byte{kind}, fields...)
		return string(entry(entry(b, t-1000, 1), t, 1))
	}
	closed := string(field(nil, t-2000))
	return [][]string{
		{open('S', 2, 2, t, 1)},
		{open('T', 2, 2, t, 1, window)},
		{open('U', 2, 2, t, 1, window)},
		{open('F', 3, 3, t, 1, 0, 1, t-2000, 1, 0), closed},
		{open('G', 3, 3, t, 1, window, 0, 1, t-2000, 1, 0), closed},
		{open('H', 3, 3, t, 1, window, 0, 1, t-2000, 1, 0), closed},
		{string(field([]byte{'C', 1}, t-window, t+window, 2)) + open('T', 2, 2, t, 1, window)},
	}
}

// Another program's list under the engine's prefix is never read as a log, whatever its first
// byte: every call refuses it with ErrUnknownLayout, promptly (no script runs on for its
// header's counts), fail-open admits nothing on it, and nothing of it changes.
func TestForeignListsAreRefused(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer()) // a looping script would hold it BUSY
	c := own.Client(t)
	ctx := context.Background()
	l := engine.PerMinute(5)
	slotted := engine.Limit{Max: 100, Window: time.Minute, Resolution: time.Second}
	policy := engine.Policy{engine.PerSecond(2), l}
	engines := map[string]*engine.Engine{
		"closed":      enginetest.New(t, c),
		"open":        enginetest.New(t, c, engine.WithFailOpen(true)),
		"not batched": enginetest.New(t, c, engine.WithBatching(false)),
	}
	for i, list := range foreignLists() {
		key := enginetest.NewKey(t)
		full := enginetest.Prefix + key
		if err := c.Do(ctx, c.B().Rpush().Key(full).Element(list...).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		before := stateOf(t, c, full)
		for how, e := range engines {
			entry := engine.Result{Allowed: true, Entry: engine.EntryID{Key: full, At: time.Now(), Seq: 1, Cost: 3}}
			calls := map[string]func(context.Context) (engine.Result, error){
				"Allow":       func(ctx context.Context) (engine.Result, error) { return e.Allow(ctx, key, l) },
				"AllowN":      func(ctx context.Context) (engine.Result, error) { return e.AllowN(ctx, key, l, 3) },
				"slotted":     func(ctx context.Context) (engine.Result, error) { return e.AllowN(ctx, key, slotted, 2) },
				"AllowPolicy": func(ctx context.Context) (engine.Result, error) { return e.AllowPolicy(ctx, key, policy, 1) },
				"Peek":        func(ctx context.Context) (engine.Result, error) { return e.Peek(ctx, key, l) },
				"PeekPolicy":  func(ctx context.Context) (engine.Result, error) { return e.PeekPolicy(ctx, key, policy, 1) },
				"AllowAll": func(ctx context.Context) (engine.Result, error) {
					_, rs, err := e.AllowAll(ctx, []engine.Request{{Key: key, Policy: engine.Policy{l}, N: 1},
						{Key: enginetest.NewKey(t), Policy: engine.Policy{l}, N: 1}})
					if len(rs) > 0 {
						return rs[0], err
					}
					return engine.Result{}, err
				},
				"Refund": func(ctx context.Context) (engine.Result, error) { return engine.Result{}, e.Refund(ctx, key, entry) },
				"Settle": func(ctx context.Context) (engine.Result, error) { return engine.Result{}, e.Settle(ctx, key, entry, 1) },
				"Inspect": func(ctx context.Context) (engine.Result, error) {
					_, err := inspect.Read(ctx, c, full, 0)
					return engine.Result{}, err
				},
			}
			for name, call := range calls {
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				r, err := call(cctx)
				cancel()
				if errors.Is(err, context.DeadlineExceeded) {
					_ = c.Do(ctx, c.B().ScriptKill().Build()).Error()
					t.Fatalf("list %d %q, %s: %s did not come back in 20 s: a script walked the header's counts", i, list, how, name)
				}
				if !errors.Is(err, engine.ErrUnknownLayout) || r.Allowed || r.BackendErr != nil {
					t.Errorf("list %d %q, %s: %s: %+v, %v; want ErrUnknownLayout", i, list, how, name, r, err)
				}
			}
		}
		wantUntouched(t, c, fmt.Sprintf("list %d", i), full, before)
	}
}
