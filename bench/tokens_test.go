package main

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
)

// The tokens scenario alone, a few windows long: the budget binds (denials, charges over it),
// nothing is admitted over it or denied with room, the tokens charged are the tokens used, and
// the server's logs hold every entry the reads checked at its cost.
func TestTokensScenarioAudits(t *testing.T) {
	r, out, progress := runBench(t, config{Duration: 3 * tokensWindow, Concurrency: 32, Clients: 2, Keys: 100, Limit: 20,
		Window: 100 * time.Millisecond, Scenario: "tokens"})
	if len(r.Exactness)+len(r.Throughput)+len(r.Memory)+len(r.ServerCost)+len(r.BusyKeys)+len(r.Leases) > 0 {
		t.Errorf("-scenario tokens ran other scenarios too")
	}
	checkTokens(t, r.Tokens, out.String())
	if !strings.Contains(progress.String(), "tokens: ") || !strings.Contains(progress.String(), " mismatched") {
		t.Errorf("no progress line for the tokens scenario:\n%s", progress.String())
	}
}

// checkTokens checks a run's tokens row and its Markdown.
func checkTokens(t *testing.T, r *TokensRow, markdown string) {
	t.Helper()
	if r == nil {
		t.Fatal("no tokens row")
	}
	if r.Over != 0 || r.FalseDenials != 0 || r.Misjudged != 0 || r.Mismatched != 0 || r.TokensCharged != r.TokensUsed || !r.met() {
		t.Errorf("tokens: %d over, %d false denials, %d charges misjudged, %d mismatched, %d tokens charged for %d used",
			r.Over, r.FalseDenials, r.Misjudged, r.Mismatched, r.TokensCharged, r.TokensUsed)
	}
	if r.Denied == 0 || r.ChargedOver == 0 || r.Peak > r.Max || r.Peak < r.Max-tokensEstimateMax {
		t.Errorf("tokens: %d denied, %d charges over the budget, at most %d of %d at an admission: the budget never bound",
			r.Denied, r.ChargedOver, r.Peak, r.Max)
	}
	if r.Admitted == 0 || r.Settled == 0 || r.Charged == 0 || r.Requests != r.Admitted+r.Denied || r.Admitted != r.Settled+r.Charged ||
		r.Calls != r.Requests+r.Admitted || r.TokensUsed <= 0 || r.DecisionsPerSec <= 0 || r.P50us <= 0 || r.P50us > r.P99us {
		t.Errorf("tokens row %+v", *r)
	}
	// Nearly every entry read in its final state: the reads come a quarter window apart.
	if r.Entries == 0 || r.Tokens <= 0 || r.Unchecked*10 > r.Entries || r.Reads < 2 {
		t.Errorf("tokens: %d entries (%d tokens) checked on the server, %d unchecked, in %d reads", r.Entries, r.Tokens, r.Unchecked, r.Reads)
	}
	for _, want := range []string{"### Token budgets: reserve, settle, charge (`-scenario tokens`)", "| admitted over the budget | 0 |",
		"| mismatched | 0 |", "exactness held"} {
		if !strings.Contains(markdown, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, markdown)
		}
	}
}

// The audit finds what it is there for: an admission over the budget, a false denial, a
// charge said to fit that did not; it holds a decision that hangs on a Settle in flight for
// neither. The check of the logs finds an entry at another cost, and one nobody recorded, and
// leaves a microsecond whose Settle may not have landed.
func TestTokensAuditFindsEachFailure(t *testing.T) {
	l := engine.Limit{Max: 100, Window: time.Second}
	const s = 1_000_000 // µs
	reqs := []tokensRequest{
		// 60 reserved at 1 s, settled to 20 surely by 1.1 s.
		{at: s, seq: 1, estimate: 60, allowed: true, used: 20, settledBy: s + 100_000},
		// 1.05 s: 50 admitted, room only while the Settle is in flight: in doubt.
		{at: s + 50_000, seq: 1, estimate: 50, allowed: true, used: 50, settledBy: math.MaxInt64},
		// 1.2 s: 40 admitted on 20 + 50 held: over.
		{at: s + 200_000, seq: 1, estimate: 40, allowed: true, used: 40, settledBy: math.MaxInt64},
		// 1.2 s: 5 denied on 110 held: right.
		{at: s + 200_000, estimate: 5, settledBy: math.MaxInt64},
		// 2.5 s: everything left the window, 10 denied: false.
		{at: s + 1_500_000, estimate: 10, settledBy: math.MaxInt64},
		// 2.6 s: 10 admitted, used 30, the charge of 20 said not to fit on 10 held: misjudged.
		{at: s + 1_600_000, seq: 1, estimate: 10, allowed: true, used: 30, settledBy: math.MaxInt64,
			charge: tokensCharge{at: s + 1_600_100, seq: 1, cost: 20}},
	}
	logs := tokensLogs(reqs, 1)
	a := auditTokens(reqs, logs, l)
	if a.Over != 1 || a.FalseDenials != 1 || a.Misjudged != 1 || a.InDoubt != 1 || a.Peak != 110 || a.First == "" {
		t.Errorf("audit %+v: want 1 over, 1 false denial, 1 charge misjudged, 1 in doubt, 110 at most at an admission", a)
	}

	entry := func(at int64, cost int) inspect.Entry { return inspect.Entry{At: time.UnixMicro(at), Cost: cost} }
	reads := []tokensRead{
		// At 1.05 s: the first entry's Settle may be on its way (by 1.1 s): not checked.
		{from: s + 50_000, to: s + 50_010, logs: [][]inspect.Entry{{entry(s, 60)}}},
		// At 1.3 s: the first three at their costs.
		{from: s + 300_000, to: s + 300_010, logs: [][]inspect.Entry{{entry(s, 20), entry(s+50_000, 50), entry(s+200_000, 40)}}},
		// After the run: the last admission at 11 instead of 10, and an entry nobody recorded.
		{from: s + 1_700_000, to: s + 1_700_010, final: true,
			logs: [][]inspect.Entry{{entry(s+1_600_000, 11), entry(s+1_600_100, 20), entry(s+1_650_000, 3)}}},
	}
	c := checkTokenLogs(logs, reads, l.Window)
	if c.Reads != 3 || c.Entries != 4 || c.Tokens != 130 || c.Unchecked != 1 || c.Mismatched != 2 || c.FirstMismatch == "" {
		t.Errorf("check %+v: want 4 entries (130 tokens) checked, 1 unchecked, 2 mismatched", c)
	}
}
