package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
)

// writeMarkdown prints the report as Markdown tables.
func writeMarkdown(w io.Writer, r *Report) {
	s := r.Settings
	fmt.Fprintf(w, "## strictrate bench\n\n%s (%s), %s, GOMAXPROCS %d of %d CPUs; %d goroutines over %d clients; limit %d per %s; %s per scenario and mode.\n",
		s.ServerVersion, s.ServerSource, s.GoVersion, s.GOMAXPROCS, s.NumCPU, s.Config.Concurrency, s.Config.Clients,
		s.Config.Limit, s.Config.Window, s.Config.Duration)

	if len(r.Exactness) > 0 {
		fmt.Fprintf(w, "\n### Exactness under contention (one key, every goroutine)\n\n")
		table(w, []string{"mode", "requests/s", "admitted", "full windows", "admitted per window min / mean / max", "limit",
			"max in any window", "overshoot", "false denials", "log events: largest seen / at end", "server calls per request",
			"decided by the deny cache", "timestamps"})
		for _, e := range r.Exactness {
			row(w, e.Mode, f0(e.OfferedPS), strconv.Itoa(e.Admitted), strconv.Itoa(e.FullWindows),
				fmt.Sprintf("%d / %.1f / %d", e.PerWindowMin, e.PerWindowMean, e.PerWindowMax), strconv.Itoa(e.Limit),
				strconv.Itoa(e.MaxInAnyWindow), strconv.Itoa(e.Overshoot), strconv.Itoa(e.FalseDenials), fmt.Sprintf("%d / %d", e.LogMax, e.LogEntries),
				fmt.Sprintf("%.3f", float64(e.ServerCalls)/float64(max(e.Requests, 1))), pct(float64(e.Cached)/float64(max(e.Requests, 1))), e.Clock)
		}
	}
	if len(r.Throughput) > 0 {
		fmt.Fprintf(w, "\n### Throughput and latency (%d keys)\n\n", r.Throughput[0].Keys)
		table(w, []string{"mode", "clock", "decisions/s", "p50 µs", "p99 µs", "p99.9 µs", "allocs/decision", "heap B/decision",
			"server CPU µs/decision", "(in commands)", "client CPU µs/decision", "server cores busy", "decisions/call", "admitted"})
		for _, t := range r.Throughput {
			batch := "-"
			if t.MeanBatch > 0 {
				batch = f1(t.MeanBatch)
			}
			row(w, t.Mode, t.Clock, f0(t.DecisionsPerSec), f0(t.P50us), f0(t.P99us), f0(t.P999us), f1(t.AllocsPerOp),
				f0(t.BytesPerOp), f1(t.ServerCPUPerOp), f1(t.ServerUSPerOp), f1(t.ClientCPUPerOp), fmt.Sprintf("%.2f", t.ServerCPU), batch, pct(t.AdmittedShare))
		}
		rates := map[string]float64{}
		for _, t := range r.Throughput {
			if t.Clock == "server" || t.Mode == "pipelined" {
				rates[t.Mode] = t.DecisionsPerSec
			}
		}
		if rates["pipelined"] > 0 {
			fmt.Fprintf(w, "\ndecisions/s, same run: atomic / pipelined %.2f; batched / pipelined %.2f; batched / atomic %.2f\n",
				rates["atomic"]/rates["pipelined"], rates["batched"]/rates["pipelined"], rates["batched"]/max(rates["atomic"], 1))
		}
	}
	if len(r.Memory) > 0 {
		fmt.Fprintf(w, "\n### Memory per key (MEMORY USAGE, window one hour)\n\n")
		table(w, []string{"mode", "limit", "requests × cost", "log events", "log entries", "bytes", "bytes/entry", "encoding",
			"first layout (quoted)", "target"})
		for _, m := range r.Memory {
			row(w, m.Mode, strconv.Itoa(m.Limit), fmt.Sprintf("%d × %d", m.Requests, m.Cost), strconv.FormatInt(m.Events, 10),
				strconv.FormatInt(m.Entries, 10), strconv.FormatInt(m.Bytes, 10), f1(float64(m.Bytes)/float64(max(m.Entries, 1))),
				m.Encoding, orDash(m.Before), orDash(m.Target))
		}
	}
	if len(r.ServerCost) > 0 {
		fmt.Fprintf(w, "\n### Server time per decision (INFO commandstats), by Max and cost n\n\n")
		table(w, []string{"limit", "n", "decisions", "admitted", "server µs/decision"})
		for _, c := range r.ServerCost {
			row(w, strconv.Itoa(c.Limit), strconv.Itoa(c.Cost), strconv.Itoa(c.Decisions), strconv.Itoa(c.Admitted), f1(c.ServerUSPerD))
		}
	}
	writeQuota(w, r.QuotaMemory, r.QuotaCost)
	writeLocalQuota(w, r.LocalQuota)
	writeBusy(w, r.BusyKeys)
	writeTokens(w, r.Tokens)
	if len(r.Leases) > 0 {
		fmt.Fprintf(w, "\n### In-flight limits: leases (max %d per key, Acquire then Release)\n\n", r.Leases[0].Max)
		table(w, []string{"case", "keys", "goroutines", "hold", "acquire+release pairs/s", "acquire attempts/s", "denied",
			"pair p50 µs", "pair p99 µs", "server µs/call", "max holders at once", "over max", "goroutines through"})
		for _, l := range r.Leases {
			peak, over := "-", "-" // counted on one key only
			if l.Keys == 1 {
				peak, over = fmt.Sprintf("%d of %d", l.PeakHolders, l.Max), strconv.FormatInt(l.Overshoot, 10)
			}
			row(w, l.Case, strconv.Itoa(l.Keys), strconv.Itoa(l.Goroutines), l.Hold, f0(l.PairsPerSec), f0(l.AttemptsPerSec),
				pct(l.DeniedShare), f0(l.P50us), f0(l.P99us), f1(l.ServerUSPerCall), peak, over, fmt.Sprintf("%d of %d", l.Through, l.Goroutines))
		}
	}
	if len(r.Ceiling) > 0 {
		fmt.Fprintf(w, "\n### Ceiling: the atomic scripts driven by %s\n\n", r.Ceiling[0].Tool)
		table(w, []string{"script", "connections × pipeline", "decisions/call", "calls/s", "decisions/s", "p50 ms", "p99 ms",
			"server µs/call", "engine / ceiling"})
		for _, c := range r.Ceiling {
			ratio := "n/a"
			if c.EngineRatio > 0 {
				ratio = fmt.Sprintf("%.2f", c.EngineRatio)
			}
			row(w, c.Script, fmt.Sprintf("%d × %d", c.Connections, c.Pipeline), strconv.Itoa(c.DecisionsPerCall),
				f0(c.RequestsPerSec), f0(c.DecisionsPerSec), fmt.Sprintf("%.3f", c.P50ms), fmt.Sprintf("%.3f", c.P99ms),
				f1(c.ServerUSPerCall), ratio)
		}
	}
	if len(r.Durability) > 0 {
		fmt.Fprintf(w, "\n### Durability: batched decisions on %d keys, each setting on a server of its own\n\n", r.Durability[0].Keys)
		table(w, []string{"setting", "decisions/s", "vs no persistence", "p50 µs", "p99 µs", "decisions/call",
			"server CPU µs/decision", "client CPU µs/decision", "admitted"})
		for _, d := range r.Durability {
			row(w, d.Setting, f0(d.DecisionsPerSec), fmt.Sprintf("%.3f", d.OverNone), f0(d.P50us), f0(d.P99us), f1(d.MeanBatch),
				f1(d.ServerCPUPerOp), f1(d.ClientCPUPerOp), pct(d.AdmittedShare))
		}
	}
	if len(r.Floor) > 0 {
		writeFloor(w, r.Floor)
	}
	writeCluster(w, r.Cluster)
	for _, n := range r.Notes {
		fmt.Fprintf(w, "\n%s\n", n)
	}
}

func table(w io.Writer, header []string) {
	row(w, header...)
	seps := make([]string, len(header))
	for i := range seps {
		seps[i] = "---"
	}
	row(w, seps...)
}

func row(w io.Writer, cells ...string) { fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | ")) }

func f0(x float64) string { return fmt.Sprintf("%.0f", x) }

// orDash prints a quoted figure, or "-" where none was set.
func orDash(n int64) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}
func f1(x float64) string  { return fmt.Sprintf("%.1f", x) }
func pct(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }
