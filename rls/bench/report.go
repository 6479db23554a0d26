package main

import (
	"fmt"
	"strings"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// report is every figure of a run.
type report struct {
	cfg        config
	setup      setup
	throughput []throughput
	exactness  []exactResult // nil when not run
}

// reference is the reference server's run with n descriptors, if there is one.
func (r *report) reference(n int) (throughput, bool) {
	for _, t := range r.throughput {
		if t.Server == nameReference && t.Descriptors == n {
			return t, true
		}
	}
	return throughput{}, false
}

// markdown is the report as Markdown: the setup, the throughput table, the exactness table.
func (r *report) markdown() string {
	var b strings.Builder
	s := r.setup
	fmt.Fprintf(&b, "## strictrate-rls and the reference rate limit service\n\n")
	fmt.Fprintf(&b, "%s, %s (%s), %d CPUs, %s, %s. ", s.Started.Format("2006-01-02 15:04 UTC"), s.Valkey, s.ValkeySource, s.NumCPU, s.OS, s.GoVersion)
	if r.cfg.Reference != "" {
		v := s.ReferenceVersion
		if v == "" {
			v = "version unknown"
		}
		fmt.Fprintf(&b, "Reference: envoyproxy/ratelimit %s. ", v)
	}
	fmt.Fprintf(&b, "Each server runs as a process with the reference's environment variables on the same Valkey "+
		"(its own CACHE_KEY_PREFIX), and its own defaults otherwise%s; the servers are measured one at a time, "+
		"and the callers share the machine with them.\n\n", extraEnv(r.cfg))

	fmt.Fprintf(&b, "### Throughput\n\n")
	fmt.Fprintf(&b, "%d concurrent callers over %d gRPC connections, each with one `ShouldRateLimit` in flight "+
		"(a 1 s deadline). Each server measured for %s, in %d runs taking turns with the other server, each after %s of warm-up. "+
		"One descriptor: `user`, one of %s values, 1,000/s. Three: also `path` (%s values, 10,000/s) and `tenant` (%s values, 100,000/s). "+
		"A decision is one request answered, over all of its descriptors. "+
		"The CPU columns are µs of CPU time per decision: Valkey's (INFO cpu), the server process's, the callers' (the bench's own process); "+
		"Valkey cmds is the commands Valkey processed per decision (INFO stats), those that scripts call included. "+
		"Defaults that bear on the figures: the reference keeps 10 connections to Valkey and no pipelining window "+
		"(REDIS_POOL_SIZE, REDIS_PIPELINE_WINDOW); strictrate-rls decides concurrent requests together in one script call "+
		"(STRICTRATE_BATCHING), each request's descriptors all or nothing, and keeps a rule above 3,600 "+
		"per unit in 3,600 slots (STRICTRATE_SLOTS_PER_WINDOW: here path and tenant).\n\n",
		r.cfg.Concurrency, r.cfg.Conns, r.cfg.Duration, r.cfg.Rounds, r.cfg.Warmup,
		thousands(float64(r.cfg.Keys)), thousands(float64(max(1, r.cfg.Keys/10))), thousands(float64(max(1, r.cfg.Keys/100))))
	fmt.Fprintln(&b, "| server | descriptors | decisions/s | p50 | p99 | vs reference | Valkey CPU µs | server CPU µs | callers' CPU µs | Valkey cmds | OK | OVER_LIMIT | errors |")
	fmt.Fprintln(&b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, t := range r.throughput {
		ratio := "—"
		if ref, ok := r.reference(t.Descriptors); ok && ref.PerSecond > 0 {
			ratio = fmt.Sprintf("%.2fx", t.PerSecond/ref.PerSecond)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s | %d | %d | %d |\n",
			t.Server, t.Descriptors, thousands(t.PerSecond), latency(t.P50), latency(t.P99), ratio,
			decimal(t.perDecision(t.Used.ValkeyCPU)), decimal(t.perDecision(t.Used.ServerCPU)), decimal(t.perDecision(t.Used.ClientCPU)),
			decimal(t.commandsPerDecision()), t.OK, t.OverLimit, t.Errors)
	}

	if r.exactness != nil {
		r.exactnessMarkdown(&b)
	}
	return b.String()
}

// exactnessMarkdown writes the exactness table: one row a scenario, a column a server.
func (r *report) exactnessMarkdown(b *strings.Builder) {
	fmt.Fprintf(b, "\n### Exactness\n\n")
	fmt.Fprint(b, "| scenario | exact |")
	for _, e := range r.exactness {
		fmt.Fprintf(b, " %s |", e.Server)
	}
	fmt.Fprint(b, "\n|---|---|")
	for range r.exactness {
		fmt.Fprint(b, "---|")
	}
	fmt.Fprintln(b)
	row := func(scenario, exact string, cell func(exactResult) string) {
		fmt.Fprintf(b, "| %s | %s |", scenario, exact)
		for _, e := range r.exactness {
			fmt.Fprintf(b, " %s |", cell(e))
		}
		fmt.Fprintln(b)
	}
	if r.exactness[0].BoundaryRan {
		row("10/min: 10 requests in the last second before a minute boundary, 10 in the first second after: admitted",
			"10 + 0 = 10", func(e exactResult) string {
				return fmt.Sprintf("%d + %d = %d", e.Before, e.After, e.Before+e.After)
			})
	}
	row("a used-up 1/min descriptor beside a 3/min one: 3 requests carrying both, admitted", "0 of 3",
		func(e exactResult) string { return fmt.Sprintf("%d of 3", e.BothAdmitted) })
	row("then 3 requests on the 3/min one alone: admitted", "3 of 3",
		func(e exactResult) string { return fmt.Sprintf("%d of 3", e.ThreeLeft) })
	row("hits_addend 4, 4, 1 against 5/min", codes(pb.RateLimitResponse_OK, pb.RateLimitResponse_OVER_LIMIT, pb.RateLimitResponse_OK),
		func(e exactResult) string { return codes(e.Addend...) })
	row(fmt.Sprintf("token budget of %s/hour (record_over_limit): %d requests, each checked (hits_addend 0) and, when admitted, "+
		"reported at %d tokens after its response: admitted, tokens reported, tokens counted, admitted past the budget",
		thousands(tokenBudget), tokenRequests, tokenCost),
		tokenCells(exactTokens()), func(e exactResult) string { return tokenCells(e.Tokens) })
	if e := r.exactness[0]; e.BoundaryRan {
		fmt.Fprintf(b, "\nThe boundary scenario took %s from its first request to its last.", e.Span.Round(time.Millisecond))
		if e.Late {
			fmt.Fprint(b, " The first ten were not all answered before the boundary: its figures do not show what it is about; run again.")
		}
		fmt.Fprintln(b)
	}
}

// exactTokens is what an exact limiter that records every report does in the token budget
// scenario: it admits the checks until the reports are over the budget, and none after.
func exactTokens() tokenResult {
	var r tokenResult
	for range tokenRequests {
		if r.Reported > tokenBudget {
			continue
		}
		r.Admitted++
		r.Reported += tokenCost
	}
	r.Counted = r.Reported
	return r
}

// tokenCells is a token budget result as the table shows it: "4, 1,200, 1,200, 0".
func tokenCells(r tokenResult) string {
	return fmt.Sprintf("%d, %s, %s, %d", r.Admitted, thousands(float64(r.Reported)), thousands(float64(r.Counted)), r.PastBudget)
}

// extraEnv says which variables the command line added to the servers' environment.
func extraEnv(c config) string {
	var parts []string
	if len(c.StrictrateEnv) > 0 {
		parts = append(parts, "strictrate-rls with "+strings.Join(c.StrictrateEnv, " "))
	}
	if len(c.ReferenceEnv) > 0 {
		parts = append(parts, "the reference with "+strings.Join(c.ReferenceEnv, " "))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (but " + strings.Join(parts, "; ") + ")"
}

// codes is a list of response codes, "OK, OVER_LIMIT, ...".
func codes(cs ...pb.RateLimitResponse_Code) string {
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = c.String()
	}
	return strings.Join(parts, ", ")
}

// thousands formats a rate as an integer with thousands separators: 16,298.
func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// latency formats a latency in ms with two decimals.
func latency(d time.Duration) string {
	return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
}

// decimal formats a figure with one decimal, "—" for unknown (negative).
func decimal(v float64) string {
	if v < 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", v)
}
