package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/loader"
	"github.com/strictrate/strictrate/scripts"
)

// serverStats is a reading of INFO commandstats and INFO cpu, to diff around a measurement.
type serverStats struct {
	usecByCommand  map[string]float64 // total microseconds spent per command
	callsByCommand map[string]int64   // calls per command
	cpuSeconds     float64            // used_cpu_user + used_cpu_sys
}

func (s serverStats) calls(commands []string) int64 {
	var total int64
	for _, c := range commands {
		total += s.callsByCommand[c]
	}
	return total
}

func (s serverStats) usec(commands []string) float64 {
	var total float64
	for _, c := range commands {
		total += s.usecByCommand[c]
	}
	return total
}

func readServerStats(ctx context.Context, c valkey.Client) (serverStats, error) {
	info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		return serverStats{}, fmt.Errorf("INFO commandstats: %w", err)
	}
	cpu, err := c.Do(ctx, c.B().Info().Section("cpu").Build()).ToString()
	if err != nil {
		return serverStats{}, fmt.Errorf("INFO cpu: %w", err)
	}
	return parseServerStats(info, cpu), nil
}

// parseServerStats reads the texts of INFO commandstats ("cmdstat_evalsha:calls=10,usec=123,...")
// and INFO cpu ("used_cpu_sys:1.5").
func parseServerStats(commandstats, cpu string) serverStats {
	s := serverStats{usecByCommand: map[string]float64{}, callsByCommand: map[string]int64{}}
	for name, st := range valkeytest.ParseInfo(commandstats).CommandStats() {
		s.usecByCommand[name] = st.Usec
		s.callsByCommand[name] = st.Calls
	}
	s.cpuSeconds, _ = valkeytest.ParseInfo(cpu).CPUSeconds() // 0 where INFO cpu says nothing
	return s
}

// decideSHA1 is the digest EVALSHA calls the atomic decision script by.
func decideSHA1() string { return loader.New("decide", scripts.Source("decide")).SHA1() }

// decideBatchSHA1 is the digest of the batch script, which takes several decisions per call.
func decideBatchSHA1() string {
	return loader.New("decide_batch", scripts.Source("decide_batch")).SHA1()
}

func splitHostPort(addr string) (string, string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", "", fmt.Errorf("server address %q: %w", addr, err)
	}
	return host, port, nil
}

// toolResult is one line of valkey-benchmark --csv output.
type toolResult struct {
	rps, p50ms, p99ms float64
}

func runBenchmarkTool(ctx context.Context, tool string, args []string) (toolResult, error) {
	cmd := exec.CommandContext(ctx, tool, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return toolResult{}, fmt.Errorf("%s: %w: %s", tool, err, strings.TrimSpace(stderr.String()))
	}
	return parseToolCSV(out)
}

// parseToolCSV reads the header and the one result line of valkey-benchmark --csv.
func parseToolCSV(out []byte) (toolResult, error) {
	records, err := csv.NewReader(bytes.NewReader(out)).ReadAll()
	if err != nil {
		return toolResult{}, fmt.Errorf("benchmark tool output: %w", err)
	}
	if len(records) < 2 {
		return toolResult{}, fmt.Errorf("benchmark tool printed no result: %q", out)
	}
	col := map[string]int{}
	for i, name := range records[0] {
		col[name] = i
	}
	row := records[len(records)-1]
	get := func(name string) (float64, error) {
		i, ok := col[name]
		if !ok || i >= len(row) {
			return 0, fmt.Errorf("benchmark tool output has no %q column", name)
		}
		return strconv.ParseFloat(row[i], 64)
	}
	var r toolResult
	if r.rps, err = get("rps"); err != nil {
		return r, err
	}
	if r.p50ms, err = get("p50_latency_ms"); err != nil {
		return r, err
	}
	r.p99ms, err = get("p99_latency_ms")
	return r, err
}
