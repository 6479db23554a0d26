package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/bench/internal/cputime"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// clusterPrimaries is the size of the cluster scenario's cluster.
const clusterPrimaries = 3

// ClusterRow is the cluster scenario for one mode: every goroutine on random keys out of
// many, on a cluster of valkey-server processes of its own, unbatched and batched on the same
// cluster. In a cluster a batch goes to the primary that serves its keys' slots and holds keys
// of all of them (the engine's slot routing), so it stays several decisions per call with many
// keys.
type ClusterRow struct {
	Mode            string  `json:"mode"`
	Primaries       int     `json:"primaries"`
	Keys            int     `json:"keys"`
	Decisions       int     `json:"decisions"`
	AdmittedShare   float64 `json:"admitted_fraction"`
	DecisionsPerSec float64 `json:"decisions_per_sec"`
	P50us           float64 `json:"latency_p50_us"`
	P99us           float64 `json:"latency_p99_us"`
	// MeanBatch is decisions per script call (EVALSHA and EVAL summed over the primaries).
	MeanBatch float64 `json:"decisions_per_script_call"`
	// ServerCPUPerOp is the primaries' CPU time (user and system, summed) per decision, and
	// ServerUSPerOp the part of it INFO commandstats counts in the script calls.
	ServerCPUPerOp float64 `json:"server_cpu_us_per_decision"`
	ServerUSPerOp  float64 `json:"server_command_us_per_decision"`
	// ClientCPUPerOp is this process's CPU time per decision.
	ClientCPUPerOp float64 `json:"client_cpu_us_per_decision"`
}

// clusterVariants are the cluster scenario's rows, in the order they run.
var clusterVariants = []throughputVariant{
	{name: "atomic", opts: unbatched, clock: "server"},
	{name: "batched", opts: batched, clock: "server"},
}

// cluster runs the cluster scenario: it starts a cluster of clusterPrimaries primaries (no
// replicas) of valkey-server processes through valkeytest, whatever -addr says, connects
// cfg.Clients cluster clients, and measures each of clusterVariants on cfg.Keys keys from
// cfg.Concurrency goroutines. It stops the cluster before it returns. Without valkey-server on
// PATH it is skipped, with a note.
func (b *bencher) cluster(ctx context.Context) ([]ClusterRow, string, error) {
	if valkeytest.FindBinary() == "" {
		note := "cluster: skipped, a cluster needs valkey-server (or redis-server 7+) on PATH"
		b.logf("%s", note)
		return nil, note, nil
	}
	began := time.Now()
	c, err := valkeytest.StartCluster(ctx, clusterPrimaries, 0)
	if err != nil {
		return nil, "", fmt.Errorf("start a cluster: %w", err)
	}
	defer c.Close()
	b.logf("cluster: %d primaries up in %s", clusterPrimaries, time.Since(began).Round(time.Millisecond))
	var primaries []string
	for _, p := range c.Primaries {
		primaries = append(primaries, p.Addr)
	}
	var clients []valkey.Client
	defer func() {
		for _, cl := range clients {
			cl.Close()
		}
	}()
	for i := 0; i < b.cfg.Clients; i++ {
		cl, err := valkey.NewClient(valkey.ClientOption{InitAddress: primaries, MaxFlushDelay: b.cfg.FlushDelay})
		if err != nil {
			return nil, "", fmt.Errorf("connect to the cluster: %w", err)
		}
		clients = append(clients, cl)
	}
	var rows []ClusterRow
	for _, v := range clusterVariants {
		row, err := b.clusterRow(ctx, c, clients, v)
		if err != nil {
			return nil, "", fmt.Errorf("%s: %w", v.name, err)
		}
		rows = append(rows, row)
	}
	return rows, "", nil
}

// clusterRow measures one variant on the cluster c through clients.
func (b *bencher) clusterRow(ctx context.Context, c *valkeytest.Cluster, clients []valkey.Client, v throughputVariant) (ClusterRow, error) {
	engines, err := b.enginesOn(clients, v.opts...)
	if err != nil {
		return ClusterRow{}, err
	}
	es := make([]decider, len(engines))
	for i, e := range engines {
		es[i] = e
	}
	load, err := b.randomLoad(ctx, es, "cluster:"+v.name, 17)
	if err != nil {
		return ClusterRow{}, err
	}
	before, err := readClusterStats(ctx, c)
	if err != nil {
		return ClusterRow{}, err
	}
	cpu0 := cputime.Process()
	began := time.Now()
	if err := drive(ctx, b, b.cfg.Duration, load.op, es); err != nil {
		return ClusterRow{}, err
	}
	elapsed := time.Since(began)
	cpu1 := cputime.Process()
	after, err := readClusterStats(ctx, c)
	if err != nil {
		return ClusterRow{}, err
	}
	all, admitted := load.measured()
	n := len(all)
	if n == 0 {
		return ClusterRow{}, errors.New("no decision was measured")
	}
	scripts := dataCommands(false)
	row := ClusterRow{
		Mode: v.name, Primaries: len(c.Primaries), Keys: len(load.keys), Decisions: n,
		AdmittedShare:   float64(admitted) / float64(n),
		DecisionsPerSec: float64(n) / elapsed.Seconds(),
		P50us:           us(percentile(all, 50)),
		P99us:           us(percentile(all, 99)),
		MeanBatch:       meanBatch(n, before, after, false),
		ServerCPUPerOp:  (after.cpuSeconds - before.cpuSeconds) * 1e6 / float64(n),
		ServerUSPerOp:   (after.usec(scripts) - before.usec(scripts)) / float64(n),
		ClientCPUPerOp:  (cpu1 - cpu0).Seconds() * 1e6 / float64(n),
	}
	b.logf("cluster/%s: %s, %.0f decisions/s, %.1f decisions per call (%d script calls), p50 %.0fµs p99 %.0fµs",
		v.name, elapsed.Round(time.Millisecond), row.DecisionsPerSec, row.MeanBatch,
		after.calls(scripts)-before.calls(scripts), row.P50us, row.P99us)
	return row, nil
}

// readClusterStats reads every primary's INFO commandstats and cpu, summed.
func readClusterStats(ctx context.Context, c *valkeytest.Cluster) (serverStats, error) {
	sum := serverStats{usecByCommand: map[string]float64{}, callsByCommand: map[string]int64{}}
	for _, p := range c.Primaries {
		s, err := readServerStats(ctx, p.Client())
		if err != nil {
			return serverStats{}, fmt.Errorf("%s: %w", p.Addr, err)
		}
		for name, calls := range s.callsByCommand {
			sum.callsByCommand[name] += calls
		}
		for name, usec := range s.usecByCommand {
			sum.usecByCommand[name] += usec
		}
		sum.cpuSeconds += s.cpuSeconds
	}
	return sum, nil
}

// writeCluster prints the cluster scenario's table, and batched over unbatched.
func writeCluster(w io.Writer, rows []ClusterRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n### Cluster: %d primaries, %d keys\n\n", rows[0].Primaries, rows[0].Keys)
	table(w, []string{"mode", "decisions/s", "p50 µs", "p99 µs", "decisions/call", "server CPU µs/decision", "(in commands)",
		"client CPU µs/decision", "admitted"})
	rates := map[string]float64{}
	for _, r := range rows {
		row(w, r.Mode, f0(r.DecisionsPerSec), f0(r.P50us), f0(r.P99us), f1(r.MeanBatch), f1(r.ServerCPUPerOp), f1(r.ServerUSPerOp),
			f1(r.ClientCPUPerOp), pct(r.AdmittedShare))
		rates[r.Mode] = r.DecisionsPerSec
	}
	if rates["atomic"] > 0 && rates["batched"] > 0 {
		fmt.Fprintf(w, "\ndecisions/s on the same cluster: batched / atomic (unbatched) %.2f\n", rates["batched"]/rates["atomic"])
	}
}
