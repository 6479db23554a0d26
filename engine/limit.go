package engine

import (
	"fmt"
	"time"
)

// Limit is a sliding-window limit: at most Max events in any trailing Window; or, made by
// Calendar, a calendar limit: at most Max events since the start of the current calendar
// period (a day, an ISO week, a month, a year) in a time zone.
//
// A sliding limit is exact by default: its key's log keeps one entry per admitted request.
// With a Resolution g, the log keeps at most one entry per g-wide slot of time, so its memory
// is at most about Window/g entries however many requests it admits, and it still never
// admits more than Max in any trailing Window; the price is that a denial may come up to g
// early (docs/limits.md, "Long quotas in little memory").
type Limit struct {
	Max    int           // events admitted in any trailing window (or period); 1 to MaxEvents
	Window time.Duration // window length; 1ms to MaxWindow, counted in whole microseconds; 0 for a calendar limit
	// Resolution, when not 0, records each admitted request at the end of its Resolution-wide
	// slot of time (its time rounded up to the next multiple of Resolution, since the Unix
	// epoch), and requests of the same slot share one entry: 0 < Resolution <= Window. A
	// request the exact log would admit at t is admitted by t + Resolution, and RetryAfter is
	// at most Resolution longer than the exact log's; no window ever holds more than Max.
	Resolution time.Duration
	// Period, Location and BillingDay make a calendar limit (Calendar sets them; a sliding
	// limit leaves them zero): the period, the time zone whose calendar and clock changes its
	// boundaries follow, and, for Month only, the day of the month each period starts on
	// (1 to 31; 0 is the 1st; a month without that day starts on its last day).
	Period     Period
	Location   *time.Location
	BillingDay int
}

const (
	// MaxEvents is the largest Max a Limit may have, and the largest cost of one request. The
	// log keeps one entry per admitted request, whatever its cost, so a key's memory grows with
	// the requests its window holds (at most Max of them); counts stay exact in the script's
	// float64 arithmetic.
	MaxEvents = 1<<31 - 1
	// MinWindow is the shortest window: PEXPIRE works in milliseconds.
	MinWindow = time.Millisecond
	// MaxWindow is the longest window, about 35 years: now minus the window must stay exact
	// in a float64 sorted-set score.
	MaxWindow = time.Duration(1<<50) * time.Microsecond
)

// PerSecond returns a Limit of n events per second.
func PerSecond(n int) Limit { return Limit{Max: n, Window: time.Second} }

// PerMinute returns a Limit of n events per minute.
func PerMinute(n int) Limit { return Limit{Max: n, Window: time.Minute} }

// PerHour returns a Limit of n events per hour.
func PerHour(n int) Limit { return Limit{Max: n, Window: time.Hour} }

// String returns the limit as "max/window", for logs and errors: "100/1m0s", with its
// resolution "1000000/720h0m0s~1h0m0s", a calendar limit "1000000/month@UTC".
func (l Limit) String() string {
	switch {
	case l.IsCalendar():
		return fmt.Sprintf("%d/%s", l.Max, l.calendarTag())
	case l.Resolution > 0:
		return fmt.Sprintf("%d/%s~%s", l.Max, l.Window, l.Resolution)
	}
	return fmt.Sprintf("%d/%s", l.Max, l.Window)
}

// windowMicros is the window in whole microseconds, rounded up: a window is never shortened.
func (l Limit) windowMicros() int64 { return ceilUnits(time.Microsecond, l.Window) }

// ceilMicros is d in whole microseconds, rounded up, as the scripts take times.
func ceilMicros(d time.Duration) int64 { return ceilUnits(time.Microsecond, d) }

// ceilUnits is d in whole units, rounded up: microseconds for the scripts, milliseconds for
// PEXPIRE and the timeouts of WAIT and WAITAOF.
func ceilUnits(unit, d time.Duration) int64 {
	n := int64(d / unit)
	if d%unit != 0 {
		n++
	}
	return n
}

// validate checks the limit and the cost n of a request against it.
func (l Limit) validate(n int) error {
	if err := l.validateCalendar(); err != nil {
		return err
	}
	switch {
	case l.Max < 1:
		return fmt.Errorf("%w: limit Max %d is below 1", ErrInvalidArgument, l.Max)
	case l.Max > MaxEvents:
		return fmt.Errorf("%w: limit Max %d is above %d", ErrInvalidArgument, l.Max, MaxEvents)
	case n < 1:
		return fmt.Errorf("%w: cost n %d is below 1", ErrInvalidArgument, n)
	case n > l.Max:
		return fmt.Errorf("%w: cost n %d is above the limit's Max %d", ErrInvalidArgument, n, l.Max)
	case l.IsCalendar():
		return nil
	case l.Window < MinWindow:
		return fmt.Errorf("%w: limit Window %s is below %s", ErrInvalidArgument, l.Window, MinWindow)
	case l.Window > MaxWindow:
		return fmt.Errorf("%w: limit Window %s is above %s", ErrInvalidArgument, l.Window, MaxWindow)
	case l.Resolution < 0:
		return fmt.Errorf("%w: limit Resolution %s is negative", ErrInvalidArgument, l.Resolution)
	case l.Resolution > l.Window:
		return fmt.Errorf("%w: limit Resolution %s is longer than its Window %s", ErrInvalidArgument, l.Resolution, l.Window)
	}
	return nil
}
