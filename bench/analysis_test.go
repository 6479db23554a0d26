package main

import (
	"testing"
	"time"
)

func admittedAt(ms ...int64) []Decision {
	var d []Decision
	for _, m := range ms {
		d = append(d, Decision{AtMicros: m * 1000, Allowed: true})
	}
	return d
}

func deniedAt(ms ...int64) []Decision {
	var d []Decision
	for _, m := range ms {
		d = append(d, Decision{AtMicros: m * 1000})
	}
	return d
}

func TestAnalyzeExactRun(t *testing.T) {
	// Limit 3 per 100ms, always full: bursts of 3 at 0, 100, 200 ms; denials in between;
	// the event at 300ms (the one at 200 has just left) closes three full windows.
	d := append(admittedAt(0, 1, 2, 100, 101, 102, 200, 201, 202, 300), deniedAt(50, 99, 150, 250)...)
	ex := analyze(d, 3, 100*time.Millisecond)
	want := Exactness{
		Requests: 14, Admitted: 10, FullWindows: 3,
		PerWindowMin: 3, PerWindowMean: 3, PerWindowMax: 3,
		MaxInAnyWindow: 3, Overshoot: 0, FalseDenials: 0,
	}
	if ex != want {
		t.Fatalf("analyze = %+v\nwant      %+v", ex, want)
	}
}

func TestAnalyzeOvershootAndFalseDenials(t *testing.T) {
	// Four admitted within 100ms against a limit of 3: overshoot 1. The denial at 150ms sees
	// only the events at 60 and 99 (2 < 3): false. The one at 99ms sees 4: not false.
	// The event at 0 leaves at exactly 100: a denial at 100 sees 3 (50, 60, 99): not false.
	d := append(admittedAt(0, 50, 60, 99), deniedAt(99, 100, 150)...)
	ex := analyze(d, 3, 100*time.Millisecond)
	if ex.MaxInAnyWindow != 4 || ex.Overshoot != 1 {
		t.Fatalf("max in window %d overshoot %d, want 4 and 1", ex.MaxInAnyWindow, ex.Overshoot)
	}
	if ex.FalseDenials != 1 {
		t.Fatalf("false denials %d, want 1", ex.FalseDenials)
	}
	if ex.FullWindows != 1 || ex.PerWindowMin != 4 || ex.PerWindowMax != 4 {
		t.Fatalf("windows %d min %d max %d, want 1, 4, 4", ex.FullWindows, ex.PerWindowMin, ex.PerWindowMax)
	}
}

func TestAnalyzeWindowBoundaryIsExclusiveOfTheOldEvent(t *testing.T) {
	// Events exactly one window apart never share a window.
	ex := analyze(admittedAt(0, 100, 200, 300), 1, 100*time.Millisecond)
	if ex.Overshoot != 0 || ex.MaxInAnyWindow != 1 {
		t.Fatalf("%+v: want max 1, overshoot 0", ex)
	}
	// One microsecond closer, they do.
	d := []Decision{{AtMicros: 0, Allowed: true}, {AtMicros: 99_999, Allowed: true}}
	if ex := analyze(d, 1, 100*time.Millisecond); ex.Overshoot != 1 {
		t.Fatalf("%+v: want overshoot 1", ex)
	}
}

func TestAnalyzeUnorderedAndUneven(t *testing.T) {
	d := append(deniedAt(330), admittedAt(250, 0, 120, 10)...)
	ex := analyze(d, 2, 100*time.Millisecond)
	// Windows from 0: [0,100) has 2, [100,200) has 1, [200,300) has 1; 330 closes 3 windows.
	if ex.FullWindows != 3 || ex.PerWindowMin != 1 || ex.PerWindowMax != 2 || ex.PerWindowMean != 4.0/3 {
		t.Fatalf("%+v", ex)
	}
	// The denial at 330 sees only 250: false.
	if ex.FalseDenials != 1 {
		t.Fatalf("false denials %d, want 1", ex.FalseDenials)
	}
	if ex := analyze(deniedAt(1, 2), 5, time.Second); ex.FalseDenials != 2 || ex.Admitted != 0 {
		t.Fatalf("nothing admitted: %+v", ex)
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 1000; i++ {
		s = append(s, time.Duration(i)*time.Microsecond)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{50, 500 * time.Microsecond}, {99, 990 * time.Microsecond}, {99.9, 999 * time.Microsecond}, {100, 1000 * time.Microsecond}, {0.01, time.Microsecond}} {
		if got := percentile(s, tc.p); got != tc.want {
			t.Errorf("p%v = %s, want %s", tc.p, got, tc.want)
		}
	}
	if percentile(nil, 50) != 0 {
		t.Error("p50 of nothing should be 0")
	}
	if got := percentile([]time.Duration{7}, 99.9); got != 7 {
		t.Errorf("p99.9 of one sample = %s", got)
	}
}
