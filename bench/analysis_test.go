package main

import (
	"slices"
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

func TestTrailingSteps(t *testing.T) {
	// Limit 3 per 100ms: a burst of 3 at 0-2ms, the next at 100-102ms as the first leave, a
	// fourth admitted at 150ms (an overshoot), a denial at 250ms ending the run.
	d := append(admittedAt(2, 0, 1, 100, 101, 102, 150), deniedAt(50, 250)...)
	got := trailing(d, 100*time.Millisecond, 100)
	want := []TrailPoint{{0, 1}, {0.001, 2}, {0.002, 3}, {0.150, 4}, {0.200, 3}, {0.201, 2}, {0.202, 1}, {0.25, 0}}
	if !slices.Equal(got, want) {
		t.Fatalf("trailing =\n%v\nwant\n%v", got, want)
	}
	if got := trailing(nil, time.Second, 100); got != nil {
		t.Errorf("trailing(nil) = %v, want nil", got)
	}
	// Only denials: zero throughout, from the first to the last.
	if got, want := trailing(deniedAt(10, 30), 100*time.Millisecond, 100), []TrailPoint{{0, 0}, {0.02, 0}}; !slices.Equal(got, want) {
		t.Errorf("trailing(denials) = %v, want %v", got, want)
	}
}

func TestTrailingThinKeepsThePeak(t *testing.T) {
	// One admitted event every ms for 10s against a 100ms window: 100 in the window, but one
	// brief spike of 5 more at 7.5s.
	var d []Decision
	for ms := int64(0); ms < 10_000; ms++ {
		d = append(d, admittedAt(ms)...)
	}
	for i := 0; i < 5; i++ {
		d = append(d, Decision{AtMicros: 7_500_000 + int64(i) + 1, Allowed: true})
	}
	full := trailing(d, 100*time.Millisecond, 1<<30)
	thin := trailing(d, 100*time.Millisecond, 50)
	if len(thin) > 51 || len(full) <= 51 {
		t.Fatalf("%d points thinned to %d, want at most 51", len(full), len(thin))
	}
	peak := func(ps []TrailPoint) int {
		m := 0
		for _, p := range ps {
			m = max(m, p.Admitted)
		}
		return m
	}
	if peak(full) != 105 || peak(thin) != 105 {
		t.Errorf("peak: %d full, %d thinned, want 105", peak(full), peak(thin))
	}
	if end := thin[len(thin)-1].Seconds; end != 9.999 {
		t.Errorf("thinned trail ends at %vs, want 9.999", end)
	}
	if ex := analyze(d, 100, 100*time.Millisecond); ex.MaxInAnyWindow != peak(full) {
		t.Errorf("analyze finds %d in a window, the trail %d", ex.MaxInAnyWindow, peak(full))
	}
}
