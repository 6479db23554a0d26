package engine

import (
	"fmt"
	"strconv"
	"time"
)

// Period is the calendar period of a calendar limit (see Calendar): its count starts afresh
// at the start of each period, as a bill or a quota does, instead of sliding with the clock.
// The zero Period means "not a calendar limit": the Limit is a sliding one.
type Period uint8

const (
	// Day runs from midnight to the next midnight in the limit's Location: 24 hours, or 23
	// or 25 on the days its clock changes.
	Day Period = iota + 1
	// Week is the ISO week: from Monday 00:00 to the next Monday 00:00.
	Week
	// Month runs from 00:00 on the 1st to 00:00 on the 1st of the next month, or from one
	// billing day to the next (see Limit.WithBillingDay).
	Month
	// Year runs from January 1 00:00 to the next January 1 00:00.
	Year
)

// String returns the period's name ("day", "week", "month", "year"), or "period(N)" for a
// value that names none, for logs, errors and keys.
func (p Period) String() string {
	switch p {
	case Day:
		return "day"
	case Week:
		return "week"
	case Month:
		return "month"
	case Year:
		return "year"
	}
	return "period(" + strconv.Itoa(int(p)) + ")"
}

// Calendar returns a calendar limit: at most max events admitted since the start of the
// current period in loc, for quotas that reset on the calendar ("a million a month") rather
// than over a trailing window. The count resets at the next boundary, and boundaries follow
// loc's rules, clock changes included: a Day can be 23 or 25 hours long. The key holds one
// counter per period, so its memory is constant however many events the period admits.
// ResetAfter, RetryAfter (when the limit is full) and QuotaAfter are the time to the next
// boundary.
//
// A calendar limit can share a Policy with sliding limits, e.g.
// Policy{PerSecond(10), Calendar(1_000_000, Month, time.UTC)}.
//
// The server's clock decides near a boundary: the engine sends the boundaries around its own
// clock's time (the start of the previous period, of the current one, of the next, and the
// end of the next), and the script counts in the period that holds the server's time, so
// clients whose clocks disagree still share one count.
//
// Calendar checks nothing: the limit is validated where it is used, and its errors wrap
// ErrInvalidArgument (an unknown period, a nil loc, a max out of range).
func Calendar(max int, period Period, loc *time.Location) Limit {
	return Limit{Max: max, Period: period, Location: loc}
}

// WithBillingDay returns l with its billing day set to day, for a Month limit that follows a
// customer's billing cycle instead of the calendar month: each period starts on that day of
// the month, at 00:00 in the limit's Location. A month without that day starts its period on
// its last day, so a billing day of 31 starts periods on February 28 (29 in a leap year) and
// April 30. Day 0 is the 1st; other periods take no billing day (validation refuses one).
func (l Limit) WithBillingDay(day int) Limit {
	l.BillingDay = day
	return l
}

// IsCalendar reports whether l is a calendar limit (made by Calendar, with a Period) rather
// than a sliding one.
func (l Limit) IsCalendar() bool { return l.Period != 0 }

// PeriodAt returns the period of l that holds t, start <= t < end, for showing a caller when
// its quota resets or for auditing a count. For a calendar limit, both are in l.Location
// (whatever t's own location), and the boundaries follow its calendar and clock changes; a
// nil Location, which validation refuses, is taken as UTC. For a sliding limit, the period is
// the trailing window (t - Window, t). For a Period that names none (which validation
// refuses), it is the empty (t, t).
func (l Limit) PeriodAt(t time.Time) (start, end time.Time) {
	if !l.IsCalendar() {
		return t.Add(-l.Window), t
	}
	if l.Period > Year {
		return t, t
	}
	loc := l.location()
	y, m, d := t.In(loc).Date()
	// Find the period from t's date in loc, then step while t falls outside it: the first
	// guess is off only where a clock change moves a boundary away from 00:00 of its date.
	k := 0
	start, end = l.periodStart(y, m, d, k, loc), l.periodStart(y, m, d, k+1, loc)
	for !t.Before(end) {
		k++
		start, end = end, l.periodStart(y, m, d, k+1, loc)
	}
	for t.Before(start) {
		k--
		start, end = l.periodStart(y, m, d, k, loc), start
	}
	return start, end
}

// boundariesAround returns, around t, the start of the period before the current one, the
// start of the current one, its end, and the end of the next one, strictly ascending. The
// engine sends them with a request so that the script can count in the period that holds the
// server's time, which may be a neighbour of the one holding the engine's t.
func (l Limit) boundariesAround(t time.Time) [4]time.Time {
	start, end := l.PeriodAt(t)
	prev, _ := l.PeriodAt(start.Add(-time.Nanosecond))
	_, next := l.PeriodAt(end)
	return [4]time.Time{prev, start, end, next}
}

// validateCalendar checks the fields that make a calendar limit: a known Period, a Location,
// no Window or Resolution (the period is the window), and a billing day only for Month; and,
// for a sliding limit, that none of them is set. Max is checked by validate, as for any limit.
func (l Limit) validateCalendar() error {
	if !l.IsCalendar() {
		switch {
		case l.Location != nil:
			return fmt.Errorf("%w: sliding limit %s has a Location (%s): Location and BillingDay belong to calendar limits (see Calendar)",
				ErrInvalidArgument, l, l.Location)
		case l.BillingDay != 0:
			return fmt.Errorf("%w: sliding limit %s has a BillingDay (%d): Location and BillingDay belong to calendar limits (see Calendar)",
				ErrInvalidArgument, l, l.BillingDay)
		}
		return nil
	}
	switch {
	case l.Period > Year:
		return fmt.Errorf("%w: unknown period %s in calendar limit (want Day, Week, Month or Year)", ErrInvalidArgument, l.Period)
	case l.Location == nil:
		return fmt.Errorf("%w: calendar limit has a nil Location (use time.UTC, time.Local or time.LoadLocation)", ErrInvalidArgument)
	case l.Window != 0:
		return fmt.Errorf("%w: calendar limit (%s) has a Window (%s): its period is its window; leave Window 0",
			ErrInvalidArgument, l.calendarTag(), l.Window)
	case l.Resolution != 0:
		return fmt.Errorf("%w: calendar limit (%s) has a Resolution (%s): it keeps one counter per period; leave Resolution 0",
			ErrInvalidArgument, l.calendarTag(), l.Resolution)
	case l.BillingDay < 0 || l.BillingDay > 31:
		return fmt.Errorf("%w: calendar limit (%s) has billing day %d, outside 1 to 31 (0 is the 1st)",
			ErrInvalidArgument, l.calendarTag(), l.BillingDay)
	case l.BillingDay != 0 && l.Period != Month:
		return fmt.Errorf("%w: calendar limit (%s) has billing day %d: only a Month period takes one",
			ErrInvalidArgument, l.calendarTag(), l.BillingDay)
	}
	return nil
}

// calendarTag names a calendar limit's periods compactly, for keys and logs: the period, the
// billing day when it is not the 1st, and the location, as in "month@UTC",
// "month:15@Europe/Berlin" or "week@Local". Limits with the same tag count in the same periods.
func (l Limit) calendarTag() string {
	tag := l.Period.String()
	if l.BillingDay > 1 {
		tag += ":" + strconv.Itoa(l.BillingDay)
	}
	return tag + "@" + l.location().String()
}

// location is the limit's Location, with nil taken as UTC, as time.Location's own methods do.
func (l Limit) location() *time.Location {
	if l.Location == nil {
		return time.UTC
	}
	return l.Location
}

// periodStart returns the start of the k-th period after (k < 0: before) the one whose dates
// hold y-m-d in loc's calendar. For a valid Period it is non-decreasing in k, and strictly
// increasing unless a zone skips a whole period (Samoa skipped 2011-12-30).
func (l Limit) periodStart(y int, m time.Month, d, k int, loc *time.Location) time.Time {
	switch l.Period {
	case Day:
		return startOfDate(y, m, d+k, loc)
	case Week:
		// ISO weeks start on Monday; the weekday of a date does not depend on the zone.
		sinceMonday := (int(time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Weekday()) + 6) % 7
		return startOfDate(y, m, d-sinceMonday+7*k, loc)
	case Month:
		billing := max(l.BillingDay, 1)
		// The month's start is on its billing day, or on its last day when shorter; when the
		// date is before that, the date's period began in the month before.
		if d < min(billing, daysIn(y, m)) {
			k--
		}
		first := time.Date(y, m+time.Month(k), 1, 0, 0, 0, 0, time.UTC) // normalises the month
		fy, fm, _ := first.Date()
		return startOfDate(fy, fm, min(billing, daysIn(fy, fm)), loc)
	default: // Year
		return startOfDate(y+k, time.January, 1, loc)
	}
}

// daysIn returns the number of days of month m of year y: day 0 of the next month is m's last.
func daysIn(y int, m time.Month) int {
	return time.Date(y, m+1, 0, 0, 0, 0, 0, time.UTC).Day()
}

// maxZoneOffset bounds the UTC offset of any zone (real ones stay within -12h to +14h).
const maxZoneOffset = 26 * time.Hour

// startOfDate returns the first instant whose date in loc is y-m-d or later (out-of-range
// values normalise as in time.Date), in loc. It is time.Date(y, m, d, 0, 0, 0, 0, loc) on
// most days; but where loc's clock skips midnight (America/Santiago, America/Havana) time.Date
// may answer 23:00 of the day before, and where it repeats midnight, the second 00:00. Here,
// the day starts at the first instant that reads that date, so that boundaries ascend with
// the dates and every instant has exactly one period.
func startOfDate(y int, m time.Month, d int, loc *time.Location) time.Time {
	midnight := time.Date(y, m, d, 0, 0, 0, 0, time.UTC) // the date's midnight read as UTC
	// Walk loc's zone spans (a span keeps one offset) from an instant that reads an earlier
	// date in any zone: in each span, midnight comes at midnight minus the span's offset.
	at := midnight.Add(-maxZoneOffset).In(loc)
	for range 16 {
		_, offset := at.Zone()
		first := midnight.Add(-time.Duration(offset) * time.Second)
		if first.Before(at) {
			first = at // the span starts after the date's midnight: its first instant reads a later time
		}
		_, spanEnd := at.ZoneBounds()
		if spanEnd.IsZero() || first.Before(spanEnd) {
			return first.In(loc)
		}
		at = spanEnd.In(loc)
	}
	return time.Date(y, m, d, 0, 0, 0, 0, loc) // not reached with real zones
}
