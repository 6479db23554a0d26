package main

import (
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// The quota scenario alone, at 20,000 requests over the 30 days instead of a million: every
// row is there, the resolution log holds an entry per hour at most whatever its requests, the
// calendar keys their counter, every key is within its target, and the server-cost rows have
// positive figures.
func TestQuotaScenarioReportsEveryRow(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the bench program's quota scenario")
	r, out, progress := runBench(t, config{Duration: 400 * time.Millisecond, Concurrency: 16, Clients: 2, Keys: 100, Limit: 20,
		Window: 100 * time.Millisecond, Scenario: "quota", QuotaRequests: 20_000})
	if len(r.Exactness)+len(r.Throughput)+len(r.Memory)+len(r.ServerCost)+len(r.Floor) > 0 {
		t.Errorf("-scenario quota ran other scenarios too")
	}
	checkQuota(t, r, 20_000, out.String())
	if !strings.Contains(progress.String(), "quota/resolution: 20,000 requests") {
		t.Errorf("no progress line for the resolution log:\n%s", progress.String())
	}
}

// checkQuota checks a run's quota rows, of requests spread over the 30 days, and its Markdown.
func checkQuota(t *testing.T, r Report, requests int, markdown string) {
	t.Helper()
	if len(r.QuotaMemory) != 4 {
		t.Fatalf("quota memory rows: %d, want 4", len(r.QuotaMemory))
	}
	res, exact, cal, pol := r.QuotaMemory[0], r.QuotaMemory[1], r.QuotaMemory[2], r.QuotaMemory[3]
	if res.Requests != requests || res.Admitted != requests || res.Events != int64(requests) || res.Entries < 700 ||
		res.Entries > quotaResolutionMaxEntries || res.MaxEntries != quotaResolutionMaxEntries || res.Counters != 0 {
		t.Errorf("resolution log row %+v: want %d requests admitted, at most %d entries holding them", res, requests, quotaResolutionMaxEntries)
	}
	if exact.Requests != requests || exact.Admitted != requests || exact.Entries != int64(requests) || exact.Events != int64(requests) ||
		exact.Bytes <= 7*int64(requests) || !strings.Contains(exact.Case, "measured") {
		t.Errorf("exact log row %+v: want an entry per request, about 9 bytes each", exact)
	}
	if res.Bytes*10 > exact.Bytes {
		t.Errorf("the resolution log's %d bytes are not a tenth of the exact log's %d", res.Bytes, exact.Bytes)
	}
	if cal.Admitted != quotaCalendarRequests || cal.Counters != 1 || cal.Entries != 0 {
		t.Errorf("calendar row %+v: want %d admitted, one counter, no entry", cal, quotaCalendarRequests)
	}
	if pol.Admitted != 10 || pol.Counters != 1 || pol.Entries != 10 {
		t.Errorf("policy row %+v: want 10 admitted, one counter, 10 entries", pol)
	}
	for _, m := range r.QuotaMemory {
		if m.Bytes <= 0 || m.Limit == "" || m.Case == "" || m.Target > 0 && m.Bytes > m.Target {
			t.Errorf("quota memory row %+v: bytes out of (0, target]", m)
		}
		if !strings.Contains(markdown, "| "+m.Case+" | `"+m.Limit+"` | ") {
			t.Errorf("Markdown lacks the row %q", m.Case)
		}
	}
	if res.Target != quotaResolutionTargetBytes || cal.Target != quotaCalendarTargetBytes || pol.Target != quotaPolicyTargetBytes {
		t.Errorf("targets %d, %d, %d", res.Target, cal.Target, pol.Target)
	}

	if len(r.QuotaCost) != 3 {
		t.Fatalf("quota server-cost rows: %d, want 3", len(r.QuotaCost))
	}
	for _, c := range r.QuotaCost {
		if c.Decisions <= 0 || c.Admitted <= 0 || c.Admitted > c.Decisions || c.USPerDecision <= 0 || c.OverSmall <= 0 || c.Entries <= 0 {
			t.Errorf("quota server-cost row %+v", c)
		}
		if !strings.Contains(markdown, "| "+c.Row+" | `"+c.Limit+"` | ") {
			t.Errorf("Markdown lacks the row %q", c.Row)
		}
	}
	if small := r.QuotaCost[0]; small.OverSmall != 1 || small.Keys != quotaSmallKeys || small.Entries > quotaSmallEntries+1 {
		t.Errorf("small log row %+v: want 1× itself, %d keys of about %d entries", small, quotaSmallKeys, quotaSmallEntries)
	}
	// The resolution log's window holds about its Max in events (the admissions since the fill
	// replaced the slots that left), in at most an entry per hour.
	if big := r.QuotaCost[2]; big.Keys != 1 || big.Entries > float64(quotaResolutionMaxEntries) || big.Entries < 700 ||
		big.Events < 0.99*float64(requests) || big.Events > float64(requests) {
		t.Errorf("resolution log row %+v: want about %d events in at most %d entries", big, requests, quotaResolutionMaxEntries)
	}
	for _, want := range []string{"### Long windows and calendar quotas", "### Long windows: server time per decision",
		"the small log's server time per decision", "the target of 1.5×", "within the target of 12,000"} {
		if !strings.Contains(markdown, want) {
			t.Errorf("Markdown lacks %q:\n%s", want, markdown)
		}
	}
}
