package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
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
		`key "inspect-me" (tool:inspect-me): 3 entries, 15 events`,
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
