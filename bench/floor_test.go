package main

import (
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// The floor scenario alone, briefly, against a test server: every row is there, in order, with
// positive figures, and the table and decide.lua's line against the target are printed.
func TestFloorScenarioReportsEveryRow(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the bench program's floor scenario")
	r, out, _ := runBench(t, config{Duration: 400 * time.Millisecond, Concurrency: 16, Clients: 2, Keys: 100, Limit: 20,
		Window: 100 * time.Millisecond, Scenario: "floor"})
	if len(r.Exactness)+len(r.Throughput)+len(r.Memory)+len(r.Ceiling) > 0 {
		t.Errorf("-scenario floor ran other scenarios too")
	}
	checkFloor(t, r.Floor, out.String())
}

// checkFloor checks a run's floor rows (one per floorCase, in order, every figure positive, the
// floor row 1× itself) and its Markdown.
func checkFloor(t *testing.T, rows []FloorRow, markdown string) {
	t.Helper()
	if len(rows) != len(floorCases) {
		t.Fatalf("floor rows: %d, want %d", len(rows), len(floorCases))
	}
	for i, r := range rows {
		fc := floorCases[i]
		if r.Row != fc.row || r.Command != fc.command || r.Calls <= 0 || r.CallsPerSec <= 0 || r.USPerCall <= 0 ||
			r.USPerDecision <= 0 || r.FloorUS <= 0 || r.OverFloor <= 0 || r.DecisionsPerCall != fc.decisionsPerCall ||
			fc.live != nil && r.LiveEntries <= 0 {
			t.Errorf("floor row %+v", r)
		}
		if r.Row == floorFloorRow && r.OverFloor != 1 {
			t.Errorf("the floor row is %.3f× itself", r.OverFloor)
		}
		if !strings.Contains(markdown, "| "+r.Row+" | "+r.Command+" | ") {
			t.Errorf("Markdown lacks the row %q", r.Row)
		}
	}
	for _, want := range []string{"### Where the server's time goes", "decide.lua: ", "the target of 1.3×"} {
		if !strings.Contains(markdown, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, markdown)
		}
	}
}
