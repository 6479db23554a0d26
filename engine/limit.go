package engine

import (
	"fmt"
	"time"
)

// Limit is a sliding-window limit: at most Max events in any trailing Window.
type Limit struct {
	Max    int           // events admitted in any trailing window; 1 to MaxEvents
	Window time.Duration // window length; 1ms to MaxWindow, counted in whole microseconds
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

// String returns the limit as "max/window", for logs and errors.
func (l Limit) String() string { return fmt.Sprintf("%d/%s", l.Max, l.Window) }

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
	switch {
	case l.Max < 1:
		return fmt.Errorf("%w: limit Max %d is below 1", ErrInvalidArgument, l.Max)
	case l.Max > MaxEvents:
		return fmt.Errorf("%w: limit Max %d is above %d", ErrInvalidArgument, l.Max, MaxEvents)
	case l.Window < MinWindow:
		return fmt.Errorf("%w: limit Window %s is below %s", ErrInvalidArgument, l.Window, MinWindow)
	case l.Window > MaxWindow:
		return fmt.Errorf("%w: limit Window %s is above %s", ErrInvalidArgument, l.Window, MaxWindow)
	case n < 1:
		return fmt.Errorf("%w: cost n %d is below 1", ErrInvalidArgument, n)
	case n > l.Max:
		return fmt.Errorf("%w: cost n %d is above the limit's Max %d", ErrInvalidArgument, n, l.Max)
	}
	return nil
}
