package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// The busykeys scenario alone on small logs: a row per size, smallest first, every cell's
// decisions taken and come out as the case wants (the scenario fails on any other), each log
// holding its N live entries before and after the rounds, and every figure positive.
func TestBusyKeysScenarioReportsEveryRow(t *testing.T) {
	sizes := []int{100, 5, 33} // out of order: the scenario sorts them
	r, out, progress := runBench(t, config{Duration: 400 * time.Millisecond, Concurrency: 16, Clients: 2, Keys: 100, Limit: 20,
		Window: 100 * time.Millisecond, Scenario: "busykeys", BusySizes: sizes})
	if len(r.Exactness)+len(r.Throughput)+len(r.Memory)+len(r.ServerCost)+len(r.Floor)+len(r.QuotaCost) > 0 {
		t.Errorf("-scenario busykeys ran other scenarios too")
	}
	checkBusy(t, r.BusyKeys, []int{5, 33, 100}, out.String())
	if !strings.Contains(progress.String(), "busykeys/100 live entries: server µs per decision admission") {
		t.Errorf("no progress line for the 100-entry log:\n%s", progress.String())
	}
}

// checkBusy checks a run's busykeys rows, one per size of sizes (ascending), and its
// Markdown: one table.
func checkBusy(t *testing.T, rows []BusyRow, sizes []int, markdown string) {
	t.Helper()
	if len(rows) != len(sizes) {
		t.Fatalf("busykeys rows: %d, want %d", len(rows), len(sizes))
	}
	for i, r := range rows {
		n := sizes[i]
		if r.Entries != n || r.LiveBefore != n || r.LiveAfter != n || r.WindowUS <= 0 || r.Bytes <= 0 ||
			r.BytesPerEntry != float64(r.Bytes)/float64(n) || r.FillSeconds <= 0 || len(r.Cells) != len(busyCases) {
			t.Errorf("busykeys row %+v: want %d live entries before and after, positive figures", r, n)
			continue
		}
		for j, c := range r.Cells {
			bc := busyCases[j]
			wantMax, wantCost := bc.limit(n)
			admitted := 0
			if bc.admit {
				admitted = c.Decisions
			}
			if c.Max != wantMax || c.Cost != wantCost || c.Decisions != busyRounds*busyDecisions(n) || c.Admitted != admitted ||
				len(c.RoundsUS) != busyRounds || len(c.RoundsOver) != busyRounds || c.USPerDecision <= 0 || c.OverSmall <= 0 {
				t.Errorf("%d live entries, %s: %+v", n, bc.column, c)
			}
			for k := range c.RoundsUS {
				if c.RoundsUS[k] <= 0 || c.RoundsOver[k] <= 0 {
					t.Errorf("%d live entries, %s: round %d: %.2f µs, %.2f×", n, bc.column, k, c.RoundsUS[k], c.RoundsOver[k])
				}
			}
		}
		if !strings.Contains(markdown, "| "+commas(n)+" | ") {
			t.Errorf("Markdown lacks the row of %d live entries", n)
		}
	}
	if small := rows[0]; small.Cells[0].OverSmall != 1 {
		t.Errorf("the small admission is %.3f× itself", small.Cells[0].OverSmall)
	}
	if got := strings.Count(markdown, "### Busy keys"); got != 1 {
		t.Errorf("Markdown holds %d busykeys tables, want 1", got)
	}
	for _, want := range []string{"### Busy keys: server µs per decision by live entries (INFO commandstats)",
		"| live entries | admission µs | × small admission | denial (full) µs |", "the target of 1.5×"} {
		if !strings.Contains(markdown, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, markdown)
		}
	}
}

func TestParseSizes(t *testing.T) {
	got, err := parseSizes("5, 32,100000")
	if err != nil || len(got) != 3 || got[0] != 5 || got[1] != 32 || got[2] != 100_000 {
		t.Fatalf("parseSizes = %v, %v", got, err)
	}
	for _, bad := range []string{"", "5,,6", "5;6", "1e3"} {
		if _, err := parseSizes(bad); err == nil {
			t.Errorf("parseSizes(%q): no error", bad)
		}
	}
}

// A decision that does not come out as its case says fails the scenario: the check that makes
// the table an exactness check too. So does a log that does not hold N live entries.
func TestBusyCellRefusesAnUnexpectedOutcome(t *testing.T) {
	ctx := context.Background()
	b, err := newBencher(ctx, config{Clients: 1, Concurrency: 1}, valkeytest.New(t), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer b.close()
	k, err := b.newBusyKey(ctx, 5, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.busyFill(ctx, k); err != nil {
		t.Fatal(err)
	}
	for _, c := range []busyCase{
		{column: "an admission over a limit lowered to half", admit: true, limit: func(n int) (int, int) { return n / 2, 1 }},
		{column: "a denial with room", limit: func(n int) (int, int) { return n + 1, 1 }},
	} {
		if _, err := b.busyCell(ctx, k, c, 32); err == nil || !strings.Contains(err.Error(), "decision 1 of 32") {
			t.Errorf("%s: %v, want the first decision refused", c.column, err)
		}
	}
	if live, err := b.busyLive(ctx, k); err != nil || live != 5 {
		t.Fatalf("busyLive = %d, %v, want 5", live, err)
	}
	k.clock.tick++ // the oldest entry leaves the window
	if _, err := b.busyLive(ctx, k); err == nil || !strings.Contains(err.Error(), "4 in the window") {
		t.Errorf("busyLive on a log of 4 live entries: %v, want an error", err)
	}
}
