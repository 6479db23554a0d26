package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

var modes = []engine.Mode{engine.Atomic, engine.Pipelined}

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

// engines returns one engine per client, all in the given mode and under the run's prefix.
func (b *bencher) engines(mode engine.Mode, opts ...engine.Option) ([]*engine.Engine, error) {
	var es []*engine.Engine
	for _, c := range b.clients {
		e, err := engine.New(c, append([]engine.Option{engine.WithMode(mode), engine.WithPrefix(b.prefix)}, opts...)...)
		if err != nil {
			return nil, err
		}
		es = append(es, e)
	}
	return es, nil
}

func (b *bencher) wants(s string) bool { return b.cfg.Scenario == "all" || b.cfg.Scenario == s }

// Report is everything one run measured.
type Report struct {
	Settings   Settings        `json:"settings"`
	Exactness  []ExactnessRow  `json:"exactness,omitempty"`
	Throughput []ThroughputRow `json:"throughput,omitempty"`
	Memory     []MemoryRow     `json:"memory,omitempty"`
	Ceiling    []CeilingRow    `json:"ceiling,omitempty"`
	Notes      []string        `json:"notes,omitempty"`
}

func (b *bencher) runAll(ctx context.Context) (*Report, error) {
	r := &Report{Settings: currentSettings(ctx, b.cfg, b.srv, b.clients[0])}
	b.logf("server %s (%s) at %s; %d goroutines over %d clients; GOMAXPROCS %d",
		r.Settings.ServerVersion, b.srv.Source, b.srv.Addr, b.cfg.Concurrency, b.cfg.Clients, r.Settings.GOMAXPROCS)
	if b.wants("exactness") {
		for _, m := range modes {
			row, err := b.exactness(ctx, m)
			if err != nil {
				return nil, fmt.Errorf("exactness/%s: %w", m, err)
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
	if b.wants("ceiling") {
		var atomicRate float64
		for _, t := range r.Throughput {
			if t.Mode == engine.Atomic.String() && t.Clock == "server" {
				atomicRate = t.DecisionsPerSec
			}
		}
		rows, note, err := b.ceiling(ctx, atomicRate)
		if err != nil {
			return nil, fmt.Errorf("ceiling: %w", err)
		}
		r.Ceiling = rows
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
	Exactness
}

func (b *bencher) exactness(ctx context.Context, mode engine.Mode) (ExactnessRow, error) {
	es, err := b.engines(mode)
	if err != nil {
		return ExactnessRow{}, err
	}
	key := "hot:" + mode.String()
	limit := engine.Limit{Max: b.cfg.Limit, Window: b.cfg.Window}
	began := time.Now()
	perG := make([][]Decision, b.cfg.Concurrency)
	sampled := b.sampleLogSize(ctx, b.prefix+key, b.cfg.Duration)
	err = b.drive(ctx, b.cfg.Duration, func(g int, e *engine.Engine) error {
		r, err := e.Allow(ctx, key, limit)
		if err != nil {
			return err
		}
		perG[g] = append(perG[g], Decision{AtMicros: r.At.UnixMicro(), Allowed: r.Allowed})
		return nil
	}, es)
	if err != nil {
		return ExactnessRow{}, err
	}
	elapsed := time.Since(began)
	decisions := slices.Concat(perG...)
	c := b.clients[0]
	n, err := c.Do(ctx, c.B().Zcard().Key(b.prefix+key).Build()).AsInt64()
	if err != nil {
		return ExactnessRow{}, err
	}
	clock := "server (TIME in the script)"
	if mode == engine.Pipelined {
		clock = "caller (time.Now)"
	}
	row := ExactnessRow{
		Mode: mode.String(), Clock: clock, Limit: limit.Max, WindowMS: ms(limit.Window),
		OfferedPS: float64(len(decisions)) / elapsed.Seconds(), LogEntries: n, LogMax: <-sampled,
		Exactness: analyze(decisions, limit.Max, limit.Window),
	}
	b.logf("exactness/%s: %s, %d requests, %d admitted, overshoot %d, false denials %d",
		mode, elapsed.Round(time.Millisecond), row.Requests, row.Admitted, row.Overshoot, row.FalseDenials)
	return row, nil
}

// throughputVariant is one row of scenario 2: a mode, and for Atomic, which clock.
type throughputVariant struct {
	name  string
	mode  engine.Mode
	opts  []engine.Option
	clock string
}

// The caller's-clock row shows what reading the server's clock (TIME) costs the server.
var throughputVariants = []throughputVariant{
	{name: "atomic", mode: engine.Atomic, clock: "server"},
	{name: "atomic", mode: engine.Atomic, opts: []engine.Option{engine.WithClock(time.Now)}, clock: "caller"},
	{name: "pipelined", mode: engine.Pipelined, clock: "caller"},
}

// sampleLogSize reads ZCARD of key every 20ms for d and sends the largest size it saw.
func (b *bencher) sampleLogSize(ctx context.Context, key string, d time.Duration) <-chan int64 {
	out := make(chan int64, 1)
	go func() {
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		c := b.clients[0]
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		var largest int64
		for {
			select {
			case <-ctx.Done():
				out <- largest
				return
			case <-tick.C:
				if n, err := c.Do(ctx, c.B().Zcard().Key(key).Build()).AsInt64(); err == nil {
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
}

func (b *bencher) throughput(ctx context.Context, v throughputVariant) (ThroughputRow, error) {
	mode := v.mode
	es, err := b.engines(mode, v.opts...)
	if err != nil {
		return ThroughputRow{}, err
	}
	keys := make([]string, b.cfg.Keys)
	for i := range keys {
		keys[i] = "tp:" + v.name + ":" + v.clock + ":" + strconv.Itoa(i)
	}
	limit := engine.Limit{Max: b.cfg.Limit, Window: b.cfg.Window}
	rngs := make([]*rand.Rand, b.cfg.Concurrency)
	for g := range rngs {
		rngs[g] = rand.New(rand.NewPCG(uint64(g), uint64(mode)))
	}
	lat := make([][]time.Duration, b.cfg.Concurrency)
	admitted := make([]int, b.cfg.Concurrency)
	op := func(g int, e *engine.Engine) error {
		t := time.Now()
		r, err := e.Allow(ctx, keys[rngs[g].IntN(len(keys))], limit)
		if err != nil {
			return err
		}
		lat[g] = append(lat[g], time.Since(t))
		if r.Allowed {
			admitted[g]++
		}
		return nil
	}
	// Warm up connections, script caches and the keys' first entries; then measure.
	if err := b.drive(ctx, min(b.cfg.Duration/5, time.Second), op, es); err != nil {
		return ThroughputRow{}, err
	}
	for g := range lat {
		lat[g] = make([]time.Duration, 0, 1<<16)
		admitted[g] = 0
	}
	before, err := readServerStats(ctx, b.clients[0])
	if err != nil {
		return ThroughputRow{}, err
	}
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	cpu0 := processCPU()
	began := time.Now()
	if err := b.drive(ctx, b.cfg.Duration, op, es); err != nil {
		return ThroughputRow{}, err
	}
	elapsed := time.Since(began)
	cpu1 := processCPU()
	runtime.ReadMemStats(&m1)
	after, err := readServerStats(ctx, b.clients[0])
	if err != nil {
		return ThroughputRow{}, err
	}

	all := slices.Concat(lat...)
	slices.Sort(all)
	n := len(all)
	total := 0
	for _, a := range admitted {
		total += a
	}
	serverUS := after.usec(dataCommands(mode)) - before.usec(dataCommands(mode))
	serverCPU := after.cpuSeconds - before.cpuSeconds
	row := ThroughputRow{
		Mode: v.name, Clock: v.clock, Keys: len(keys), Decisions: n,
		AdmittedShare:   float64(total) / float64(n),
		DecisionsPerSec: float64(n) / elapsed.Seconds(),
		P50us:           us(percentile(all, 50)),
		P99us:           us(percentile(all, 99)),
		P999us:          us(percentile(all, 99.9)),
		AllocsPerOp:     float64(m1.Mallocs-m0.Mallocs) / float64(n),
		BytesPerOp:      float64(m1.TotalAlloc-m0.TotalAlloc) / float64(n),
		ServerUSPerOp:   serverUS / float64(n),
		ServerCPUPerOp:  serverCPU * 1e6 / float64(n),
		ServerCPU:       serverCPU / elapsed.Seconds(),
		ClientCPUPerOp:  (cpu1 - cpu0).Seconds() * 1e6 / float64(n),
	}
	b.logf("throughput/%s (%s clock): %s, %.0f decisions/s, p50 %.0fµs p99 %.0fµs, CPU per decision: server %.1fµs, client %.1fµs",
		v.name, v.clock, elapsed.Round(time.Millisecond), row.DecisionsPerSec, row.P50us, row.P99us, row.ServerCPUPerOp, row.ClientCPUPerOp)
	return row, nil
}

// dataCommands are the commands one decision costs the server, as INFO commandstats names them.
func dataCommands(mode engine.Mode) []string {
	if mode == engine.Pipelined {
		return []string{"zremrangebyscore", "zadd", "zcard", "pexpire"}
	}
	return []string{"evalsha", "eval"}
}

// drive runs op from cfg.Concurrency goroutines, spread over the engines, for d.
func (b *bencher) drive(ctx context.Context, d time.Duration, op func(g int, e *engine.Engine) error, es []*engine.Engine) error {
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
					if ctx.Err() == nil {
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

// MemoryRow is scenario 3: bytes per key for a log at Max entries.
type MemoryRow struct {
	Mode          string  `json:"mode"`
	Limit         int     `json:"limit_max"`
	Attempts      int     `json:"attempts"`
	Entries       int64   `json:"log_entries"`
	Bytes         int64   `json:"memory_usage_bytes"`
	BytesPerEntry float64 `json:"bytes_per_entry"`
	Encoding      string  `json:"encoding"`
}

func (b *bencher) memory(ctx context.Context) ([]MemoryRow, error) {
	began := time.Now()
	var rows []MemoryRow
	c := b.clients[0]
	for _, mode := range modes {
		es, err := b.engines(mode)
		if err != nil {
			return nil, err
		}
		e := es[0]
		for _, max := range []int{10, 100, 1000} {
			overloads := []int{1}
			if mode == engine.Pipelined {
				overloads = append(overloads, 10) // its log keeps every attempt
			}
			for _, times := range overloads {
				key := fmt.Sprintf("mem:%s:%d:%d", mode, max, times)
				limit := engine.Limit{Max: max, Window: time.Hour}
				for i := 0; i < max*times; i++ {
					if _, err := e.Allow(ctx, key, limit); err != nil {
						return nil, err
					}
				}
				full := b.prefix + key
				size, err := c.Do(ctx, c.B().MemoryUsage().Key(full).Samples(0).Build()).AsInt64()
				if err != nil {
					return nil, err
				}
				n, err := c.Do(ctx, c.B().Zcard().Key(full).Build()).AsInt64()
				if err != nil {
					return nil, err
				}
				enc, err := c.Do(ctx, c.B().ObjectEncoding().Key(full).Build()).ToString()
				if err != nil {
					return nil, err
				}
				rows = append(rows, MemoryRow{Mode: mode.String(), Limit: max, Attempts: max * times, Entries: n,
					Bytes: size, BytesPerEntry: float64(size) / float64(n), Encoding: enc})
				if err := c.Do(ctx, c.B().Del().Key(full).Build()).Error(); err != nil {
					return nil, err
				}
			}
		}
	}
	b.logf("memory: %d logs measured in %s", len(rows), time.Since(began).Round(time.Millisecond))
	return rows, nil
}

// CeilingRow is scenario 4: the same atomic script driven by valkey-benchmark.
type CeilingRow struct {
	Tool            string  `json:"tool"`
	Connections     int     `json:"connections"`
	Pipeline        int     `json:"pipeline_depth"`
	Requests        int     `json:"requests"`
	RequestsPerSec  float64 `json:"requests_per_sec"`
	P50ms           float64 `json:"latency_p50_ms"`
	P99ms           float64 `json:"latency_p99_ms"`
	EngineRatio     float64 `json:"engine_atomic_over_ceiling"`
	ServerUSPerCall float64 `json:"server_cpu_us_per_call"`
}

func (b *bencher) ceiling(ctx context.Context, engineRate float64) ([]CeilingRow, string, error) {
	tool := valkeytest.FindTool("valkey-benchmark", "redis-benchmark")
	if tool == "" {
		note := "ceiling: skipped, neither valkey-benchmark nor redis-benchmark is on PATH (Debian: valkey-tools)"
		b.logf("%s", note)
		return nil, note, nil
	}
	es, err := b.engines(engine.Atomic) // loads the script, so EVALSHA finds it
	if err != nil {
		return nil, "", err
	}
	_ = es
	host, port, err := splitHostPort(b.srv.Addr)
	if err != nil {
		return nil, "", err
	}
	sha := decideSHA1()
	// Same in-flight requests as the engine: Concurrency connections with one request each,
	// and Clients connections pipelining Concurrency/Clients each, as valkey-go does.
	shapes := [][2]int{{b.cfg.Concurrency, 1}, {b.cfg.Clients, max(1, b.cfg.Concurrency/b.cfg.Clients)}}
	var rows []CeilingRow
	for _, shape := range shapes {
		rate := engineRate
		if rate <= 0 {
			rate = 30_000
		}
		requests := int(rate * b.cfg.Duration.Seconds())
		args := []string{"-h", host, "-p", port, "-c", strconv.Itoa(shape[0]), "-P", strconv.Itoa(shape[1]),
			"-n", strconv.Itoa(requests), "-r", strconv.Itoa(b.cfg.Keys), "--csv",
			"EVALSHA", sha, "1", b.prefix + "ceil:__rand_int__", "",
			strconv.FormatInt(b.cfg.Window.Microseconds(), 10), strconv.Itoa(b.cfg.Limit), "1"}
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
		row := CeilingRow{Tool: filepath.Base(tool), Connections: shape[0], Pipeline: shape[1], Requests: requests,
			RequestsPerSec: res.rps, P50ms: res.p50ms, P99ms: res.p99ms,
			ServerUSPerCall: (after.usec([]string{"evalsha"}) - before.usec([]string{"evalsha"})) / float64(requests)}
		if engineRate > 0 && res.rps > 0 {
			row.EngineRatio = engineRate / res.rps
		}
		rows = append(rows, row)
		b.logf("ceiling: %s -c %d -P %d: %s, %.0f requests/s", row.Tool, shape[0], shape[1], time.Since(began).Round(time.Millisecond), res.rps)
	}
	return rows, "", nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
