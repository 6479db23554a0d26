// Command bench measures strictrate-rls side by side with the reference rate limit service
// (envoyproxy/ratelimit) on one Valkey server: decisions/s and latency under load, and what
// each admits in the cases where a fixed window and a counter that counts denials are not
// exact.
//
//	cd rls && go run ./bench                                # strictrate-rls alone
//	cd rls && go run ./bench -reference /path/to/service_cmd # side by side
//	cd rls && go run ./bench -reference ... -out bench.md   # also write the Markdown to a file
//
// It provisions a Valkey server as the tests do (valkey-server on PATH, else Docker; -addr or
// VALKEY_ADDR to use one that runs), writes one configuration directory in the reference's
// format, builds strictrate-rls, and starts each server as a process with the reference's
// environment variables, each with its own CACHE_KEY_PREFIX. Both are driven over gRPC with
// the client that Envoy's protos generate: concurrent callers over many keys, one descriptor
// a request and then three, one server at a time so that they never compete for the CPU. The
// exactness scenarios wait for the wall clock to near a minute boundary (up to a minute;
// -exactness=false skips them). Progress goes to stderr, Markdown to stdout.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// config holds the command line.
type config struct {
	// Reference is the reference server's binary (service_cmd); empty runs strictrate-rls alone.
	Reference string
	// Strictrate is a strictrate-rls binary to run; empty builds ./cmd/strictrate-rls.
	Strictrate string
	// StrictrateEnv and ReferenceEnv are more environment for strictrate-rls and for the
	// reference ("NAME=value"), after the bench's.
	StrictrateEnv []string
	ReferenceEnv  []string
	// Addr is a Valkey server to use as it is; empty provisions one.
	Addr string
	// Duration is the measured time of each server in each throughput scenario, split into
	// Rounds runs; Warmup runs before each run, unmeasured.
	Duration time.Duration
	Rounds   int
	Warmup   time.Duration
	// Concurrency is the number of callers, each with one request in flight.
	Concurrency int
	// Conns is the number of gRPC connections the callers share, per server.
	Conns int
	// Keys is the number of distinct user values; paths and tenants are fewer (descriptorValues).
	Keys int
	// Exactness runs the exactness scenarios; Boundary, within them, the minute-boundary one,
	// which waits for the wall clock.
	Exactness bool
	Boundary  bool
	// Out is a file to write the Markdown to, besides stdout.
	Out string
	// Profile is a directory to write CPU profiles of strictrate-rls to, taken from its debug
	// port over its first run of each scenario: strictrate-rls-1.pprof (one descriptor a
	// request) and strictrate-rls-3.pprof.
	Profile string
}

// envList is a repeatable flag of NAME=value pairs.
type envList []string

func (e *envList) String() string     { return fmt.Sprint([]string(*e)) }
func (e *envList) Set(v string) error { *e = append(*e, v); return nil }

func main() {
	cfg := config{Boundary: true}
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	fs.StringVar(&cfg.Reference, "reference", "", "the reference server's binary (envoyproxy/ratelimit's service_cmd); empty: strictrate-rls alone")
	fs.StringVar(&cfg.Strictrate, "strictrate", "", "a strictrate-rls binary (default: build ./cmd/strictrate-rls)")
	fs.Var((*envList)(&cfg.StrictrateEnv), "strictrate-env", "NAME=value added to strictrate-rls's environment (repeatable), e.g. STRICTRATE_BATCHING=false")
	fs.Var((*envList)(&cfg.ReferenceEnv), "reference-env", "NAME=value added to the reference's environment (repeatable), e.g. REDIS_PIPELINE_WINDOW=150us")
	fs.StringVar(&cfg.Addr, "addr", "", "Valkey address host:port to use as it is (default: $VALKEY_ADDR, else a throwaway server)")
	fs.DurationVar(&cfg.Duration, "duration", 10*time.Second, "measured time of each server in each throughput scenario")
	fs.IntVar(&cfg.Rounds, "rounds", 5, "runs the measured time is split into, the servers taking turns")
	fs.DurationVar(&cfg.Warmup, "warmup", time.Second, "unmeasured load before each run")
	fs.IntVar(&cfg.Concurrency, "concurrency", 64, "concurrent callers, each with one request in flight")
	fs.IntVar(&cfg.Conns, "conns", 4, "gRPC connections the callers share, per server")
	fs.IntVar(&cfg.Keys, "keys", 10_000, "distinct user values")
	fs.BoolVar(&cfg.Exactness, "exactness", true, "run the exactness scenarios (waits up to a minute for a minute boundary)")
	fs.StringVar(&cfg.Out, "out", "", "also write the Markdown to this file")
	fs.StringVar(&cfg.Profile, "profile", "", "write CPU profiles of strictrate-rls's first run of each scenario into this directory (strictrate-rls-N.pprof)")
	_ = fs.Parse(os.Args[1:])

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		stop()
		os.Exit(1)
	}
}

// run is the command: it provisions Valkey, starts the servers, runs every scenario, and
// writes the report's Markdown to out (and to cfg.Out). Progress goes to progress. Every
// process it starts is stopped before it returns, on an error or a cancelled ctx too.
func run(ctx context.Context, cfg config, out, progress io.Writer) error {
	rep, err := measure(ctx, cfg, progress)
	if err != nil {
		return err
	}
	md := rep.markdown()
	if _, err := io.WriteString(out, md); err != nil {
		return err
	}
	if cfg.Out != "" {
		if err := os.WriteFile(cfg.Out, []byte(md), 0o644); err != nil {
			return fmt.Errorf("bench: write %s: %w", cfg.Out, err)
		}
		fmt.Fprintf(progress, "wrote %s\n", cfg.Out)
	}
	return nil
}

// validate refuses a command line that cannot run.
func (c config) validate() error {
	switch {
	case c.Duration <= 0 || c.Warmup < 0:
		return fmt.Errorf("bench: -duration must be positive and -warmup not negative")
	case c.Concurrency < 1 || c.Conns < 1 || c.Keys < 1 || c.Rounds < 1:
		return fmt.Errorf("bench: -concurrency, -conns, -keys and -rounds must be at least 1")
	case c.Duration/time.Duration(c.Rounds) < 10*time.Millisecond:
		return fmt.Errorf("bench: -duration / -rounds must be at least 10ms")
	}
	return nil
}

// measure provisions everything, runs the scenarios and returns their figures.
func measure(ctx context.Context, cfg config, progress io.Writer) (*report, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	work, err := os.MkdirTemp("", "strictrate-rls-bench-")
	if err != nil {
		return nil, fmt.Errorf("bench: temp dir: %w", err)
	}
	defer os.RemoveAll(work)
	if cfg.Profile != "" {
		if err := os.MkdirAll(cfg.Profile, 0o755); err != nil {
			return nil, fmt.Errorf("bench: -profile: %w", err)
		}
	}

	vk, err := valkeytest.Start(ctx, valkeytest.Addr(cfg.Addr))
	if err != nil {
		return nil, fmt.Errorf("bench: valkey: %w", err)
	}
	defer vk.Close()
	fmt.Fprintf(progress, "valkey at %s (%s)\n", vk.Addr, vk.Source)

	b, err := newBench(ctx, cfg, vk, work, progress)
	if err != nil {
		return nil, err
	}
	defer b.close()
	return b.runAll(ctx)
}
