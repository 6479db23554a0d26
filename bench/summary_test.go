package main

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// Every scenario -scenario names is a step of the run, in the order the runs take them.
func TestScenarioStepsAreTheScenarios(t *testing.T) {
	var names []string
	for _, s := range (&bencher{}).scenarioSteps(&Report{}) {
		names = append(names, s.name)
		if s.estimate(config{Duration: 5 * time.Second}) <= 0 {
			t.Errorf("step %s estimates no time", s.name)
		}
	}
	if !slices.Equal(slices.Sorted(slices.Values(names)), slices.Sorted(slices.Values(scenarios))) {
		t.Fatalf("steps %v, scenarios %v: want the same", names, scenarios)
	}
}

// The summary puts exactness first, gives every headline a verdict, prints the README's table
// from the run, and fails the run (exactnessHeld) when an engine mode admitted over its limit
// or denied with room; the pipelined design's drift is the comparison, never a failure.
func TestSummaryVerdictsAndExitStatus(t *testing.T) {
	good := &Report{Settings: Settings{Config: config{Limit: 100, Keys: 10_000}}, Exactness: []ExactnessRow{
		{Mode: "atomic", Limit: 100, Exactness: Exactness{MaxInAnyWindow: 100}},
		{Mode: "batched", Limit: 100, Exactness: Exactness{MaxInAnyWindow: 100}},
		{Mode: "pipelined", Limit: 100, Exactness: Exactness{MaxInAnyWindow: 100, FalseDenials: 9000}},
	}, Throughput: []ThroughputRow{
		{Mode: "atomic", Clock: "server", DecisionsPerSec: 50_000, ServerCPUPerOp: 14},
		{Mode: "batched", Clock: "server", DecisionsPerSec: 90_000, ServerCPUPerOp: 8},
		{Mode: "pipelined", Clock: "caller", DecisionsPerSec: 60_000, ServerCPUPerOp: 12},
	}}
	hs := summarize(good)
	if len(hs) < 3 || !hs[0].exact || !strings.HasPrefix(hs[0].what, "exactness") {
		t.Fatalf("headlines %+v: want exactness first", hs)
	}
	if err := exactnessHeld(hs); err != nil {
		t.Fatalf("a run whose engine held its limits: %v", err)
	}
	var out strings.Builder
	writeSummary(&out, good, hs, []string{"bench-charts/exactness.svg"})
	for _, want := range []string{"## Summary", "): met", "the pipelined design under the same load, for comparison: max 100 in any window, 9000 false denials;", "every exactness promise held",
		"The README's table, from this run", "| batched (the default: group commit) | 100 | 0 | 90,000 | 8.0 |",
		"Charts: bench-charts/exactness.svg"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}

	bad := *good
	bad.Exactness = append([]ExactnessRow{{Mode: "atomic", Limit: 100, Exactness: Exactness{MaxInAnyWindow: 101, Overshoot: 1}}}, good.Exactness[1:]...)
	err := exactnessHeld(summarize(&bad))
	if !errors.Is(err, errExactness) || !strings.Contains(err.Error(), "1 over") {
		t.Fatalf("a run with an overshoot: %v, want errExactness naming it", err)
	}
	out.Reset()
	writeSummary(&out, &bad, summarize(&bad), nil)
	if !strings.Contains(out.String(), "NOT MET") || !strings.Contains(out.String(), "EXACTNESS FAILED") {
		t.Errorf("summary of a failed run:\n%s", out.String())
	}
}
