package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
)

// headline is one line of the run's summary: a figure the project states, beside its target,
// and whether the run met it. An exactness headline is a promise: a run that does not meet it
// fails (exactnessHeld), whatever the tables say.
type headline struct {
	what   string // what is measured
	figure string // what the run measured
	target string // what it should be
	met    bool
	exact  bool // a promise of exactness: no overshoot, no false denial
	// compare marks a figure shown for comparison (the pipelined design's): no target, no
	// verdict.
	compare bool
	limits  string // when not met (or compared), what holds it there
}

// summarize makes the run's headlines from its report, exactness first; a scenario that did
// not run gives none.
func summarize(r *Report) []headline {
	var hs []headline
	// Exactness: every mode of the engine, on one key under every goroutine.
	if engine, pipe := exactnessRows(r.Exactness); len(engine) > 0 {
		worst, over, falseDenials, limit := 0, 0, 0, engine[0].Limit
		var modes []string
		for _, e := range engine {
			worst, over, falseDenials = max(worst, e.MaxInAnyWindow), over+e.Overshoot, falseDenials+e.FalseDenials
			modes = append(modes, e.Mode)
		}
		hs = append(hs, headline{what: "exactness, one key, " + strings.Join(modes, ", "),
			figure: fmt.Sprintf("max %d in any window, %d over, %d false denials", worst, over, falseDenials),
			target: fmt.Sprintf("at most %d, 0 over, 0 false denials", limit), met: over == 0 && falseDenials == 0 && worst <= limit,
			exact: true})
		if pipe != nil {
			hs = append(hs, headline{what: "the pipelined design under the same load, for comparison",
				figure: fmt.Sprintf("max %d in any window, %d false denials", pipe.MaxInAnyWindow, pipe.FalseDenials), compare: true,
				limits: "four commands in a pipeline are not atomic: denied attempts fill its log"})
		}
	}
	if len(r.LocalQuota) > 0 {
		over := 0
		for _, l := range r.LocalQuota {
			over += l.Overshoot
		}
		hs = append(hs, headline{what: "local quota, one hot key, a paused server included",
			figure: fmt.Sprintf("%d over the limit in any window", over), target: "0 over", met: over == 0, exact: true})
	}
	if t := r.Tokens; t != nil {
		hs = append(hs, headline{what: fmt.Sprintf("token budgets, reserve-settle-charge on %d tenants", t.Tenants),
			figure: fmt.Sprintf("%d admitted over the budget, %d false denials, %d charges misjudged; %s tokens charged for %s used, %s of them found in the server's logs (%s entries), %d mismatched",
				t.Over, t.FalseDenials, t.Misjudged, commas64(t.TokensCharged), commas64(t.TokensUsed), commas64(t.Tokens), commas(t.Entries), t.Mismatched),
			target: "0 over, 0 false denials, charged = used, 0 mismatched", met: t.met(), exact: true})
	}
	for _, l := range r.Leases {
		if l.Keys == 1 {
			hs = append(hs, headline{what: "in-flight limits (leases), " + l.Case,
				figure: fmt.Sprintf("at most %d held at once, %d over", l.PeakHolders, l.Overshoot),
				target: fmt.Sprintf("at most %d", l.Max), met: l.Overshoot == 0, exact: true})
		}
	}
	// Speed, measured side by side in this run.
	rates, cpu := map[string]float64{}, map[string]float64{}
	for _, t := range r.Throughput {
		if t.Clock == "server" || t.Mode == "pipelined" {
			rates[t.Mode], cpu[t.Mode] = t.DecisionsPerSec, t.ServerCPUPerOp
		}
	}
	if rates["batched"] > 0 && rates["pipelined"] > 0 {
		ratio := rates["batched"] / rates["pipelined"]
		hs = append(hs, headline{what: "decisions/s, batched over pipelined",
			figure: fmt.Sprintf("%.2f× (%s against %s)", ratio, commas(int(rates["batched"])), commas(int(rates["pipelined"]))),
			target: "at least 1×", met: ratio >= 1,
			limits: "the two cores are shared by the server, the clients and the bench"})
		hs = append(hs, headline{what: "server CPU per decision, batched against pipelined",
			figure: fmt.Sprintf("%.1f µs against %.1f", cpu["batched"], cpu["pipelined"]), target: "no more",
			met: cpu["batched"] <= cpu["pipelined"]})
	}
	if figure, target, met := boundedBytes(r.Memory); figure != "" {
		hs = append(hs, headline{what: "memory of a full window's log, by requests × cost", figure: figure, target: target, met: met})
	}
	for _, f := range r.Floor {
		if f.Script == "decide.lua" {
			hs = append(hs, headline{what: "server time of " + f.Row + ", over the bare script's floor",
				figure: fmt.Sprintf("%.2f×", f.OverFloor), target: fmt.Sprintf("at most %.1f×", floorTarget),
				met:    f.OverFloor <= floorTarget,
				limits: "the Lua work of a decision: the header's fields and entries unpacked, the new header and the reply packed"})
		}
	}
	if worst, at := busyWorst(r.BusyKeys); at != "" {
		hs = append(hs, headline{what: "busy keys: the costliest decision over a small admission",
			figure: fmt.Sprintf("%.2f× (%s)", worst, at), target: fmt.Sprintf("at most %.1f×", busyTarget), met: worst <= busyTarget,
			limits: "a busy header is read and written whole on every call, about three times a small one's bytes"})
	}
	var quotaFigures, quotaTargets []string
	quotaMet := true
	for _, m := range r.QuotaMemory {
		if m.Target > 0 {
			quotaFigures = append(quotaFigures, fmt.Sprintf("%s: %s B", m.Limit, commas64(m.Bytes)))
			quotaTargets = append(quotaTargets, commas64(m.Target))
			quotaMet = quotaMet && m.Bytes <= m.Target
		}
	}
	if len(quotaFigures) > 0 {
		hs = append(hs, headline{what: "memory of long and calendar quotas", figure: strings.Join(quotaFigures, ", "),
			target: "at most " + strings.Join(quotaTargets, ", ") + " B", met: quotaMet})
	}
	if n := len(r.QuotaCost); n > 0 {
		last := r.QuotaCost[n-1]
		hs = append(hs, headline{what: "long quota decision, " + last.Row + ", over a small log's",
			figure: fmt.Sprintf("%.2f×", last.OverSmall), target: fmt.Sprintf("at most %.1f×", quotaCostTarget),
			met: last.OverSmall <= quotaCostTarget})
	}
	return hs
}

// boundedBytes is the memory table's engine rows that have a target, as one headline's figure
// and target, and whether every row met its own.
func boundedBytes(rows []MemoryRow) (figure, target string, met bool) {
	var figures, targets []string
	met = true
	for _, m := range rows {
		if m.Mode != "atomic" || m.Target == 0 {
			continue
		}
		figures = append(figures, fmt.Sprintf("%s × %d: %s B (%.1f/entry)", commas(m.Requests), m.Cost, commas64(m.Bytes),
			float64(m.Bytes)/float64(max(m.Entries, 1))))
		targets = append(targets, commas64(m.Target))
		met = met && m.Bytes <= m.Target
	}
	if len(figures) == 0 {
		return "", "", true
	}
	return strings.Join(figures, ", "), "at most " + strings.Join(targets, ", ") + " B", met
}

// exactnessRows splits the exactness rows into the engine's and the pipelined design's.
func exactnessRows(rows []ExactnessRow) (engine []ExactnessRow, pipe *ExactnessRow) {
	for i := range rows {
		if rows[i].Mode == "pipelined" {
			pipe = &rows[i]
			continue
		}
		engine = append(engine, rows[i])
	}
	return engine, pipe
}

// busyWorst is the largest ratio of the busykeys rows, and where it was; "" when the scenario
// did not run.
func busyWorst(rows []BusyRow) (worst float64, at string) {
	for _, r := range rows {
		for j, c := range r.Cells {
			if c.OverSmall > worst {
				worst, at = c.OverSmall, fmt.Sprintf("%s, %s live entries", busyCases[j].column, commas(r.Entries))
			}
		}
	}
	return worst, at
}

// errExactness is the run's error when an exactness headline was not met.
var errExactness = errors.New("exactness did not hold")

// exactnessHeld returns an error naming every exactness headline the run did not meet, nil
// when it met them all.
func exactnessHeld(hs []headline) error {
	var failed []string
	for _, h := range hs {
		if h.exact && !h.met {
			failed = append(failed, h.what+": "+h.figure)
		}
	}
	if len(failed) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", errExactness, strings.Join(failed, "; "))
}

// writeSummary prints the run's headlines, the README's table from this run, and where the
// charts went (dir; "" when none were drawn).
func writeSummary(w io.Writer, r *Report, hs []headline, charts []string) {
	if len(hs) == 0 {
		return
	}
	fmt.Fprintf(w, "\n## Summary\n\n")
	met, targets := 0, 0
	for _, h := range hs {
		if h.compare {
			fmt.Fprintf(w, "- %s: %s; %s\n", h.what, h.figure, h.limits)
			continue
		}
		targets++
		verdict := "met"
		if !h.met {
			verdict = "NOT MET"
		} else {
			met++
		}
		line := fmt.Sprintf("- %s: %s (target %s): %s", h.what, h.figure, h.target, verdict)
		if h.limits != "" && !h.met {
			line += "; " + h.limits
		}
		fmt.Fprintln(w, line)
	}
	fmt.Fprintf(w, "\n%d of %d targets met", met, targets)
	if err := exactnessHeld(hs); err != nil {
		fmt.Fprintf(w, "; EXACTNESS FAILED: %v", err)
	} else {
		fmt.Fprint(w, "; every exactness promise held")
	}
	fmt.Fprintln(w, ".")
	writeOneTable(w, r)
	switch {
	case len(charts) > 0:
		fmt.Fprintf(w, "\nCharts: %s\n", strings.Join(charts, ", "))
	case r.Settings.Config.ChartsDir == "":
		fmt.Fprintf(w, "\nCharts: none drawn (-charts \"\"); `go run ./bench -charts DIR` draws them.\n")
	default:
		fmt.Fprintf(w, "\nCharts: none, the exactness and throughput scenarios did not run.\n")
	}
}

// writeOneTable prints the README's table ("The benchmark in one table") from this run's
// exactness and throughput rows; nothing when either did not run.
func writeOneTable(w io.Writer, r *Report) {
	exact := map[string]ExactnessRow{}
	for _, e := range r.Exactness {
		exact[e.Mode] = e
	}
	thru := map[string]ThroughputRow{}
	for _, t := range r.Throughput {
		if t.Clock == "server" || t.Mode == "pipelined" {
			thru[t.Mode] = t
		}
	}
	if len(exact) == 0 || len(thru) == 0 {
		return
	}
	fmt.Fprintf(w, "\nThe README's table, from this run:\n\n")
	table(w, []string{"mode", fmt.Sprintf("exactness: max in any window (limit %d)", r.Settings.Config.Limit), "false denials",
		fmt.Sprintf("decisions/s, %s keys", commas(r.Settings.Config.Keys)), "server CPU µs/decision"})
	for _, m := range []struct{ mode, exact, thru, name string }{
		{"atomic", "atomic", "atomic", "atomic (one EVALSHA per decision)"},
		{"batched", "batched", "batched", "batched (the default: group commit)"},
		{"cached", "cached", "", "batched + deny cache, one hot key"},
		{"pipelined", "pipelined", "pipelined", "pipelined (the common design: four commands in a pipeline)"},
	} {
		e, ok := exact[m.exact]
		if !ok {
			continue
		}
		rate, server := fmt.Sprintf("%s (one key)", commas(int(e.OfferedPS))), "-"
		if t, ok := thru[m.thru]; ok {
			rate, server = commas(int(t.DecisionsPerSec)), f1(t.ServerCPUPerOp)
		}
		row(w, m.name, fmt.Sprint(e.MaxInAnyWindow), commas(e.FalseDenials), rate, server)
	}
}
