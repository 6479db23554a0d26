package main

// The quota scenario: long windows and calendar quotas. What a key costs in memory under a
// limit of a million requests per 30 days, with a Resolution (one log entry per hour-wide
// slot) and exact (one per request), under a calendar month, and under a per-second limit
// beside a calendar month; then what a decision costs the server on the resolution log that
// holds its million requests, side by side with the common small log.
//
// The million requests are spread evenly over the 30 days on a caller's clock (WithClock)
// that steps by 30 days / requests at every reading, and are sent as fast as the server takes
// them: many goroutines through batching engines.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/strictrate/strictrate/engine"
)

const (
	// quotaWindow and quotaResolution are the long limit's: Max (the scenario's requests,
	// -quota-requests) per 30 days, recorded by the hour.
	quotaWindow     = 30 * 24 * time.Hour
	quotaResolution = time.Hour
	// defaultQuotaRequests is -quota-requests' default, the quota the docs quote.
	defaultQuotaRequests = 1_000_000
	// minQuotaRequests keeps more requests than slots in the window, so that each slot has one.
	minQuotaRequests = 1_000
	// quotaCalendarRequests is how many requests the calendar month's key admits before it is
	// measured: its size does not grow with them.
	quotaCalendarRequests = 5_000
	// quotaSmallKeys and quotaSmallEntries are the small log's: a few keys of 100 per 2 s,
	// each holding about quotaSmallEntries live entries (the floor scenario's load).
	quotaSmallKeys    = 8
	quotaSmallEntries = floorEntriesPerKey
	// quotaSlices: the server-cost rows are measured in this many slices each, alternating,
	// each a fifteenth of -duration: a small log's key (a 2 s window, so a relative expiry of
	// about 2 s on a caller's clock) outlives the other rows' slices between two of its own.
	quotaSlices = 10
)

// The targets (docs/limits.md): bytes of the resolution log after a million requests, of a
// calendar month, of a per-second limit beside it at a full second; the most entries of the
// resolution log (an entry per hour of 30 days, and the slot now ends in); and the most its
// decisions may cost the server over the small log's.
const (
	quotaResolutionTargetBytes = 12_000
	quotaResolutionMaxEntries  = int64(quotaWindow/quotaResolution) + 1
	quotaCalendarTargetBytes   = 200
	quotaPolicyTargetBytes     = 1_300
	quotaCostTarget            = 1.5
)

var quotaT0 = time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC) // on a slot's boundary

// QuotaMemoryRow is one key of the quota scenario's memory table: its bytes (MEMORY USAGE) and
// log after the requests its case names.
type QuotaMemoryRow struct {
	Case     string `json:"case"`
	Limit    string `json:"limit"`
	Requests int    `json:"requests"`
	Admitted int    `json:"admitted"`
	// Entries, Events and Counters are the key's log as inspect.Read reads it: its entries, their
	// events, its calendar counters.
	Entries  int64 `json:"log_entries"`
	Events   int64 `json:"log_events"`
	Counters int   `json:"calendar_counters"`
	Bytes    int64 `json:"memory_usage_bytes"`
	// Target is the aim for Bytes, MaxEntries for Entries; 0 where there is none.
	Target     int64 `json:"target_bytes,omitempty"`
	MaxEntries int64 `json:"max_entries,omitempty"`
	// Seconds is how long the requests took.
	Seconds float64 `json:"fill_seconds"`
}

// QuotaCostRow is one row of the quota scenario's server-cost table: the decision script's
// server time per call (INFO commandstats), one decision per call.
type QuotaCostRow struct {
	Row   string `json:"row"`
	Limit string `json:"limit"`
	Keys  int    `json:"keys"`
	// Decisions is the calls commandstats counted over the row's slices; Admitted how many of
	// them admitted.
	Decisions int64 `json:"decisions"`
	Admitted  int64 `json:"admitted"`
	// Entries and Events are per key, as inspect.Read reads them at the row's end (the log trims
	// what left the window at each decision).
	Entries float64 `json:"log_entries_per_key"`
	Events  float64 `json:"log_events_per_key"`
	// USPerDecision is the median of the row's slices' µs per call. OverSmall is the median,
	// over the rounds of slices, of the row's µs per call over the small log row's in the same
	// round (1 for that row): a round's slices run back to back, so the ratio holds where other
	// load on the machine comes and goes.
	USPerDecision float64 `json:"server_us_per_decision"`
	OverSmall     float64 `json:"per_decision_over_small_log"`
}

// steppedClock is a caller's clock that goroutines share: each reading is the next time of a
// sequence step apart from start (an atomic counter, so no two readings are alike).
type steppedClock struct {
	start time.Time
	step  time.Duration
	next  atomic.Int64
}

func (c *steppedClock) now() time.Time {
	return c.start.Add(time.Duration(c.next.Add(1)-1) * c.step)
}

// quotaRequests is the scenario's request count, -quota-requests (0: the default).
func (c config) quotaRequests() int {
	if c.QuotaRequests == 0 {
		return defaultQuotaRequests
	}
	return c.QuotaRequests
}

func (b *bencher) quota(ctx context.Context) ([]QuotaMemoryRow, []QuotaCostRow, error) {
	began := time.Now()
	n := b.cfg.quotaRequests()
	long := engine.Limit{Max: n, Window: quotaWindow, Resolution: quotaResolution}
	bigKey := "quota:resolution"
	res, clock, err := b.quotaSpread(ctx, bigKey, long, n, true)
	if err != nil {
		return nil, nil, fmt.Errorf("resolution log: %w", err)
	}
	res.Case = fmt.Sprintf("%s per 30 days, Resolution 1h, after %s requests spread over the window", commas(n), commas(n))
	res.Target, res.MaxEntries = quotaResolutionTargetBytes, quotaResolutionMaxEntries
	b.logf("quota/resolution: %s requests in %.1fs, %d admitted, %d entries, %d bytes", commas(n), res.Seconds, res.Admitted, res.Entries, res.Bytes)

	// The exact log of the same limit, measured in full, not extrapolated: a million requests
	// fill it in 20 to 25 s on 2 cores (measured: 100,000 of them, extrapolated linearly,
	// came within 0.1 % of the full log's bytes).
	exact := engine.Limit{Max: n, Window: quotaWindow}
	ex, _, err := b.quotaSpread(ctx, "quota:exact", exact, n, false)
	if err != nil {
		return nil, nil, fmt.Errorf("exact log: %w", err)
	}
	ex.Case = fmt.Sprintf("the same limit exact (no Resolution): measured (not extrapolated) after %s requests on the server's clock", commas(n))
	b.logf("quota/exact: %s requests in %.1fs, %d entries, %d bytes", commas(n), ex.Seconds, ex.Entries, ex.Bytes)
	if err := b.dropKey(ctx, "quota:exact"); err != nil {
		return nil, nil, err
	}

	cal, err := b.quotaCalendar(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("calendar: %w", err)
	}
	pol, err := b.quotaPolicy(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("policy: %w", err)
	}
	mem := []QuotaMemoryRow{res, ex, cal, pol}

	cost, err := b.quotaCost(ctx, bigKey, long, clock)
	if err != nil {
		return nil, nil, fmt.Errorf("server cost: %w", err)
	}
	if err := b.dropKey(ctx, bigKey); err != nil {
		return nil, nil, err
	}
	b.logf("quota: %s", time.Since(began).Round(time.Millisecond))
	return mem, cost, nil
}

// quotaSpread sends requests requests of cost 1 for key against l from cfg.Concurrency
// goroutines over batching engines, as fast as they are admitted, and measures the key.
//
// spread puts them evenly over quotaWindow: the i-th at quotaT0 + i × quotaWindow/requests,
// on a stepped clock the engines share, returned for more decisions on the key. Each
// hour-wide slot's requests are then held back until the slot before is decided: a clock
// reading is taken before its request queues, so without that a request of the slot before
// could reach the log after one of the next slot, and give its slot a second entry. Without
// spread, the server's clock decides (the requests' times then follow the order the server
// runs them in: an exact log appends every entry, where out-of-order times would make it
// insert them, slowly).
func (b *bencher) quotaSpread(ctx context.Context, key string, l engine.Limit, requests int, spread bool) (QuotaMemoryRow, *steppedClock, error) {
	var clock *steppedClock
	opts := batched
	if spread {
		clock = &steppedClock{start: quotaT0, step: quotaWindow / time.Duration(requests)}
		opts = append(batched[:len(batched):len(batched)], engine.WithClock(clock.now))
	}
	es, err := b.engines(opts...)
	if err != nil {
		return QuotaMemoryRow{}, nil, err
	}
	// slot(i) is the slot of the i-th reading: its index from quotaT0's, rounded up as the
	// log rounds a time to its slot's end.
	slot := func(i int) int {
		if !spread {
			return 0
		}
		return int((time.Duration(i)*clock.step + quotaResolution - 1) / quotaResolution)
	}
	slots := slot(requests-1) + 1
	left := make([]atomic.Int64, slots) // requests of each slot not decided yet
	decided := make([]chan struct{}, slots)
	for k := range decided {
		decided[k] = make(chan struct{})
	}
	for i := 0; i < requests; i++ {
		left[slot(i)].Add(1)
	}
	for k := range left {
		if left[k].Load() == 0 {
			close(decided[k])
		}
	}

	began := time.Now()
	admitted, err := b.decideConcurrently(ctx, es, requests, func(ctx context.Context, e *engine.Engine, i int) (engine.Result, error) {
		k := slot(i)
		if k > 0 {
			select {
			case <-decided[k-1]:
			case <-ctx.Done():
				return engine.Result{}, ctx.Err()
			}
		}
		r, err := e.Allow(ctx, key, l)
		if err == nil && left[k].Add(-1) == 0 {
			close(decided[k])
		}
		return r, err
	})
	if err != nil {
		return QuotaMemoryRow{}, nil, err
	}
	row := QuotaMemoryRow{Limit: l.String(), Requests: requests, Admitted: admitted, Seconds: time.Since(began).Seconds()}
	if err := b.measureKey(ctx, key, &row); err != nil {
		return QuotaMemoryRow{}, nil, err
	}
	if row.Admitted != requests {
		return QuotaMemoryRow{}, nil, fmt.Errorf("%s of %s requests admitted against %s, want all",
			commas(row.Admitted), commas(requests), l)
	}
	return row, clock, nil
}

// measureKey fills in row's bytes (MEMORY USAGE, every element sampled) and log (inspect.Read).
func (b *bencher) measureKey(ctx context.Context, key string, row *QuotaMemoryRow) error {
	c := b.clients[0]
	size, err := c.Do(ctx, c.B().MemoryUsage().Key(b.prefix+key).Samples(0).Build()).AsInt64()
	if err != nil {
		return fmt.Errorf("MEMORY USAGE %s: %w", key, err)
	}
	log, err := b.readLog(ctx, key, 1)
	if err != nil {
		return err
	}
	row.Bytes, row.Entries, row.Events, row.Counters = size, int64(log.Count), int64(log.Events), len(log.Periods)
	return nil
}

func (b *bencher) dropKey(ctx context.Context, key string) error {
	c := b.clients[0]
	return c.Do(ctx, c.B().Del().Key(b.prefix+key).Build()).Error()
}

// quotaCalendar measures a key of Calendar(Max, Month, UTC) alone after quotaCalendarRequests
// admissions on the server's clock, from the goroutines through batching engines.
func (b *bencher) quotaCalendar(ctx context.Context) (QuotaMemoryRow, error) {
	const key = "quota:calendar"
	n := b.cfg.quotaRequests()
	l := engine.Calendar(n, engine.Month, time.UTC)
	es, err := b.engines(batched...)
	if err != nil {
		return QuotaMemoryRow{}, err
	}
	began := time.Now()
	admitted, err := b.decideConcurrently(ctx, es, quotaCalendarRequests, func(ctx context.Context, e *engine.Engine, _ int) (engine.Result, error) {
		return e.Allow(ctx, key, l)
	})
	if err != nil {
		return QuotaMemoryRow{}, err
	}
	row := QuotaMemoryRow{Case: fmt.Sprintf("Calendar(%s, Month, UTC) after %s admissions", commas(n), commas(quotaCalendarRequests)),
		Limit: l.String(), Requests: quotaCalendarRequests, Admitted: admitted,
		Seconds: time.Since(began).Seconds(), Target: quotaCalendarTargetBytes}
	if err := b.measureKey(ctx, key, &row); err != nil {
		return QuotaMemoryRow{}, err
	}
	b.logf("quota/calendar: %d admitted, %d bytes", row.Admitted, row.Bytes)
	return row, b.dropKey(ctx, key)
}

// quotaPolicy measures a key of Policy{PerSecond(10), Calendar(Max, Month, UTC)} at a full
// second: 10 admissions one after another, well within a second, on the server's clock.
func (b *bencher) quotaPolicy(ctx context.Context) (QuotaMemoryRow, error) {
	const key, perSecond = "quota:policy", 10
	n := b.cfg.quotaRequests()
	p := engine.Policy{engine.PerSecond(perSecond), engine.Calendar(n, engine.Month, time.UTC)}
	es, err := b.engines(unbatched...)
	if err != nil {
		return QuotaMemoryRow{}, err
	}
	began := time.Now()
	first, admitted := time.Time{}, 0
	for i := 0; i < perSecond; i++ {
		r, err := es[0].AllowPolicy(ctx, key, p, 1)
		if err != nil {
			return QuotaMemoryRow{}, err
		}
		if r.Allowed {
			admitted++
		}
		if i == 0 {
			first = r.At
		} else if r.At.Sub(first) >= time.Second {
			return QuotaMemoryRow{}, fmt.Errorf("%d admissions took %s, not within one second", perSecond, r.At.Sub(first))
		}
	}
	row := QuotaMemoryRow{Case: fmt.Sprintf("Policy{PerSecond(10), Calendar(%s, Month, UTC)} at a full second: 10 admissions within one second", commas(n)),
		Limit: p.String(), Requests: perSecond, Admitted: admitted, Seconds: time.Since(began).Seconds(), Target: quotaPolicyTargetBytes}
	if err := b.measureKey(ctx, key, &row); err != nil {
		return QuotaMemoryRow{}, err
	}
	b.logf("quota/policy: %d admitted, %d bytes", row.Admitted, row.Bytes)
	return row, b.dropKey(ctx, key)
}

// quotaCost measures the server's time per decision on bigKey (the resolution log that holds
// its limit's Max in its window), on its stepped clock going on, against the small log: a few
// keys of 100 per 2 s, each holding about quotaSmallEntries live entries, on a stepped clock
// too (so that every row reads the caller's clock, and none runs TIME). Between them, the
// same small keys' load under a resolution (a slot per entry): what the resolution costs
// apart from the log's length. Each row is one goroutine through an unbatched engine: one
// call per decision, and the clock's readings in the order the calls run. The rows alternate,
// quotaSlices slices each, after a warm-up: the big key's first hour past its window denies
// everything (its window holds Max until its oldest slot leaves), the small keys fill their
// windows.
func (b *bencher) quotaCost(ctx context.Context, bigKey string, long engine.Limit, bigClock *steppedClock) ([]QuotaCostRow, error) {
	small := engine.Limit{Max: 100, Window: 2 * time.Second}
	smallRes := small
	smallRes.Resolution = small.Window / (quotaSmallEntries + 1) // shorter than the keys' spacing: a slot per entry
	type side struct {
		row        QuotaCostRow
		keys       []string
		limit      engine.Limit
		clock      *steppedClock
		e          *engine.Engine
		next       int
		slices     []float64 // µs per call, by round
		admitted   int64
		decisions  int64
		warmupSpan int
	}
	smallKeys := func(name string) []string {
		keys := make([]string, quotaSmallKeys)
		for i := range keys {
			keys[i] = "quota:" + name + ":" + strconv.Itoa(i)
		}
		return keys
	}
	smallClock := func() *steppedClock {
		return &steppedClock{start: quotaT0, step: small.Window / (quotaSmallEntries * quotaSmallKeys)}
	}
	sides := []*side{
		{row: QuotaCostRow{Row: fmt.Sprintf("small log: 100 per 2s, %d keys of about %d entries", quotaSmallKeys, quotaSmallEntries)},
			keys: smallKeys("small"), limit: small, clock: smallClock(), warmupSpan: 2 * quotaSmallEntries * quotaSmallKeys},
		{row: QuotaCostRow{Row: fmt.Sprintf("small log with a resolution: 100 per 2s ~%s, %d keys of about %d entries", smallRes.Resolution, quotaSmallKeys, quotaSmallEntries)},
			keys: smallKeys("small-res"), limit: smallRes, clock: smallClock(), warmupSpan: 2 * quotaSmallEntries * quotaSmallKeys},
		{row: QuotaCostRow{Row: fmt.Sprintf("resolution log: %s per 30 days ~1h, holding %s requests", commas(long.Max), commas(long.Max))},
			keys: []string{bigKey}, limit: long, clock: bigClock, warmupSpan: int(2*quotaResolution/bigClock.step) + 1},
	}
	for _, s := range sides {
		es, err := b.enginesOn(b.clients[:1], engine.WithBatching(false), engine.WithClock(s.clock.now))
		if err != nil {
			return nil, err
		}
		s.e = es[0]
	}
	// decide runs s's decisions one after another, for d or count of them (whichever the
	// caller set), and returns how many admitted.
	decide := func(s *side, d time.Duration, count int) (int64, error) {
		deadline := time.Now().Add(d)
		var admitted int64
		for i := 0; count > 0 && i < count || count == 0 && time.Now().Before(deadline); i++ {
			r, err := s.e.Allow(ctx, s.keys[s.next%len(s.keys)], s.limit)
			if err != nil {
				return 0, err
			}
			s.next++
			if r.Allowed {
				admitted++
			}
		}
		return admitted, nil
	}
	for _, s := range sides {
		if _, err := decide(s, 0, s.warmupSpan); err != nil {
			return nil, err
		}
	}
	slice := max(b.cfg.Duration/15, 30*time.Millisecond)
	cmds := dataCommands(false)
	for i := 0; i < quotaSlices; i++ {
		for _, s := range sides {
			before, err := readServerStats(ctx, b.clients[0])
			if err != nil {
				return nil, err
			}
			admitted, err := decide(s, slice, 0)
			if err != nil {
				return nil, err
			}
			after, err := readServerStats(ctx, b.clients[0])
			if err != nil {
				return nil, err
			}
			calls := after.calls(cmds) - before.calls(cmds)
			if calls == 0 {
				return nil, fmt.Errorf("%s: commandstats counted no evalsha", s.row.Row)
			}
			s.slices = append(s.slices, (after.usec(cmds)-before.usec(cmds))/float64(calls))
			s.decisions += calls
			s.admitted += admitted
			if i == quotaSlices-1 { // the logs as the row leaves them
				for _, k := range s.keys {
					log, err := b.readLog(ctx, k, 1)
					if err != nil {
						return nil, err
					}
					s.row.Entries += float64(log.Count) / float64(len(s.keys))
					s.row.Events += float64(log.Events) / float64(len(s.keys))
				}
			}
		}
	}
	var rows []QuotaCostRow
	for _, s := range sides {
		row := s.row
		row.Limit, row.Keys, row.Decisions, row.Admitted = s.limit.String(), len(s.keys), s.decisions, s.admitted
		ratios := make([]float64, len(s.slices))
		for i, us := range s.slices {
			ratios[i] = us / sides[0].slices[i]
		}
		row.OverSmall = median(ratios)
		row.USPerDecision = median(slices.Clone(s.slices))
		rows = append(rows, row)
		b.logf("quota/cost %s: %d decisions, %.2f server µs/decision (slices %.2f to %.2f), %.2f× the small log (rounds %.2f to %.2f)",
			row.Row, row.Decisions, row.USPerDecision, slices.Min(s.slices), slices.Max(s.slices), row.OverSmall, ratios[0], ratios[len(ratios)-1])
	}
	for _, s := range sides[:2] {
		for _, k := range s.keys {
			if err := b.dropKey(ctx, k); err != nil {
				return nil, err
			}
		}
	}
	return rows, nil
}

// writeQuota prints the quota scenario's two tables and their figures against the targets.
func writeQuota(w io.Writer, mem []QuotaMemoryRow, cost []QuotaCostRow) {
	if len(mem) > 0 {
		fmt.Fprintf(w, "\n### Long windows and calendar quotas: memory per key (MEMORY USAGE)\n\n")
		table(w, []string{"case", "limit", "requests", "admitted", "log entries", "log events", "calendar counters", "bytes",
			"target", "fill s"})
		for _, m := range mem {
			target := "-"
			if m.Target > 0 {
				target = "≤ " + commas64(m.Target)
			}
			entries := commas64(m.Entries)
			if m.MaxEntries > 0 {
				entries += " (≤ " + commas64(m.MaxEntries) + ")"
			}
			row(w, m.Case, "`"+m.Limit+"`", commas(m.Requests), commas(m.Admitted), entries, commas64(m.Events),
				strconv.Itoa(m.Counters), commas64(m.Bytes), target, f1(m.Seconds))
		}
		fmt.Fprintln(w)
		for _, m := range mem {
			if m.Target > 0 {
				fmt.Fprintf(w, "- %s: %s bytes, %s the target of %s\n", m.Limit, commas64(m.Bytes), verdict(float64(m.Bytes) <= float64(m.Target)), commas64(m.Target))
			}
		}
	}
	if len(cost) > 0 {
		fmt.Fprintf(w, "\n### Long windows: server time per decision (INFO commandstats), one call per decision, caller's clock\n\n")
		table(w, []string{"row", "limit", "keys", "log entries/key", "log events/key", "decisions", "admitted", "server µs/decision", "× small log"})
		for _, c := range cost {
			row(w, c.Row, "`"+c.Limit+"`", strconv.Itoa(c.Keys), f1(c.Entries), f0(c.Events), strconv.FormatInt(c.Decisions, 10),
				pct(float64(c.Admitted)/float64(max(c.Decisions, 1))), fmt.Sprintf("%.2f", c.USPerDecision), fmt.Sprintf("%.2f", c.OverSmall))
		}
		last := cost[len(cost)-1]
		fmt.Fprintf(w, "\n%s: %.2f× the small log's server time per decision, %s the target of %.1f×\n",
			last.Row, last.OverSmall, verdict(last.OverSmall <= quotaCostTarget), quotaCostTarget)
	}
}

func verdict(within bool) string {
	if within {
		return "within"
	}
	return "above"
}

// commas writes n with thousands separators: 1,000,000.
func commas(n int) string { return commas64(int64(n)) }

func commas64(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// decideConcurrently hands the requests 0 to requests-1 out to the run's goroutines, spread
// over es, each deciding its request by decide, and returns how many were admitted. The first
// error stops every goroutine and is returned.
func (b *bencher) decideConcurrently(ctx context.Context, es []*engine.Engine, requests int,
	decide func(ctx context.Context, e *engine.Engine, i int) (engine.Result, error)) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var tickets, admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, b.cfg.Concurrency)
	for g := 0; g < b.cfg.Concurrency; g++ {
		e := es[g%len(es)]
		wg.Go(func() {
			for i := int(tickets.Add(1) - 1); i < requests; i = int(tickets.Add(1) - 1) {
				r, err := decide(ctx, e, i)
				if err != nil {
					errs[g] = err
					cancel()
					return
				}
				if r.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return int(admitted.Load()), errors.Join(errs...)
}
