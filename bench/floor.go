package main

// The floor scenario: where the server's time per decision goes. It runs bare scripts that do
// what the common decision must do (start a script, read the clock, read the log's header,
// write it back, set the expiry) and nothing else, the textbook sorted-set script, and the
// engine's own scripts as the engine sends them, each at the same load, and reads each one's
// server time per call from INFO commandstats. The row "TIME+LINDEX+LSET+PEXPIRE" is the
// floor: the four calls decide.lua's common path makes, without any of its Lua around them.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/scripts"
)

// The floor scenario's load: floorPipeline script calls per DoMulti from every goroutine, paced
// so that each key holds about floorEntriesPerKey live entries (decisions per second = entries
// per key × keys / window).
const (
	floorPipeline      = 16
	floorEntriesPerKey = 7
	// floorBatch is the decisions per decide_batch.lua call: about what the batched engine
	// groups under the bench's load (the throughput table's decisions/call).
	floorBatch = 8
	// floorPeekEvery: in the peek row, one peek.lua call goes with every this many decide.lua
	// calls, which keep the logs at their steady size while peeks (which write nothing) read
	// them.
	floorPeekEvery = 4
	// floorSample is how many keys a row reads at its end to count their live entries.
	floorSample = 200
)

// floorHeaderBytes is the size of a log's header holding floorEntriesPerKey cost-1 entries in
// its open chunk (lib_log.lua: a kind byte, five 7-byte fields, 8 bytes per entry): the value the
// bare LSET rows write, so that they move as many bytes as decide.lua does.
const floorHeaderBytes = 1 + 5*7 + 8*floorEntriesPerKey

// floorTTLms is the bare rows' PEXPIRE: longer than any run, so that no prefilled list expires
// under them (LSET on a missing key is an error); the value costs PEXPIRE nothing more.
const floorTTLms = 600_000

// The bare scripts: constant values, no logic, one key each.
var (
	bareReturnScript = "return 1"
	bareWriteScript  = fmt.Sprintf("redis.call('LINDEX', KEYS[1], 0)\n"+
		"redis.call('LSET', KEYS[1], 0, '%s')\n"+
		"redis.call('PEXPIRE', KEYS[1], %d)\n"+
		"return 1\n", strings.Repeat("h", floorHeaderBytes), floorTTLms)
	bareTimeWriteScript = "redis.call('TIME')\n" + bareWriteScript
)

// textbookScript is the sliding-window log as tutorials write it, one EVALSHA on a sorted set
// whose members are the admitted requests' times: trim what left the window, count, add only
// below max, set the expiry. The member is the time itself, so two admissions of one key in
// the same microsecond count once (the textbook's flaw, not a cost).
//
// KEYS[1] the sorted set; ARGV[1] the window in microseconds; ARGV[2] max. Reply: 1 admitted,
// 0 denied.
const textbookScript = `local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[1]))
local allowed = 0
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now, now)
  allowed = 1
end
redis.call('PEXPIRE', KEYS[1], math.ceil(tonumber(ARGV[1]) / 1000))
return allowed
`

// FloorRow is one row of the floor scenario: one script's server time per call, at the
// scenario's load.
type FloorRow struct {
	// Row names what runs; Script is the script the row's USPerCall is of.
	Row    string `json:"row"`
	Script string `json:"script"`
	// Command is the commandstats entry read: evalsha, or evalsha_ro for peek.lua.
	Command          string  `json:"command"`
	Calls            int64   `json:"calls"`
	CallsPerSec      float64 `json:"calls_per_sec"`
	DecisionsPerCall int     `json:"decisions_per_call"`
	// USPerCall is INFO commandstats' usec over calls (its usec_per_call, unrounded) for
	// Command, each slice counted from a CONFIG RESETSTAT at its start: the median of the row's
	// slices.
	USPerCall     float64 `json:"server_us_per_call"`
	USPerDecision float64 `json:"server_us_per_decision"`
	// FloorUS is the floor row's µs per call measured between this row's slices (the median of
	// those slices); OverFloor is USPerDecision over it.
	FloorUS   float64 `json:"floor_us_per_call_between"`
	OverFloor float64 `json:"per_decision_over_floor"`
	// LiveEntries is the mean live entries (inside the window) of floorSample of the row's keys
	// at its end; 0 for the rows that keep no log.
	LiveEntries float64 `json:"live_entries_per_key,omitempty"`
}

// floorFloorRow names the row the others are compared with.
const floorFloorRow = "TIME+LINDEX+LSET+PEXPIRE"

// floorCase is one row: its keys, the script calls of one DoMulti, and how to count its logs.
type floorCase struct {
	row, script, command string
	decisionsPerCall     int
	keys                 string // the key set: rows that name the same set share it
	// calls appends one DoMulti's commands: floorPipeline calls of the row's script, which
	// take floorPipeline × decisionsPerCall decisions (the pacing counts decisions).
	calls func(f *floorRun, c valkey.Client, rng *rand.Rand, cmds valkey.Commands) valkey.Commands
	// live counts one key's live entries; nil for rows that keep no log.
	live func(ctx context.Context, f *floorRun, key string) (int, error)
}

// floorRun holds one scenario run's digests, keys and limit arguments.
type floorRun struct {
	b               *bencher
	sha             map[string]string // script name -> digest
	keys            map[string][]string
	window, max     string // the limit as the scripts take it: µs, events
	decideArgs      []string
	batchArgs       []string // the limit part of decide_batch.lua's ARGV, before the requests'
	batchPerRequest []string
	windowDur       time.Duration
}

var floorCases = []floorCase{
	{row: "return 1", script: "bare", command: "evalsha", decisionsPerCall: 1, keys: "bare",
		calls: func(f *floorRun, c valkey.Client, rng *rand.Rand, cmds valkey.Commands) valkey.Commands {
			return f.single(c, rng, cmds, "bare", "return", nil)
		}},
	{row: "LINDEX+LSET+PEXPIRE", script: "bare", command: "evalsha", decisionsPerCall: 1, keys: "bare",
		calls: func(f *floorRun, c valkey.Client, rng *rand.Rand, cmds valkey.Commands) valkey.Commands {
			return f.single(c, rng, cmds, "bare", "write", nil)
		}},
	{row: floorFloorRow, script: "bare", command: "evalsha", decisionsPerCall: 1, keys: "bare",
		calls: func(f *floorRun, c valkey.Client, rng *rand.Rand, cmds valkey.Commands) valkey.Commands {
			return f.single(c, rng, cmds, "bare", "timewrite", nil)
		}},
	{row: "textbook sorted set", script: "textbook", command: "evalsha", decisionsPerCall: 1, keys: "textbook",
		calls: func(f *floorRun, c valkey.Client, rng *rand.Rand, cmds valkey.Commands) valkey.Commands {
			return f.single(c, rng, cmds, "textbook", "textbook", []string{f.window, f.max})
		},
		live: func(ctx context.Context, f *floorRun, key string) (int, error) {
			c := f.b.clients[0]
			since := time.Now().Add(-f.windowDur).UnixMicro()
			n, err := c.Do(ctx, c.B().Zcount().Key(key).Min("("+strconv.FormatInt(since, 10)).Max("+inf").Build()).AsInt64()
			return int(n), err
		}},
	{row: "decide.lua", script: "decide.lua", command: "evalsha", decisionsPerCall: 1, keys: "decide",
		calls: func(f *floorRun, c valkey.Client, rng *rand.Rand, cmds valkey.Commands) valkey.Commands {
			return f.single(c, rng, cmds, "decide", "decide", f.decideArgs)
		},
		live: liveInLog},
	{row: fmt.Sprintf("decide_batch.lua (%d keys)", floorBatch), script: "decide_batch.lua", command: "evalsha",
		decisionsPerCall: floorBatch, keys: "batch",
		calls: func(f *floorRun, c valkey.Client, rng *rand.Rand, cmds valkey.Commands) valkey.Commands {
			return f.batch(c, rng, cmds, "batch", "batch")
		},
		live: liveInLog},
	{row: fmt.Sprintf("peek.lua (1 per %d decide.lua)", floorPeekEvery), script: "peek.lua", command: "evalsha_ro",
		decisionsPerCall: 1, keys: "decide",
		calls: func(f *floorRun, c valkey.Client, rng *rand.Rand, cmds valkey.Commands) valkey.Commands {
			keys := f.keys["decide"]
			for i := 0; i < floorPipeline; i++ {
				cmds = append(cmds, c.B().Evalsha().Sha1(f.sha["decide"]).Numkeys(1).Key(keys[rng.IntN(len(keys))]).Arg(f.decideArgs...).Build())
				if i%floorPeekEvery == 0 {
					cmds = append(cmds, c.B().EvalshaRo().Sha1(f.sha["peek"]).Numkeys(1).Key(keys[rng.IntN(len(keys))]).Arg(f.decideArgs...).Build())
				}
			}
			return cmds // paced by decide.lua's calls, which keep the logs
		},
		live: liveInLog},
}

// batch appends floorPipeline calls of the named batch script, floorBatch random keys of the
// set each.
func (f *floorRun) batch(c valkey.Client, rng *rand.Rand, cmds valkey.Commands, set, script string) valkey.Commands {
	keys := f.keys[set]
	for i := 0; i < floorPipeline; i++ {
		ks := make([]string, floorBatch)
		for j := range ks {
			ks[j] = keys[rng.IntN(len(keys))]
		}
		args := append(append([]string(nil), f.batchArgs...), f.batchPerRequest...)
		cmds = append(cmds, c.B().Evalsha().Sha1(f.sha[script]).Numkeys(floorBatch).Key(ks...).Arg(args...).Build())
	}
	return cmds
}

// single appends floorPipeline calls of the named script, one random key of the set each.
func (f *floorRun) single(c valkey.Client, rng *rand.Rand, cmds valkey.Commands, set, script string, args []string) valkey.Commands {
	keys := f.keys[set]
	for i := 0; i < floorPipeline; i++ {
		cmds = append(cmds, c.B().Evalsha().Sha1(f.sha[script]).Numkeys(1).Key(keys[rng.IntN(len(keys))]).Arg(args...).Build())
	}
	return cmds
}

// liveInLog counts the entries of an engine log inside the window (inspect.Read reads the log as
// stored, entries not yet trimmed included).
func liveInLog(ctx context.Context, f *floorRun, key string) (int, error) {
	log, err := f.b.readLog(ctx, strings.TrimPrefix(key, f.b.prefix), 10*f.b.cfg.Limit)
	if err != nil {
		return 0, err
	}
	since, n := time.Now().Add(-f.windowDur), 0
	for _, e := range log.Entries {
		if e.At.After(since) {
			n++
		}
	}
	return n, nil
}

// floor runs every floorCase in order. A row that keeps logs first runs one window at the
// load (its logs reach their steady size). Then its measured time, 2/5 of -duration, goes in
// floorSlices slices, each after a quarter as long of the floor row: the row's µs per call is
// the median of its slices', and its ratio is over the median of the floor slices between
// them (its live entries are counted right after its last slice), so that both are measured in the same seconds of a machine whose other load comes and
// goes. The floor row itself is measured the same way, without the pairs.
func (b *bencher) floor(ctx context.Context) ([]FloorRow, string, error) {
	f, err := b.newFloorRun(ctx)
	if err != nil {
		return nil, "", err
	}
	rate := float64(floorEntriesPerKey*b.cfg.Keys) / b.cfg.Window.Seconds()
	slice := max(b.cfg.Duration*2/5/floorSlices, 20*time.Millisecond)
	warmup := b.cfg.Window + b.cfg.Window/10
	var floorCase floorCase
	for _, fc := range floorCases {
		if fc.row == floorFloorRow {
			floorCase = fc
		}
	}
	var note string
	var rows []FloorRow
	for _, fc := range floorCases {
		if fc.live != nil {
			if _, err := b.floorLoad(ctx, warmup, rate, f, fc); err != nil {
				return nil, "", fmt.Errorf("%s: %w", fc.row, err)
			}
		}
		var mine, floors []float64
		var calls int64
		var elapsed time.Duration
		for i := 0; i < floorSlices; i++ {
			if fc.row != floorFloorRow {
				s, err := b.floorSlice(ctx, slice/4, rate, f, floorCase, &note)
				if err != nil {
					return nil, "", fmt.Errorf("%s: %w", floorCase.row, err)
				}
				if s.calls > 0 {
					floors = append(floors, s.usec/float64(s.calls))
				}
			}
			s, err := b.floorSlice(ctx, slice, rate, f, fc, &note)
			if err != nil {
				return nil, "", fmt.Errorf("%s: %w", fc.row, err)
			}
			if s.calls > 0 {
				mine = append(mine, s.usec/float64(s.calls))
			}
			calls, elapsed = calls+s.calls, elapsed+s.elapsed
		}
		if fc.row == floorFloorRow {
			floors = mine
		}
		if len(mine) == 0 || len(floors) == 0 {
			return nil, "", fmt.Errorf("%s: commandstats counted no %s", fc.row, fc.command)
		}
		row := FloorRow{Row: fc.row, Script: fc.script, Command: fc.command, Calls: calls,
			CallsPerSec: float64(calls) / elapsed.Seconds(), DecisionsPerCall: fc.decisionsPerCall,
			USPerCall: median(mine), FloorUS: median(floors)}
		row.USPerDecision = row.USPerCall / float64(fc.decisionsPerCall)
		row.OverFloor = row.USPerDecision / row.FloorUS
		if fc.live != nil {
			if row.LiveEntries, err = f.meanLive(ctx, fc); err != nil {
				return nil, "", fmt.Errorf("%s: %w", fc.row, err)
			}
		}
		rows = append(rows, row)
		b.logf("floor/%s: %d calls, %.0f calls/s, %.2f server µs/call, %.2f× the floor (%.2f µs)",
			fc.row, calls, row.CallsPerSec, row.USPerCall, row.OverFloor, row.FloorUS)
	}
	return rows, note, nil
}

// floorSlices is how many slices a row's measured time is cut into.
const floorSlices = 5

// floorSliceStats is what commandstats counted for one row's command over one slice.
type floorSliceStats struct {
	calls   int64
	usec    float64
	elapsed time.Duration
}

// floorSlice resets the server's statistics (CONFIG RESETSTAT; where it is refused, *note
// says so and the slice is read as a difference), runs fc at the load for d, and returns what
// INFO commandstats counted for fc's command.
func (b *bencher) floorSlice(ctx context.Context, d time.Duration, rate float64, f *floorRun, fc floorCase, note *string) (floorSliceStats, error) {
	c := b.clients[0]
	if err := c.Do(ctx, c.B().ConfigResetstat().Build()).Error(); err != nil && *note == "" {
		*note = "floor: CONFIG RESETSTAT refused (" + err.Error() + "); rows read as differences of INFO commandstats"
	}
	before, err := readServerStats(ctx, c)
	if err != nil {
		return floorSliceStats{}, err
	}
	began := time.Now()
	if _, err := b.floorLoad(ctx, d, rate, f, fc); err != nil {
		return floorSliceStats{}, err
	}
	elapsed := time.Since(began)
	after, err := readServerStats(ctx, c)
	if err != nil {
		return floorSliceStats{}, err
	}
	cmd := []string{fc.command}
	return floorSliceStats{calls: after.calls(cmd) - before.calls(cmd), usec: after.usec(cmd) - before.usec(cmd), elapsed: elapsed}, nil
}

// median is the middle of xs (the mean of the two middle ones for an even count); xs is sorted
// in place.
func median(xs []float64) float64 {
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 1 {
		return xs[n/2]
	}
	return (xs[n/2-1] + xs[n/2]) / 2
}

// newFloorRun loads the scripts, names the key sets and fills the bare rows' lists: one header
// sized element per key, which their LINDEX reads and their LSET rewrites.
func (b *bencher) newFloorRun(ctx context.Context) (*floorRun, error) {
	f := &floorRun{b: b, sha: map[string]string{}, keys: map[string][]string{}, windowDur: b.cfg.Window,
		window: strconv.FormatInt(b.cfg.Window.Microseconds(), 10), max: strconv.Itoa(b.cfg.Limit)}
	f.decideArgs = []string{singleArg(b.cfg.Window.Microseconds(), b.cfg.Limit)}
	f.batchArgs = []string{"", "1", "2", f.window, f.max}
	for i := 0; i < floorBatch; i++ {
		f.batchPerRequest = append(f.batchPerRequest, "1", "1")
	}
	c := b.clients[0]
	for name, src := range map[string]string{"return": bareReturnScript, "write": bareWriteScript, "timewrite": bareTimeWriteScript,
		"textbook": textbookScript, "decide": scripts.Source("decide"), "batch": scripts.Source("decide_batch"), "peek": scripts.Source("peek")} {
		sha, err := c.Do(ctx, c.B().ScriptLoad().Script(src).Build()).ToString()
		if err != nil {
			return nil, fmt.Errorf("SCRIPT LOAD %s: %w", name, err)
		}
		f.sha[name] = sha
	}
	for _, fc := range floorCases {
		if f.keys[fc.keys] != nil {
			continue
		}
		keys := make([]string, b.cfg.Keys)
		for i := range keys {
			keys[i] = b.prefix + "floor:" + fc.keys + ":" + strconv.Itoa(i)
		}
		f.keys[fc.keys] = keys
	}
	header := strings.Repeat("h", floorHeaderBytes)
	var cmds valkey.Commands
	for _, k := range f.keys["bare"] {
		cmds = append(cmds, c.B().Rpush().Key(k).Element(header).Build())
	}
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			return nil, fmt.Errorf("fill the bare rows' lists: %w", err)
		}
	}
	return f, nil
}

// floorLoad sends fc's calls from cfg.Concurrency goroutines spread over the clients for d,
// one DoMulti at a time each, paced so that all of them together take rate decisions per
// second (fewer when the server cannot keep up). It returns the decisions sent.
func (b *bencher) floorLoad(ctx context.Context, d time.Duration, rate float64, f *floorRun, fc floorCase) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var sent atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, b.cfg.Concurrency)
	for g := 0; g < b.cfg.Concurrency; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			c := b.clients[g%len(b.clients)]
			rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
			var cmds valkey.Commands
			// Every goroutine sends one DoMulti per interval, the goroutines staggered over it.
			per := floorPipeline * fc.decisionsPerCall
			interval := time.Duration(float64(per*b.cfg.Concurrency) / rate * float64(time.Second))
			next := time.Now().Add(interval * time.Duration(g) / time.Duration(b.cfg.Concurrency))
			for {
				if wait := time.Until(next); wait > 0 {
					select {
					case <-ctx.Done():
						return
					case <-time.After(wait):
					}
				}
				if ctx.Err() != nil {
					return
				}
				cmds = fc.calls(f, c, rng, cmds[:0])
				for _, r := range c.DoMulti(ctx, cmds...) {
					if err := r.Error(); err != nil {
						if !runEnded(ctx, err) {
							errs[g] = err
						}
						return
					}
				}
				sent.Add(int64(per))
				// Behind schedule by more than one interval (the server is slower than the
				// rate): start again from now rather than send a burst.
				next = next.Add(interval)
				if now := time.Now(); now.Sub(next) > interval {
					next = now
				}
			}
		}(g)
	}
	wg.Wait()
	return sent.Load(), errors.Join(errs...)
}

// meanLive is the mean live entries of floorSample of fc's keys, spread over the set.
func (f *floorRun) meanLive(ctx context.Context, fc floorCase) (float64, error) {
	keys := f.keys[fc.keys]
	n := min(floorSample, len(keys))
	total := 0
	for i := 0; i < n; i++ {
		live, err := fc.live(ctx, f, keys[i*len(keys)/n])
		if err != nil {
			return 0, err
		}
		total += live
	}
	return float64(total) / float64(n), nil
}

// floorTarget is the decision script's aim: decide.lua's server time per call at most this many times
// the floor's.
const floorTarget = 1.3

// writeFloor prints the floor table, then decide.lua's ratio to the floor against the target.
func writeFloor(w io.Writer, rows []FloorRow) {
	fmt.Fprintf(w, "\n### Where the server's time goes: µs per call (INFO commandstats), against the %s floor\n\n", floorFloorRow)
	table(w, []string{"row", "command", "calls", "calls/s", "decisions/call", "server µs/call", "µs/decision",
		"floor µs/call (between)", "× floor", "live entries/key"})
	for _, r := range rows {
		live := "-"
		if r.LiveEntries > 0 {
			live = f1(r.LiveEntries)
		}
		row(w, r.Row, r.Command, strconv.FormatInt(r.Calls, 10), f0(r.CallsPerSec), strconv.Itoa(r.DecisionsPerCall),
			fmt.Sprintf("%.2f", r.USPerCall), fmt.Sprintf("%.2f", r.USPerDecision), fmt.Sprintf("%.2f", r.FloorUS),
			fmt.Sprintf("%.2f", r.OverFloor), live)
	}
	for _, r := range rows {
		if r.Script == "decide.lua" {
			verdict := "within"
			if r.OverFloor > floorTarget {
				verdict = "above"
			}
			fmt.Fprintf(w, "\n%s: %.2f× the floor, %s the target of %.1f×\n", r.Row, r.OverFloor, verdict, floorTarget)
		}
	}
}

// singleArg is decide.lua's (and peek.lua's) one argument (its header documents it) for a
// request of one event on the server's clock (SERVER_CLOCK, 2^60) against max per window µs:
// 8-byte big-endian integers.
func singleArg(window int64, max int) string {
	var b []byte
	for _, v := range []int64{1 << 60, 1, window, int64(max)} {
		b = binary.BigEndian.AppendUint64(b, uint64(v))
	}
	return string(b)
}
