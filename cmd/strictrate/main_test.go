package main

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/pipelined"
)

var server *valkeytest.Server

func TestMain(m *testing.M) { valkeytest.Main(m, &server) }

// inspect shows each entry with its time and cost, and per -limit the events in that window
// and the room left; reset deletes the log, and inspect then shows nothing.
func TestInspectAndReset(t *testing.T) {
	c := server.Client(t)
	e, clock := enginetest.Clocked(t, c, engine.WithPrefix("tool:"))
	ctx := context.Background()
	key := "inspect-me"
	if err := e.Reset(ctx, key); err != nil {
		t.Fatal(err)
	}
	p := engine.Policy{engine.PerSecond(10), engine.PerMinute(100)}
	for i, n := range []int{3, 5, 7} {
		clock.Set(enginetest.T0.Add(time.Duration(i) * 2 * time.Second))
		if r, err := e.AllowPolicy(ctx, key, p, n); err != nil || !r.Allowed {
			t.Fatalf("AllowPolicy(%d): %+v, %v", n, r, err)
		}
	}

	var out bytes.Buffer
	args := []string{"inspect", "-addr", server.Addr, "-prefix", "tool:", "-limit", "10/1s", "-limit", "100/1m", key}
	if err := run(ctx, args, &out); err != nil {
		t.Fatalf("inspect: %v\n%s", err, out.String())
	}
	// The entries were stamped on the test's clock in 2026; the ages are on the server's.
	for _, want := range []string{
		`key "inspect-me" (tool:inspect-me): 3 entries, 15 events (layout 5, 1 cursors)`,
		"2026-11-30T12:00:00.000000Z",
		"2026-11-30T12:00:02.000000Z",
		"2026-11-30T12:00:04.000000Z",
		"limit 10/1s: 0 events in the window, 10 remaining, reset after 0s",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out.String())
		}
	}
	for _, cost := range []string{" 3 ", " 5 ", " 7 "} {
		if !strings.Contains(out.String(), cost) {
			t.Errorf("inspect output lacks the cost %q:\n%s", cost, out.String())
		}
	}

	out.Reset()
	if err := run(ctx, []string{"reset", "-addr", server.Addr, "-prefix", "tool:", key}, &out); err != nil {
		t.Fatalf("reset: %v", err)
	}
	if n, err := c.Do(ctx, c.B().Exists().Key("tool:"+key).Build()).AsInt64(); err != nil || n != 0 {
		t.Fatalf("EXISTS after reset: %d, %v", n, err)
	}
	out.Reset()
	if err := run(ctx, []string{"inspect", "-addr", server.Addr, "-prefix", "tool:", key}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "0 entries, 0 events") {
		t.Errorf("inspect after reset:\n%s", out.String())
	}
}

// The window's count comes from the server's clock: events of the last second count, older
// ones do not.
func TestInspectCountsTheWindowNow(t *testing.T) {
	c := server.Client(t)
	e := enginetest.New(t, c, engine.WithPrefix("tool:"))
	ctx := context.Background()
	key := "now-" + t.Name()
	if _, err := e.AllowN(ctx, key, engine.PerHour(50), 4); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"inspect", "-addr", server.Addr, "-prefix", "tool:", "-limit", "50/1h", key}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "limit 50/1h0m0s: 4 events in the window, 46 remaining") {
		t.Errorf("inspect output:\n%s", out.String())
	}
}

func TestUsage(t *testing.T) {
	ctx := context.Background()
	for _, args := range [][]string{
		nil,
		{"inspect"},
		{"frobnicate", "k"},
		{"inspect", "-limit", "ten/1s", "k"},
		{"inspect", "-limit", "10", "k"},
		{"inspect", "a", "b"},
	} {
		if err := run(ctx, args, &bytes.Buffer{}); !errors.Is(err, errUsage) {
			t.Errorf("run(%q) = %v, want a usage error", args, err)
		}
	}
	err := run(ctx, []string{"inspect", "-addr", server.Addr, "-limit", "0/1s", "k"}, &bytes.Buffer{})
	if !errors.Is(err, engine.ErrInvalidArgument) {
		t.Errorf("a limit of 0: %v, want ErrInvalidArgument", err)
	}
}

// reset says what it deleted: a log's entries and events, as package inspect read them before
// the delete.
func TestResetDeletesALog(t *testing.T) {
	c := server.Client(t)
	e := enginetest.New(t, c, engine.WithPrefix("tool:"))
	ctx := context.Background()
	key := "log-" + t.Name()
	for _, n := range []int{3, 5} {
		if r, err := e.AllowN(ctx, key, engine.PerMinute(100), n); err != nil || !r.Allowed {
			t.Fatalf("AllowN(%d): %+v, %v", n, r, err)
		}
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"reset", "-addr", server.Addr, "-prefix", "tool:", key}, &out); err != nil {
		t.Fatalf("reset: %v", err)
	}
	want := `deleted the log of "` + key + `" (tool:` + key + `): 2 entries, 8 events`
	if !strings.Contains(out.String(), want) {
		t.Errorf("reset output lacks %q:\n%s", want, out.String())
	}
	if n := valkeytest.Must(t, "EXISTS", c.Do(ctx, c.B().Exists().Key("tool:"+key).Build()), valkey.ValkeyResult.AsInt64); n != 0 {
		t.Errorf("the log is still there after reset")
	}
}

// The pipelined design's log (package pipelined) is a sorted set, one member per event: reset
// deletes it as its Reset does, and counts its events.
func TestResetDeletesAPipelinedLog(t *testing.T) {
	c := server.Client(t)
	e, err := pipelined.New(c, pipelined.WithPrefix("tool:"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := "zlog-" + t.Name()
	if r, err := e.AllowN(ctx, key, engine.PerMinute(100), 3); err != nil || !r.Allowed {
		t.Fatalf("AllowN: %+v, %v", r, err)
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"reset", "-addr", server.Addr, "-prefix", "tool:", key}, &out); err != nil {
		t.Fatalf("reset: %v", err)
	}
	want := `deleted the log of "` + key + `" (tool:` + key + `): the pipelined sorted set of 3 events`
	if !strings.Contains(out.String(), want) {
		t.Errorf("reset output lacks %q:\n%s", want, out.String())
	}
	if n := valkeytest.Must(t, "EXISTS", c.Do(ctx, c.B().Exists().Key("tool:"+key).Build()), valkey.ValkeyResult.AsInt64); n != 0 {
		t.Errorf("the log is still there after reset")
	}
}

// A key that does not exist: reset succeeds and says that nothing was there.
func TestResetMissingKey(t *testing.T) {
	ctx := context.Background()
	key := "missing-" + t.Name()
	for _, force := range []bool{false, true} {
		args := []string{"reset", "-addr", server.Addr, "-prefix", "tool:", key}
		if force {
			args = []string{"reset", "-addr", server.Addr, "-prefix", "tool:", "-force", key}
		}
		var out bytes.Buffer
		if err := run(ctx, args, &out); err != nil {
			t.Fatalf("run(%q): %v", args, err)
		}
		want := `nothing deleted: there is no key "` + key + `" (tool:` + key + `)`
		if !strings.Contains(out.String(), want) || strings.Contains(out.String(), "deleted the log") {
			t.Errorf("run(%q) output, want %q:\n%s", args, want, out.String())
		}
	}
}

// foreignKeys are keys that are not strictrate logs, each made by its commands, with the TYPE
// the server reports for it.
var foreignKeys = []struct {
	name, kind string
	make       func(c valkey.Client, full string) valkey.Completed
}{
	{"string", "string", func(c valkey.Client, full string) valkey.Completed {
		return c.B().Set().Key(full).Value("session data").Build()
	}},
	{"hash", "hash", func(c valkey.Client, full string) valkey.Completed {
		return c.B().Hset().Key(full).FieldValue().FieldValue("user", "ada").Build()
	}},
	{"set", "set", func(c valkey.Client, full string) valkey.Completed {
		return c.B().Sadd().Key(full).Member("a", "b").Build()
	}},
	// The engine's script refuses this header.
	{"list", "list", func(c valkey.Client, full string) valkey.Completed {
		return c.B().Rpush().Key(full).Element("job-1", "job-2").Build()
	}},
	// These open as a header does and are long enough for one: the scripts refuse them, as
	// they refuse every header whose fields do not agree with what the list holds (a version
	// notice once looped the scripts until SCRIPT KILL).
	{"list-like-a-header", "list", func(c valkey.Client, full string) valkey.Completed {
		return c.B().Rpush().Key(full).Element("S0123456789012345678901234567890").Build()
	}},
	{"version-notice", "list", func(c valkey.Client, full string) valkey.Completed {
		return c.B().Rpush().Key(full).Element("Version 1.2.3 released with fixes for the importer and the CLI").Build()
	}},
	{"job-queue", "list", func(c valkey.Client, full string) valkey.Completed {
		return c.B().Rpush().Key(full).Element(`Task {"id": 17, "queue": "mail", "attempts": 0, "payload": "welcome"}`).Build()
	}},
	{"access-log", "list", func(c valkey.Client, full string) valkey.Completed {
		return c.B().Rpush().Key(full).Element("GET /api/v1/users?page=2 HTTP/1.1 200 512 0.004", "GET /").Build()
	}},
}

// reset refuses a key that is not a strictrate log, names the key and its type, and leaves it.
func TestResetRefusesAForeignKey(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	for _, fk := range foreignKeys {
		t.Run(fk.name, func(t *testing.T) {
			key := "foreign-" + t.Name()
			full := "tool:" + key
			valkeytest.Must(t, "make the key", c.Do(ctx, fk.make(c, full)), valkey.ValkeyResult.ToAny)
			var out bytes.Buffer
			err := run(ctx, []string{"reset", "-addr", server.Addr, "-prefix", "tool:", key}, &out)
			if !errors.Is(err, errNotALog) {
				t.Fatalf("reset of a %s: %v, want errNotALog (output %q)", fk.name, err, out.String())
			}
			for _, want := range []string{strconv.Quote(key), full, "holds a " + fk.kind, "-force"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the error lacks %q: %v", want, err)
				}
			}
			if strings.Contains(out.String(), "deleted the") {
				t.Errorf("reset output says it deleted: %q", out.String())
			}
			if n := valkeytest.Must(t, "EXISTS", c.Do(ctx, c.B().Exists().Key(full).Build()), valkey.ValkeyResult.AsInt64); n != 1 {
				t.Errorf("the %s was deleted", fk.name)
			}
		})
	}
}

// reset -force deletes a key that is not a strictrate log, and says what it was.
func TestResetForceDeletesAForeignKey(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	for _, fk := range foreignKeys {
		t.Run(fk.name, func(t *testing.T) {
			key := "forced-" + t.Name()
			full := "tool:" + key
			valkeytest.Must(t, "make the key", c.Do(ctx, fk.make(c, full)), valkey.ValkeyResult.ToAny)
			var out bytes.Buffer
			if err := run(ctx, []string{"reset", "-addr", server.Addr, "-prefix", "tool:", "-force", key}, &out); err != nil {
				t.Fatalf("reset -force of a %s: %v", fk.name, err)
			}
			want := `deleted "` + key + `" (` + full + `): a ` + fk.kind + `, not a strictrate log (-force)`
			if !strings.Contains(out.String(), want) {
				t.Errorf("reset -force output lacks %q:\n%s", want, out.String())
			}
			if n := valkeytest.Must(t, "EXISTS", c.Do(ctx, c.B().Exists().Key(full).Build()), valkey.ValkeyResult.AsInt64); n != 0 {
				t.Errorf("the %s is still there after reset -force", fk.name)
			}
		})
	}
}
