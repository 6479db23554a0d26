package main

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"embed"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// The configuration's domains: one for the throughput runs, one for the exactness scenarios.
const (
	benchDomain = "bench"
	exactDomain = "exact"
)

// runtimeSubdirectory is RUNTIME_SUBDIRECTORY: the files are in
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config/.
const runtimeSubdirectory = "ratelimit"

// configFiles are the configuration, in the reference's format (config/*.yaml). The
// throughput rules are high enough that nearly every request is admitted at the rates the
// bench reaches (a user's share of 20,000 requests/s over 10,000 users is 2/s), so that both
// servers do the whole work of an admission. The service's Go benchmark
// (BenchmarkShouldRateLimit) reads the same bench.yaml. The reference has no
// record_over_limit (exact.yaml's tokens rule), and refuses a file that says it: it is given
// the files without that line, and counts every hit, denied ones included, anyway.
//
//go:embed config/*.yaml
var configFiles embed.FS

// bench holds what the scenarios run on: the Valkey server, a client to read its INFO, and
// the rate limit servers, strictrate-rls first.
type bench struct {
	cfg      config
	vk       *valkeytest.Server
	info     valkey.Client
	servers  []*server
	run      string // this run's id, in every key it writes
	progress io.Writer
	setup    setup
}

// setup records what the run ran on, for the report.
type setup struct {
	Valkey           string
	ValkeySource     string
	ReferenceVersion string
	GoVersion        string
	NumCPU           int
	OS               string
	Started          time.Time
}

// newBench writes the configuration under work, builds strictrate-rls unless given, and
// starts the servers. The caller must close it, on an error too: newBench closes what it
// started before it fails.
func newBench(ctx context.Context, cfg config, vk *valkeytest.Server, work string, progress io.Writer) (*bench, error) {
	b := &bench{cfg: cfg, vk: vk, progress: progress, run: strconv.FormatInt(time.Now().UnixNano(), 36)}
	if err := b.start(ctx, work); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

// start is newBench's work: what it starts, b.close stops.
func (b *bench) start(ctx context.Context, work string) (err error) {
	cfg, progress := b.cfg, b.progress
	b.info, err = valkey.NewClient(valkey.ClientOption{InitAddress: []string{b.vk.Addr}, DisableCache: true})
	if err != nil {
		return fmt.Errorf("bench: valkey client: %w", err)
	}
	b.setup = setup{Valkey: valkeytest.ServerVersion(ctx, b.info), ValkeySource: b.vk.Source, GoVersion: runtime.Version(),
		NumCPU: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Started: time.Now().UTC()}

	bin := cfg.Strictrate
	if bin == "" {
		fmt.Fprintln(progress, "building strictrate-rls")
		if bin, err = buildStrictrate(ctx, work); err != nil {
			return err
		}
	}
	specs := []processSpec{{name: nameStrictrate, bin: bin, extraEnv: cfg.StrictrateEnv}}
	if cfg.Reference != "" {
		specs = append(specs, processSpec{name: nameReference, bin: cfg.Reference, extraEnv: cfg.ReferenceEnv})
		b.setup.ReferenceVersion = moduleVersion(cfg.Reference, "github.com/envoyproxy/ratelimit")
	}
	for _, spec := range specs {
		root := filepath.Join(work, "runtime-"+spec.name)
		if err := writeConfig(filepath.Join(root, runtimeSubdirectory, "config"), spec.name == nameReference); err != nil {
			return err
		}
		spec.valkey, spec.configDir, spec.logDir, spec.conns = b.vk.Addr, root, work, cfg.Conns
		spec.prefix = "rlsbench_" + b.run + "_" + spec.name + "_"
		fmt.Fprintf(progress, "starting %s\n", spec.name)
		s, err := startServer(ctx, spec)
		if err != nil {
			return err
		}
		b.servers = append(b.servers, s)
	}
	return nil
}

// close stops the servers and closes the Valkey client.
func (b *bench) close() {
	for _, s := range b.servers {
		s.stop()
	}
	b.servers = nil
	if b.info != nil {
		b.info.Close()
	}
}

// runAll runs the throughput runs, one and then three descriptors a request, and then the
// exactness scenarios. Each server's measured time is split into cfg.Rounds runs, and the
// servers take turns, one at a time, the first one changing each round: a load on the
// machine that comes and goes falls on both alike.
func (b *bench) runAll(ctx context.Context) (*report, error) {
	rep := &report{cfg: b.cfg, setup: b.setup}
	slice := b.cfg.Duration / time.Duration(b.cfg.Rounds)
	for _, n := range []int{1, 3} {
		fmt.Fprintf(b.progress, "throughput: %d descriptor(s) a request, %d rounds of %s (+%s warm-up) a server\n",
			n, b.cfg.Rounds, slice, b.cfg.Warmup)
		samples := make([][]sample, len(b.servers))
		for round := range b.cfg.Rounds {
			for k := range b.servers {
				i := (k + round) % len(b.servers)
				s := b.servers[i]
				var profile chan error
				path := filepath.Join(b.cfg.Profile, fmt.Sprintf("strictrate-rls-%d.pprof", n))
				if b.cfg.Profile != "" && s.name == nameStrictrate && round == 0 {
					profile = make(chan error, 1)
					go func() { profile <- b.profile(ctx, s, slice, path) }()
				}
				shape := loadShape{descriptors: n, callers: b.cfg.Concurrency, keys: b.cfg.Keys, warmup: b.cfg.Warmup, duration: slice}
				smp, err := drive(ctx, s, shape, b.counters(s))
				if err == nil {
					err = s.alive()
				}
				if err != nil {
					return nil, err
				}
				if profile != nil {
					if err := <-profile; err != nil {
						return nil, err
					}
					fmt.Fprintf(b.progress, "wrote %s\n", path)
				}
				fmt.Fprintf(b.progress, "  round %d, %s: %.0f decisions/s, %d errors\n",
					round+1, s.name, float64(smp.ok+smp.over)/slice.Seconds(), smp.errs)
				samples[i] = append(samples[i], smp)
			}
		}
		for i, s := range b.servers {
			t := summarize(s.name, n, samples[i])
			fmt.Fprintf(b.progress, "  %s: %.0f decisions/s, p50 %s, p99 %s, %d errors\n", s.name, t.PerSecond, t.P50, t.P99, t.Errors)
			rep.throughput = append(rep.throughput, t)
		}
	}
	if b.cfg.Exactness {
		exact, err := runExactness(ctx, b.servers, b.info, b.run, b.cfg.Boundary, b.progress)
		if err != nil {
			return nil, err
		}
		rep.exactness = exact
	}
	return rep, nil
}

// counters reads, for a run of s, Valkey's CPU time and commands (INFO cpu and stats), s's
// CPU time and the bench's own (/proc).
func (b *bench) counters(s *server) func(context.Context) counters {
	return func(ctx context.Context) counters {
		c := counters{ValkeyCPU: -1, ServerCPU: -1, ClientCPU: -1, ValkeyCommands: -1}
		if info, err := valkeytest.ReadInfo(ctx, b.info, "cpu"); err == nil {
			if cpu, err := info.CPUSeconds(); err == nil {
				c.ValkeyCPU = time.Duration(cpu * float64(time.Second))
			}
		}
		if info, err := valkeytest.ReadInfo(ctx, b.info, "stats"); err == nil {
			if n, err := strconv.ParseInt(info["total_commands_processed"], 10, 64); err == nil {
				c.ValkeyCommands = n
			}
		}
		if d, err := processCPU(s.pid()); err == nil {
			c.ServerCPU = d
		}
		if d, err := processCPU(os.Getpid()); err == nil {
			c.ClientCPU = d
		}
		return c
	}
}

// profile takes a CPU profile of s over the measured time of the run that starts now, from
// its debug port, into the file path.
func (b *bench) profile(ctx context.Context, s *server, measured time.Duration, path string) error {
	sleepUntil(ctx, time.Now().Add(b.cfg.Warmup))
	secs := max(1, int(measured/time.Second))
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", s.debugAddr, secs)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("bench: profile %s: %w", s.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("bench: profile %s: %s", s.name, resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("bench: profile: %w", err)
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return fmt.Errorf("bench: profile %s: %w", s.name, err)
	}
	return f.Close()
}

// writeConfig writes configFiles into dir; for the reference, without the lines of this
// service's record_over_limit key, which it does not know.
func writeConfig(dir string, reference bool) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bench: config dir: %w", err)
	}
	files, err := fs.Glob(configFiles, "config/*.yaml")
	if err != nil {
		return fmt.Errorf("bench: config: %w", err)
	}
	for _, name := range files {
		text, err := configFiles.ReadFile(name)
		if reference {
			text = withoutKey(text, "record_over_limit")
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(dir, filepath.Base(name)), text, 0o644)
		}
		if err != nil {
			return fmt.Errorf("bench: config: %w", err)
		}
	}
	return nil
}

// withoutKey is a YAML file without the lines that give key, each of which must hold that
// key alone.
func withoutKey(text []byte, key string) []byte {
	var out []byte
	for _, line := range bytes.SplitAfter(text, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte(key+":")) {
			out = append(out, line...)
		}
	}
	return out
}

// moduleVersion is the version of module mod that the Go binary bin was built from (its
// build information, as `go version -m` prints it), or "" when that cannot be told.
func moduleVersion(bin, mod string) string {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return ""
	}
	if info.Main.Path == mod {
		return info.Main.Version
	}
	for _, dep := range info.Deps {
		if dep.Path == mod {
			return dep.Version
		}
	}
	return ""
}
