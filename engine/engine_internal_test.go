package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
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

func TestLimitValidate(t *testing.T) {
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

func TestPerHelpers(t *testing.T) {
	for _, tc := range []struct {
		got  Limit
		want Limit
	}{
		{PerSecond(7), Limit{7, time.Second}},
		{PerMinute(8), Limit{8, time.Minute}},
		{PerHour(9), Limit{9, time.Hour}},
	} {
		if tc.got != tc.want {
			t.Errorf("%v, want %v", tc.got, tc.want)
		}
	}
	if s := PerMinute(8).String(); s != "8/1m0s" {
		t.Errorf("String() = %q", s)
	}
}

// Pipelined members are unique within an engine and across engines, and compact.
func TestPipelinedMembersAreUniqueAndCompact(t *testing.T) {
	seen := map[string]bool{}
	for i := 0; i < 3; i++ {
		e := &Engine{}
		copy(e.memberID[:], fmt.Sprintf("engine%02d", i))
		for j := 0; j < 100_000; j++ {
			m := e.nextMember()
			if seen[m] {
				t.Fatalf("member %q made twice", m)
			}
			if len(m) > 8+3 {
				t.Fatalf("member %d is %d bytes, want at most 11 below 2^21 events", j, len(m))
			}
			seen[m] = true
		}
	}
}

func TestClassify(t *testing.T) {
	c := func(err error) error { return classify("op", err) }
	if err := c(context.DeadlineExceeded); !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrUnavailable) {
		t.Errorf("deadline: %v", err)
	}
	if err := c(valkey.ErrClosing); !errors.Is(err, ErrUnavailable) || !errors.Is(err, valkey.ErrClosing) {
		t.Errorf("closing: %v", err)
	}
	if err := c(errors.New("dial tcp: connection refused")); !errors.Is(err, ErrUnavailable) {
		t.Errorf("dial: %v", err)
	}
}

func TestClockReadingRange(t *testing.T) {
	for _, tc := range []struct {
		t  time.Time
		ok bool
	}{
		{time.Unix(0, 0), true},
		{time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC), true},
		{time.Date(1850, 1, 1, 0, 0, 0, 0, time.UTC), true},
		{time.Time{}, false},
		{time.Date(2113, 1, 1, 0, 0, 0, 0, time.UTC), false},
	} {
		_, err := clockReading{t: tc.t, set: true}.micros()
		if (err == nil) != tc.ok {
			t.Errorf("micros(%s) err = %v, want ok=%v", tc.t, err, tc.ok)
		}
	}
}
