package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/bench/internal/cputime"
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

// ExactnessRow is scenario 1 for one mode: every goroutine hammers one key.
type ExactnessRow struct {
	Mode       string  `json:"mode"`
	Clock      string  `json:"timestamps_from"`
	Limit      int     `json:"limit_max"`
	WindowMS   float64 `json:"window_ms"`
	OfferedPS  float64 `json:"offered_requests_per_sec"`
	LogEntries int64   `json:"log_entries_at_end"`
	// LogMax is the largest log seen by ZCARD every 20ms during the run: at the end, the last
	// events may just have left the window.
	LogMax int64 `json:"log_entries_max_sampled"`
	// ServerCalls is what the server ran for the row's decisions: script calls (atomic) or
	// commands (pipelined, four per decision).
	ServerCalls int64 `json:"server_calls"`
	// Cached is how many decisions the deny cache took without the server.
	Cached int `json:"decided_by_deny_cache"`
	Exactness
	// Trail is the admitted events per trailing window over the run, for -charts; not in the
	// JSON report.
	Trail []TrailPoint `json:"-"`
}

// maxTrailPoints bounds an exactness row's Trail (see trailing): far more than a chart's width
// needs, few enough to keep its SVG small.
const maxTrailPoints = 4000

// exactnessVariants are the rows of scenario 1; "cached" is batched with the deny cache on,
// which sheds the hot key's overload on the client.
var exactnessVariants = []throughputVariant{
	{name: "atomic", opts: unbatched},
	{name: "batched", opts: batched},
	{name: "cached", opts: append(slices.Clone(batched), engine.WithDenyCache(1024))},
	{name: "pipelined", pipelined: true},
}

func (b *bencher) exactness(ctx context.Context, v throughputVariant) (ExactnessRow, error) {
	pipe := v.pipelined
	es, err := b.deciders(pipe, v.opts...)
	if err != nil {
		return ExactnessRow{}, err
	}
	key := "hot:" + v.name
	limit := engine.Limit{Max: b.cfg.Limit, Window: b.cfg.Window}
	before, err := readServerStats(ctx, b.clients[0])
	if err != nil {
		return ExactnessRow{}, err
	}
	began := time.Now()
	perG := make([][]Decision, b.cfg.Concurrency)
	cached := make([]int, b.cfg.Concurrency)
	sampled := b.sampleLogSize(ctx, pipe, key, b.cfg.Duration)
	err = drive(ctx, b, b.cfg.Duration, func(g int, e decider) error {
		r, err := e.Allow(ctx, key, limit)
		if err != nil {
			return err
		}
		if r.FromCache {
			cached[g]++
		}
		perG[g] = append(perG[g], Decision{AtMicros: r.At.UnixMicro(), Allowed: r.Allowed})
		return nil
	}, es)
	if err != nil {
		return ExactnessRow{}, err
	}
	elapsed := time.Since(began)
	after, err := readServerStats(ctx, b.clients[0])
	if err != nil {
		return ExactnessRow{}, err
	}
	decisions := slices.Concat(perG...)
	n, _, err := b.logSize(ctx, pipe, key)
	if err != nil {
		return ExactnessRow{}, err
	}
	clock := "server (TIME in the script)"
	if pipe {
		clock = "caller (time.Now)"
	}
	row := ExactnessRow{
		Mode: v.name, Clock: clock, Limit: limit.Max, WindowMS: ms(limit.Window),
		OfferedPS: float64(len(decisions)) / elapsed.Seconds(), LogEntries: n, LogMax: <-sampled,
		ServerCalls: after.calls(dataCommands(pipe)) - before.calls(dataCommands(pipe)), Cached: sumInts(cached),
		Exactness: analyze(decisions, limit.Max, limit.Window),
		Trail:     trailing(decisions, limit.Window, maxTrailPoints),
	}
	b.logf("exactness/%s: %s, %d requests, %d admitted, overshoot %d, false denials %d",
		v.name, elapsed.Round(time.Millisecond), row.Requests, row.Admitted, row.Overshoot, row.FalseDenials)
	return row, nil
}

// throughputVariant is one row of scenario 2: the engine with opts (and which clock it
// reads), or the pipelined design.
type throughputVariant struct {
	name      string
	pipelined bool
	opts      []engine.Option
	clock     string
}

// The caller's-clock row shows what reading the server's clock (TIME) costs the server.
var throughputVariants = []throughputVariant{
	{name: "atomic", opts: unbatched, clock: "server"},
	{name: "atomic", opts: []engine.Option{engine.WithBatching(false), engine.WithClock(time.Now)}, clock: "caller"},
	{name: "batched", opts: batched, clock: "server"},
	{name: "pipelined", pipelined: true, clock: "caller"},
}

// The options of the two atomic flavours the scenarios compare.
var (
	unbatched = []engine.Option{engine.WithBatching(false)}
	batched   = []engine.Option{engine.WithBatching(true)}
)

// logSize returns the events key's log holds, and its entries: inspect.Read for an
// engine's log (one entry per admitted request), ZCARD for the pipelined sorted set (one
// member per event, admitted or not).
func (b *bencher) logSize(ctx context.Context, pipe bool, key string) (events, entries int64, err error) {
	if pipe {
		c := b.clients[0]
		n, err := c.Do(ctx, c.B().Zcard().Key(b.prefix+key).Build()).AsInt64()
		return n, n, err
	}
	log, err := b.readLog(ctx, key, 1)
	return int64(log.Events), int64(log.Count), err
}

// sampleLogSize reads the events in key's log every 20ms for d and sends the most it saw.
func (b *bencher) sampleLogSize(ctx context.Context, pipe bool, key string, d time.Duration) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		var largest int64
		for {
			select {
			case <-ctx.Done():
				out <- largest
				return
			case <-tick.C:
				if n, _, err := b.logSize(ctx, pipe, key); err == nil {
					largest = max(largest, n)
				}
			}
		}
	}()
	return out
}

// ThroughputRow is scenario 2 for one mode: every goroutine on random keys out of many.
type ThroughputRow struct {
	Mode            string  `json:"mode"`
	Clock           string  `json:"clock"`
	Keys            int     `json:"keys"`
	Decisions       int     `json:"decisions"`
	AdmittedShare   float64 `json:"admitted_fraction"`
	DecisionsPerSec float64 `json:"decisions_per_sec"`
	P50us           float64 `json:"latency_p50_us"`
	P99us           float64 `json:"latency_p99_us"`
	P999us          float64 `json:"latency_p999_us"`
	AllocsPerOp     float64 `json:"allocs_per_decision"`
	BytesPerOp      float64 `json:"heap_bytes_per_decision"`
	ServerUSPerOp   float64 `json:"server_command_us_per_decision"`
	ServerCPUPerOp  float64 `json:"server_cpu_us_per_decision"`
	ServerCPU       float64 `json:"server_cpu_cores_busy"`
	ClientCPUPerOp  float64 `json:"client_cpu_us_per_decision"`
	// MeanBatch is decisions per script call (atomic modes): 1 unbatched.
	MeanBatch float64 `json:"decisions_per_script_call,omitempty"`
}

func (b *bencher) throughput(ctx context.Context, v throughputVariant) (ThroughputRow, error) {
	pipe := v.pipelined
	es, err := b.deciders(pipe, v.opts...)
	if err != nil {
		return ThroughputRow{}, err
	}
	seed := uint64(0)
	if pipe {
		seed = 1
	}
	load, err := b.randomLoad(ctx, es, "tp:"+v.name+":"+v.clock, seed)
	if err != nil {
		return ThroughputRow{}, err
	}
	before, err := readServerStats(ctx, b.clients[0])
	if err != nil {
		return ThroughputRow{}, err
	}
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0 := cputime.Process()
	began := time.Now()
	if err := drive(ctx, b, b.cfg.Duration, load.op, es); err != nil {
		return ThroughputRow{}, err
	}
	elapsed := time.Since(began)
	cpu1 := cputime.Process()
	runtime.ReadMemStats(&m1)
	after, err := readServerStats(ctx, b.clients[0])
	if err != nil {
		return ThroughputRow{}, err
	}

	all, total := load.measured()
	n := len(all)
	serverUS := after.usec(dataCommands(pipe)) - before.usec(dataCommands(pipe))
	serverCPU := after.cpuSeconds - before.cpuSeconds
	row := ThroughputRow{
		Mode: v.name, Clock: v.clock, Keys: len(load.keys), Decisions: n,
		AdmittedShare:   float64(total) / float64(n),
		DecisionsPerSec: float64(n) / elapsed.Seconds(),
		P50us:           us(percentile(all, 50)),
		P99us:           us(percentile(all, 99)),
		P999us:          us(percentile(all, 99.9)),
		AllocsPerOp:     float64(m1.Mallocs-m0.Mallocs) / float64(n),
		BytesPerOp:      float64(m1.TotalAlloc-m0.TotalAlloc) / float64(n),
		ServerUSPerOp:   serverUS / float64(n),
		MeanBatch:       meanBatch(n, before, after, pipe),
		ServerCPUPerOp:  serverCPU * 1e6 / float64(n),
		ServerCPU:       serverCPU / elapsed.Seconds(),
		ClientCPUPerOp:  (cpu1 - cpu0).Seconds() * 1e6 / float64(n),
	}
	b.logf("throughput/%s (%s clock): %s, %.0f decisions/s, p50 %.0fµs p99 %.0fµs, CPU per decision: server %.1fµs, client %.1fµs",
		v.name, v.clock, elapsed.Round(time.Millisecond), row.DecisionsPerSec, row.P50us, row.P99us, row.ServerCPUPerOp, row.ClientCPUPerOp)
	return row, nil
}

// dataCommands are the commands one decision costs the server, as INFO commandstats names them.
func dataCommands(pipe bool) []string {
	if pipe {
		return []string{"zremrangebyscore", "zadd", "zcard", "pexpire"}
	}
	return []string{"evalsha", "eval"}
}

func sumInts(xs []int) int {
	total := 0
	for _, x := range xs {
		total += x
	}
	return total
}

// meanBatch is n decisions over the script calls between two readings; 0 for the pipelined
// design.
func meanBatch(n int, before, after serverStats, pipe bool) float64 {
	calls := after.calls(dataCommands(pipe)) - before.calls(dataCommands(pipe))
	if pipe || calls == 0 {
		return 0
	}
	return float64(n) / float64(calls)
}

// load is the throughput scenarios' load: every goroutine asks Allow, against the run's
// limit, for a key drawn at random (a source of its own per goroutine) out of keys, and
// records how long each decision took and whether it admitted.
type load struct {
	ctx      context.Context
	keys     []string
	limit    engine.Limit
	rngs     []*rand.Rand
	lat      [][]time.Duration
	admitted []int
}

// randomLoad makes the load on cfg.Keys keys named prefix:i, the goroutines' sources seeded
// with seed, and runs it on es briefly, unmeasured (connections, script caches, slot maps and
// the keys' first entries warm up), before it returns it ready to measure.
func (b *bencher) randomLoad(ctx context.Context, es []decider, prefix string, seed uint64) (*load, error) {
	l := &load{ctx: ctx, keys: make([]string, b.cfg.Keys), limit: engine.Limit{Max: b.cfg.Limit, Window: b.cfg.Window},
		rngs: make([]*rand.Rand, b.cfg.Concurrency), lat: make([][]time.Duration, b.cfg.Concurrency),
		admitted: make([]int, b.cfg.Concurrency)}
	for i := range l.keys {
		l.keys[i] = prefix + ":" + strconv.Itoa(i)
	}
	for g := range l.rngs {
		l.rngs[g] = rand.New(rand.NewPCG(uint64(g), seed))
	}
	if err := drive(ctx, b, min(b.cfg.Duration/5, time.Second), l.op, es); err != nil {
		return nil, err
	}
	for g := range l.lat {
		l.lat[g] = make([]time.Duration, 0, 1<<16)
		l.admitted[g] = 0
	}
	return l, nil
}

// op takes goroutine g's next decision on e.
func (l *load) op(g int, e decider) error {
	t := time.Now()
	r, err := e.Allow(l.ctx, l.keys[l.rngs[g].IntN(len(l.keys))], l.limit)
	if err != nil {
		return err
	}
	l.lat[g] = append(l.lat[g], time.Since(t))
	if r.Allowed {
		l.admitted[g]++
	}
	return nil
}

// measured returns every decision's latency since the warm-up, sorted, and how many admitted.
func (l *load) measured() (sorted []time.Duration, admitted int) {
	sorted = slices.Concat(l.lat...)
	slices.Sort(sorted)
	return sorted, sumInts(l.admitted)
}

// drive runs op from b's cfg.Concurrency goroutines, spread over the engines es, for d.
func drive[E any](ctx context.Context, b *bencher, d time.Duration, op func(g int, e E) error, es []E) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, b.cfg.Concurrency)
	for g := 0; g < b.cfg.Concurrency; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			e := es[g%len(es)]
			for ctx.Err() == nil {
				if err := op(g, e); err != nil {
					if !runEnded(ctx, err) {
						errs[g] = err
					}
					return
				}
			}
		}(g)
	}
	wg.Wait()
	return errors.Join(errs...)
}

// runEnded says whether err, from a call made on ctx, is only the end of the run's own
// deadline. The client may report the deadline a moment before ctx does; and a connection it
// dials lazily on ctx (a client's second pipe, say) is cut short by the same deadline with "i/o
// timeout" (os.ErrDeadlineExceeded), which does not match context.DeadlineExceeded.
func runEnded(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	deadline, ok := ctx.Deadline()
	return ok && !time.Now().Before(deadline) && errors.Is(err, os.ErrDeadlineExceeded)
}

// MemoryRow is scenario 3: bytes per key for a log at a full window.
type MemoryRow struct {
	Mode     string `json:"mode"`
	Limit    int    `json:"limit_max"`
	Requests int    `json:"requests"`
	Cost     int    `json:"cost_per_request"`
	Events   int64  `json:"log_events"`
	Entries  int64  `json:"log_entries"`
	Bytes    int64  `json:"memory_usage_bytes"`
	Encoding string `json:"encoding"`
	// Before is what the first layout (a sorted set, one member per event) took for the same
	// case, as measured before the change; Target is the aim for the current layout. Both are
	// quoted, not measured in this run; 0 where none was set.
	Before int64 `json:"before_bytes_quoted,omitempty"`
	Target int64 `json:"target_bytes,omitempty"`
}

// memoryCase is one log the memory scenario fills: requests of cost each, against Max.
type memoryCase struct {
	pipelined             bool
	max, requests, cost   int
	beforeBytes, aimBytes int64
}

var memoryCases = []memoryCase{
	{max: 10, requests: 10, cost: 1, beforeBytes: 304},
	{max: 100, requests: 100, cost: 1, beforeBytes: 2_128, aimBytes: 1_200},
	{max: 1_000, requests: 1_000, cost: 1, beforeBytes: 118_696, aimBytes: 12_000},
	{max: 10_000, requests: 10_000, cost: 1, beforeBytes: 1_200_000, aimBytes: 120_000},
	{max: 100_000, requests: 100, cost: 1_000, beforeBytes: 11_000_000, aimBytes: 2_500},
	{pipelined: true, max: 100, requests: 100, cost: 1},
	{pipelined: true, max: 100, requests: 1_000, cost: 1}, // its log keeps every attempt
	{pipelined: true, max: 1_000, requests: 1_000, cost: 1},
}

func (b *bencher) memory(ctx context.Context) ([]MemoryRow, error) {
	began := time.Now()
	var rows []MemoryRow
	c := b.clients[0]
	for _, mc := range memoryCases {
		es, err := b.deciders(mc.pipelined)
		if err != nil {
			return nil, err
		}
		key := fmt.Sprintf("mem:%s:%d:%dx%d", modeName(mc.pipelined), mc.max, mc.requests, mc.cost)
		limit := engine.Limit{Max: mc.max, Window: time.Hour}
		for i := 0; i < mc.requests; i++ {
			if _, err := es[0].AllowN(ctx, key, limit, mc.cost); err != nil {
				return nil, err
			}
		}
		full := b.prefix + key
		size, err := c.Do(ctx, c.B().MemoryUsage().Key(full).Samples(0).Build()).AsInt64()
		if err != nil {
			return nil, err
		}
		events, entries, err := b.logSize(ctx, mc.pipelined, key)
		if err != nil {
			return nil, err
		}
		enc, err := c.Do(ctx, c.B().ObjectEncoding().Key(full).Build()).ToString()
		if err != nil {
			return nil, err
		}
		rows = append(rows, MemoryRow{Mode: modeName(mc.pipelined), Limit: mc.max, Requests: mc.requests, Cost: mc.cost,
			Events: events, Entries: entries, Bytes: size, Encoding: enc, Before: mc.beforeBytes, Target: mc.aimBytes})
		if err := c.Do(ctx, c.B().Del().Key(full).Build()).Error(); err != nil {
			return nil, err
		}
	}
	b.logf("memory: %d logs measured in %s", len(rows), time.Since(began).Round(time.Millisecond))
	return rows, nil
}

// ServerCostRow is scenario 5: what one decision costs the server (INFO commandstats, the
// decision script's µs per call) for a limit's Max and a request's cost n.
type ServerCostRow struct {
	Limit        int     `json:"limit_max"`
	Cost         int     `json:"cost_per_request"`
	Decisions    int     `json:"decisions"`
	Admitted     int     `json:"admitted"`
	ServerUSPerD float64 `json:"server_us_per_decision"`
}

// serverCost takes the same number of decisions (servercostKeys keys, servercostPerKey each,
// admitted while they fit) for every Max and n, and reads the script's server time per call.
func (b *bencher) serverCost(ctx context.Context) ([]ServerCostRow, error) {
	const servercostKeys, servercostPerKey = 200, 25
	es, err := b.engines()
	if err != nil {
		return nil, err
	}
	var rows []ServerCostRow
	for _, max := range []int{100, 10_000, 1_000_000} {
		for _, n := range []int{1, 100, 10_000} {
			if n > max {
				continue
			}
			limit := engine.Limit{Max: max, Window: time.Hour}
			before, err := readServerStats(ctx, b.clients[0])
			if err != nil {
				return nil, err
			}
			var mu sync.Mutex
			admitted, calls := 0, 0
			var wg sync.WaitGroup
			errs := make([]error, len(es))
			for i, e := range es {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for k := i; k < servercostKeys; k += len(es) {
						key := fmt.Sprintf("cost:%d:%d:%d", max, n, k)
						for j := 0; j < servercostPerKey; j++ {
							r, err := e.AllowN(ctx, key, limit, n)
							if err != nil {
								errs[i] = err
								return
							}
							mu.Lock()
							calls++
							if r.Allowed {
								admitted++
							}
							mu.Unlock()
						}
					}
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				return nil, err
			}
			after, err := readServerStats(ctx, b.clients[0])
			if err != nil {
				return nil, err
			}
			cmds := dataCommands(false)
			rows = append(rows, ServerCostRow{Limit: max, Cost: n, Decisions: calls, Admitted: admitted,
				ServerUSPerD: (after.usec(cmds) - before.usec(cmds)) / float64(calls)})
		}
	}
	b.logf("server cost: %d cells", len(rows))
	return rows, nil
}

// CeilingRow is scenario 4: the same atomic script driven by valkey-benchmark.
type CeilingRow struct {
	Tool             string  `json:"tool"`
	Connections      int     `json:"connections"`
	Pipeline         int     `json:"pipeline_depth"`
	Script           string  `json:"script"`
	DecisionsPerCall int     `json:"decisions_per_call"`
	DecisionsPerSec  float64 `json:"decisions_per_sec"`
	Requests         int     `json:"requests"`
	RequestsPerSec   float64 `json:"requests_per_sec"`
	P50ms            float64 `json:"latency_p50_ms"`
	P99ms            float64 `json:"latency_p99_ms"`
	EngineRatio      float64 `json:"engine_atomic_over_ceiling"`
	ServerUSPerCall  float64 `json:"server_cpu_us_per_call"`
}

func (b *bencher) ceiling(ctx context.Context, atomicRate, batchedRate, meanBatch float64) ([]CeilingRow, string, error) {
	tool := valkeytest.FindTool("valkey-benchmark", "redis-benchmark")
	if tool == "" {
		note := "ceiling: skipped, neither valkey-benchmark nor redis-benchmark is on PATH (Debian: valkey-tools)"
		b.logf("%s", note)
		return nil, note, nil
	}
	if _, err := b.engines(); err != nil { // loads the scripts, so EVALSHA finds them
		return nil, "", err
	}
	host, port, err := splitHostPort(b.srv.Addr)
	if err != nil {
		return nil, "", err
	}
	window, limit := strconv.FormatInt(b.cfg.Window.Microseconds(), 10), strconv.Itoa(b.cfg.Limit)
	// The single script at the engine's in-flight requests: Concurrency connections with one
	// request each, and Clients connections pipelining Concurrency/Clients each, as valkey-go
	// does; then the batch script carrying the batched engine's mean batch, on Clients
	// connections, one call each in flight, as the batched engine sends them.
	type shape struct {
		name          string
		conns, depth  int
		keysPerCall   int
		engineRate    float64
		script, usage []string
	}
	single := []string{"EVALSHA", decideSHA1(), "1", b.prefix + "ceil:__rand_int__", "", "1", window, limit}
	k := max(1, int(meanBatch+0.5))
	batch := []string{"EVALSHA", decideBatchSHA1(), strconv.Itoa(k)}
	for i := 0; i < k; i++ {
		batch = append(batch, b.prefix+"ceil:__rand_int__")
	}
	batch = append(batch, "", "1", "2", window, limit)
	for i := 0; i < k; i++ {
		batch = append(batch, "1", "1")
	}
	shapes := []shape{
		{"single", b.cfg.Concurrency, 1, 1, atomicRate, single, []string{"evalsha"}},
		{"single", b.cfg.Clients, max(1, b.cfg.Concurrency/b.cfg.Clients), 1, atomicRate, single, []string{"evalsha"}},
		{"batch", b.cfg.Clients, 1, k, batchedRate, batch, []string{"evalsha"}},
	}
	var rows []CeilingRow
	for _, sh := range shapes {
		if sh.name == "batch" && meanBatch <= 0 {
			continue // no batched throughput row to match
		}
		rate := sh.engineRate
		if rate <= 0 {
			rate = 30_000
		}
		requests := max(1, int(rate*b.cfg.Duration.Seconds())/sh.keysPerCall)
		args := append([]string{"-h", host, "-p", port, "-c", strconv.Itoa(sh.conns), "-P", strconv.Itoa(sh.depth),
			"-n", strconv.Itoa(requests), "-r", strconv.Itoa(b.cfg.Keys), "--csv"}, sh.script...)
		before, err := readServerStats(ctx, b.clients[0])
		if err != nil {
			return nil, "", err
		}
		began := time.Now()
		res, err := runBenchmarkTool(ctx, tool, args)
		if err != nil {
			return nil, "", err
		}
		after, err := readServerStats(ctx, b.clients[0])
		if err != nil {
			return nil, "", err
		}
		row := CeilingRow{Tool: filepath.Base(tool), Script: sh.name, Connections: sh.conns, Pipeline: sh.depth,
			DecisionsPerCall: sh.keysPerCall, Requests: requests, RequestsPerSec: res.rps,
			DecisionsPerSec: res.rps * float64(sh.keysPerCall), P50ms: res.p50ms, P99ms: res.p99ms,
			ServerUSPerCall: (after.usec(sh.usage) - before.usec(sh.usage)) / float64(requests)}
		if sh.engineRate > 0 && res.rps > 0 {
			row.EngineRatio = sh.engineRate / row.DecisionsPerSec
		}
		rows = append(rows, row)
		b.logf("ceiling: %s script, %s -c %d -P %d, %d decisions per call: %s, %.0f decisions/s", sh.name, row.Tool,
			sh.conns, sh.depth, sh.keysPerCall, time.Since(began).Round(time.Millisecond), row.DecisionsPerSec)
	}
	return rows, "", nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
