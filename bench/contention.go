package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/strictrate/strictrate/bench/internal/cputime"
	"github.com/strictrate/strictrate/engine"
)

// The scenarios of many goroutines on one key or on many: exactness under contention and
// throughput, and the load that drives them.

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
