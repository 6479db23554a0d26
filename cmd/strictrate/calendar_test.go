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
)

// -limit reads what engine.Limit.String writes: sliding limits, with a Resolution or not, and
// calendar limits, with a billing day and a zone or not.
func TestParseLimit(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err) // time/tzdata is linked in
	}
	for _, tc := range []struct {
		text string
		want engine.Limit
	}{
		{"100/1m", engine.PerMinute(100)},
		{"100/1m~1s", engine.Limit{Max: 100, Window: time.Minute, Resolution: time.Second}},
		{"1000000/720h0m0s~1h0m0s", engine.Limit{Max: 1000000, Window: 720 * time.Hour, Resolution: time.Hour}},
		{"1000/month", engine.Calendar(1000, engine.Month, time.UTC)},
		{"1000/month@UTC", engine.Calendar(1000, engine.Month, time.UTC)},
		{"1000/month@Europe/Berlin", engine.Calendar(1000, engine.Month, berlin)},
		{"1000/month:15@UTC", engine.Calendar(1000, engine.Month, time.UTC).WithBillingDay(15)},
		{"1000/month-15", engine.Calendar(1000, engine.Month, time.UTC).WithBillingDay(15)},
		{"5/day@Local", engine.Calendar(5, engine.Day, time.Local)},
		{"5/Week", engine.Calendar(5, engine.Week, time.UTC)},
		{"5/year", engine.Calendar(5, engine.Year, time.UTC)},
	} {
		got, err := parseLimit(tc.text)
		if err != nil {
			t.Errorf("parseLimit(%q): %v", tc.text, err)
			continue
		}
		if got.String() != tc.want.String() || got.Resolution != tc.want.Resolution || got.BillingDay != tc.want.BillingDay {
			t.Errorf("parseLimit(%q) = %s, want %s", tc.text, got, tc.want)
		}
		// What String writes reads back as the same limit.
		if again, err := parseLimit(got.String()); err != nil || again.String() != got.String() {
			t.Errorf("parseLimit(%q), from %q: %v, %v", got.String(), tc.text, again, err)
		}
	}
	for _, bad := range []string{"1/fortnight", "1/month@Nowhere/City", "1/month@", "1/month:x", "1/1m~x", "1/1m~0s", "1/1m~-1s", "1/"} {
		if l, err := parseLimit(bad); err == nil {
			t.Errorf("parseLimit(%q) = %s, want an error", bad, l)
		}
	}
	// Values the engine refuses are refused before anything is read.
	ctx := context.Background()
	for _, invalid := range []string{"10/1s~2s", "10/week:3", "10/month:32", "0/month"} {
		err := run(ctx, []string{"inspect", "-addr", server.Addr, "-limit", invalid, "k"}, &bytes.Buffer{})
		if !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("-limit %s: %v, want ErrInvalidArgument", invalid, err)
		}
	}
}

// inspect prints a key's calendar counters, one line per period, and says that a Resolution's
// entries are slots; -limit counts a calendar limit's current period and a resolution limit's
// window. reset says which counters it deleted.
func TestInspectCalendarAndSlots(t *testing.T) {
	c := server.Client(t)
	e := enginetest.New(t, c, engine.WithPrefix("tool:")) // the server's clock, as the tool's peeks
	ctx := context.Background()
	key := enginetest.NewKey(t)
	p := engine.Policy{{Max: 100, Window: time.Minute, Resolution: time.Second}, engine.Calendar(1000, engine.Month, time.UTC)}
	var at time.Time
	for _, n := range []int{2, 3} {
		r := enginetest.MustAllowPolicy(t, e, key, p, n)
		if !r.Allowed {
			t.Fatalf("AllowPolicy(%d): %+v", n, r)
		}
		at = r.At
	}
	y, m, _ := at.UTC().Date()
	start := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
	month := start.Format(time.RFC3339) + " .. " + start.AddDate(0, 1, 0).Format(time.RFC3339)

	var out bytes.Buffer
	if err := run(ctx, []string{"inspect", "-addr", server.Addr, "-prefix", "tool:", "-limit", "100/1m~1s", "-limit", "1000/month@UTC", key}, &out); err != nil {
		t.Fatalf("inspect: %v\n%s", err, out.String())
	}
	if y2, m2, _ := time.Now().UTC().Date(); y2 != y || m2 != m {
		t.Skipf("the month changed during the test:\n%s", out.String())
	}
	t.Logf("inspect output:\n%s", out.String())
	for _, want := range []string{
		"(layout 5,",
		"calendar counters (their events are not the entries'):\nperiod " + month + ": 5 events\n",
		"entries are slots of 1s",
		"limit 100/1m0s~1s: 5 events in the window, 95 remaining",
		"limit 1000/month@UTC: 5 events in the period " + month + ", 995 remaining, reset after ",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out.String())
		}
	}

	// Without a -limit, the counters are there, and nothing says what the entries are.
	out.Reset()
	if err := run(ctx, []string{"inspect", "-addr", server.Addr, "-prefix", "tool:", key}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "period "+month+": 5 events") || strings.Contains(out.String(), "slots") {
		t.Errorf("inspect output without -limit:\n%s", out.String())
	}

	out.Reset()
	if err := run(ctx, []string{"reset", "-addr", server.Addr, "-prefix", "tool:", key}, &out); err != nil {
		t.Fatalf("reset: %v", err)
	}
	if want := ", and its calendar counters: period " + month + ": 5 events\n"; !strings.Contains(out.String(), want) {
		t.Errorf("reset output lacks %q:\n%s", want, out.String())
	}
}

// A calendar counter prints in the zone of a -limit of its period; a key of calendar limits
// alone has counters and no entries.
func TestInspectCalendarZone(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	c := server.Client(t)
	e, _ := enginetest.Clocked(t, c, engine.WithPrefix("tool:")) // 2026-11-30 12:00 UTC
	ctx := context.Background()
	key := enginetest.NewKey(t)
	l := engine.Calendar(10, engine.Day, berlin)
	if r := enginetest.MustAllowN(t, e, key, l, 4); !r.Allowed {
		t.Fatalf("AllowN: %+v", r)
	}
	var out bytes.Buffer
	if err := run(ctx, []string{"inspect", "-addr", server.Addr, "-prefix", "tool:", "-limit", "10/day@Europe/Berlin", key}, &out); err != nil {
		t.Fatalf("inspect: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"0 entries, 0 events (layout 5,",
		"period 2026-11-30T00:00:00+01:00 .. 2026-12-01T00:00:00+01:00: 4 events\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "time ") {
		t.Errorf("an entries table for a log without entries:\n%s", out.String())
	}
}
