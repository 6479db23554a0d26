package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// The scenarios of what a log costs: memory per key, the server's time per decision by Max
// and cost, and the scripts' ceiling under valkey-benchmark.

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
