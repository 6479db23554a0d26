package inspect_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// server is the one Valkey every test in this package shares; tests keep apart by key.
var server *valkeytest.Server

func TestMain(m *testing.M) { valkeytest.Main(m, &server) }

// Read returns what the engine stored: the totals, the newest entries as asked, the calendar
// counters; a key that does not exist is an empty log of layout 0.
func TestReadsWhatTheEngineStored(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	e, clock := enginetest.Clocked(t, c)
	key := enginetest.NewKey(t)
	if log, err := inspect.Read(ctx, c, enginetest.Prefix+key, 0); err != nil || log.Layout != 0 || log.Count != 0 {
		t.Fatalf("a key that does not exist: %+v, %v", log, err)
	}
	p := engine.Policy{engine.PerMinute(10), engine.Calendar(100, engine.Day, time.UTC)}
	for i, n := range []int{1, 2, 3} {
		clock.Set(enginetest.T0.Add(time.Duration(i) * time.Second))
		enginetest.MustAllowPolicy(t, e, key, p, n)
	}
	log, err := inspect.Read(ctx, c, enginetest.Prefix+key, 2)
	if err != nil {
		t.Fatal(err)
	}
	if log.Events != 6 || log.Count != 3 || log.Layout != 5 || len(log.Entries) != 2 {
		t.Fatalf("log %+v: want 6 events in 3 entries, layout 5 (with calendar counters), the 2 newest entries", log)
	}
	if e := log.Entries[1]; !e.At.Equal(enginetest.T0.Add(2*time.Second)) || e.Cost != 3 {
		t.Fatalf("the newest entry %+v, want 3 events at T0+2s", e)
	}
	start, end := p[1].PeriodAt(enginetest.T0)
	if len(log.Periods) != 1 || !log.Periods[0].Start.Equal(start) || !log.Periods[0].End.Equal(end) || log.Periods[0].Events != 6 {
		t.Fatalf("periods %+v, want the day of T0 with 6 events", log.Periods)
	}
}

// Bad input is refused before anything is sent; a key that is not a log is ErrUnknownLayout.
func TestRefusals(t *testing.T) {
	c := server.Client(t)
	ctx := context.Background()
	var nilCtx context.Context
	for name, f := range map[string]func() error{
		"nil context": func() error { _, err := inspect.Read(nilCtx, c, "k", 0); return err },
		"nil client":  func() error { _, err := inspect.Read(ctx, nil, "k", 0); return err },
		"empty key":   func() error { _, err := inspect.Read(ctx, c, "", 0); return err },
		"most -1":     func() error { _, err := inspect.Read(ctx, c, "k", -1); return err },
	} {
		if err := f(); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	key := enginetest.Prefix + enginetest.NewKey(t)
	if err := c.Do(ctx, c.B().Set().Key(key).Value("not a log").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, err := inspect.Read(ctx, c, key, 0); !errors.Is(err, engine.ErrUnknownLayout) || !strings.Contains(err.Error(), "string") {
		t.Fatalf("a string key: %v, want ErrUnknownLayout naming a string", err)
	}
}

// Inspect says which layout version a log is stored in: a small header of this release's
// default layout (5) is version 3's once written, 0 for a key that does not exist.
func TestInspectReportsTheLayout(t *testing.T) {
	c := server.Client(t)
	e := enginetest.New(t, c)
	key := enginetest.NewKey(t)
	enginetest.Want(t, "layout of no key", enginetest.Log(t, c, enginetest.Prefix, key).Layout, 0)
	enginetest.MustAllowN(t, e, key, engine.PerMinute(3), 1)
	enginetest.Want(t, "layout of a log this release wrote", enginetest.Log(t, c, enginetest.Prefix, key).Layout, 5)
}
