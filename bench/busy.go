package main

// The busykeys scenario: what a decision costs the server on a busy key, one whose log holds
// many live entries, by the log's size (the design's aim: a busy key should cost what an idle one
// does). Each size N gets a key of its own whose log holds exactly N live entries of cost 1,
// one per distinct time: on the caller's clock (WithClock), a clock the scenario alone moves,
// the entries lie dt apart in a window of N × dt (about an hour, so that no key expires
// during the run). Then, one call per decision (an unbatched engine, no deny cache), rounds of:
//
//   - admission: Max N+1, each admission one tick later than the newest entry, which trims
//     the oldest entry and adds one, so the log stays at N;
//   - denial (full): Max N, n 1, at the newest entry's time (nothing trims);
//   - denial (limit lowered to half): Max N/2 (at least 1), n 1;
//   - denial (cost = Max): Max N, n N.
//
// Every decision must come out as its case says (an admission admitted, a denial denied),
// else the scenario fails: that doubles as an exactness check. So must each log's live
// entries, read with package inspect before the first round and after the last. The server's
// time per decision is INFO commandstats' evalsha µs over its calls; a cell's figure is the
// median of busyRounds rounds, each round running every size's cells in turn. Its ratio to the
// small admission (the smallest log's) is the median of each round's ratio to small
// admissions taken between its chunks: the machine's other load comes and goes, and both
// sides of a ratio see the same seconds of it.

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/strictrate/strictrate/engine"
)

const (
	// busyRounds is how many times each cell is measured; its figure is their median.
	busyRounds = 3
	// busySpan is about every key's window: far longer than the run, so that no key's expiry
	// (which follows its window) comes during it.
	busySpan = time.Hour
	// busyTarget is the busy path's aim: no cell of the table costs the server more than this many
	// times the admission on the smallest log.
	busyTarget = 1.5
	// busyWarmup is how many admissions each key takes, unmeasured, before the first round:
	// two open chunks' worth (lib_log.lua keeps the newest 32 entries in the header), so that
	// every log has gone through the moves and trims of its steady state.
	busyWarmup = 64
)

// busyRefDecisions is how many admissions on the smallest log each round of another cell
// takes, between its chunks (busyRound), as the reference of its ratio (BusyCell.OverSmall);
// busyChunks is how many chunks a round is cut into. Both keep every chunk a multiple of 32.
const (
	busyRefDecisions = 512
	busyChunks       = 16
)

// defaultBusySizes are -busy-sizes' default: the log sizes the table has a row for. 32 and
// 33 straddle the header's open chunk (lib_log.lua): up to 32 live entries, a log is its
// header alone.
var defaultBusySizes = []int{5, 32, 33, 100, 1_000, 10_000, 100_000}

// maxBusySize bounds -busy-sizes: a log of a million entries takes a minute or more to fill.
const maxBusySize = 1_000_000

// busyDecisions is how many decisions each cell of a size takes per round: a multiple of 32
// (the open chunk), so that every round of admissions moves the same number of chunks; fewer
// on the largest logs, whose decisions take longest.
func busyDecisions(n int) int {
	if n >= 100_000 {
		return 1024
	}
	return 2048
}

var busyT0 = time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC)

// busyCase is one column of the table: the limit and cost one decision asks for on a log of n
// live entries, and whether it must be admitted.
type busyCase struct {
	column string
	admit  bool
	limit  func(n int) (max, cost int)
}

var busyCases = []busyCase{
	{column: "admission", admit: true, limit: func(n int) (int, int) { return n + 1, 1 }},
	{column: "denial (full)", limit: func(n int) (int, int) { return n, 1 }},
	{column: "denial (limit lowered to half)", limit: func(n int) (int, int) { return max(n/2, 1), 1 }},
	{column: "denial (cost = Max)", limit: func(n int) (int, int) { return n, n }},
}

// BusyCell is one case's figures on one log size.
type BusyCell struct {
	// Case is the column: a busyCases' name.
	Case string `json:"case"`
	// Max and Cost are the decision's limit Max and request cost n.
	Max  int `json:"limit_max"`
	Cost int `json:"cost_per_request"`
	// Decisions is how many decisions the cell took over its rounds, every one of them as the
	// case wants (admitted, or denied): the scenario fails on any other.
	Decisions int `json:"decisions"`
	Admitted  int `json:"admitted"`
	// USPerDecision is the median of RoundsUS, each round's evalsha µs per call (INFO
	// commandstats).
	USPerDecision float64   `json:"server_us_per_decision"`
	RoundsUS      []float64 `json:"server_us_per_decision_by_round"`
	// OverSmall is the median of RoundsOver: each round's µs per call over that of the
	// admissions on the smallest log (the small admission) taken between its chunks
	// (busyRound); 1 for the small admission itself.
	OverSmall  float64   `json:"per_decision_over_small_admission"`
	RoundsOver []float64 `json:"per_decision_over_small_admission_by_round"`
}

// BusyRow is one log size of the busykeys scenario.
type BusyRow struct {
	// Entries is the live entries the key's log holds through the row's decisions: N.
	Entries  int   `json:"live_entries"`
	WindowUS int64 `json:"window_us"`
	// LiveBefore and LiveAfter are the log's live entries as inspect.Read counts them after the
	// fill and after the last round: both must be Entries.
	LiveBefore int `json:"live_entries_before_rounds"`
	LiveAfter  int `json:"live_entries_after_rounds"`
	// Cells are the cases in busyCases' order.
	Cells []BusyCell `json:"cases"`
	// Bytes is MEMORY USAGE of the key after the last round (every element counted).
	Bytes         int64   `json:"memory_usage_bytes"`
	BytesPerEntry float64 `json:"memory_usage_bytes_per_entry"`
	FillSeconds   float64 `json:"fill_seconds"`
}

// busyClock is a key's caller's clock: tick × dt after busyT0. Only the scenario moves it,
// one goroutine at a time.
type busyClock struct {
	dt   time.Duration
	tick int64
}

func (c *busyClock) now() time.Time { return busyT0.Add(time.Duration(c.tick) * c.dt) }

// busyKey is one size's key, its clock and the engine that reads it.
type busyKey struct {
	n      int
	key    string
	window time.Duration
	clock  *busyClock
	e      *engine.Engine
	row    BusyRow
}

// newBusyKey makes the key of a log of n live entries, empty, its clock at busyT0 and its
// engine on the run's i-th client (modulo their number).
func (b *bencher) newBusyKey(ctx context.Context, n, i int) (*busyKey, error) {
	dt := (busySpan / time.Duration(n)).Truncate(time.Microsecond)
	k := &busyKey{n: n, key: "busy:" + uuid.NewString()[:8] + ":" + strconv.Itoa(n), window: time.Duration(n) * dt,
		clock: &busyClock{dt: dt}}
	es, err := b.enginesOn(b.clients[i%len(b.clients):][:1], engine.WithBatching(false), engine.WithClock(k.clock.now))
	if err != nil {
		return nil, err
	}
	k.e, k.row = es[0], BusyRow{Entries: n, WindowUS: k.window.Microseconds(), Cells: make([]BusyCell, len(busyCases))}
	for j, c := range busyCases {
		k.row.Cells[j].Case = c.column
		k.row.Cells[j].Max, k.row.Cells[j].Cost = c.limit(n)
	}
	return k, nil
}

// busySizes is the scenario's log sizes, -busy-sizes (nil: the default), smallest first.
func (c config) busySizes() []int {
	if len(c.BusySizes) == 0 {
		return defaultBusySizes
	}
	return slices.Sorted(slices.Values(c.BusySizes))
}

// busyKeys fills every size's key (all at once, one goroutine each), then measures every cell
// busyRounds times, round by round, and checks each log still holds its N live entries: a row
// per size, smallest first.
func (b *bencher) busyKeys(ctx context.Context) ([]BusyRow, error) {
	began := time.Now()
	sizes := b.cfg.busySizes()
	var keys []*busyKey
	defer func() { // on an error too: a key lives about busySpan otherwise
		for _, k := range keys {
			_ = b.dropKey(context.WithoutCancel(ctx), k.key)
		}
	}()
	for i, n := range sizes {
		k, err := b.newBusyKey(ctx, n, i)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	var wg sync.WaitGroup
	var err error
	errs := make([]error, len(keys))
	for i, k := range keys {
		wg.Go(func() { errs[i] = b.busyFill(ctx, k) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("fill %s live entries: %w", commas(keys[i].n), err)
		}
	}
	b.logf("busykeys: %d logs filled in %s", len(keys), time.Since(began).Round(time.Millisecond))
	for _, k := range keys {
		if k.row.LiveBefore, err = b.busyLive(ctx, k); err != nil {
			return nil, err
		}
		// Unmeasured: the logs reach the steady state of the admissions to come.
		if _, err := b.busyCell(ctx, k, busyCases[0], busyWarmup); err != nil {
			return nil, err
		}
	}

	for round := 0; round < busyRounds; round++ {
		for i, k := range keys {
			for j, c := range busyCases {
				us, over, err := b.busyRound(ctx, k, c, keys[0], i == 0 && j == 0)
				if err != nil {
					return nil, err
				}
				cell := &k.row.Cells[j]
				cell.RoundsUS, cell.RoundsOver = append(cell.RoundsUS, us), append(cell.RoundsOver, over)
				cell.Decisions += busyDecisions(k.n)
				if c.admit {
					cell.Admitted += busyDecisions(k.n)
				}
			}
		}
	}

	var rows []BusyRow
	for _, k := range keys {
		if k.row.LiveAfter, err = b.busyLive(ctx, k); err != nil {
			return nil, err
		}
		c := b.clients[0]
		size, err := c.Do(ctx, c.B().MemoryUsage().Key(b.prefix+k.key).Samples(0).Build()).AsInt64()
		if err != nil {
			return nil, fmt.Errorf("MEMORY USAGE %s: %w", k.key, err)
		}
		k.row.Bytes, k.row.BytesPerEntry = size, float64(size)/float64(k.n)
		for j := range k.row.Cells {
			cell := &k.row.Cells[j]
			cell.USPerDecision, cell.OverSmall = median(slices.Clone(cell.RoundsUS)), median(slices.Clone(cell.RoundsOver))
		}
		rows = append(rows, k.row)
	}
	for _, r := range rows {
		b.logf("busykeys/%s live entries: server µs per decision %s; %.1f bytes/entry; filled in %.1fs",
			commas(r.Entries), busyFigures(r), r.BytesPerEntry, r.FillSeconds)
	}
	b.logf("busykeys: %s", time.Since(began).Round(time.Millisecond))
	return rows, nil
}

// busyFigures is a row's µs per decision for the progress line: each case's median and
// rounds.
func busyFigures(r BusyRow) string {
	var parts []string
	for j, c := range r.Cells {
		rounds := make([]string, len(c.RoundsUS))
		for i, us := range c.RoundsUS {
			rounds[i] = fmt.Sprintf("%.2f", us)
		}
		parts = append(parts, fmt.Sprintf("%s %.2f (%s) %.2f×", busyCases[j].column, c.USPerDecision, strings.Join(rounds, ", "), c.OverSmall))
	}
	return strings.Join(parts, "; ")
}

// busyFill admits k's N entries, one per tick, on an empty log: its window then holds them
// all.
func (b *bencher) busyFill(ctx context.Context, k *busyKey) error {
	began := time.Now()
	l := engine.Limit{Max: k.n + 1, Window: k.window}
	for k.clock.tick < int64(k.n) {
		k.clock.tick++
		r, err := k.e.Allow(ctx, k.key, l)
		if err != nil {
			return err
		}
		if !r.Allowed {
			return fmt.Errorf("entry %d of %d denied against %s", k.clock.tick, k.n, l)
		}
	}
	k.row.FillSeconds = time.Since(began).Seconds()
	return nil
}

// busyLive reads k's log (inspect.Read, every entry) and returns its live entries: the entries
// in the window that ends at k's clock. Each must cost 1 and have a time of its own, and the
// newest be at the clock: else the log is not what the scenario built, and that is an error.
func (b *bencher) busyLive(ctx context.Context, k *busyKey) (int, error) {
	log, err := b.readLog(ctx, k.key, 0)
	if err != nil {
		return 0, err
	}
	now := k.clock.now()
	live := 0
	for i, e := range log.Entries {
		if e.Cost != 1 || i > 0 && !e.At.After(log.Entries[i-1].At) {
			return 0, fmt.Errorf("%s: entry %d of %d is of cost %d at %s, after %s: want cost 1, times ascending",
				k.key, i, len(log.Entries), e.Cost, e.At, log.Entries[max(i-1, 0)].At)
		}
		if e.At.After(now.Add(-k.window)) {
			live++
		}
	}
	if live != k.n || log.Count != k.n || log.Events != k.n || len(log.Entries) == 0 || !log.Entries[len(log.Entries)-1].At.Equal(now) {
		return 0, fmt.Errorf("%s: %d entries (%d events), %d in the window, the newest at %v: want %d, the newest at %s",
			k.key, log.Count, log.Events, live, log.Entries[len(log.Entries)-1:], k.n, now)
	}
	return live, nil
}

// busyRound measures one round of case c on k's log: busyDecisions calls in busyChunks chunks,
// each (but for the small admission itself, ref) right after a chunk of busyRefDecisions /
// busyChunks admissions on the smallest log, small. It returns the server's µs per call of
// c's chunks, and that over the µs per call of the small log's chunks between them: both
// sides sample the same seconds, so the ratio holds where the machine's other load comes
// and goes.
func (b *bencher) busyRound(ctx context.Context, k *busyKey, c busyCase, small *busyKey, ref bool) (us, over float64, err error) {
	var mine, refs busySpent
	for q := 0; q < busyChunks; q++ {
		if !ref {
			s, err := b.busyCell(ctx, small, busyCases[0], busyRefDecisions/busyChunks)
			if err != nil {
				return 0, 0, err
			}
			refs.add(s)
		}
		s, err := b.busyCell(ctx, k, c, busyDecisions(k.n)/busyChunks)
		if err != nil {
			return 0, 0, err
		}
		mine.add(s)
	}
	if ref {
		return mine.perCall(), 1, nil
	}
	return mine.perCall(), mine.perCall() / refs.perCall(), nil
}

// busySpent is what INFO commandstats counted for the decisions' script calls.
type busySpent struct {
	calls int64
	usec  float64
}

func (s *busySpent) add(t busySpent) { s.calls, s.usec = s.calls+t.calls, s.usec+t.usec }

func (s busySpent) perCall() float64 { return s.usec / float64(s.calls) }

// busyCell takes decisions of case c on k's log, one call each, and returns what the server
// spent on them (INFO commandstats, evalsha). An admission moves k's clock one tick on first;
// a denial decides at the newest entry's time. A decision that does not come out as c wants,
// or calls that commandstats does not count one per decision (another client on the server),
// fail the cell.
func (b *bencher) busyCell(ctx context.Context, k *busyKey, c busyCase, decisions int) (busySpent, error) {
	maxEvents, cost := c.limit(k.n)
	l := engine.Limit{Max: maxEvents, Window: k.window}
	before, err := readServerStats(ctx, b.clients[0])
	if err != nil {
		return busySpent{}, err
	}
	for i := 0; i < decisions; i++ {
		if c.admit {
			k.clock.tick++
		}
		r, err := k.e.AllowN(ctx, k.key, l, cost)
		if err != nil {
			return busySpent{}, fmt.Errorf("%s live entries, %s: %w", commas(k.n), c.column, err)
		}
		if r.Allowed != c.admit {
			return busySpent{}, fmt.Errorf("%s live entries, %s: decision %d of %d (n %d against %s) admitted %v, want %v",
				commas(k.n), c.column, i+1, decisions, cost, l, r.Allowed, c.admit)
		}
	}
	after, err := readServerStats(ctx, b.clients[0])
	if err != nil {
		return busySpent{}, err
	}
	cmds := dataCommands(false)
	s := busySpent{calls: after.calls(cmds) - before.calls(cmds), usec: after.usec(cmds) - before.usec(cmds)}
	if s.calls != int64(decisions) {
		return busySpent{}, fmt.Errorf("%s live entries, %s: commandstats counted %d script calls for %d decisions: is another client using the server?",
			commas(k.n), c.column, s.calls, decisions)
	}
	return s, nil
}

// writeBusy prints the busykeys table and its worst ratio against the target; nothing when the
// scenario did not run.
func writeBusy(w io.Writer, rows []BusyRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprint(w, "\n### Busy keys: server µs per decision by live entries (INFO commandstats)\n\n")
	header := []string{"live entries"}
	for _, c := range busyCases {
		header = append(header, c.column+" µs", "× small admission")
	}
	table(w, append(header, "bytes/entry"))
	worst, worstRow, worstCase := 0.0, 0, 0
	for i, r := range rows {
		cells := []string{commas(r.Entries)}
		for j, c := range r.Cells {
			cells = append(cells, fmt.Sprintf("%.2f", c.USPerDecision), fmt.Sprintf("%.2f", c.OverSmall))
			if c.OverSmall > worst {
				worst, worstRow, worstCase = c.OverSmall, i, j
			}
		}
		row(w, append(cells, f1(r.BytesPerEntry))...)
	}
	fmt.Fprintf(w, "\nThe small admission is the admission on %s live entries (%.2f µs). Worst: %s on %s live entries, %.2f×, %s the target of %.1f×\n",
		commas(rows[0].Entries), rows[0].Cells[0].USPerDecision, busyCases[worstCase].column, commas(rows[worstRow].Entries),
		worst, verdict(worst <= busyTarget), busyTarget)
}
