// Command peers compares strictrate with two well-known Go rate limiters for Redis,
// go-redis/redis_rate (GCRA) and ulule/limiter (a fixed-window counter), on one throwaway
// Valkey server:
//
//	cd bench/peers && go run .
//	go run . -duration 10s -json peers.json
//
// Every row runs the same load, one after the other on the same server, which is flushed
// (FLUSHALL) before each row: -goroutines goroutines take decisions back to back on keys drawn
// at random out of -keys, each key limited to 100 per second, so that nearly every request is
// admitted and every row does the same writes. After a warm-up (a fifth of -duration, at most a
// second) each row is measured for -duration: decisions per second, the server's CPU time per
// decision (INFO cpu, used_cpu_sys + used_cpu_user) and how much of it went to executing
// commands and scripts (INFO commandstats), this process's CPU time per decision (getrusage),
// and how many times strictrate's batched engine's decisions per second the row's is.
//
// strictrate runs as the main bench (../) runs it: four valkey-go clients, the goroutines
// spread over them, the engine with batching on and with batching off, and package pipelined.
// The peers share one go-redis client whose pool holds a connection per goroutine.
//
// The server is always one of its own: valkey-server (or redis-server) from PATH on a free
// loopback port, else a Docker container, as the tests get one; VALKEY_ADDR is ignored,
// since every row begins with FLUSHALL. The Markdown table goes to stdout, progress to stderr.
// This is a separate module so that the main module does not depend on go-redis.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/bench/internal/cputime"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// benchRate is the limit of every key in the measured rows: high enough that the load admits
// nearly everything.
var benchRate = rate{max: 100, window: time.Second}

// config holds the command line.
type config struct {
	Duration   time.Duration `json:"duration_per_row_ns"`
	Goroutines int           `json:"goroutines"`
	Keys       int           `json:"keys"`
	JSONPath   string        `json:"-"`
}

// main parses the flags and runs the comparison; an interrupt stops it.
func main() {
	var cfg config
	fs := flag.NewFlagSet("peers", flag.ExitOnError)
	fs.DurationVar(&cfg.Duration, "duration", 5*time.Second, "measured time per row (after a warm-up of a fifth of it, at most 1s)")
	fs.IntVar(&cfg.Goroutines, "goroutines", 64, "goroutines taking decisions at once")
	fs.IntVar(&cfg.Keys, "keys", 10_000, "keys the goroutines draw from at random")
	fs.StringVar(&cfg.JSONPath, "json", "", "also write the settings and every figure to this file")
	_ = fs.Parse(os.Args[1:])

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "peers:", err)
		os.Exit(1)
	}
}

// validate checks the command line.
func (c config) validate() error {
	switch {
	case c.Duration <= 0:
		return errors.New("-duration must be positive")
	case c.Goroutines < 1 || c.Keys < 1:
		return errors.New("-goroutines and -keys must be at least 1")
	}
	return nil
}

// Report is everything one run measured, as -json writes it.
type Report struct {
	Settings Settings `json:"settings"`
	Rows     []Row    `json:"rows"`
}

// Settings records what the run ran with and on.
type Settings struct {
	Config        config            `json:"config"`
	LimitMax      int               `json:"limit_max_per_key"`
	LimitWindowNS time.Duration     `json:"limit_window_ns"`
	WarmUpNS      time.Duration     `json:"warm_up_per_row_ns"`
	ServerVersion string            `json:"server_version"`
	ServerSource  string            `json:"server_source"`
	GoVersion     string            `json:"go_version"`
	GOMAXPROCS    int               `json:"gomaxprocs"`
	NumCPU        int               `json:"num_cpu"`
	OS            string            `json:"os_arch"`
	Modules       map[string]string `json:"module_versions,omitempty"`
	Started       string            `json:"started"`
}

// Row is one limiter's measurement.
type Row struct {
	Limiter     string `json:"limiter"`
	Algorithm   string `json:"algorithm"`
	Connections string `json:"connections"`
	Decisions   int64  `json:"decisions"`
	Admitted    int64  `json:"admitted"`
	// Seconds is the measured time: from the start to the return of the last call.
	Seconds         float64 `json:"seconds"`
	DecisionsPerSec float64 `json:"decisions_per_sec"`
	AdmittedShare   float64 `json:"admitted_fraction"`
	// ServerCPUPerOp is the server's user plus system CPU time over the row, per decision.
	ServerCPUPerOp float64 `json:"server_cpu_us_per_decision"`
	// ServerCmdPerOp is the time the server's commands took to execute (INFO commandstats)
	// over the row, per decision: the part of ServerCPUPerOp spent in commands and scripts,
	// the rest going to the network (reads, parsing, replies, the event loop).
	ServerCmdPerOp float64 `json:"server_command_us_per_decision"`
	// ServerCores is the server's CPU time over the row's wall time: cores kept busy.
	ServerCores float64 `json:"server_cpu_cores_busy"`
	// ClientCPUPerOp is this process's user plus system CPU time over the row, per decision.
	ClientCPUPerOp float64 `json:"client_cpu_us_per_decision"`
	// BatchedOverThis is strictrate batched's decisions per second over this row's.
	BatchedOverThis float64 `json:"strictrate_batched_over_this"`
}

// run provisions the server, measures every contender and prints the table (and the JSON
// file when asked).
func run(ctx context.Context, cfg config, out, progress io.Writer) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	// A server of our own even when VALKEY_ADDR is set: every row flushes it.
	srv, err := valkeytest.Start(ctx, valkeytest.OwnServer())
	if err != nil {
		return fmt.Errorf("start a server: %w", err)
	}
	defer srv.Close()
	admin, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}})
	if err != nil {
		return fmt.Errorf("connect to %s: %w", srv.Addr, err)
	}
	defer admin.Close()

	report := Report{Settings: settings(ctx, cfg, srv, admin)}
	began := time.Now()
	fmt.Fprintf(progress, "%s (%s) at %s; %d goroutines, %d keys, %d per %s per key; %s per row\n",
		report.Settings.ServerVersion, srv.Source, srv.Addr, cfg.Goroutines, cfg.Keys, benchRate.max, benchRate.window, cfg.Duration)
	for _, c := range contenders {
		row, err := measure(ctx, cfg, srv.Addr, admin, c)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		fmt.Fprintf(progress, "[%6.1fs] %-24s %9.0f decisions/s, admitted %.4f, CPU per decision: server %.1fµs (%.1fµs in commands), client %.1fµs\n",
			time.Since(began).Seconds(), row.Limiter, row.DecisionsPerSec, row.AdmittedShare,
			row.ServerCPUPerOp, row.ServerCmdPerOp, row.ClientCPUPerOp)
		report.Rows = append(report.Rows, row)
	}
	compare(report.Rows)
	writeMarkdown(out, report)
	if cfg.JSONPath != "" {
		data, err := json.MarshalIndent(report, "", "  ")
		if err != nil {
			return fmt.Errorf("encode the report: %w", err)
		}
		if err := os.WriteFile(cfg.JSONPath, append(data, '\n'), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", cfg.JSONPath, err)
		}
		fmt.Fprintf(progress, "wrote %s\n", cfg.JSONPath)
	}
	return nil
}

// warmUp is how long a row runs before it is measured: connections, script caches and the
// keys' first entries are then in place.
func warmUp(d time.Duration) time.Duration { return min(d/5, time.Second) }

// measure runs one contender on a flushed server: a warm-up, then cfg.Duration measured.
func measure(ctx context.Context, cfg config, addr string, admin valkey.Client, c contender) (Row, error) {
	if err := admin.Do(ctx, admin.B().Flushall().Build()).Error(); err != nil {
		return Row{}, fmt.Errorf("FLUSHALL: %w", err)
	}
	ls, closeLimiters, err := c.connect(ctx, addr, benchRate, cfg.Goroutines)
	if err != nil {
		return Row{}, fmt.Errorf("connect: %w", err)
	}
	defer closeLimiters()
	keys := make([]string, cfg.Keys)
	for i := range keys {
		keys[i] = "peers:" + strconv.Itoa(i)
	}
	if _, err := drive(ctx, cfg.Goroutines, warmUp(cfg.Duration), keys, ls); err != nil {
		return Row{}, fmt.Errorf("warm-up: %w", err)
	}

	runtime.GC()
	server0, err := readServer(ctx, admin)
	if err != nil {
		return Row{}, err
	}
	client0 := cputime.Process()
	began := time.Now()
	t, err := drive(ctx, cfg.Goroutines, cfg.Duration, keys, ls)
	if err != nil {
		return Row{}, err
	}
	elapsed := time.Since(began)
	client1 := cputime.Process()
	server1, err := readServer(ctx, admin)
	if err != nil {
		return Row{}, err
	}
	if t.decisions == 0 {
		return Row{}, errors.New("no decision was taken")
	}
	n := float64(t.decisions)
	return Row{
		Limiter: c.name, Algorithm: c.algorithm, Connections: c.clients(cfg.Goroutines),
		Decisions: t.decisions, Admitted: t.admitted,
		Seconds:         elapsed.Seconds(),
		DecisionsPerSec: n / elapsed.Seconds(),
		AdmittedShare:   float64(t.admitted) / n,
		ServerCPUPerOp:  (server1.cpuSeconds - server0.cpuSeconds) * 1e6 / n,
		ServerCmdPerOp:  (server1.commandUsec - server0.commandUsec) / n,
		ServerCores:     (server1.cpuSeconds - server0.cpuSeconds) / elapsed.Seconds(),
		ClientCPUPerOp:  float64(client1-client0) / float64(time.Microsecond) / n,
	}, nil
}

// tally counts one goroutine's decisions; the padding keeps two goroutines' counts off one
// cache line.
type tally struct {
	decisions, admitted int64
	_                   [48]byte
}

// drive runs goroutines goroutines for d, each taking decisions back to back on keys drawn at
// random, goroutine g through ls[g % len(ls)], and returns their sum. The goroutines stop at
// a flag, not by cancelling their calls: every call in flight at the end completes, and is
// counted. The first error stops them all and is returned.
func drive(ctx context.Context, goroutines int, d time.Duration, keys []string, ls []limiter) (tally, error) {
	var stop atomic.Bool
	timer := time.AfterFunc(d, func() { stop.Store(true) })
	defer timer.Stop()
	tallies := make([]tally, goroutines)
	errs := make([]error, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, rng, t := ls[g%len(ls)], rand.New(rand.NewPCG(uint64(g), 0x9e3779b97f4a7c15)), &tallies[g]
			for !stop.Load() {
				if err := ctx.Err(); err != nil {
					errs[g] = err
					return
				}
				ok, err := l.allow(ctx, keys[rng.IntN(len(keys))])
				if err != nil {
					errs[g] = err
					stop.Store(true)
					return
				}
				t.decisions++
				if ok {
					t.admitted++
				}
			}
		}()
	}
	wg.Wait()
	var sum tally
	for _, t := range tallies {
		sum.decisions += t.decisions
		sum.admitted += t.admitted
	}
	return sum, errors.Join(errs...)
}

// serverReading is what the server says it has spent so far, to diff around a measurement.
type serverReading struct {
	// cpuSeconds is the process's CPU time: INFO cpu used_cpu_sys + used_cpu_user.
	cpuSeconds float64
	// commandUsec is the time its commands took to execute (INFO commandstats, every
	// command's usec but INFO's own), in microseconds: the part of cpuSeconds spent in
	// commands and scripts rather than in reading, parsing and answering.
	commandUsec float64
}

// readServer reads INFO cpu and INFO commandstats.
func readServer(ctx context.Context, admin valkey.Client) (serverReading, error) {
	var r serverReading
	info, err := valkeytest.ReadInfo(ctx, admin, "cpu")
	if err != nil {
		return r, fmt.Errorf("INFO cpu: %w", err)
	}
	if r.cpuSeconds, err = info.CPUSeconds(); err != nil {
		return r, err
	}
	stats, err := valkeytest.ReadInfo(ctx, admin, "commandstats")
	if err != nil {
		return r, fmt.Errorf("INFO commandstats: %w", err)
	}
	for name, st := range stats.CommandStats() {
		if name != "info" {
			r.commandUsec += st.Usec
		}
	}
	return r, nil
}

// compare fills every row's BatchedOverThis from the strictrate batched row's decisions/s.
func compare(rows []Row) {
	var batched float64
	for _, r := range rows {
		if r.Limiter == batchedName {
			batched = r.DecisionsPerSec
		}
	}
	for i := range rows {
		if batched > 0 && rows[i].DecisionsPerSec > 0 {
			rows[i].BatchedOverThis = batched / rows[i].DecisionsPerSec
		}
	}
}

// settings records the run's configuration and environment; what cannot be read is
// "unknown".
func settings(ctx context.Context, cfg config, srv *valkeytest.Server, admin valkey.Client) Settings {
	s := Settings{
		Config: cfg, LimitMax: benchRate.max, LimitWindowNS: benchRate.window, WarmUpNS: warmUp(cfg.Duration),
		ServerVersion: "unknown", ServerSource: srv.Source,
		GoVersion: runtime.Version(), GOMAXPROCS: runtime.GOMAXPROCS(0), NumCPU: runtime.NumCPU(),
		OS: runtime.GOOS + "/" + runtime.GOARCH, Started: time.Now().UTC().Format(time.RFC3339),
	}
	if info, err := valkeytest.ReadInfo(ctx, admin, "server"); err == nil {
		for _, field := range []string{"valkey_version", "redis_version"} {
			if v := info[field]; v != "" {
				s.ServerVersion = "Valkey " + v
				break
			}
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		s.Modules = map[string]string{}
		for _, m := range bi.Deps {
			switch m.Path {
			case "github.com/go-redis/redis_rate/v10", "github.com/ulule/limiter/v3",
				"github.com/redis/go-redis/v9", "github.com/valkey-io/valkey-go":
				s.Modules[m.Path] = m.Version
			}
		}
	}
	return s
}

// writeMarkdown prints the settings line and the table.
func writeMarkdown(w io.Writer, r Report) {
	s := r.Settings
	fmt.Fprintf(w, "%s, %d goroutines, %d keys at random, limit %d per %s per key, %s per row after a %s warm-up; "+
		"%s, GOMAXPROCS %d, %d CPUs (server and client on this machine).\n\n",
		s.ServerVersion, s.Config.Goroutines, s.Config.Keys, s.LimitMax, s.LimitWindowNS, s.Config.Duration, s.WarmUpNS,
		s.GoVersion, s.GOMAXPROCS, s.NumCPU)
	fmt.Fprintln(w, "| limiter | algorithm | connections | decisions/s | admitted | server CPU µs/decision | of which in commands | client CPU µs/decision | strictrate batched ÷ row |")
	fmt.Fprintln(w, "|---|---|---|--:|--:|--:|--:|--:|--:|")
	for _, row := range r.Rows {
		fmt.Fprintf(w, "| %s | %s | %s | %.0f | %.2f%% | %.2f | %.2f | %.2f | %.2f× |\n",
			row.Limiter, row.Algorithm, row.Connections, row.DecisionsPerSec, 100*row.AdmittedShare,
			row.ServerCPUPerOp, row.ServerCmdPerOp, row.ClientCPUPerOp, row.BatchedOverThis)
	}
	if len(s.Modules) > 0 {
		var mods []string
		for _, path := range []string{"github.com/valkey-io/valkey-go", "github.com/redis/go-redis/v9",
			"github.com/go-redis/redis_rate/v10", "github.com/ulule/limiter/v3"} {
			if v, ok := s.Modules[path]; ok {
				mods = append(mods, path+" "+v)
			}
		}
		fmt.Fprintf(w, "\nModules: %s.\n", strings.Join(mods, ", "))
	}
}
