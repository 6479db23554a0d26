package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/pipelined"
)

// bencher runs the scenarios against one server with one set of clients.
type bencher struct {
	cfg      config
	srv      *valkeytest.Server
	clients  []valkey.Client
	prefix   string // every key of this run starts with it, so runs never meet
	progress io.Writer
	start    time.Time
}

func newBencher(ctx context.Context, cfg config, srv *valkeytest.Server, progress io.Writer) (*bencher, error) {
	b := &bencher{cfg: cfg, srv: srv, progress: progress, start: time.Now(),
		prefix: "strictrate-bench:" + uuid.NewString()[:8] + ":"}
	for i := 0; i < cfg.Clients; i++ {
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{srv.Addr}, MaxFlushDelay: cfg.FlushDelay})
		if err != nil {
			b.close()
			return nil, fmt.Errorf("connect to %s: %w", srv.Addr, err)
		}
		b.clients = append(b.clients, c)
	}
	// An engine loads the scripts, so that the scenarios' first calls find them.
	if _, err := b.engines(); err != nil {
		b.close()
		return nil, err
	}
	return b, nil
}

func (b *bencher) close() {
	for _, c := range b.clients {
		c.Close()
	}
}

func (b *bencher) logf(format string, args ...any) {
	fmt.Fprintf(b.progress, "[%6.1fs] %s\n", time.Since(b.start).Seconds(), fmt.Sprintf(format, args...))
}

// engines returns one engine per client of the run's server (enginesOn).
func (b *bencher) engines(opts ...engine.Option) ([]*engine.Engine, error) {
	return b.enginesOn(b.clients, opts...)
}

// enginesOn returns one engine per client, under the run's prefix. The bench's servers run
// without persistence on purpose (but for the durability scenario's): the persistence check
// is off.
func (b *bencher) enginesOn(clients []valkey.Client, opts ...engine.Option) ([]*engine.Engine, error) {
	var es []*engine.Engine
	for _, c := range clients {
		base := []engine.Option{engine.WithPrefix(b.prefix), engine.WithPersistenceCheck(engine.Ignore)}
		e, err := engine.New(c, append(base, opts...)...)
		if err != nil {
			return nil, err
		}
		es = append(es, e)
	}
	return es, nil
}

// decider is what the exactness, throughput and memory scenarios decide with: the engine, or
// the pipelined design it is measured against (package pipelined).
type decider interface {
	Allow(ctx context.Context, key string, l engine.Limit) (engine.Result, error)
	AllowN(ctx context.Context, key string, l engine.Limit, n int) (engine.Result, error)
}

// deciders returns one decider per client: the pipelined design's, or engines with opts.
func (b *bencher) deciders(pipe bool, opts ...engine.Option) ([]decider, error) {
	var ds []decider
	if pipe {
		for _, c := range b.clients {
			p, err := pipelined.New(c, pipelined.WithPrefix(b.prefix))
			if err != nil {
				return nil, err
			}
			ds = append(ds, p)
		}
		return ds, nil
	}
	es, err := b.engines(opts...)
	for _, e := range es {
		ds = append(ds, e)
	}
	return ds, err
}

// modeName names a row's design: "pipelined", or "atomic" for the engine's log.
func modeName(pipe bool) string {
	if pipe {
		return "pipelined"
	}
	return "atomic"
}

// readLog reads key's log under the run's prefix (package inspect), with its most newest
// entries.
func (b *bencher) readLog(ctx context.Context, key string, most int) (inspect.Log, error) {
	return inspect.Read(ctx, b.clients[0], b.prefix+key, most)
}

func (b *bencher) wants(s string) bool { return b.cfg.Scenario == "all" || b.cfg.Scenario == s }

// Report is everything one run measured.
type Report struct {
	Settings   Settings        `json:"settings"`
	Exactness  []ExactnessRow  `json:"exactness,omitempty"`
	Throughput []ThroughputRow `json:"throughput,omitempty"`
	Memory     []MemoryRow     `json:"memory,omitempty"`
	ServerCost []ServerCostRow `json:"server_cost,omitempty"`
	Ceiling    []CeilingRow    `json:"ceiling,omitempty"`
	Leases     []LeaseRow      `json:"leases,omitempty"`
	Durability []DurabilityRow `json:"durability,omitempty"`
	Floor      []FloorRow      `json:"floor,omitempty"`
	Cluster    []ClusterRow    `json:"cluster,omitempty"`
	// QuotaMemory and QuotaCost are the quota scenario's (quota.go).
	QuotaMemory []QuotaMemoryRow `json:"quota_memory,omitempty"`
	QuotaCost   []QuotaCostRow   `json:"quota_server_cost,omitempty"`
	// LocalQuota is the local quota scenario's (localquota.go).
	LocalQuota []LocalQuotaRow `json:"local_quota,omitempty"`
	// BusyKeys is the busykeys scenario's (busy.go), a row per log size.
	BusyKeys []BusyRow `json:"busy_keys,omitempty"`
	// Tokens is the tokens scenario's (tokens.go).
	Tokens *TokensRow `json:"tokens,omitempty"`
	Notes  []string   `json:"notes,omitempty"`
}

func (b *bencher) runAll(ctx context.Context) (*Report, error) {
	r := &Report{Settings: currentSettings(ctx, b.cfg, b.srv, b.clients[0])}
	b.logf("server %s (%s) at %s; %d goroutines over %d clients; GOMAXPROCS %d",
		r.Settings.ServerVersion, b.srv.Source, b.srv.Addr, b.cfg.Concurrency, b.cfg.Clients, r.Settings.GOMAXPROCS)
	var steps []scenarioStep
	for _, s := range b.scenarioSteps(r) {
		if b.wants(s.name) {
			steps = append(steps, s)
		}
	}
	for i, s := range steps {
		var left time.Duration
		for _, rest := range steps[i:] {
			left += rest.estimate(b.cfg)
		}
		b.logf("== %d/%d %s, about %s left", i+1, len(steps), s.name, left.Round(10*time.Second))
		if err := s.run(ctx); err != nil {
			return nil, fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return r, nil
}

// scenarioStep is one scenario of a run: its name (-scenario's), what it takes on a two-core
// machine at the run's settings (for the progress line's time left: measured with the defaults,
// scaled by -duration where the scenario runs for it), and what runs it into the report.
type scenarioStep struct {
	name     string
	estimate func(config) time.Duration
	run      func(ctx context.Context) error
}

// per is an estimate of modes measured runs of -duration each, and fixed seconds more.
func per(modes int, fixed float64) func(config) time.Duration {
	return func(c config) time.Duration {
		return time.Duration(modes)*c.Duration + time.Duration(fixed*float64(time.Second))
	}
}

// scenarioSteps are the scenarios in the order a run takes them, each filling its part of r.
func (b *bencher) scenarioSteps(r *Report) []scenarioStep {
	withNote := func(note string) {
		if note != "" {
			r.Notes = append(r.Notes, note)
		}
	}
	return []scenarioStep{
		{"exactness", per(4, 4), func(ctx context.Context) error {
			for _, v := range exactnessVariants {
				row, err := b.exactness(ctx, v)
				if err != nil {
					return fmt.Errorf("%s: %w", v.name, err)
				}
				r.Exactness = append(r.Exactness, row)
			}
			return nil
		}},
		{"throughput", per(4, 4), func(ctx context.Context) error {
			for _, v := range throughputVariants {
				row, err := b.throughput(ctx, v)
				if err != nil {
					return fmt.Errorf("%s: %w", v.name, err)
				}
				r.Throughput = append(r.Throughput, row)
			}
			return nil
		}},
		{"memory", per(0, 2), func(ctx context.Context) (err error) {
			r.Memory, err = b.memory(ctx)
			return err
		}},
		{"servercost", per(0, 2), func(ctx context.Context) (err error) {
			r.ServerCost, err = b.serverCost(ctx)
			return err
		}},
		{"quota", per(0, 28), func(ctx context.Context) (err error) {
			r.QuotaMemory, r.QuotaCost, err = b.quota(ctx)
			return err
		}},
		{"localquota", per(7, 5), func(ctx context.Context) (err error) {
			r.LocalQuota, err = b.localQuota(ctx)
			return err
		}},
		{"busykeys", per(0, 30), func(ctx context.Context) (err error) {
			r.BusyKeys, err = b.busyKeys(ctx)
			return err
		}},
		{"tokens", per(1, 1), func(ctx context.Context) error {
			row, err := b.tokens(ctx)
			if err == nil {
				r.Tokens = &row
			}
			return err
		}},
		{"leases", per(3, 1), func(ctx context.Context) (err error) {
			r.Leases, err = b.leases(ctx)
			return err
		}},
		{"ceiling", per(0, 12), func(ctx context.Context) error {
			var atomicRate, batchedRate, meanBatch float64
			for _, t := range r.Throughput {
				switch {
				case t.Mode == "atomic" && t.Clock == "server":
					atomicRate = t.DecisionsPerSec
				case t.Mode == "batched":
					batchedRate, meanBatch = t.DecisionsPerSec, t.MeanBatch
				}
			}
			rows, note, err := b.ceiling(ctx, atomicRate, batchedRate, meanBatch)
			r.Ceiling = rows
			withNote(note)
			return err
		}},
		{"durability", per(4, 5), func(ctx context.Context) error {
			rows, note, err := b.durability(ctx)
			r.Durability = rows
			withNote(note)
			return err
		}},
		// On a cluster of its own (bench/cluster.go), whatever -addr says.
		{"cluster", per(2, 4), func(ctx context.Context) error {
			rows, note, err := b.cluster(ctx)
			r.Cluster = rows
			withNote(note)
			return err
		}},
		// Last: it resets the server's statistics (CONFIG RESETSTAT) before each of its rows.
		{"floor", per(0, 29), func(ctx context.Context) error {
			rows, note, err := b.floor(ctx)
			r.Floor = rows
			withNote(note)
			return err
		}},
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
