package main

import (
	"math"
	"slices"
	"sort"
	"time"
)

// Decision is one request's outcome for the exactness analysis: when it was decided (µs since
// the epoch, on the clock that decided it) and whether it was admitted.
type Decision struct {
	AtMicros int64
	Allowed  bool
}

// Exactness is what the analysis of a run on one key finds.
type Exactness struct {
	Requests int `json:"requests"`
	Admitted int `json:"admitted"`
	// FullWindows counts the consecutive windows, starting at the first admitted event, that
	// end before the last decision; partial windows at the end are left out.
	FullWindows int `json:"full_windows"`
	// PerWindowMin, PerWindowMean and PerWindowMax are admitted events per full window.
	PerWindowMin  int     `json:"admitted_per_window_min"`
	PerWindowMean float64 `json:"admitted_per_window_mean"`
	PerWindowMax  int     `json:"admitted_per_window_max"`
	// MaxInAnyWindow is the largest number of admitted events in any trailing window
	// (now - window, now]; Overshoot is how far that exceeds the limit.
	MaxInAnyWindow int `json:"max_admitted_in_any_window"`
	Overshoot      int `json:"overshoot"`
	// FalseDenials counts requests denied while fewer than Max admitted events lay in their
	// trailing window.
	FalseDenials int `json:"false_denials"`
}

// analyze computes Exactness for decisions on one key with the given limit. Decisions may come
// in any order. An admitted event at t counts at time T when T - window < t <= T; a denial at
// T is false when fewer than limit admitted events count at T.
func analyze(decisions []Decision, limit int, window time.Duration) Exactness {
	w := window.Microseconds()
	var admitted, denied []int64
	for _, d := range decisions {
		if d.Allowed {
			admitted = append(admitted, d.AtMicros)
		} else {
			denied = append(denied, d.AtMicros)
		}
	}
	slices.Sort(admitted)
	slices.Sort(denied)
	ex := Exactness{Requests: len(decisions), Admitted: len(admitted)}
	if len(admitted) == 0 {
		ex.FalseDenials = len(denied)
		return ex
	}

	// Trailing windows: the count is largest in a window that ends on an admitted event.
	lo := 0
	for hi, t := range admitted {
		for admitted[lo] <= t-w {
			lo++
		}
		if n := hi - lo + 1; n > ex.MaxInAnyWindow {
			ex.MaxInAnyWindow = n
		}
	}
	if ex.MaxInAnyWindow > limit {
		ex.Overshoot = ex.MaxInAnyWindow - limit
	}

	// A denial at T: count admitted events in (T - w, T] with two binary searches.
	for _, t := range denied {
		upto := sort.Search(len(admitted), func(i int) bool { return admitted[i] > t })
		from := sort.Search(len(admitted), func(i int) bool { return admitted[i] > t-w })
		if upto-from < limit {
			ex.FalseDenials++
		}
	}

	// Fixed windows from the first admitted event to the last decision.
	last := admitted[len(admitted)-1]
	if len(denied) > 0 && denied[len(denied)-1] > last {
		last = denied[len(denied)-1]
	}
	start := admitted[0]
	ex.FullWindows = int((last - start) / w)
	if ex.FullWindows == 0 {
		return ex
	}
	counts := make([]int, ex.FullWindows)
	for _, t := range admitted {
		if k := int((t - start) / w); k < ex.FullWindows {
			counts[k]++
		}
	}
	ex.PerWindowMin = math.MaxInt
	total := 0
	for _, c := range counts {
		total += c
		ex.PerWindowMin = min(ex.PerWindowMin, c)
		ex.PerWindowMax = max(ex.PerWindowMax, c)
	}
	ex.PerWindowMean = float64(total) / float64(ex.FullWindows)
	return ex
}

// percentile returns the p-th percentile (0 < p <= 100) of sorted durations by the
// nearest-rank method: the smallest value with at least p % of the samples at or below it.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// The small epsilon keeps float error from pushing an exact rank (99.9 % of 1000) up by one.
	rank := int(math.Ceil(p/100*float64(len(sorted)) - 1e-9))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

// TrailPoint is one step of the admitted events per trailing window over a run on one key:
// from Seconds after the run's first decision on, until the next point, Admitted events lay
// in the trailing window (T - window, T].
type TrailPoint struct {
	Seconds  float64
	Admitted int
}

// trailing returns the admitted events per trailing window over a run on one key, as a step
// function: a point wherever the count changes (an admitted event counts from its time until
// a window later), from the first decision (0 s) to the last, which ends the series. Decisions
// may come in any order. Past maxPoints points it keeps, for each of maxPoints equal slices of
// the run, the largest count in the slice, so that thinning never hides an overshoot.
func trailing(decisions []Decision, window time.Duration, maxPoints int) []TrailPoint {
	if len(decisions) == 0 {
		return nil
	}
	w := window.Microseconds()
	first, last := decisions[0].AtMicros, decisions[0].AtMicros
	var admitted []int64
	for _, d := range decisions {
		first, last = min(first, d.AtMicros), max(last, d.AtMicros)
		if d.Allowed {
			admitted = append(admitted, d.AtMicros)
		}
	}
	slices.Sort(admitted)
	sec := func(t int64) float64 { return float64(t-first) / 1e6 }

	// Merge the events' entries (admitted[i]) and exits (admitted[i] + w), both sorted.
	points := []TrailPoint{{0, 0}}
	count, in, out := 0, 0, 0
	for in < len(admitted) || out < len(admitted) {
		t := admitted[out] + w
		if in < len(admitted) {
			t = min(t, admitted[in])
		}
		if t > last {
			break
		}
		for in < len(admitted) && admitted[in] == t {
			count++
			in++
		}
		for out < len(admitted) && admitted[out]+w == t {
			count--
			out++
		}
		switch p := &points[len(points)-1]; {
		case p.Admitted == count: // the count did not change: no step
		case p.Seconds == sec(t):
			p.Admitted = count
		default:
			points = append(points, TrailPoint{sec(t), count})
		}
	}
	if end := sec(last); points[len(points)-1].Seconds < end {
		points = append(points, TrailPoint{end, count})
	}
	if maxPoints < 2 || len(points) <= maxPoints {
		return points
	}

	// Thin: one point per slice, at the largest count in effect during it.
	span := sec(last)
	thin := make([]TrailPoint, 0, maxPoints+1)
	p, current := 0, 0
	for k := 0; k < maxPoints; k++ {
		from, to := span*float64(k)/float64(maxPoints), span*float64(k+1)/float64(maxPoints)
		largest := current
		for p < len(points) && (points[p].Seconds < to || k == maxPoints-1) {
			current = points[p].Admitted
			largest = max(largest, current)
			p++
		}
		thin = append(thin, TrailPoint{from, largest})
	}
	return append(thin, TrailPoint{span, current})
}
