// Command bench compares strictrate's engine with the pipelined design (package pipelined) side by
// side on one Valkey server, measures how close the engine gets to the server's own ceiling, and
// what in-flight limits (leases) cost and whether they hold, and where the server's time per
// decision goes (the floor scenario: the engine's scripts against bare scripts doing the same
// calls).
//
//	go run ./bench                  # every scenario, engine and pipelined, a throwaway server
//	go run ./bench -scenario memory # one scenario
//	go run ./bench -scenario leases # acquire+release pairs/s and the holders-at-once audit
//	go run ./bench -scenario floor  # server µs per call: bare scripts, the textbook one, the engine's
//	go run ./bench -scenario cluster # a 3-primary cluster of its own: batched against unbatched
//	go run ./bench -scenario quota  # a million per 30 days by the hour, exact, calendar months: bytes per key, server µs per decision
//	go run ./bench -scenario localquota # a hot key with and without local quota, and through a paused server
//	go run ./bench -scenario busykeys # server µs per decision on logs of 5 to 100,000 live entries: admissions and denials
//	go run ./bench -scenario busykeys -busy-sizes 5,1000 # the same, on these log sizes only
//	go run ./bench -scenario tokens # a token budget spent through reserve, settle and charge, audited
//	go run ./bench -json out.json   # also every figure, with units and settings, as JSON
//	go run ./bench -charts docs/charts # the SVG charts of exactness, throughput and latency there
//
// Without -addr (or VALKEY_ADDR) it provisions a server as the tests do: valkey-server on
// PATH on a free loopback port, else Docker. Progress goes to stderr, a line per scenario
// with the time left; Markdown tables to stdout, then a summary: each headline figure beside
// its target and a verdict, exactness first, the README's table from the run, and where the
// charts went (bench-charts/ unless -charts says otherwise). The exit status is 1 when
// exactness did not hold: an admission over a limit, or a false denial, where the design
// promises none.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// config holds the command line.
type config struct {
	Addr        string        `json:"-"`
	Duration    time.Duration `json:"duration_per_mode_ns"`
	Concurrency int           `json:"concurrency_goroutines"`
	Clients     int           `json:"valkey_clients"`
	Keys        int           `json:"keys"`
	Limit       int           `json:"limit_max"`
	Window      time.Duration `json:"window_ns"`
	FlushDelay  time.Duration `json:"max_flush_delay_ns"`
	// QuotaRequests is the quota scenario's Max per 30 days and the requests spread over them
	// (0: defaultQuotaRequests).
	QuotaRequests int `json:"quota_requests,omitempty"`
	// BusySizes are the busykeys scenario's log sizes, -busy-sizes (nil: defaultBusySizes).
	BusySizes []int  `json:"busy_sizes_live_entries,omitempty"`
	Scenario  string `json:"scenario"`
	JSONPath  string `json:"-"`
	ChartsDir string `json:"-"`
}

var scenarios = []string{"exactness", "throughput", "memory", "servercost", "leases", "durability", "ceiling", "floor", "cluster", "quota", "localquota", "busykeys", "tokens"}

func main() {
	var cfg config
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	fs.StringVar(&cfg.Addr, "addr", os.Getenv(valkeytest.EnvAddr), "Valkey address host:port (default: $VALKEY_ADDR, else a throwaway server)")
	fs.DurationVar(&cfg.Duration, "duration", 5*time.Second, "measured time per scenario and mode")
	fs.IntVar(&cfg.Concurrency, "concurrency", 64, "goroutines issuing requests")
	fs.IntVar(&cfg.Clients, "clients", 4, "valkey-go clients the goroutines are spread over")
	fs.IntVar(&cfg.Keys, "keys", 10_000, "keys in the throughput and ceiling scenarios")
	fs.IntVar(&cfg.Limit, "limit", 100, "the limit's Max")
	fs.DurationVar(&cfg.Window, "window", time.Second, "the limit's Window")
	fs.DurationVar(&cfg.FlushDelay, "flush-delay", 0, "valkey-go MaxFlushDelay: wait up to this long to batch writes (fewer syscalls, more latency)")
	fs.IntVar(&cfg.QuotaRequests, "quota-requests", defaultQuotaRequests, "the quota scenario's requests, spread over 30 days, and its limit's Max")
	fs.Func("busy-sizes", "the busykeys scenario's log sizes, live entries, comma-separated (default "+joinInts(defaultBusySizes)+")", func(s string) error {
		sizes, err := parseSizes(s)
		cfg.BusySizes = sizes
		return err
	})
	fs.StringVar(&cfg.Scenario, "scenario", "all", "one of "+strings.Join(scenarios, ", ")+", or all")
	fs.StringVar(&cfg.JSONPath, "json", "", "also write every figure with its units to this file")
	fs.StringVar(&cfg.ChartsDir, "charts", defaultChartsDir, `draw SVG charts of the run (exactness, throughput, latency) into this directory ("" for none)`)
	_ = fs.Parse(os.Args[1:])

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// defaultChartsDir is where a run draws its charts unless told otherwise: a folder of the
// working directory (.gitignore keeps it out of the repository).
const defaultChartsDir = "bench-charts"

func run(ctx context.Context, cfg config, out, progress io.Writer) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	// The server at -addr when given (checked to answer, used as is), else one like the tests'.
	srv, err := valkeytest.Start(ctx, valkeytest.Addr(cfg.Addr))
	if err != nil {
		return err
	}
	defer srv.Close()

	b, err := newBencher(ctx, cfg, srv, progress)
	if err != nil {
		return err
	}
	defer b.close()
	report, err := b.runAll(ctx)
	if err != nil {
		return err
	}
	writeMarkdown(out, report)
	var charts []string
	if cfg.ChartsDir != "" {
		if charts, err = writeCharts(cfg.ChartsDir, report); err != nil {
			return err
		}
		if len(charts) == 0 {
			fmt.Fprintln(progress, "charts: nothing to draw, the exactness and throughput scenarios did not run")
		}
		for _, f := range charts {
			fmt.Fprintf(progress, "wrote %s\n", f)
		}
	}
	headlines := summarize(report)
	writeSummary(out, report, headlines, charts)
	if cfg.JSONPath != "" {
		data, err := json.MarshalIndent(report, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(cfg.JSONPath, append(data, '\n'), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", cfg.JSONPath, err)
		}
		fmt.Fprintf(progress, "wrote %s\n", cfg.JSONPath)
	}
	// The exit status says whether exactness held: a run that admitted over a limit, or denied
	// with room, where the design promises neither, fails.
	return exactnessHeld(headlines)
}

func (c config) validate() error {
	switch {
	case c.Duration <= 0:
		return fmt.Errorf("-duration must be positive")
	case c.Concurrency < 1 || c.Clients < 1 || c.Keys < 1 || c.Limit < 1:
		return fmt.Errorf("-concurrency, -clients, -keys and -limit must be at least 1")
	case c.Window < time.Millisecond:
		return fmt.Errorf("-window must be at least 1ms")
	case c.QuotaRequests != 0 && (c.QuotaRequests < minQuotaRequests || c.QuotaRequests > engine.MaxEvents):
		return fmt.Errorf("-quota-requests must be %d to %d", minQuotaRequests, engine.MaxEvents)
	}
	for i, n := range c.BusySizes {
		if n < 1 || n > maxBusySize || slices.Contains(c.BusySizes[:i], n) {
			return fmt.Errorf("-busy-sizes %s: want distinct sizes of 1 to %s", joinInts(c.BusySizes), commas(maxBusySize))
		}
	}
	if c.Scenario == "all" {
		return nil
	}
	for _, s := range scenarios {
		if s == c.Scenario {
			return nil
		}
	}
	return fmt.Errorf("-scenario %q: want one of %s, or all", c.Scenario, strings.Join(scenarios, ", "))
}

// Settings records what the run ran on.
type Settings struct {
	Config        config `json:"config"`
	ServerVersion string `json:"server_version"`
	ServerSource  string `json:"server_source"`
	GoVersion     string `json:"go_version"`
	GOMAXPROCS    int    `json:"gomaxprocs"`
	NumCPU        int    `json:"num_cpu"`
	OS            string `json:"os_arch"`
	Started       string `json:"started"`
}

func currentSettings(ctx context.Context, cfg config, srv *valkeytest.Server, c valkey.Client) Settings {
	return Settings{
		Config:        cfg,
		ServerVersion: valkeytest.ServerVersion(ctx, c),
		ServerSource:  srv.Source,
		GoVersion:     runtime.Version(),
		GOMAXPROCS:    runtime.GOMAXPROCS(0),
		NumCPU:        runtime.NumCPU(),
		OS:            runtime.GOOS + "/" + runtime.GOARCH,
		Started:       time.Now().UTC().Format(time.RFC3339),
	}
}

// parseSizes reads a comma-separated list of integers: "5,32,1000".
func parseSizes(s string) ([]int, error) {
	var sizes []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("%q: want integers separated by commas", s)
		}
		sizes = append(sizes, n)
	}
	return sizes, nil
}

// joinInts writes xs as parseSizes reads them, for -busy-sizes' help and errors.
func joinInts(xs []int) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ",")
}
