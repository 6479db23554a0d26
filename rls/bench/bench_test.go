package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/internal/valkeytest"
	rlsconfig "github.com/strictrate/strictrate/rls/config"
)

// TestRunStrictrateAlone runs the command's core with tiny durations against strictrate-rls
// alone, with one variable added by -strictrate-env (STRICTRATE_BATCHING=true, the service's
// default): the report must name it, the throughput table must hold figures for one and three
// descriptors, and the exactness scenarios that need no minute boundary must show what an
// exact limiter admits.
func TestRunStrictrateAlone(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the whole rls bench program")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := filepath.Join(t.TempDir(), "bench.md")
	cfg := config{
		Duration: 400 * time.Millisecond, Rounds: 2, Warmup: 100 * time.Millisecond,
		Concurrency: 8, Conns: 2, Keys: 100, Exactness: true, Boundary: false, Out: out,
		StrictrateEnv: []string{"STRICTRATE_BATCHING=true"},
	}
	var stdout, progress strings.Builder
	if err := run(ctx, cfg, &stdout, &progress); err != nil {
		t.Fatalf("run: %v\nprogress:\n%s", err, progress.String())
	}
	md := stdout.String()
	written, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if string(written) != md {
		t.Errorf("-out file differs from stdout")
	}

	if !strings.Contains(md, "strictrate-rls with STRICTRATE_BATCHING=true") {
		t.Errorf("the report does not say that strictrate-rls ran with STRICTRATE_BATCHING=true:\n%s", md)
	}

	row := regexp.MustCompile(`(?m)^\| strictrate-rls \| ([13]) \| ([\d,]+) \| ([\d.]+) ms \| ([\d.]+) ms \| — \|.*\| (\d+) \| (\d+) \| (\d+) \|$`)
	rows := row.FindAllStringSubmatch(md, -1)
	if len(rows) != 2 {
		t.Fatalf("want 2 throughput rows for strictrate-rls, got %d in:\n%s", len(rows), md)
	}
	for i, r := range rows {
		if want := []string{"1", "3"}[i]; r[1] != want {
			t.Errorf("row %d: %s descriptors, want %s", i, r[1], want)
		}
		rate, _ := strconv.Atoi(strings.ReplaceAll(r[2], ",", ""))
		p50, _ := strconv.ParseFloat(r[3], 64)
		p99, _ := strconv.ParseFloat(r[4], 64)
		ok, _ := strconv.Atoi(r[5])
		errs, _ := strconv.Atoi(r[7])
		if rate <= 0 || ok <= 0 || p50 <= 0 || p99 < p50 {
			t.Errorf("row %q: want a positive rate, OK count and p50, and p99 >= p50", r[0])
		}
		if errs != 0 {
			t.Errorf("row %q: %d errors", r[0], errs)
		}
	}
	for _, want := range []string{
		"| a used-up 1/min descriptor beside a 3/min one: 3 requests carrying both, admitted | 0 of 3 | 0 of 3 |",
		"| then 3 requests on the 3/min one alone: admitted | 3 of 3 | 3 of 3 |",
		"| hits_addend 4, 4, 1 against 5/min | OK, OVER_LIMIT, OK | OK, OVER_LIMIT, OK |",
		// 6 checks of a 1,000-token budget, each admitted one reporting 300: the checks at 0,
		// 300, 600 and 900 are admitted, the fourth report (1,200) is recorded over the
		// budget, and the last two checks are denied.
		"| token budget of 1,000/hour (record_over_limit): 6 requests, each checked (hits_addend 0) and, when admitted, " +
			"reported at 300 tokens after its response: admitted, tokens reported, tokens counted, admitted past the budget " +
			"| 4, 1,200, 1,200, 0 | 4, 1,200, 1,200, 0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("exactness: want the row\n%s\nin:\n%s", want, md)
		}
	}
	if strings.Contains(md, "minute boundary") {
		t.Errorf("the boundary scenario was skipped, yet reported:\n%s", md)
	}
}

// TestMarkdownRatio checks the table's figures against a report made by hand: the ratio to
// the reference, thousands separators, per-decision CPU and unknown figures.
func TestMarkdownRatio(t *testing.T) {
	unknown := counters{ValkeyCPU: -1, ServerCPU: -1, ClientCPU: -1, ValkeyCommands: -1}
	rep := &report{
		cfg: config{Concurrency: 64, Conns: 4, Keys: 10_000, Duration: 10 * time.Second, Rounds: 5, Warmup: time.Second, Reference: "ref"},
		throughput: []throughput{
			{Server: nameStrictrate, Descriptors: 1, Decisions: 300_000, OK: 300_000, PerSecond: 30_000,
				P50: 1500 * time.Microsecond, P99: 4 * time.Millisecond,
				Used: counters{ValkeyCPU: 3 * time.Second, ServerCPU: 6 * time.Second, ClientCPU: 3 * time.Second, ValkeyCommands: 600_000}},
			{Server: nameReference, Descriptors: 1, Decisions: 150_000, OK: 150_000, PerSecond: 15_000, Used: unknown},
		},
	}
	md := rep.markdown()
	for _, want := range []string{
		"| strictrate-rls | 1 | 30,000 | 1.50 ms | 4.00 ms | 2.00x | 10.0 | 20.0 | 10.0 | 2.0 | 300000 | 0 | 0 |",
		"| reference | 1 | 15,000 | 0.00 ms | 0.00 ms | 1.00x | — | — | — | — | 150000 | 0 | 0 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("want the row\n%s\nin:\n%s", want, md)
		}
	}
}

// TestCounters checks that a figure unknown at either end of a run, or in any run, stays
// unknown rather than turning into a wrong number.
func TestCounters(t *testing.T) {
	a := counters{ValkeyCPU: 5, ServerCPU: -1, ClientCPU: 7, ValkeyCommands: 10}
	b := counters{ValkeyCPU: 2, ServerCPU: 3, ClientCPU: -1, ValkeyCommands: 4}
	if got, want := a.minus(b), (counters{3, -1, -1, 6}); got != want {
		t.Errorf("minus: got %+v, want %+v", got, want)
	}
	if got, want := a.plus(b), (counters{7, -1, -1, 14}); got != want {
		t.Errorf("plus: got %+v, want %+v", got, want)
	}
	s := summarize(nameStrictrate, 1, []sample{
		{ok: 3, over: 1, measured: time.Second, latencies: []time.Duration{1, 2, 3, 4}, used: counters{1, 1, 1, 1}},
		{ok: 4, errs: 2, measured: time.Second, latencies: []time.Duration{5, 6, 7, 8}, used: counters{1, -1, 1, 1}},
	})
	if s.Decisions != 10 || s.PerSecond != 4 || s.P50 != 5 || s.P99 != 8 || s.Used != (counters{2, -1, 2, 2}) {
		t.Errorf("summarize: got %+v", s)
	}
}

// The reference is given the configuration without record_over_limit, a key it refuses: the
// files still parse, the tokens rule is there, and nothing else changed.
func TestReferenceConfig(t *testing.T) {
	for _, reference := range []bool{false, true} {
		dir := t.TempDir()
		if err := writeConfig(dir, reference); err != nil {
			t.Fatal(err)
		}
		text, err := os.ReadFile(filepath.Join(dir, "exact.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Contains(string(text), "record_over_limit"); got == reference {
			t.Errorf("reference %t: the file says record_over_limit: %t", reference, got)
		}
		c, err := rlsconfig.LoadDir(dir, false)
		if err != nil {
			t.Fatalf("reference %t: %v", reference, err)
		}
		m := c.Match(exactDomain, []rlsconfig.Entry{{Key: "tokens", Value: "u"}})
		if m.Limit == nil || m.Limit.RequestsPerUnit != tokenBudget || m.Limit.RecordOverLimit == reference {
			t.Errorf("reference %t: the tokens rule is %+v", reference, m.Limit)
		}
		if got, want := strings.Count(c.String(), "\n"), 8; got != want {
			t.Errorf("reference %t: %d rules, want %d:\n%s", reference, got, want, c)
		}
	}
}
