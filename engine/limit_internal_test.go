package engine

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestWindowMicrosRoundsUp(t *testing.T) {
	for _, tc := range []struct {
		window time.Duration
		want   int64
	}{
		{time.Millisecond, 1000},
		{time.Second, 1_000_000},
		{time.Millisecond + 1, 1001},
		{time.Millisecond + 999, 1001},
		{time.Millisecond + 1000, 1001},
	} {
		if got := (Limit{Max: 1, Window: tc.window}).windowMicros(); got != tc.want {
			t.Errorf("windowMicros(%s) = %d, want %d", tc.window, got, tc.want)
		}
	}
}

func TestLimitValidateNamesWhatIsWrong(t *testing.T) {
	ok := []struct {
		l Limit
		n int
	}{
		{Limit{Max: 1, Window: MinWindow}, 1},
		{Limit{Max: MaxEvents, Window: MaxWindow}, MaxEvents},
		{PerSecond(5), 5},
	}
	for _, tc := range ok {
		if err := tc.l.validate(tc.n); err != nil {
			t.Errorf("validate(%v, %d) = %v, want nil", tc.l, tc.n, err)
		}
	}
	bad := []struct {
		l    Limit
		n    int
		says string
	}{
		{Limit{Max: 0, Window: time.Second}, 1, "Max 0"},
		{Limit{Max: MaxEvents + 1, Window: time.Second}, 1, "Max 2147483648"},
		{Limit{Max: 1, Window: MinWindow - 1}, 1, "Window 999.999µs"},
		{Limit{Max: 1, Window: MaxWindow + 1}, 1, "Window"},
		{PerMinute(3), 0, "n 0"},
		{PerMinute(3), 4, "n 4"},
	}
	for _, tc := range bad {
		err := tc.l.validate(tc.n)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("validate(%v, %d) = %v, want ErrInvalidArgument naming %q", tc.l, tc.n, err, tc.says)
		}
	}
}

func TestPerHelpersMakeTheirLimits(t *testing.T) {
	for _, tc := range []struct {
		got  Limit
		want Limit
	}{
		{PerSecond(7), Limit{Max: 7, Window: time.Second}},
		{PerMinute(8), Limit{Max: 8, Window: time.Minute}},
		{PerHour(9), Limit{Max: 9, Window: time.Hour}},
	} {
		if tc.got != tc.want {
			t.Errorf("%v, want %v", tc.got, tc.want)
		}
	}
	if s := PerMinute(8).String(); s != "8/1m0s" {
		t.Errorf("PerMinute(8).String() = %q, want \"8/1m0s\"", s)
	}
}

// Durations go to the scripts in whole microseconds and to PEXPIRE, WAIT and WAITAOF in whole
// milliseconds, rounded up: never less than the duration asked for.
func TestCeilUnitsRoundsUpToWholeUnits(t *testing.T) {
	for _, tc := range []struct {
		unit, d time.Duration
		want    int64
	}{
		{time.Millisecond, time.Millisecond + 1, 2},
		{time.Millisecond, time.Second, 1000},
		{time.Millisecond, 0, 0},
		{time.Microsecond, time.Nanosecond, 1},
	} {
		if got := ceilUnits(tc.unit, tc.d); got != tc.want {
			t.Errorf("ceilUnits(%s, %s) = %d, want %d", tc.unit, tc.d, got, tc.want)
		}
	}
	if got := ceilMicros(time.Nanosecond); got != 1 {
		t.Errorf("ceilMicros(1ns) = %d, want 1", got)
	}
}
