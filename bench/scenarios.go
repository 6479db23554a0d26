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

// enginesOn returns one engine per client, under the run's prefix and writing its layout
// (-write-layout). The bench's servers run without persistence on purpose (but for the
// durability scenario's): the persistence check is off.
func (b *bencher) enginesOn(clients []valkey.Client, opts ...engine.Option) ([]*engine.Engine, error) {
	var es []*engine.Engine
	for _, c := range clients {
		base := []engine.Option{engine.WithPrefix(b.prefix), engine.WithPersistenceCheck(engine.Ignore)}
		if b.cfg.WriteLayout != 0 { // 0: a config made in a test, the engine's default
			base = append(base, engine.WithWriteLayout(b.cfg.WriteLayout))
		}
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
	Notes    []string  `json:"notes,omitempty"`
}

func (b *bencher) runAll(ctx context.Context) (*Report, error) {
	r := &Report{Settings: currentSettings(ctx, b.cfg, b.srv, b.clients[0])}
	b.logf("server %s (%s) at %s; %d goroutines over %d clients; GOMAXPROCS %d",
		r.Settings.ServerVersion, b.srv.Source, b.srv.Addr, b.cfg.Concurrency, b.cfg.Clients, r.Settings.GOMAXPROCS)
	if b.wants("exactness") {
		for _, v := range exactnessVariants {
			row, err := b.exactness(ctx, v)
			if err != nil {
				return nil, fmt.Errorf("exactness/%s: %w", v.name, err)
			}
			r.Exactness = append(r.Exactness, row)
		}
	}
	if b.wants("throughput") {
		for _, v := range throughputVariants {
			row, err := b.throughput(ctx, v)
			if err != nil {
				return nil, fmt.Errorf("throughput/%s: %w", v.name, err)
			}
			r.Throughput = append(r.Throughput, row)
		}
	}
	if b.wants("memory") {
		rows, err := b.memory(ctx)
		if err != nil {
			return nil, fmt.Errorf("memory: %w", err)
		}
		r.Memory = rows
	}
	if b.wants("servercost") {
		rows, err := b.serverCost(ctx)
		if err != nil {
			return nil, fmt.Errorf("servercost: %w", err)
		}
		r.ServerCost = rows
	}
	if b.wants("quota") {
		mem, cost, err := b.quota(ctx)
		if err != nil {
			return nil, fmt.Errorf("quota: %w", err)
		}
		r.QuotaMemory, r.QuotaCost = mem, cost
	}
	if b.wants("localquota") {
		rows, err := b.localQuota(ctx)
		if err != nil {
			return nil, fmt.Errorf("localquota: %w", err)
		}
		r.LocalQuota = rows
	}
	if b.wants("busykeys") {
		rows, err := b.busyKeys(ctx)
		if err != nil {
			return nil, fmt.Errorf("busykeys: %w", err)
		}
		r.BusyKeys = rows
	}
	if b.wants("leases") {
		rows, err := b.leases(ctx)
		if err != nil {
			return nil, fmt.Errorf("leases: %w", err)
		}
		r.Leases = rows
	}
	if b.wants("ceiling") {
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
		if err != nil {
			return nil, fmt.Errorf("ceiling: %w", err)
		}
		r.Ceiling = rows
		if note != "" {
			r.Notes = append(r.Notes, note)
		}
	}
	if b.wants("durability") {
		rows, note, err := b.durability(ctx)
		if err != nil {
			return nil, fmt.Errorf("durability: %w", err)
		}
		r.Durability = rows
		if note != "" {
			r.Notes = append(r.Notes, note)
		}
	}
	// On a cluster of its own (bench/cluster.go), whatever -addr says.
	if b.wants("cluster") {
		rows, note, err := b.cluster(ctx)
		if err != nil {
			return nil, fmt.Errorf("cluster: %w", err)
		}
		r.Cluster = rows
		if note != "" {
			r.Notes = append(r.Notes, note)
		}
	}
	// Last: it resets the server's statistics (CONFIG RESETSTAT) before each of its rows.
	if b.wants("floor") {
		rows, note, err := b.floor(ctx)
		if err != nil {
			return nil, fmt.Errorf("floor: %w", err)
		}
		r.Floor = rows
		if note != "" {
			r.Notes = append(r.Notes, note)
		}
	}
	return r, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
