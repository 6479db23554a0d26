package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"
	"time"
	_ "time/tzdata" // Europe/Berlin loads even where the machine has no zoneinfo

	"github.com/google/uuid"
	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
	"github.com/strictrate/strictrate/internal/enginetest"
)

// calendarZone loads a zone, failing the test (never skipping it) when it cannot.
func calendarZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("LoadLocation(%q): %v", name, err)
	}
	return loc
}

// calendarLog is key's log as Inspect reads it.
func calendarLog(t *testing.T, key string) inspect.Log {
	t.Helper()
	l, err := inspect.Read(context.Background(), exampleServer.Client(t), enginetest.Prefix+key, 0)
	if err != nil {
		t.Fatalf("Inspect(%q): %v", key, err)
	}
	return l
}

// calendarPeriods formats counters in a fixed order, for comparing them.
func calendarPeriods(ps []inspect.Period) string {
	ps = slices.Clone(ps)
	slices.SortFunc(ps, func(a, b inspect.Period) int { return a.Start.Compare(b.Start) })
	s := ""
	for _, p := range ps {
		s += fmt.Sprintf("[%s, %s): %d; ", p.Start.UTC().Format(time.RFC3339Nano), p.End.UTC().Format(time.RFC3339Nano), p.Events)
	}
	return s
}

// wantPeriods fails t unless key's counters are want (in any order).
func wantPeriods(t *testing.T, key string, want ...inspect.Period) inspect.Log {
	t.Helper()
	log := calendarLog(t, key)
	if got, w := calendarPeriods(log.Periods), calendarPeriods(want); got != w {
		t.Fatalf("counters of %q:\n got %s\nwant %s", key, got, w)
	}
	return log
}

// periodCount is the counter of l's period holding at, with events.
func periodCount(l engine.Limit, at time.Time, events int) inspect.Period {
	start, end := l.PeriodAt(at)
	return inspect.Period{Start: start, End: end, Events: events}
}

const day = 24 * time.Hour

// Every kind of boundary, on the caller's clock: a calendar limit filled shortly before its
// period ends is denied until the boundary, to the microsecond (RetryAfter = QuotaAfter =
// ResetAfter = boundary - now, Window the period's length, 23 or 25 hours on the days the
// clock changes), and admits again exactly at the boundary, with a fresh counter.
func TestCalendarBoundariesOnCallersClock(t *testing.T) {
	berlin := calendarZone(t, "Europe/Berlin")
	utc := func(y int, m time.Month, d, h, min, s, us int) time.Time {
		return time.Date(y, m, d, h, min, s, us*1000, time.UTC)
	}
	in := func(loc *time.Location, y int, m time.Month, d, h int) time.Time {
		return time.Date(y, m, d, h, 0, 0, 0, loc)
	}
	month, bill31 := engine.Calendar(3, engine.Month, time.UTC), engine.Calendar(3, engine.Month, time.UTC).WithBillingDay(31)
	for _, tc := range []struct {
		name     string
		l        engine.Limit
		fill     time.Time   // the limit is filled here
		still    []time.Time // later instants of the same period: still denied
		boundary time.Time
		window   time.Duration // the filled period's length
		next     time.Duration // the next period's length
	}{
		{"end of January (Month, UTC)", month, utc(2026, 1, 31, 22, 0, 0, 123_457), []time.Time{utc(2026, 1, 31, 23, 59, 59, 0)},
			utc(2026, 2, 1, 0, 0, 0, 0), 31 * day, 28 * day},
		{"end of January (Month, Berlin; UTC still says January)", engine.Calendar(3, engine.Month, berlin),
			utc(2026, 1, 31, 21, 30, 0, 1), nil, in(berlin, 2026, 2, 1, 0), 31 * day, 28 * day},
		{"into a leap day (Day)", engine.Calendar(3, engine.Day, time.UTC), utc(2028, 2, 28, 23, 0, 0, 0), nil,
			utc(2028, 2, 29, 0, 0, 0, 0), day, day},
		{"out of a leap day (Day)", engine.Calendar(3, engine.Day, time.UTC), utc(2028, 2, 29, 0, 0, 0, 0), []time.Time{utc(2028, 2, 29, 12, 0, 0, 7)},
			utc(2028, 3, 1, 0, 0, 0, 0), day, day},
		{"leap February (Month)", month, utc(2028, 2, 29, 12, 0, 0, 0), nil, utc(2028, 3, 1, 0, 0, 0, 0), 29 * day, 31 * day},
		{"New Year (Year)", engine.Calendar(3, engine.Year, time.UTC), utc(2026, 12, 31, 23, 59, 59, 500_000), nil,
			utc(2027, 1, 1, 0, 0, 0, 0), 365 * day, 365 * day},
		{"New Year inside an ISO week (Week)", engine.Calendar(3, engine.Week, time.UTC), utc(2026, 12, 31, 12, 0, 0, 0), // a Thursday
			[]time.Time{utc(2027, 1, 1, 0, 0, 0, 0), utc(2027, 1, 3, 23, 59, 59, 999_999)}, utc(2027, 1, 4, 0, 0, 0, 0), 7 * day, 7 * day},
		{"23-hour day (Day, Berlin)", engine.Calendar(3, engine.Day, berlin), utc(2026, 3, 29, 0, 30, 0, 0), // 01:30 CET
			[]time.Time{utc(2026, 3, 29, 1, 30, 0, 0)}, // 03:30 CEST
			in(berlin, 2026, 3, 30, 0), 23 * time.Hour, day},
		{"25-hour day (Day, Berlin)", engine.Calendar(3, engine.Day, berlin), utc(2026, 10, 24, 23, 0, 0, 0), // 01:00 CEST
			[]time.Time{utc(2026, 10, 25, 1, 30, 0, 0)}, // the second 02:30 (CET)
			in(berlin, 2026, 10, 26, 0), 25 * time.Hour, day},
		{"week of the 23-hour day (Week, Berlin)", engine.Calendar(3, engine.Week, berlin), in(berlin, 2026, 3, 29, 12), nil,
			in(berlin, 2026, 3, 30, 0), 7*day - time.Hour, 7 * day},
		{"billing day 31 in April", bill31, utc(2026, 4, 29, 12, 0, 0, 0), nil, utc(2026, 4, 30, 0, 0, 0, 0), 30 * day, 31 * day},
		{"billing day 31 in February 2026", bill31, utc(2026, 2, 27, 23, 0, 0, 0), nil, utc(2026, 2, 28, 0, 0, 0, 0), 28 * day, 31 * day},
		{"billing day 31 in February 2028", bill31, utc(2028, 2, 28, 23, 0, 0, 0), nil, utc(2028, 2, 29, 0, 0, 0, 0), 29 * day, 31 * day},
		{"billing day 15", engine.Calendar(3, engine.Month, time.UTC).WithBillingDay(15), utc(2026, 3, 14, 23, 0, 0, 0),
			[]time.Time{utc(2026, 3, 1, 0, 0, 0, 0).Add(13*day + 23*time.Hour + 30*time.Minute)}, utc(2026, 3, 15, 0, 0, 0, 0), 28 * day, 31 * day},
		{"billing day 15 across New Year (Berlin)", engine.Calendar(3, engine.Month, berlin).WithBillingDay(15), in(berlin, 2027, 1, 14, 22),
			nil, in(berlin, 2027, 1, 15, 0), 31 * day, 31 * day},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &steppedClock{now: tc.fill}
			e := enginetest.New(t, exampleServer.Client(t), engine.WithClock(clock.Now))
			key, ctx, l := enginetest.NewKey(t), context.Background(), tc.l
			if start, end := l.PeriodAt(tc.fill); !end.Equal(tc.boundary) || end.Sub(start) != tc.window {
				t.Fatalf("PeriodAt(%s) = [%s, %s), want one of %s ending at %s", tc.fill, start, end, tc.window, tc.boundary)
			}
			denied := func(at time.Time, what string) {
				t.Helper()
				clock.now = at
				want := tc.boundary.Sub(at)
				r, err := e.AllowN(ctx, key, l, 1)
				if err != nil {
					t.Fatal(err)
				}
				if r.Allowed || r.Remaining != 0 || r.RetryAfter != want || r.QuotaAfter != want || r.ResetAfter != want ||
					r.Window != tc.window || !r.At.Equal(at) || !r.Entry.IsZero() {
					t.Fatalf("%s at %s: %+v\nwant denied, retry/quota/reset after %s, window %s", what, at, r, want, tc.window)
				}
				p, err := e.Peek(ctx, key, l)
				if err != nil {
					t.Fatal(err)
				}
				if p.Allowed || p.RetryAfter != want || p.QuotaAfter != want || p.ResetAfter != want || p.Window != tc.window {
					t.Fatalf("Peek %s at %s: %+v\nwant denied, retry/quota/reset after %s, window %s", what, at, p, want, tc.window)
				}
			}

			for i := range 3 {
				r, err := e.Allow(ctx, key, l)
				if err != nil {
					t.Fatal(err)
				}
				want := tc.boundary.Sub(tc.fill)
				if !r.Allowed || r.Remaining != 2-i || r.QuotaAfter != want || r.ResetAfter != want || r.Window != tc.window {
					t.Fatalf("admission %d at %s: %+v\nwant admitted, %d remaining, quota/reset after %s, window %s",
						i+1, tc.fill, r, 2-i, want, tc.window)
				}
				if id := r.Entry; id.Key != enginetest.Prefix+key || !id.At.Equal(tc.fill) || id.Seq != 0 || id.Cost != 1 || !id.Shared {
					t.Fatalf("admission %d: entry %+v, want no seq, shared, of cost 1", i+1, r.Entry)
				}
			}
			denied(tc.fill, "the 4th request")
			for _, at := range tc.still {
				denied(at, "later in the period")
			}
			denied(tc.boundary.Add(-time.Microsecond), "the last microsecond")
			log := wantPeriods(t, key, inspect.Period{Start: tc.boundary.Add(-tc.window), End: tc.boundary, Events: 3})
			if log.Layout != 5 || log.Count != 0 || log.Events != 0 {
				t.Fatalf("log %+v: want layout 5 and no entries", log)
			}

			clock.now = tc.boundary
			r, err := e.AllowPolicy(ctx, key, engine.Policy{l}, 1)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Allowed || r.Remaining != 2 || r.Window != tc.next || r.QuotaAfter != tc.next || r.ResetAfter != tc.next {
				t.Fatalf("at the boundary %s: %+v\nwant admitted, 2 remaining, window and quota/reset after %s", tc.boundary, r, tc.next)
			}
			// The ended period's counter is gone; the new one holds the admission.
			wantPeriods(t, key, inspect.Period{Start: tc.boundary, End: tc.boundary.Add(tc.next), Events: 1})
			// The key lasts until the new period ends (PEXPIRE on a caller's clock, with a little slack).
			if ttl := time.Duration(enginetest.PTTL(t, exampleServer.Client(t), enginetest.Prefix+key)) * time.Millisecond; ttl <= tc.next-time.Minute || ttl > tc.next+time.Second {
				t.Fatalf("PTTL %s, want about %s", ttl, tc.next)
			}
		})
	}
}

// A Policy of a sliding limit and a calendar one is decided all or nothing: a request denied by
// either counts against neither, and a full month denies until it ends even when the second
// has room.
func TestCalendarPolicyAllOrNothing(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 11, 10, 12, 0, 0, 0, time.UTC)
	monthEnd, november := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC), 30*day
	p := engine.Policy{{Max: 3, Window: time.Second}, engine.Calendar(5, engine.Month, time.UTC)}
	monthOf := func(at time.Time, events int) inspect.Period { return periodCount(p[1], at, events) }

	type step struct {
		at        time.Duration // after t0
		n         int
		allowed   bool
		remaining int
		retry     time.Duration // 0 when admitted; -1: the time to the month's end
		window    time.Duration
	}
	toMonthEnd := time.Duration(-1)
	run := func(t *testing.T, steps []step) {
		clock := &steppedClock{}
		e := enginetest.New(t, exampleServer.Client(t), engine.WithClock(clock.Now))
		key := enginetest.NewKey(t)
		for i, s := range steps {
			clock.now = t0.Add(s.at)
			before := calendarLog(t, key)
			peek, err := e.PeekPolicy(ctx, key, p, s.n)
			if err != nil {
				t.Fatal(err)
			}
			r := enginetest.MustAllowPolicy(t, e, key, p, s.n)
			retry := s.retry
			if retry == toMonthEnd {
				retry = monthEnd.Sub(clock.now)
			}
			what := fmt.Sprintf("step %d (n=%d at +%s): %+v", i+1, s.n, s.at, r)
			if r.Allowed != s.allowed || r.Remaining != s.remaining || r.RetryAfter != retry || r.Window != s.window {
				t.Fatalf("%s\nwant allowed %v, %d remaining, retry after %s, window %s", what, s.allowed, s.remaining, retry, s.window)
			}
			if peek.Allowed != r.Allowed || peek.RetryAfter != r.RetryAfter || peek.Window != r.Window {
				t.Fatalf("%s\nPeekPolicy before it: %+v; want the same Allowed, RetryAfter and Window", what, peek)
			}
			if s.window == november && r.QuotaAfter != monthEnd.Sub(clock.now) {
				t.Fatalf("%s\nwant quota after %s (the month's end)", what, monthEnd.Sub(clock.now))
			}
			after := calendarLog(t, key)
			if r.Allowed {
				if !r.Entry.Shared || r.Entry.Seq < 1 || r.Entry.Cost != s.n {
					t.Fatalf("%s\nwant an entry of its own (seq >= 1), shared with the month's counter", what)
				}
				continue
			}
			// Counted against neither: the month's counter and the sliding log are unchanged
			// (the denial's trim may only drop entries that left the second).
			if calendarPeriods(after.Periods) != calendarPeriods(before.Periods) {
				t.Fatalf("%s\nthe month's counters went from %s to %s, want them unchanged", what, calendarPeriods(before.Periods), calendarPeriods(after.Periods))
			}
			if after.Count > before.Count || after.Events > before.Events {
				t.Fatalf("%s\nthe log went from %d entries (%d events) to %d (%d), want no more", what, before.Count, before.Events, after.Count, after.Events)
			}
			if r.ResetAfter != monthEnd.Sub(clock.now) {
				t.Fatalf("%s\nwant reset after %s: the month's counter holds events until it ends", what, monthEnd.Sub(clock.now))
			}
		}
		wantPeriods(t, key, monthOf(t0, 5))
		// A new month: the second's room and a fresh counter.
		clock.now = monthEnd
		if r := enginetest.MustAllowPolicy(t, e, key, p, 1); !r.Allowed || r.Remaining != 2 || r.Window != time.Second {
			t.Fatalf("on December 1: %+v, want admitted, 2 remaining in the second", r)
		}
		wantPeriods(t, key, monthOf(monthEnd, 1))
	}

	t.Run("one event each", func(t *testing.T) {
		run(t, []step{
			{at: 0, n: 1, allowed: true, remaining: 2, window: time.Second},
			{at: 0, n: 1, allowed: true, remaining: 1, window: time.Second},
			{at: 0, n: 1, allowed: true, remaining: 0, window: time.Second},
			{at: 0, n: 1, retry: time.Second, window: time.Second},                 // the second is full: the month keeps 3
			{at: time.Second, n: 1, allowed: true, remaining: 1, window: november}, // month 4
			{at: time.Second, n: 1, allowed: true, remaining: 0, window: november}, // month 5
			{at: time.Second, n: 1, retry: toMonthEnd, window: november},           // the second has room, the month none
			{at: 5 * time.Second, n: 1, retry: toMonthEnd, window: november},       // an empty second
			{at: 20 * day, n: 1, retry: toMonthEnd, window: november},              // days later, still this month
			{at: monthEnd.Sub(t0) - time.Microsecond, n: 1, retry: time.Microsecond, window: november},
		})
	})
	t.Run("weighted", func(t *testing.T) {
		run(t, []step{
			{at: 0, n: 2, allowed: true, remaining: 1, window: time.Second},
			{at: 0, n: 2, retry: time.Second, remaining: 1, window: time.Second},           // 2 + 2 > 3 in the second: the month keeps 2
			{at: time.Second, n: 2, allowed: true, remaining: 1, window: time.Second},      // month 4; both have 1 left
			{at: 2 * time.Second, n: 2, retry: toMonthEnd, remaining: 1, window: november}, // 4 + 2 > 5; the second has 3
			{at: 2 * time.Second, n: 1, allowed: true, remaining: 0, window: november},     // month 5
			{at: 3 * time.Second, n: 1, retry: toMonthEnd, window: november},
		})
	})
}

// Many engines on their own clients, on the server's clock, hammer a key of a sliding limit and
// a day, and a key of a day alone, with costs of 1 to 3: the day's counter is exactly the sum
// of the admitted costs and never above its max, no trailing window of the sliding limit holds
// more than its max, and every denial of a full day says to retry at midnight, to the
// microsecond.
func TestCalendarNeverOverAdmitsUnderConcurrency(t *testing.T) {
	if until := time.Until(nextUTCMidnight(time.Now())); until < 5*time.Second {
		time.Sleep(until + 100*time.Millisecond) // not across a midnight
	}
	const (
		goroutines = 64
		run        = 1500 * time.Millisecond
		slideMax   = 20
		slideWin   = 200 * time.Millisecond
		mixedDay   = 100 // more than one sliding window admits: the day fills as the window slides
		aloneDay   = 300
	)
	engines, _ := enginetest.Engines(t, exampleServer, 4)
	mixedKey, aloneKey := enginetest.NewKey(t), enginetest.NewKey(t)
	mixed := engine.Policy{{Max: slideMax, Window: slideWin}, engine.Calendar(mixedDay, engine.Day, time.UTC)}
	alone := engine.Calendar(aloneDay, engine.Day, time.UTC)

	// 20 calls each, for the run at least, and until each day is full: the day alone once an
	// admission leaves it no room, the policy's once a denial waits past its sliding window
	// (for midnight), however the machine's stalls fell.
	type onKey struct {
		mixed bool
		d     calendarDecision
	}
	var mixedFull, aloneFull atomic.Bool
	ctx := context.Background()
	full := runFor{calls: 20, span: run, more: func() bool { return !mixedFull.Load() || !aloneFull.Load() }}
	all := decideMany(t, engines, goroutines, full, 7, func(rng *rand.Rand, e *engine.Engine) (onKey, time.Time, error) {
		if rng.IntN(2) == 0 {
			r, err := e.AllowPolicy(ctx, mixedKey, mixed, 1)
			if err == nil && !r.Allowed && r.RetryAfter > slideWin {
				mixedFull.Store(true)
			}
			return onKey{true, calendarDecision{r, 1}}, r.At, err
		}
		n := 1 + rng.IntN(3)
		r, err := e.AllowN(ctx, aloneKey, alone, n)
		if err == nil && r.Allowed && r.Remaining == 0 {
			aloneFull.Store(true)
		}
		return onKey{false, calendarDecision{r, n}}, r.At, err
	})
	var onMixed, onAlone []calendarDecision
	for _, k := range all {
		if k.mixed {
			onMixed = append(onMixed, k.d)
		} else {
			onAlone = append(onAlone, k.d)
		}
	}

	// check checks one key's decisions, and returns the admissions, by decision time.
	check := func(name, key string, l engine.Limit, ds []calendarDecision) []calendarDecision {
		t.Helper()
		slices.SortStableFunc(ds, func(a, b calendarDecision) int { return a.r.At.Compare(b.r.At) })
		start, end := l.PeriodAt(ds[0].r.At)
		if s, _ := l.PeriodAt(ds[len(ds)-1].r.At); !s.Equal(start) {
			t.Skipf("%s: the run crossed a UTC midnight", name)
		}
		var admitted []calendarDecision
		sum, denials := 0, 0
		for _, d := range ds {
			if d.r.Allowed {
				admitted = append(admitted, d)
				sum += d.cost
				if !d.r.Entry.Shared || d.r.Entry.Cost != d.cost {
					t.Fatalf("%s: admission %+v: want a shared entry of cost %d", name, d.r, d.cost)
				}
			} else {
				denials++
			}
		}
		log := calendarLog(t, key)
		if got := calendarPeriods(log.Periods); got != calendarPeriods([]inspect.Period{{Start: start, End: end, Events: sum}}) {
			t.Fatalf("%s: counters %s, want the day's holding the %d admitted events", name, got, sum)
		}
		if sum > l.Max {
			t.Fatalf("%s: %d events admitted in the day, more than %d", name, sum, l.Max)
		}
		if len(admitted) == 0 || denials == 0 {
			t.Fatalf("%s: %d admitted, %d denied: want both", name, len(admitted), denials)
		}
		t.Logf("%s: %d decisions, %d admitted (%d events), %d denied", name, len(ds), len(admitted), sum, denials)
		return admitted
	}

	// The day alone: every denial is the day's, and says so to the microsecond.
	admitted := check("day alone", aloneKey, alone, onAlone)
	if sum := sumCosts(admitted); sum != aloneDay {
		t.Fatalf("day alone: %d events admitted, want the day filled (%d)", sum, aloneDay)
	}
	for _, d := range onAlone {
		if d.r.Allowed {
			continue
		}
		start, end := alone.PeriodAt(d.r.At)
		if want := end.Sub(d.r.At); d.r.RetryAfter != want || d.r.QuotaAfter != want || d.r.ResetAfter != want || d.r.Window != end.Sub(start) {
			t.Fatalf("day alone: denial %+v (cost %d)\nwant retry/quota/reset after %s (midnight), window %s", d.r, d.cost, want, end.Sub(start))
		}
	}

	// The policy: the day and every trailing window.
	admitted = check("policy", mixedKey, mixed[1], onMixed)
	for i, d := range admitted {
		inWindow := 0
		for j := i; j >= 0 && admitted[j].r.At.After(d.r.At.Add(-slideWin)); j-- {
			inWindow += admitted[j].cost
		}
		for j := i + 1; j < len(admitted) && admitted[j].r.At.Equal(d.r.At); j++ {
			inWindow += admitted[j].cost
		}
		if inWindow > slideMax {
			t.Fatalf("policy: %d events admitted in the %s up to %s, more than %d", inWindow, slideWin, d.r.At.Format(time.RFC3339Nano), slideMax)
		}
	}
	if sum := sumCosts(admitted); sum != mixedDay {
		t.Fatalf("policy: %d events admitted, want the day filled (%d) within the run", sum, mixedDay)
	}
	filled := admitted[len(admitted)-1].r.At
	late := 0
	for _, d := range onMixed {
		switch {
		case d.r.Allowed:
		case d.r.At.After(filled):
			_, end := mixed[1].PeriodAt(d.r.At)
			if want := end.Sub(d.r.At); d.r.RetryAfter != want || d.r.Remaining != 0 {
				t.Fatalf("policy: denial %+v after the day filled at %s\nwant retry after %s (midnight)", d.r, filled.Format(time.RFC3339Nano), want)
			}
			late++
		case d.r.At.Before(filled):
			if d.r.RetryAfter <= 0 || d.r.RetryAfter > slideWin || d.r.Window != slideWin {
				t.Fatalf("policy: denial %+v before the day filled: want one of the sliding window's", d.r)
			}
		}
	}
	if late == 0 {
		t.Fatal("policy: no denial after the day filled")
	}
}

// calendarDecision is one decision of the concurrency test, and the cost it asked for.
type calendarDecision struct {
	r    engine.Result
	cost int
}

func sumCosts(ds []calendarDecision) int {
	sum := 0
	for _, d := range ds {
		sum += d.cost
	}
	return sum
}

// nextUTCMidnight is the UTC midnight after t.
func nextUTCMidnight(t time.Time) time.Time {
	y, m, d := t.UTC().Date()
	return time.Date(y, m, d+1, 0, 0, 0, 0, time.UTC)
}

// Refunds and settles give a calendar request's cost back to the counter of the period that
// holds its decision time: alone (no entry), in a policy of two periods, after its entry left a
// policy's sliding window, and not at all once that period ended.
func TestCalendarRefundGivesBackToItsPeriod(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 6, 10, 10, 0, 0, 0, time.UTC)
	remaining := func(t *testing.T, e *engine.Engine, key string, l engine.Limit) int {
		t.Helper()
		return enginetest.MustPeek(t, e, key, l).Remaining
	}
	mustSettle := func(t *testing.T, e *engine.Engine, key string, r engine.Result, actual int) {
		t.Helper()
		if err := e.Settle(ctx, key, r, actual); err != nil {
			t.Fatalf("Settle(%+v, %d): %v", r.Entry, actual, err)
		}
	}

	t.Run("calendar alone", func(t *testing.T) {
		clock := &steppedClock{now: t0}
		c := exampleServer.Client(t)
		e := enginetest.New(t, c, engine.WithClock(clock.Now))
		key, l := enginetest.NewKey(t), engine.Calendar(10, engine.Month, time.UTC)
		r1 := enginetest.MustAllowN(t, e, key, l, 3)
		if !r1.Allowed || r1.Entry.Seq != 0 || !r1.Entry.Shared || r1.Entry.Cost != 3 || r1.Remaining != 7 {
			t.Fatalf("AllowN(3): %+v, want admitted with a shared entry of no seq", r1)
		}
		clock.now = t0.Add(time.Hour)
		r2 := enginetest.MustAllowN(t, e, key, l, 4)
		if got := remaining(t, e, key, l); got != 3 {
			t.Fatalf("after 7 events: %d remaining, want 3", got)
		}
		ttl := enginetest.PTTL(t, c, enginetest.Prefix+key)
		if err := e.Refund(ctx, key, r1); err != nil {
			t.Fatal(err)
		}
		if got := remaining(t, e, key, l); got != 6 {
			t.Fatalf("after refunding 3: %d remaining, want 6", got)
		}
		if after := enginetest.PTTL(t, c, enginetest.Prefix+key); after <= 0 || after > ttl {
			t.Fatalf("PTTL %d after the refund, was %d; want it kept (positive, no later)", after, ttl)
		}
		mustSettle(t, e, key, r2, 1) // 4 -> 1
		if got := remaining(t, e, key, l); got != 9 {
			t.Fatalf("after settling 4 to 1: %d remaining, want 9", got)
		}
		wantPeriods(t, key, periodCount(l, t0, 1))
		// A shared request gives back on every call, never below 0.
		if err := e.Refund(ctx, key, r1); err != nil {
			t.Fatal(err)
		}
		wantPeriods(t, key, periodCount(l, t0, 0))
		if got := remaining(t, e, key, l); got != 10 {
			t.Fatalf("after refunding again: %d remaining, want 10", got)
		}
		// Settle checks its arguments before anything is sent.
		if err := e.Settle(ctx, key, r2, 5); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Fatalf("Settle above the cost: %v, want ErrInvalidArgument", err)
		}
		clock.now = t0.Add(2 * time.Hour)
		full := enginetest.MustAllowN(t, e, key, l, 10)
		denied := enginetest.MustAllowN(t, e, key, l, 1)
		if !full.Allowed || denied.Allowed {
			t.Fatalf("fill: %+v, then %+v; want the fill admitted, then a denial", full, denied)
		}
		if err := e.Refund(ctx, key, denied); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Fatalf("Refund of a denial: %v, want ErrInvalidArgument", err)
		}
		// A refund of a key that was reset makes no key.
		if err := e.Reset(ctx, key); err != nil {
			t.Fatal(err)
		}
		if err := e.Refund(ctx, key, full); err != nil {
			t.Fatal(err)
		}
		if ttl := enginetest.PTTL(t, c, enginetest.Prefix+key); ttl != -2 {
			t.Fatalf("PTTL %d after refunding into a reset key, want -2 (no key)", ttl)
		}
	})

	t.Run("two periods, no sliding limit", func(t *testing.T) {
		clock := &steppedClock{now: t0}
		e := enginetest.New(t, exampleServer.Client(t), engine.WithClock(clock.Now))
		key := enginetest.NewKey(t)
		p := engine.Policy{engine.Calendar(5, engine.Day, time.UTC), engine.Calendar(20, engine.Month, time.UTC)}
		r := enginetest.MustAllowPolicy(t, e, key, p, 3)
		if !r.Allowed || r.Entry.Seq != 0 || !r.Entry.Shared || r.Remaining != 2 || r.Window != day {
			t.Fatalf("AllowPolicy(3): %+v, want admitted, no seq, shared, 2 left in the day", r)
		}
		wantPeriods(t, key, periodCount(p[0], t0, 3), periodCount(p[1], t0, 3))
		mustSettle(t, e, key, r, 2)
		wantPeriods(t, key, periodCount(p[0], t0, 2), periodCount(p[1], t0, 2))
		if err := e.Refund(ctx, key, r); err != nil {
			t.Fatal(err)
		}
		wantPeriods(t, key, periodCount(p[0], t0, 0), periodCount(p[1], t0, 0))
	})

	t.Run("after its period ended", func(t *testing.T) {
		clock := &steppedClock{now: time.Date(2026, 6, 10, 23, 0, 0, 0, time.UTC)}
		e := enginetest.New(t, exampleServer.Client(t), engine.WithClock(clock.Now))
		key, l := enginetest.NewKey(t), engine.Calendar(5, engine.Day, time.UTC)
		old := enginetest.MustAllowN(t, e, key, l, 4)
		clock.now = time.Date(2026, 6, 11, 1, 0, 0, 0, time.UTC)
		enginetest.MustAllowN(t, e, key, l, 2)
		if err := e.Refund(ctx, key, old); err != nil {
			t.Fatal(err)
		}
		wantPeriods(t, key, periodCount(l, clock.now, 2))
		if got := remaining(t, e, key, l); got != 3 {
			t.Fatalf("after refunding yesterday's request: %d remaining today, want 3", got)
		}
	})

	t.Run("policy entry that left its window", func(t *testing.T) {
		clock := &steppedClock{now: t0}
		e := enginetest.New(t, exampleServer.Client(t), engine.WithClock(clock.Now))
		key := enginetest.NewKey(t)
		p := engine.Policy{engine.PerSecond(10), engine.Calendar(100, engine.Month, time.UTC)}
		month := func(events int) inspect.Period { return periodCount(p[1], t0, events) }

		// Still in the second: the refund gives back to the entry and to the month.
		r := enginetest.MustAllowPolicy(t, e, key, p, 5)
		if !r.Allowed || r.Entry.Seq != 1 || !r.Entry.Shared {
			t.Fatalf("AllowPolicy(5): %+v, want an entry of its own, shared with the month", r)
		}
		if err := e.Refund(ctx, key, r); err != nil {
			t.Fatal(err)
		}
		if log := wantPeriods(t, key, month(0)); log.Events != 0 {
			t.Fatalf("after the refund: %+v, want no events in the log", log)
		}

		// Gone from the second: the month still gets it back.
		clock.now = t0.Add(time.Second)
		r = enginetest.MustAllowPolicy(t, e, key, p, 5)
		clock.now = t0.Add(3 * time.Second)
		enginetest.MustAllowPolicy(t, e, key, p, 1) // trims r's entry
		if log := wantPeriods(t, key, month(6)); log.Count != 1 || log.Events != 1 {
			t.Fatalf("%+v: want r's entry trimmed, one entry left", log)
		}
		mustSettle(t, e, key, r, 2)
		wantPeriods(t, key, month(3))
		if err := e.Refund(ctx, key, r); err != nil { // a shared request gives back on every call
			t.Fatal(err)
		}
		wantPeriods(t, key, month(0))
		pr, err := e.PeekPolicy(ctx, key, p, 1)
		if err != nil || pr.Remaining != 9 {
			t.Fatalf("PeekPolicy: %+v, %v; want 9 remaining (the second's)", pr, err)
		}
	})
}

// Every invalid calendar limit, and two calendar limits of the same periods in a Policy, are
// refused with ErrInvalidArgument by every call, before anything is sent.
func TestCalendarBadInputRefused(t *testing.T) {
	ctx := context.Background()
	c := exampleServer.Client(t)
	e := enginetest.New(t, c)
	berlin := calendarZone(t, "Europe/Berlin")
	absent := func(t *testing.T, key string) {
		t.Helper()
		if ttl := enginetest.PTTL(t, c, enginetest.Prefix+key); ttl != -2 {
			t.Fatalf("PTTL %d after a refused call, want -2 (no key)", ttl)
		}
	}

	bad := map[string]engine.Limit{
		"nil location":                   engine.Calendar(3, engine.Month, nil),
		"unknown period":                 engine.Calendar(3, engine.Period(9), time.UTC),
		"billing day with Week":          engine.Calendar(3, engine.Week, time.UTC).WithBillingDay(5),
		"billing day with Day":           engine.Calendar(3, engine.Day, time.UTC).WithBillingDay(1),
		"billing day 32":                 engine.Calendar(3, engine.Month, time.UTC).WithBillingDay(32),
		"billing day -1":                 engine.Calendar(3, engine.Month, time.UTC).WithBillingDay(-1),
		"a Window":                       {Max: 3, Window: time.Hour, Period: engine.Month, Location: time.UTC},
		"a Resolution":                   {Max: 3, Resolution: time.Second, Period: engine.Day, Location: time.UTC},
		"Max 0":                          engine.Calendar(0, engine.Day, time.UTC),
		"Max above MaxEvents":            engine.Calendar(engine.MaxEvents+1, engine.Day, time.UTC),
		"a Location on a sliding limit":  {Max: 3, Window: time.Second, Location: time.UTC},
		"a billing day on a sliding one": engine.PerSecond(3).WithBillingDay(15),
	}
	for name, l := range bad {
		t.Run(name, func(t *testing.T) {
			key := enginetest.NewKey(t)
			withSecond := engine.Policy{engine.PerSecond(5), l}
			for call, do := range map[string]func() error{
				"Allow":                    func() error { _, err := e.Allow(ctx, key, l); return err },
				"AllowN":                   func() error { _, err := e.AllowN(ctx, key, l, 1); return err },
				"Peek":                     func() error { _, err := e.Peek(ctx, key, l); return err },
				"AllowPolicy alone":        func() error { _, err := e.AllowPolicy(ctx, key, engine.Policy{l}, 1); return err },
				"AllowPolicy with 1/s":     func() error { _, err := e.AllowPolicy(ctx, key, withSecond, 1); return err },
				"PeekPolicy alone":         func() error { _, err := e.PeekPolicy(ctx, key, engine.Policy{l}, 1); return err },
				"PeekPolicy with 1/s":      func() error { _, err := e.PeekPolicy(ctx, key, withSecond, 1); return err },
				"Policy.Validate alone":    func() error { return engine.Policy{l}.Validate() },
				"Policy.Validate with 1/s": func() error { return withSecond.Validate() },
			} {
				if err := do(); !errors.Is(err, engine.ErrInvalidArgument) {
					t.Errorf("%s: %v, want ErrInvalidArgument", call, err)
				}
			}
			absent(t, key)
		})
	}

	t.Run("cost above the calendar's Max", func(t *testing.T) {
		key, l := enginetest.NewKey(t), engine.Calendar(3, engine.Day, time.UTC)
		if _, err := e.AllowN(ctx, key, l, 4); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("AllowN(4): %v, want ErrInvalidArgument", err)
		}
		if _, err := e.AllowPolicy(ctx, key, engine.Policy{engine.PerSecond(10), l}, 4); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("AllowPolicy(4): %v, want ErrInvalidArgument", err)
		}
		absent(t, key)
	})

	for name, p := range map[string]engine.Policy{
		"two months":                 {engine.Calendar(3, engine.Month, time.UTC), engine.Calendar(5, engine.Month, time.UTC)},
		"billing day 1 is the 1st":   {engine.Calendar(3, engine.Month, time.UTC), engine.Calendar(5, engine.Month, time.UTC).WithBillingDay(1)},
		"two Berlin days beside 1/s": {engine.PerSecond(1), engine.Calendar(3, engine.Day, berlin), engine.Calendar(4, engine.Day, berlin)},
		"the same billing day":       {engine.Calendar(3, engine.Month, berlin).WithBillingDay(15), engine.Calendar(3, engine.Month, berlin).WithBillingDay(15)},
	} {
		t.Run("duplicate: "+name, func(t *testing.T) {
			key := enginetest.NewKey(t)
			if err := p.Validate(); !errors.Is(err, engine.ErrInvalidArgument) {
				t.Errorf("Validate: %v, want ErrInvalidArgument", err)
			}
			if _, err := e.AllowPolicy(ctx, key, p, 1); !errors.Is(err, engine.ErrInvalidArgument) {
				t.Errorf("AllowPolicy: %v, want ErrInvalidArgument", err)
			}
			if _, err := e.PeekPolicy(ctx, key, p, 1); !errors.Is(err, engine.ErrInvalidArgument) {
				t.Errorf("PeekPolicy: %v, want ErrInvalidArgument", err)
			}
			absent(t, key)
		})
	}

	t.Run("distinct periods are valid", func(t *testing.T) {
		for _, p := range []engine.Policy{
			{engine.Calendar(3, engine.Month, time.UTC), engine.Calendar(5, engine.Month, berlin)},
			{engine.Calendar(3, engine.Month, time.UTC), engine.Calendar(5, engine.Month, time.UTC).WithBillingDay(15)},
			{engine.PerSecond(2), engine.PerHour(50), engine.Calendar(3, engine.Day, time.UTC), engine.Calendar(5, engine.Week, time.UTC),
				engine.Calendar(7, engine.Month, time.UTC), engine.Calendar(9, engine.Year, time.UTC)},
		} {
			if err := p.Validate(); err != nil {
				t.Errorf("%s: Validate: %v", p, err)
			}
			if r, err := e.AllowPolicy(ctx, enginetest.NewKey(t), p, 1); err != nil || !r.Allowed {
				t.Errorf("%s: AllowPolicy: %+v, %v; want an admission", p, r, err)
			}
		}
	})
}

// A calendar limit's key is one counter, whatever the number of events: a month of a million
// after a thousand admissions is a few dozen bytes; beside a per-second limit, its ten entries.
func TestCalendarMemoryIsOneCounter(t *testing.T) {
	c := exampleServer.Client(t)

	// Keys of a fixed length, whatever the test's name: MEMORY USAGE counts the key's name.
	key, month := "calendar-memory:"+uuid.NewString(), engine.Calendar(1_000_000, engine.Month, time.UTC)
	if _, end := month.PeriodAt(time.Now()); time.Until(end) < 5*time.Second {
		time.Sleep(time.Until(end) + 100*time.Millisecond) // not across a month's end
	}
	e := enginetest.New(t, c) // the server's clock
	var last engine.Result
	for range 1000 {
		last = enginetest.MustAllowN(t, e, key, month, 1)
		if !last.Allowed {
			t.Fatalf("denied: %+v, want an admission", last)
		}
	}
	if last.Entry.Key != enginetest.Prefix+key {
		t.Fatalf("entry key %q, want %q", last.Entry.Key, enginetest.Prefix+key)
	}
	size := memoryUsage(t, c, key)
	log := calendarLog(t, key)
	t.Logf("Calendar(1e6, Month) after 1000 admissions: %d bytes (%+v)", size, log)
	if size > 200 {
		t.Fatalf("MEMORY USAGE %d bytes, want at most 200", size)
	}
	if log.Layout != 5 || log.Count != 0 || len(log.Periods) != 1 || log.Periods[0].Events != 1000 || last.Remaining != 1_000_000-1000 {
		t.Fatalf("log %+v: want layout 5, no entries, one counter", log)
	}

	clock := &steppedClock{now: time.Date(2026, 6, 10, 10, 0, 0, 0, time.UTC)}
	ce := enginetest.New(t, c, engine.WithClock(clock.Now))
	pkey, p := "calendar-memory:"+uuid.NewString(), engine.Policy{engine.PerSecond(10), month}
	for i := range 10 {
		clock.now = clock.now.Add(time.Duration(i) * 20 * time.Millisecond)
		if r := enginetest.MustAllowPolicy(t, ce, pkey, p, 1); !r.Allowed {
			t.Fatalf("admission %d denied: %+v, want it admitted", i+1, r)
		}
	}
	size = memoryUsage(t, c, pkey)
	plog := wantPeriods(t, pkey, periodCount(month, clock.now, 10))
	t.Logf("PerSecond(10) and Calendar(1e6, Month) after 10 admissions: %d bytes (%d entries)", size, plog.Count)
	if size > 1300 {
		t.Fatalf("MEMORY USAGE %d bytes, want at most 1300", size)
	}
	if plog.Count != 10 || plog.Layout != 5 {
		t.Fatalf("log %+v: want 10 entries, layout 5", plog)
	}
}

// On the server's clock, the script counts in the period that holds the server's time: a
// day's decision names that UTC day, and a full day says to retry at the next UTC midnight.
// (That the server, not the engine, picks the period when their clocks disagree by up to a
// period cannot be shown through the API: with WithClock the engine sends the time it picks
// the boundaries around, and the server's clock cannot be moved.)
func TestCalendarServerClockPicksPeriod(t *testing.T) {
	if until := time.Until(nextUTCMidnight(time.Now())); until < 3*time.Second {
		time.Sleep(until + 100*time.Millisecond)
	}
	ctx := context.Background()
	c := exampleServer.Client(t)
	e := enginetest.New(t, c)
	key, l := enginetest.NewKey(t), engine.Calendar(2, engine.Day, time.UTC)
	for i := range 2 {
		r := enginetest.MustAllowN(t, e, key, l, 1)
		if since := time.Since(r.At); !r.Allowed || r.Remaining != 1-i || r.Window != day || since < -time.Second || since > time.Second {
			t.Fatalf("admission %d: %+v, want admitted, %d remaining, window 24h, at about now", i+1, r, 1-i)
		}
	}
	r, err := e.Allow(ctx, key, l)
	midnight := nextUTCMidnight(time.Now())
	local := time.Until(midnight)
	if err != nil {
		t.Fatal(err)
	}
	start, end := l.PeriodAt(r.At)
	if r.Allowed || r.Window != end.Sub(start) || r.Window != day || r.RetryAfter != end.Sub(r.At) || r.QuotaAfter != r.RetryAfter || r.ResetAfter != r.RetryAfter {
		t.Fatalf("3rd request: %+v\nwant denied until %s (retry/quota/reset after %s), window 24h", r, end, end.Sub(r.At))
	}
	if !end.Equal(midnight) || (r.RetryAfter-local).Abs() > time.Second {
		t.Fatalf("3rd request: retry after %s, the period ends %s; want the next UTC midnight %s, %s away", r.RetryAfter, end, midnight, local)
	}
	if ttl := time.Duration(enginetest.PTTL(t, c, enginetest.Prefix+key)) * time.Millisecond; (ttl - r.RetryAfter).Abs() > time.Second {
		t.Fatalf("PTTL %s, want about %s: the key lasts until midnight", ttl, r.RetryAfter)
	}
	wantPeriods(t, key, inspect.Period{Start: start, End: end, Events: 2})

	// The same beside a sliding limit.
	pkey, p := enginetest.NewKey(t), engine.Policy{engine.PerMinute(10), engine.Calendar(1, engine.Day, time.UTC)}
	if r := enginetest.MustAllowPolicy(t, e, pkey, p, 1); !r.Allowed || r.Window != day || r.Remaining != 0 {
		t.Fatalf("policy: %+v, want admitted, the day's window, 0 remaining", r)
	}
	r = enginetest.MustAllowPolicy(t, e, pkey, p, 1)
	if _, end := p[1].PeriodAt(r.At); r.Allowed || r.RetryAfter != end.Sub(r.At) {
		t.Fatalf("policy: %+v, want denied until %s", r, end)
	}
}

// The deny cache holds a full calendar limit's denial until the period ends, counting
// RetryAfter down; a Refund through the same engine clears it, and the next request goes to
// the server and is admitted.
func TestCalendarDenyCacheHoldsUntilThePeriodEnds(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 6, 10, 10, 0, 0, 0, time.UTC)
	end := time.Date(2026, 6, 11, 0, 0, 0, 0, time.UTC)
	clock := &steppedClock{now: t0}
	e := enginetest.New(t, exampleServer.Client(t), engine.WithClock(clock.Now), engine.WithDenyCache(64))
	key, l := enginetest.NewKey(t), engine.Calendar(2, engine.Day, time.UTC)
	first := enginetest.MustAllowN(t, e, key, l, 1)
	enginetest.MustAllowN(t, e, key, l, 1)

	d := enginetest.MustAllowN(t, e, key, l, 1)
	if d.Allowed || d.FromCache || d.RetryAfter != end.Sub(t0) {
		t.Fatalf("the first denial: %+v, want the server's, retry after %s", d, end.Sub(t0))
	}
	clock.now = t0.Add(time.Second)
	for _, n := range []int{1, 2} {
		r := enginetest.MustAllowN(t, e, key, l, n)
		if r.Allowed || !r.FromCache || r.RetryAfter != end.Sub(clock.now) || r.Window != day || !r.At.Equal(clock.now) {
			t.Fatalf("AllowN(%d) a second later: %+v, want from the cache, retry after %s", n, r, end.Sub(clock.now))
		}
	}
	if p := enginetest.MustPeek(t, e, key, l); p.Allowed || p.FromCache || p.RetryAfter != end.Sub(clock.now) {
		t.Fatalf("Peek: %+v, want the server's denial", p)
	}

	if err := e.Refund(ctx, key, first); err != nil {
		t.Fatal(err)
	}
	clock.now = t0.Add(2 * time.Second)
	if r := enginetest.MustAllowN(t, e, key, l, 1); !r.Allowed || r.FromCache || r.Remaining != 0 {
		t.Fatalf("after the refund: %+v, want admitted by the server, 0 remaining", r)
	}

	// Full again, and cached; at midnight, a new period: the server admits.
	if r := enginetest.MustAllowN(t, e, key, l, 1); r.Allowed || r.FromCache {
		t.Fatalf("full again: %+v, want the server's denial", r)
	}
	clock.now = end.Add(-time.Microsecond)
	if r := enginetest.MustAllowN(t, e, key, l, 1); r.Allowed || !r.FromCache || r.RetryAfter != time.Microsecond {
		t.Fatalf("the last microsecond: %+v, want the cached denial, retry after 1µs", r)
	}
	clock.now = end
	if r := enginetest.MustAllowN(t, e, key, l, 1); !r.Allowed || r.FromCache || r.Remaining != 1 {
		t.Fatalf("at midnight: %+v, want admitted by the server, 1 remaining", r)
	}
}
