package engine

import (
	"errors"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // the zones below load even where the machine has no zoneinfo
)

// mustZone loads a zone, failing the test (never skipping it) when it cannot.
func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("LoadLocation(%q): %v", name, err)
	}
	return loc
}

func TestPeriodStringNamesThePeriod(t *testing.T) {
	for p, want := range map[Period]string{Day: "day", Week: "week", Month: "month", Year: "year", 0: "period(0)", 9: "period(9)"} {
		if got := p.String(); got != want {
			t.Errorf("Period(%d).String() = %q, want %q", uint8(p), got, want)
		}
	}
}

func TestCalendarConstructorsBuildTheLimit(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	l := Calendar(1000, Month, berlin).WithBillingDay(15)
	want := Limit{Max: 1000, Period: Month, Location: berlin, BillingDay: 15}
	if l != want {
		t.Errorf("Calendar(...).WithBillingDay(15) = %+v, want %+v", l, want)
	}
	if !l.IsCalendar() {
		t.Error("calendar limit: IsCalendar() = false, want true")
	}
	if PerSecond(5).IsCalendar() {
		t.Error("PerSecond(5).IsCalendar() = true, want false")
	}
}

func TestCalendarTagNamesPeriodBillingDayAndZone(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	for _, tc := range []struct {
		l    Limit
		want string
	}{
		{Calendar(1, Month, time.UTC), "month@UTC"},
		{Calendar(1, Month, berlin).WithBillingDay(15), "month:15@Europe/Berlin"},
		{Calendar(1, Month, berlin).WithBillingDay(1), "month@Europe/Berlin"}, // the 1st is the default
		{Calendar(1, Week, time.Local), "week@Local"},
		{Calendar(1, Day, time.UTC), "day@UTC"},
		{Calendar(1, Year, berlin), "year@Europe/Berlin"},
	} {
		if got := tc.l.calendarTag(); got != tc.want {
			t.Errorf("%+v: calendarTag() = %q, want %q", tc.l, got, tc.want)
		}
	}
}

func TestPeriodAtFindsTheEnclosingPeriod(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	santiago := mustZone(t, "America/Santiago")
	utc := func(y int, m time.Month, d, h, min, s, ns int) time.Time {
		return time.Date(y, m, d, h, min, s, ns, time.UTC)
	}
	in := func(loc *time.Location, y int, m time.Month, d, h int) time.Time {
		return time.Date(y, m, d, h, 0, 0, 0, loc)
	}
	last := func(y int, m time.Month, d int, loc *time.Location) time.Time { // the last nanosecond of a day
		return time.Date(y, m, d, 23, 59, 59, 999_999_999, loc)
	}

	for _, tc := range []struct {
		name       string
		l          Limit
		t          time.Time
		start, end time.Time
		dur        time.Duration // checked when not 0
	}{
		// End of January into February.
		{"month UTC last ns of Jan", Calendar(1, Month, time.UTC), last(2026, 1, 31, time.UTC),
			in(time.UTC, 2026, 1, 1, 0), in(time.UTC, 2026, 2, 1, 0), 31 * 24 * time.Hour},
		{"month UTC on Feb 1 (boundary is the new period's)", Calendar(1, Month, time.UTC), in(time.UTC, 2026, 2, 1, 0),
			in(time.UTC, 2026, 2, 1, 0), in(time.UTC, 2026, 3, 1, 0), 28 * 24 * time.Hour},
		{"month Berlin last ns of Jan", Calendar(1, Month, berlin), last(2026, 1, 31, berlin),
			in(berlin, 2026, 1, 1, 0), in(berlin, 2026, 2, 1, 0), 0},
		{"month Berlin on Feb 1", Calendar(1, Month, berlin), in(berlin, 2026, 2, 1, 0),
			in(berlin, 2026, 2, 1, 0), in(berlin, 2026, 3, 1, 0), 0},
		// t given in UTC: its date in Berlin decides (Jan 31 23:30 UTC is Feb 1 00:30 in Berlin).
		{"month Berlin, t in UTC after Berlin's midnight", Calendar(1, Month, berlin), utc(2026, 1, 31, 23, 30, 0, 0),
			in(berlin, 2026, 2, 1, 0), in(berlin, 2026, 3, 1, 0), 0},
		{"month Berlin, t in UTC before Berlin's midnight", Calendar(1, Month, berlin), utc(2026, 1, 31, 22, 59, 59, 0),
			in(berlin, 2026, 1, 1, 0), in(berlin, 2026, 2, 1, 0), 0},

		// A leap day.
		{"month leap Feb", Calendar(1, Month, time.UTC), in(time.UTC, 2028, 2, 29, 12),
			in(time.UTC, 2028, 2, 1, 0), in(time.UTC, 2028, 3, 1, 0), 29 * 24 * time.Hour},
		{"day leap day", Calendar(1, Day, time.UTC), in(time.UTC, 2028, 2, 29, 12),
			in(time.UTC, 2028, 2, 29, 0), in(time.UTC, 2028, 3, 1, 0), 24 * time.Hour},
		{"day leap day Berlin", Calendar(1, Day, berlin), last(2028, 2, 29, berlin),
			in(berlin, 2028, 2, 29, 0), in(berlin, 2028, 3, 1, 0), 24 * time.Hour},

		// New Year.
		{"year last ns", Calendar(1, Year, time.UTC), last(2026, 12, 31, time.UTC),
			in(time.UTC, 2026, 1, 1, 0), in(time.UTC, 2027, 1, 1, 0), 365 * 24 * time.Hour},
		{"year on Jan 1", Calendar(1, Year, time.UTC), in(time.UTC, 2027, 1, 1, 0),
			in(time.UTC, 2027, 1, 1, 0), in(time.UTC, 2028, 1, 1, 0), 365 * 24 * time.Hour},
		{"year leap", Calendar(1, Year, berlin), in(berlin, 2028, 7, 1, 0),
			in(berlin, 2028, 1, 1, 0), in(berlin, 2029, 1, 1, 0), 366 * 24 * time.Hour},
		// ISO week across the year: 2026-12-31 is a Thursday.
		{"week Thursday Dec 31", Calendar(1, Week, time.UTC), in(time.UTC, 2026, 12, 31, 12),
			in(time.UTC, 2026, 12, 28, 0), in(time.UTC, 2027, 1, 4, 0), 7 * 24 * time.Hour},
		{"week Friday Jan 1", Calendar(1, Week, time.UTC), in(time.UTC, 2027, 1, 1, 0),
			in(time.UTC, 2026, 12, 28, 0), in(time.UTC, 2027, 1, 4, 0), 7 * 24 * time.Hour},
		{"week Sunday last ns", Calendar(1, Week, berlin), last(2027, 1, 3, berlin),
			in(berlin, 2026, 12, 28, 0), in(berlin, 2027, 1, 4, 0), 7 * 24 * time.Hour},
		{"week on Monday", Calendar(1, Week, berlin), in(berlin, 2027, 1, 4, 0),
			in(berlin, 2027, 1, 4, 0), in(berlin, 2027, 1, 11, 0), 7 * 24 * time.Hour},
		// Sunday 23:30 UTC is Monday 00:30 in Berlin: the new week there.
		{"week Berlin, t in UTC on Sunday", Calendar(1, Week, berlin), utc(2026, 12, 27, 23, 30, 0, 0),
			in(berlin, 2026, 12, 28, 0), in(berlin, 2027, 1, 4, 0), 7 * 24 * time.Hour},

		// Clock changes in Berlin: 2026-03-29 has 23 hours, 2026-10-25 has 25.
		{"day 23h", Calendar(1, Day, berlin), in(berlin, 2026, 3, 29, 12),
			in(berlin, 2026, 3, 29, 0), in(berlin, 2026, 3, 30, 0), 23 * time.Hour},
		{"day 23h first ns", Calendar(1, Day, berlin), in(berlin, 2026, 3, 29, 0),
			in(berlin, 2026, 3, 29, 0), in(berlin, 2026, 3, 30, 0), 23 * time.Hour},
		{"day 25h", Calendar(1, Day, berlin), in(berlin, 2026, 10, 25, 12),
			in(berlin, 2026, 10, 25, 0), in(berlin, 2026, 10, 26, 0), 25 * time.Hour},
		{"day 25h last ns", Calendar(1, Day, berlin), last(2026, 10, 25, berlin),
			in(berlin, 2026, 10, 25, 0), in(berlin, 2026, 10, 26, 0), 25 * time.Hour},
		{"day after 25h", Calendar(1, Day, berlin), in(berlin, 2026, 10, 26, 0),
			in(berlin, 2026, 10, 26, 0), in(berlin, 2026, 10, 27, 0), 24 * time.Hour},
		{"week holding the 23h day", Calendar(1, Week, berlin), in(berlin, 2026, 3, 29, 12),
			in(berlin, 2026, 3, 23, 0), in(berlin, 2026, 3, 30, 0), 7*24*time.Hour - time.Hour},
		{"month holding the 25h day", Calendar(1, Month, berlin), in(berlin, 2026, 10, 25, 12),
			in(berlin, 2026, 10, 1, 0), in(berlin, 2026, 11, 1, 0), 31*24*time.Hour + time.Hour},

		// A clock that skips midnight: America/Santiago goes from 2026-09-05 23:59:59 -04 to
		// 2026-09-06 01:00 -03. Sept 6 starts at 01:00 (04:00 UTC), and Sept 5 ends there;
		// time.Date(2026, 9, 6, 0, 0, 0, 0, santiago) says 2026-09-05 23:00 -04 instead.
		{"day before a skipped midnight", Calendar(1, Day, santiago), utc(2026, 9, 6, 3, 59, 59, 0),
			in(santiago, 2026, 9, 5, 0), utc(2026, 9, 6, 4, 0, 0, 0), 24 * time.Hour},
		{"day after a skipped midnight", Calendar(1, Day, santiago), utc(2026, 9, 6, 4, 0, 0, 0),
			utc(2026, 9, 6, 4, 0, 0, 0), in(santiago, 2026, 9, 7, 0), 23 * time.Hour},
		{"23:00 before a skipped midnight", Calendar(1, Day, santiago), in(santiago, 2026, 9, 5, 23),
			in(santiago, 2026, 9, 5, 0), utc(2026, 9, 6, 4, 0, 0, 0), 24 * time.Hour},
		// And repeats 23:00 when it goes back: 2026-04-04 has 25 hours.
		{"day with a repeated 23:00", Calendar(1, Day, santiago), utc(2026, 4, 5, 3, 30, 0, 0), // the second 23:30
			in(santiago, 2026, 4, 4, 0), in(santiago, 2026, 4, 5, 0), 25 * time.Hour},

		// Billing day 31: periods start on the last day of shorter months.
		{"billing 31 mid April", Calendar(1, Month, time.UTC).WithBillingDay(31), in(time.UTC, 2026, 4, 15, 0),
			in(time.UTC, 2026, 3, 31, 0), in(time.UTC, 2026, 4, 30, 0), 30 * 24 * time.Hour},
		{"billing 31 on April 30", Calendar(1, Month, time.UTC).WithBillingDay(31), in(time.UTC, 2026, 4, 30, 0),
			in(time.UTC, 2026, 4, 30, 0), in(time.UTC, 2026, 5, 31, 0), 31 * 24 * time.Hour},
		{"billing 31 on May 30", Calendar(1, Month, time.UTC).WithBillingDay(31), last(2026, 5, 30, time.UTC),
			in(time.UTC, 2026, 4, 30, 0), in(time.UTC, 2026, 5, 31, 0), 31 * 24 * time.Hour},
		{"billing 31 Feb non-leap before", Calendar(1, Month, time.UTC).WithBillingDay(31), last(2026, 2, 27, time.UTC),
			in(time.UTC, 2026, 1, 31, 0), in(time.UTC, 2026, 2, 28, 0), 28 * 24 * time.Hour},
		{"billing 31 Feb non-leap on 28", Calendar(1, Month, time.UTC).WithBillingDay(31), in(time.UTC, 2026, 2, 28, 0),
			in(time.UTC, 2026, 2, 28, 0), in(time.UTC, 2026, 3, 31, 0), 31 * 24 * time.Hour},
		{"billing 31 Feb leap on 28", Calendar(1, Month, time.UTC).WithBillingDay(31), in(time.UTC, 2028, 2, 28, 12),
			in(time.UTC, 2028, 1, 31, 0), in(time.UTC, 2028, 2, 29, 0), 29 * 24 * time.Hour},
		{"billing 31 Feb leap on 29", Calendar(1, Month, time.UTC).WithBillingDay(31), in(time.UTC, 2028, 2, 29, 0),
			in(time.UTC, 2028, 2, 29, 0), in(time.UTC, 2028, 3, 31, 0), 31 * 24 * time.Hour},
		{"billing 30 Feb leap", Calendar(1, Month, time.UTC).WithBillingDay(30), in(time.UTC, 2028, 3, 1, 0),
			in(time.UTC, 2028, 2, 29, 0), in(time.UTC, 2028, 3, 30, 0), 30 * 24 * time.Hour},

		// Billing day 15: the 14th belongs to the period that began last month.
		{"billing 15 on the 14th", Calendar(1, Month, time.UTC).WithBillingDay(15), last(2026, 3, 14, time.UTC),
			in(time.UTC, 2026, 2, 15, 0), in(time.UTC, 2026, 3, 15, 0), 28 * 24 * time.Hour},
		{"billing 15 on the 15th", Calendar(1, Month, time.UTC).WithBillingDay(15), in(time.UTC, 2026, 3, 15, 0),
			in(time.UTC, 2026, 3, 15, 0), in(time.UTC, 2026, 4, 15, 0), 31 * 24 * time.Hour},
		{"billing 15 across the year", Calendar(1, Month, berlin).WithBillingDay(15), in(berlin, 2026, 1, 14, 12),
			in(berlin, 2025, 12, 15, 0), in(berlin, 2026, 1, 15, 0), 31 * 24 * time.Hour},
		{"billing 15 Dec into Jan", Calendar(1, Month, berlin).WithBillingDay(15), in(berlin, 2026, 12, 20, 0),
			in(berlin, 2026, 12, 15, 0), in(berlin, 2027, 1, 15, 0), 31 * 24 * time.Hour},
		{"billing 1 is billing 0", Calendar(1, Month, time.UTC).WithBillingDay(1), in(time.UTC, 2026, 2, 1, 0),
			in(time.UTC, 2026, 2, 1, 0), in(time.UTC, 2026, 3, 1, 0), 28 * 24 * time.Hour},

		// A sliding limit's period is its trailing window.
		{"sliding", PerMinute(5), in(time.UTC, 2026, 1, 1, 0),
			in(time.UTC, 2025, 12, 31, 0).Add(24*time.Hour - time.Minute), in(time.UTC, 2026, 1, 1, 0), time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start, end := tc.l.PeriodAt(tc.t)
			if !start.Equal(tc.start) || !end.Equal(tc.end) {
				t.Fatalf("PeriodAt(%s) = [%s, %s), want [%s, %s)", tc.t, start, end, tc.start, tc.end)
			}
			if tc.l.IsCalendar() && (start.Location() != tc.l.Location || end.Location() != tc.l.Location) {
				t.Errorf("PeriodAt(%s) in %s and %s, want %s", tc.t, start.Location(), end.Location(), tc.l.Location)
			}
			if tc.l.IsCalendar() && (tc.t.Before(start) || !tc.t.Before(end)) {
				t.Errorf("PeriodAt(%s) = [%s, %s) does not hold t", tc.t, start, end)
			}
			if tc.dur != 0 && end.Sub(start) != tc.dur {
				t.Errorf("PeriodAt(%s) lasts %s, want %s", tc.t, end.Sub(start), tc.dur)
			}
		})
	}
}

// TestPeriodAtSweepLeavesNoGap walks instants across several years and zones, every period kind and
// some billing days: every period holds its instant, and neighbouring periods meet.
func TestPeriodAtSweepLeavesNoGap(t *testing.T) {
	var limits []Limit
	for _, zone := range []string{"UTC", "Europe/Berlin", "America/Santiago", "America/Havana", "Australia/Lord_Howe", "Pacific/Apia"} {
		loc := mustZone(t, zone)
		limits = append(limits, Calendar(1, Day, loc), Calendar(1, Week, loc), Calendar(1, Month, loc), Calendar(1, Year, loc),
			Calendar(1, Month, loc).WithBillingDay(29), Calendar(1, Month, loc).WithBillingDay(31))
	}
	from, to := time.Date(2010, 6, 1, 0, 0, 0, 0, time.UTC), time.Date(2029, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, l := range limits {
		for at := from; at.Before(to); at = at.Add(7*time.Hour + 13*time.Minute) {
			start, end := l.PeriodAt(at)
			if at.Before(start) || !at.Before(end) {
				t.Fatalf("%s: PeriodAt(%s) = [%s, %s) does not hold t", l.calendarTag(), at, start, end)
			}
			if s, e := l.PeriodAt(end); !s.Equal(end) || !e.After(end) {
				t.Fatalf("%s: PeriodAt(%s) = [%s, %s), and the next is [%s, %s); want the next to start at %[4]s and end after it", l.calendarTag(), at, start, end, s, e)
			}
		}
	}
}

func TestCalendarBoundariesAroundAreTheNeighbouringPeriods(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	for _, tc := range []struct {
		l    Limit
		t    time.Time
		want [4]time.Time
	}{
		{Calendar(1, Month, time.UTC), time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC), [4]time.Time{
			time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 2, 1, 0, 0, 0, 0, time.UTC),
			time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)}},
		{Calendar(1, Day, berlin), time.Date(2026, 3, 29, 5, 0, 0, 0, berlin), [4]time.Time{
			time.Date(2026, 3, 28, 0, 0, 0, 0, berlin), time.Date(2026, 3, 29, 0, 0, 0, 0, berlin),
			time.Date(2026, 3, 30, 0, 0, 0, 0, berlin), time.Date(2026, 3, 31, 0, 0, 0, 0, berlin)}},
		{Calendar(1, Week, time.UTC), time.Date(2026, 12, 31, 0, 0, 0, 0, time.UTC), [4]time.Time{
			time.Date(2026, 12, 21, 0, 0, 0, 0, time.UTC), time.Date(2026, 12, 28, 0, 0, 0, 0, time.UTC),
			time.Date(2027, 1, 4, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 11, 0, 0, 0, 0, time.UTC)}},
		{Calendar(1, Month, time.UTC).WithBillingDay(31), time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), [4]time.Time{
			time.Date(2026, 1, 31, 0, 0, 0, 0, time.UTC), time.Date(2026, 2, 28, 0, 0, 0, 0, time.UTC),
			time.Date(2026, 3, 31, 0, 0, 0, 0, time.UTC), time.Date(2026, 4, 30, 0, 0, 0, 0, time.UTC)}},
		{Calendar(1, Year, berlin), time.Date(2026, 12, 31, 23, 0, 0, 0, time.UTC), [4]time.Time{ // 2027 in Berlin
			time.Date(2026, 1, 1, 0, 0, 0, 0, berlin), time.Date(2027, 1, 1, 0, 0, 0, 0, berlin),
			time.Date(2028, 1, 1, 0, 0, 0, 0, berlin), time.Date(2029, 1, 1, 0, 0, 0, 0, berlin)}},
	} {
		got := tc.l.boundariesAround(tc.t)
		for i := range got {
			if !got[i].Equal(tc.want[i]) {
				t.Errorf("%s: boundariesAround(%s) = %v, want %v", tc.l.calendarTag(), tc.t, got, tc.want)
				break
			}
		}
	}

	// Everywhere: strictly ascending, the middle two are PeriodAt(t), and the outer two are
	// the neighbouring periods'.
	limits := []Limit{Calendar(1, Day, berlin), Calendar(1, Week, berlin), Calendar(1, Month, berlin),
		Calendar(1, Year, berlin), Calendar(1, Month, berlin).WithBillingDay(31), Calendar(1, Month, time.UTC).WithBillingDay(15),
		Calendar(1, Day, mustZone(t, "America/Santiago")), Calendar(1, Day, mustZone(t, "Pacific/Apia"))}
	from, to := time.Date(2011, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2029, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, l := range limits {
		for at := from; at.Before(to); at = at.Add(11*time.Hour + 7*time.Minute) {
			b := l.boundariesAround(at)
			for i := 1; i < len(b); i++ {
				if !b[i-1].Before(b[i]) {
					t.Fatalf("%s: boundariesAround(%s) = %v is not strictly ascending", l.calendarTag(), at, b)
				}
			}
			start, end := l.PeriodAt(at)
			prevStart, prevEnd := l.PeriodAt(b[1].Add(-time.Nanosecond))
			nextStart, nextEnd := l.PeriodAt(b[2])
			if !b[1].Equal(start) || !b[2].Equal(end) || !b[0].Equal(prevStart) || !prevEnd.Equal(start) ||
				!nextStart.Equal(end) || !b[3].Equal(nextEnd) {
				t.Fatalf("%s: boundariesAround(%s) = %v, PeriodAt = [%s, %s); want the previous period, this one and the next", l.calendarTag(), at, b, start, end)
			}
		}
	}
}

func TestValidateCalendarNamesWhatIsWrong(t *testing.T) {
	berlin := mustZone(t, "Europe/Berlin")
	for _, l := range []Limit{
		Calendar(10, Day, berlin), Calendar(10, Week, time.UTC), Calendar(10, Month, time.Local), Calendar(10, Year, berlin),
		Calendar(10, Month, berlin).WithBillingDay(31), Calendar(10, Month, berlin).WithBillingDay(1),
		Calendar(10, Month, berlin).WithBillingDay(0), PerSecond(10), {Max: 1, Window: time.Hour, Resolution: time.Minute},
	} {
		if err := l.validateCalendar(); err != nil {
			t.Errorf("%+v: validateCalendar() = %v, want nil", l, err)
		}
	}

	for _, tc := range []struct {
		name string
		l    Limit
		want string // in the message
	}{
		{"unknown period", Calendar(10, Period(9), time.UTC), "unknown period period(9)"},
		{"nil location", Calendar(10, Month, nil), "nil Location"},
		{"billing day with Week", Calendar(10, Week, time.UTC).WithBillingDay(1), "only a Month"},
		{"billing day with Day", Calendar(10, Day, time.UTC).WithBillingDay(3), "only a Month"},
		{"billing day 32", Calendar(10, Month, time.UTC).WithBillingDay(32), "billing day 32"},
		{"billing day -1", Calendar(10, Month, time.UTC).WithBillingDay(-1), "billing day -1"},
		{"window on a calendar limit", Limit{Max: 10, Window: time.Hour, Period: Month, Location: time.UTC}, "has a Window"},
		{"resolution on a calendar limit", Limit{Max: 10, Resolution: time.Second, Period: Day, Location: time.UTC}, "has a Resolution"},
		{"location on a sliding limit", Limit{Max: 10, Window: time.Hour, Location: time.UTC}, "belong to calendar limits"},
		{"billing day on a sliding limit", PerHour(10).WithBillingDay(15), "belong to calendar limits"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.validateCalendar()
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("validateCalendar() = %v, want an error wrapping ErrInvalidArgument", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("validateCalendar() = %q, want it to say %q", err, tc.want)
			}
		})
	}
}
