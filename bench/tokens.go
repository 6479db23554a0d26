package main

// The tokens scenario: a model's token budget spent through reserve, settle and charge, as
// docs/limits.md ("Usage known after the fact") has it. Every goroutine, over the run's engines
// (one per client, batched), asks again and again for a tenant drawn out of tokensTenants,
// each with a budget of tokensMax tokens per tokensWindow: it reserves an estimate with
// AllowN; denied, the request uses nothing; admitted, the "response" uses a random number of
// tokens, at or below the estimate (then Settle to it), above it (then Charge the excess), or,
// now and then, far above the budget itself (Charge again: the tenant is then over its budget
// and every decision denies until the charge has left the window).
//
// The audit runs on the server's timestamps: each reserve's Result.At, and each admission's
// and charge's entry (Entry.At, then Entry.Seq within a microsecond). At the instant of a
// decision at T, an entry of the key recorded before it counts if it lies in (T - window, T],
// at its cost then: a charge's, or a reservation's estimate until its Settle lands, what was
// used after. When a Settle landed is known only within bounds: not before its AllowN
// returned, and surely before the next reserve of the same goroutine was decided (the
// goroutine waited for the Settle's reply before it asked), at that reserve's Result.At. So
// a decision at T counts an entry whose Settle lowers it at its settled cost when that next
// reserve came before T, and else between the settled cost and the estimate, the Settle in
// flight. The audit checks, with the server's clock taken not to step back during the run:
//
//   - over: an admission (its estimate) the window had no room for, counting every entry in
//     flight at its settled cost, the least it could hold. It admits nothing over the budget
//     where the window surely held too much;
//   - false denials: a denial of an estimate the window had room for, counting every entry in
//     flight at its estimate and every entry of T's microsecond (a denial has no Seq), the
//     most it could hold;
//   - charges misjudged: a charge whose Allowed says it fit where it surely did not, or the
//     reverse;
//   - in doubt: the decisions whose outcome hangs on a Settle in flight (one sent a round trip
//     or so before): counted, neither way an error.
//
// Then against the server: the tokens charged (settled costs and charges, as recorded) must
// equal the tokens used, and the logs must hold exactly that. A reader reads every tenant's log
// (package inspect, every entry) each quarter window during the run, and once after it,
// between two readings of the server's clock (TIME), from and to. Every entry with a time in
// (to - window, from) was written before the read and is still live, so not trimmed: the
// entries the log holds at such a time must be, cost for cost, those the decisions recorded
// there, at their final costs once every Settle among them had surely landed before from.
// Entries that no read saw in their final state are counted unchecked; entries settled to 0
// are left out, as the log may drop them.

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
)

const (
	// tokensTenants is how many keys the goroutines share: a few tenants.
	tokensTenants = 4
	// tokensMax per tokensWindow is every tenant's budget: the load offers far more, so that it
	// binds, and several windows pass in a run of the default -duration.
	tokensMax    = 20_000
	tokensWindow = 500 * time.Millisecond
	// tokensEstimateMin to tokensEstimateMax is what a request reserves.
	tokensEstimateMin = 100
	tokensEstimateMax = 1_000
	// tokensReadEvery is how often the reader reads every tenant's log: a quarter window, so
	// that each entry lies in about three reads after its Settle.
	tokensReadEvery = tokensWindow / 4
)

// tokensUsed is what an admitted request's response uses, estimate having been reserved: in
// 1,000 requests, 600 at or below the estimate (0 to estimate), 395 above it (up to twice it)
// and 5 far above the budget itself (2 to 3 times tokensMax).
func tokensUsed(rng *rand.Rand, estimate int) int {
	switch p := rng.IntN(1000); {
	case p < 5:
		return 2*tokensMax + rng.IntN(tokensMax+1)
	case p < 400:
		return estimate + 1 + rng.IntN(estimate)
	default:
		return rng.IntN(estimate + 1)
	}
}

// TokensRow is the tokens scenario's one row.
type TokensRow struct {
	Tenants    int     `json:"tenants"`
	Goroutines int     `json:"goroutines"`
	Engines    int     `json:"engines"`
	Max        int     `json:"budget_tokens_per_window"`
	WindowMS   float64 `json:"window_ms"`
	// Requests is the reserves (AllowN), Admitted and Denied theirs; Settled is the admitted
	// requests that used at most their estimate, Charged those that used more (Charge of the
	// excess), ChargedOver the charges that did not fit (Result.Allowed false): the tenant
	// over its budget.
	Requests    int `json:"requests"`
	Admitted    int `json:"admitted"`
	Denied      int `json:"denied"`
	Settled     int `json:"settled"`
	Charged     int `json:"charged"`
	ChargedOver int `json:"charges_over_budget"`
	// TokensReserved is the admitted estimates; TokensUsed what their responses used;
	// TokensCharged what the calls recorded: each settled entry's cost, each charged
	// request's estimate and its charge's Entry.Cost. It must equal TokensUsed.
	TokensReserved int64 `json:"tokens_reserved"`
	TokensUsed     int64 `json:"tokens_used"`
	TokensCharged  int64 `json:"tokens_charged"`
	// UsedPerWindow is the tokens used per tenant and window of the run, on average.
	UsedPerWindow float64 `json:"tokens_used_per_tenant_window"`
	// DecisionsPerSec counts the reserves; the Settles and Charges are calls besides.
	DecisionsPerSec float64 `json:"decisions_per_sec"`
	Calls           int     `json:"calls"`
	// P50us and P99us are a reserve's round trip (AllowN), on the client.
	P50us float64 `json:"reserve_latency_p50_us"`
	P99us float64 `json:"reserve_latency_p99_us"`
	tokensAudit
	tokensCheck
}

// tokensAudit is what the audit of the decisions found (the file's comment says how).
type tokensAudit struct {
	// Peak is the most tokens the window held at an admission, its estimate included, Settles
	// in flight at their settled cost: at most Max.
	Peak         int `json:"most_tokens_at_an_admission"`
	Over         int `json:"admitted_over_budget"`
	FalseDenials int `json:"false_denials"`
	Misjudged    int `json:"charges_misjudged"`
	InDoubt      int `json:"decisions_in_doubt"`
	// First names the first failure found, for the error; "" when none.
	First string `json:"-"`
}

// tokensCheck is what the reads of the logs found.
type tokensCheck struct {
	Reads int `json:"log_reads"`
	// Entries is how many entries of non-zero cost some read saw, in their final state, at the
	// time they were recorded; Tokens is their costs; Unchecked the entries no read saw so.
	Entries   int   `json:"entries_checked"`
	Tokens    int64 `json:"tokens_checked"`
	Unchecked int   `json:"entries_unchecked"`
	// Mismatched is how many (tenant, microsecond) a read found holding other costs than the
	// decisions recorded there.
	Mismatched    int    `json:"mismatched"`
	FirstMismatch string `json:"-"`
}

// met says whether the row holds what the engine promises.
func (r TokensRow) met() bool {
	return r.Over == 0 && r.FalseDenials == 0 && r.Misjudged == 0 && r.Mismatched == 0 && r.TokensCharged == r.TokensUsed
}

// tokensRequest is one request's record: its reserve, and what came of it.
type tokensRequest struct {
	tenant   int
	at, seq  int64 // the reserve's Result.At, and its Entry.Seq when admitted
	estimate int
	allowed  bool
	used     int // admitted: the response's tokens
	// settledBy is, for an admission settled below its estimate, the server µs after which its
	// Settle had surely landed: its goroutine's next reserve's Result.At (math.MaxInt64 when it
	// had none).
	settledBy int64
	charge    tokensCharge // used > estimate: the charge of the excess
}

type tokensCharge struct {
	at, seq int64
	cost    int
	fit     bool
}

// tokensEntry is one entry of a tenant's log as the decisions recorded it.
type tokensEntry struct {
	at, seq int64
	cost    int // its final cost: settled, or charged
	// reserved is its cost until its Settle lands, settledBy (tokensRequest's) the bound of
	// that; reserved is cost when nothing lowers it.
	reserved  int
	settledBy int64
}

// costAt is what x counted at the decision of server µs t: the least and the most.
func (x tokensEntry) costAt(t int64) (low, high int) {
	if x.reserved > x.cost && x.settledBy >= t {
		return x.cost, x.reserved
	}
	return x.cost, x.cost
}

func (b *bencher) tokens(ctx context.Context) (TokensRow, error) {
	es, err := b.engines(batched...)
	if err != nil {
		return TokensRow{}, err
	}
	keys := make([]string, tokensTenants)
	for i := range keys {
		keys[i] = "tokens:tenant-" + strconv.Itoa(i)
	}
	l := engine.Limit{Max: tokensMax, Window: tokensWindow}
	n := b.cfg.Concurrency
	rngs, perG, lat, calls := make([]*rand.Rand, n), make([][]tokensRequest, n), make([][]time.Duration, n), make([]int, n)
	for g := range rngs {
		rngs[g] = rand.New(rand.NewPCG(uint64(g), 7))
	}
	// Every call takes ctx, not the run's deadline: a call cut short might have been recorded
	// by the server, unknown to the audit.
	op := func(g int, e *engine.Engine) error {
		rng := rngs[g]
		tenant, estimate := rng.IntN(len(keys)), tokensEstimateMin+rng.IntN(tokensEstimateMax-tokensEstimateMin+1)
		began := time.Now()
		r, err := e.AllowN(ctx, keys[tenant], l, estimate)
		lat[g] = append(lat[g], time.Since(began))
		calls[g]++
		if err != nil {
			return err
		}
		q := tokensRequest{tenant: tenant, at: r.At.UnixMicro(), estimate: estimate, allowed: r.Allowed}
		if r.Allowed {
			q.seq, q.used = int64(r.Entry.Seq), tokensUsed(rng, estimate)
			calls[g]++
			if q.used <= estimate {
				err = e.Settle(ctx, keys[tenant], r, q.used)
			} else {
				var c engine.Result
				c, err = e.Charge(ctx, keys[tenant], l, q.used-estimate)
				if err == nil && c.Entry.IsZero() {
					err = fmt.Errorf("a charge of %d tokens on %s recorded no entry", q.used-estimate, keys[tenant])
				}
				q.charge = tokensCharge{at: c.Entry.At.UnixMicro(), seq: int64(c.Entry.Seq), cost: c.Entry.Cost, fit: c.Allowed}
			}
			if err != nil {
				return err
			}
		}
		perG[g] = append(perG[g], q)
		return nil
	}

	var reads []tokensRead
	var readErr error
	stop, readerDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(readerDone)
		for {
			rd, err := b.readTokenLogs(ctx, keys)
			if err != nil {
				readErr = err
				return
			}
			reads = append(reads, rd)
			select {
			case <-stop:
				return
			case <-time.After(tokensReadEvery):
			}
		}
	}()
	began := time.Now()
	err = drive(ctx, b, b.cfg.Duration, op, es)
	elapsed := time.Since(began)
	close(stop)
	<-readerDone
	if err != nil {
		return TokensRow{}, err
	}
	if readErr != nil {
		return TokensRow{}, readErr
	}
	last, err := b.readTokenLogs(ctx, keys) // every call has returned: every entry is final
	if err != nil {
		return TokensRow{}, err
	}
	last.final = true
	reads = append(reads, last)

	for _, rs := range perG {
		for i := range rs {
			rs[i].settledBy = math.MaxInt64
			if i+1 < len(rs) {
				rs[i].settledBy = rs[i+1].at
			}
		}
	}
	reqs := slices.Concat(perG...)
	all := slices.Concat(lat...)
	slices.Sort(all)
	row := TokensRow{Tenants: len(keys), Goroutines: n, Engines: len(es), Max: l.Max, WindowMS: ms(l.Window),
		Requests: len(reqs), Calls: sumInts(calls), DecisionsPerSec: float64(len(reqs)) / elapsed.Seconds(),
		P50us: us(percentile(all, 50)), P99us: us(percentile(all, 99))}
	for _, q := range reqs {
		switch {
		case !q.allowed:
			row.Denied++
			continue
		case q.used <= q.estimate:
			row.Settled++
			row.TokensCharged += int64(q.used)
		default:
			row.Charged++
			row.TokensCharged += int64(q.estimate + q.charge.cost)
			if !q.charge.fit {
				row.ChargedOver++
			}
		}
		row.Admitted++
		row.TokensReserved += int64(q.estimate)
		row.TokensUsed += int64(q.used)
	}
	row.UsedPerWindow = float64(row.TokensUsed) / float64(len(keys)) / (elapsed.Seconds() / l.Window.Seconds())
	logs := tokensLogs(reqs, len(keys))
	row.tokensAudit = auditTokens(reqs, logs, l)
	row.tokensCheck = checkTokenLogs(logs, reads, l.Window)
	b.logf("tokens: %d requests, %d admitted (%d settled, %d charged, %d of them over the budget), %s tokens used, %s charged; "+
		"%.0f decisions/s, reserve p50 %.0fµs p99 %.0fµs; over %d, false denials %d, charges misjudged %d, in doubt %d; "+
		"%d of %d entries checked in %d reads of the logs, %d mismatched",
		row.Requests, row.Admitted, row.Settled, row.Charged, row.ChargedOver, commas64(row.TokensUsed), commas64(row.TokensCharged),
		row.DecisionsPerSec, row.P50us, row.P99us, row.Over, row.FalseDenials, row.Misjudged, row.InDoubt,
		row.Entries, row.Entries+row.Unchecked, row.Reads, row.Mismatched)
	for _, first := range []string{row.First, row.FirstMismatch} {
		if first != "" {
			b.logf("tokens: %s", first)
		}
	}
	return row, nil
}

// tokensRead is one read of every tenant's log (inspect.Read, every entry), between two
// readings of the server's clock, µs: from before it, to after it. final marks the read after
// the run, when every call had returned.
type tokensRead struct {
	from, to int64
	logs     [][]inspect.Entry
	final    bool
}

func (b *bencher) readTokenLogs(ctx context.Context, keys []string) (tokensRead, error) {
	var rd tokensRead
	var err error
	if rd.from, err = b.serverMicros(ctx); err != nil {
		return rd, err
	}
	for _, k := range keys {
		log, err := b.readLog(ctx, k, 0)
		if err != nil {
			return rd, err
		}
		rd.logs = append(rd.logs, log.Entries)
	}
	rd.to, err = b.serverMicros(ctx)
	return rd, err
}

// serverMicros reads the server's clock (TIME), µs since the epoch.
func (b *bencher) serverMicros(ctx context.Context) (int64, error) {
	c := b.clients[0]
	t, err := c.Do(ctx, c.B().Time().Build()).AsIntSlice()
	if err != nil || len(t) != 2 {
		return 0, fmt.Errorf("TIME: %v, %v", t, err)
	}
	return t[0]*1_000_000 + t[1], nil
}

// tokensLogs is each tenant's log as the decisions recorded it: every admission's entry and
// every charge's, in the order of the log (time, then seq).
func tokensLogs(reqs []tokensRequest, tenants int) [][]tokensEntry {
	logs := make([][]tokensEntry, tenants)
	for _, q := range reqs {
		if !q.allowed {
			continue
		}
		x := tokensEntry{at: q.at, seq: q.seq, cost: q.estimate, reserved: q.estimate}
		if q.used <= q.estimate {
			x.cost, x.settledBy = q.used, q.settledBy
		} else {
			c := q.charge
			logs[q.tenant] = append(logs[q.tenant], tokensEntry{at: c.at, seq: c.seq, cost: c.cost, reserved: c.cost})
		}
		logs[q.tenant] = append(logs[q.tenant], x)
	}
	for _, log := range logs {
		slices.SortFunc(log, func(a, b tokensEntry) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.seq, b.seq)) })
	}
	return logs
}

// tokensHeld is what log held at the decision of server µs t: the entries in (t - window, t]
// ordered before seq (every entry of t's microsecond when seq is math.MaxInt64), the least
// and the most.
func tokensHeld(log []tokensEntry, t, seq int64, window time.Duration) (low, high int) {
	for i := sort.Search(len(log), func(i int) bool { return log[i].at > t-window.Microseconds() }); i < len(log); i++ {
		x := log[i]
		if x.at > t || x.at == t && x.seq >= seq {
			break
		}
		lo, hi := x.costAt(t)
		low, high = low+lo, high+hi
	}
	return low, high
}

// auditTokens audits every decision of reqs against logs (tokensLogs') under l.
func auditTokens(reqs []tokensRequest, logs [][]tokensEntry, l engine.Limit) tokensAudit {
	var a tokensAudit
	fail := func(count *int, format string, args ...any) {
		*count++
		if a.First == "" {
			a.First = fmt.Sprintf(format, args...)
		}
	}
	for _, q := range reqs {
		log := logs[q.tenant]
		if !q.allowed {
			low, high := tokensHeld(log, q.at, math.MaxInt64, l.Window)
			switch {
			case high+q.estimate <= l.Max:
				fail(&a.FalseDenials, "tenant %d: %d tokens denied at %d µs, the window holding %d at most: a false denial",
					q.tenant, q.estimate, q.at, high)
			case low+q.estimate <= l.Max:
				a.InDoubt++
			}
			continue
		}
		low, high := tokensHeld(log, q.at, q.seq, l.Window)
		a.Peak = max(a.Peak, low+q.estimate)
		switch {
		case low+q.estimate > l.Max:
			fail(&a.Over, "tenant %d: %d tokens admitted at %d µs (seq %d), the window holding %d at least: over the budget of %d",
				q.tenant, q.estimate, q.at, q.seq, low, l.Max)
		case high+q.estimate > l.Max:
			a.InDoubt++
		}
		if c := q.charge; c.cost > 0 {
			low, high := tokensHeld(log, c.at, c.seq, l.Window)
			switch {
			case c.fit && low+c.cost > l.Max, !c.fit && high+c.cost <= l.Max:
				fail(&a.Misjudged, "tenant %d: a charge of %d tokens at %d µs (seq %d) said fit %v, the window holding %d to %d",
					q.tenant, c.cost, c.at, c.seq, c.fit, low, high)
			case (low+c.cost > l.Max) != (high+c.cost > l.Max):
				a.InDoubt++
			}
		}
	}
	return a
}

// checkTokenLogs checks the reads of the logs against logs (tokensLogs'), as the file's
// comment says.
func checkTokenLogs(logs [][]tokensEntry, reads []tokensRead, window time.Duration) tokensCheck {
	type group struct {
		costs     []int // the final costs above 0, ascending
		settledBy int64 // every Settle of the group landed after it at the latest
		checked   bool
	}
	groups := make([]map[int64]*group, len(logs))
	for k, log := range logs {
		groups[k] = map[int64]*group{}
		for _, x := range log {
			g := groups[k][x.at]
			if g == nil {
				g = &group{}
				groups[k][x.at] = g
			}
			if x.cost > 0 {
				g.costs = append(g.costs, x.cost)
			}
			if x.reserved > x.cost {
				g.settledBy = max(g.settledBy, x.settledBy)
			}
		}
		for _, g := range groups[k] {
			slices.Sort(g.costs)
		}
	}
	c := tokensCheck{Reads: len(reads)}
	mismatched := map[[2]int64]bool{}
	for _, rd := range reads {
		lo, hi := rd.to-window.Microseconds(), rd.from // the times every read entry was written before, and still live
		for k, entries := range rd.logs {
			held := map[int64][]int{}
			for _, e := range entries {
				if at := e.At.UnixMicro(); at > lo && at < hi && e.Cost > 0 {
					held[at] = append(held[at], e.Cost)
				}
			}
			ats := map[int64]bool{}
			for at := range held {
				ats[at] = true
			}
			for at := range groups[k] {
				if at > lo && at < hi {
					ats[at] = true
				}
			}
			for at := range ats {
				g := groups[k][at]
				if g == nil {
					g = &group{}
				} else if !rd.final && g.settledBy >= rd.from {
					continue // a Settle may still have been on its way
				}
				costs := held[at]
				slices.Sort(costs)
				if !slices.Equal(costs, g.costs) {
					if !mismatched[[2]int64{int64(k), at}] {
						mismatched[[2]int64{int64(k), at}] = true
						c.Mismatched++
					}
					if c.FirstMismatch == "" {
						c.FirstMismatch = fmt.Sprintf("tenant %d at %d µs: the log holds the costs %v, the decisions recorded %v", k, at, costs, g.costs)
					}
					continue
				}
				if !g.checked {
					g.checked = true
					c.Entries += len(g.costs)
					for _, cost := range g.costs {
						c.Tokens += int64(cost)
					}
				}
			}
		}
	}
	for k := range groups {
		for _, g := range groups[k] {
			if !g.checked {
				c.Unchecked += len(g.costs)
			}
		}
	}
	return c
}

// writeTokens prints the tokens scenario's table and its verdict; nothing when it did not run.
func writeTokens(w io.Writer, r *TokensRow) {
	if r == nil {
		return
	}
	fmt.Fprintf(w, "\n### Token budgets: reserve, settle, charge (`-scenario tokens`)\n\n")
	fmt.Fprintf(w, "%d tenants of %s tokens per %.0f ms, %d goroutines over %d engines; estimates of %d to %s tokens.\n\n",
		r.Tenants, commas(r.Max), r.WindowMS, r.Goroutines, r.Engines, tokensEstimateMin, commas(tokensEstimateMax))
	table(w, []string{"figure", "value"})
	for _, f := range [][2]string{
		{"requests (reserves)", commas(r.Requests)},
		{"admitted / denied", fmt.Sprintf("%s / %s", commas(r.Admitted), commas(r.Denied))},
		{"settled at or below the estimate / charged the excess", fmt.Sprintf("%s / %s", commas(r.Settled), commas(r.Charged))},
		{"charges over the budget", commas(r.ChargedOver)},
		{"tokens reserved", commas64(r.TokensReserved)},
		{"tokens used", commas64(r.TokensUsed)},
		{"tokens charged", commas64(r.TokensCharged)},
		{"tokens used per tenant and window, mean", f0(r.UsedPerWindow)},
		{"decisions/s (reserves; settles and charges besides)", f0(r.DecisionsPerSec)},
		{"calls", commas(r.Calls)},
		{"reserve p50 / p99 µs", fmt.Sprintf("%s / %s", f0(r.P50us), f0(r.P99us))},
		{"most tokens in a window at an admission", fmt.Sprintf("%s of %s", commas(r.Peak), commas(r.Max))},
		{"admitted over the budget", strconv.Itoa(r.Over)},
		{"false denials", strconv.Itoa(r.FalseDenials)},
		{"charges misjudged", strconv.Itoa(r.Misjudged)},
		{"decisions in doubt (a Settle in flight)", commas(r.InDoubt)},
		{"entries checked on the server / unchecked", fmt.Sprintf("%s / %s in %d reads", commas(r.Entries), commas(r.Unchecked), r.Reads)},
		{"tokens checked on the server", commas64(r.Tokens)},
		{"mismatched", strconv.Itoa(r.Mismatched)},
	} {
		row(w, f[0], f[1])
	}
	held := "held"
	if !r.met() {
		held = "FAILED"
	}
	fmt.Fprintf(w, "\nTokens charged %s for %s used; %d admitted over the budget, %d false denials, %d charges misjudged, %d mismatched on the server: exactness %s\n",
		commas64(r.TokensCharged), commas64(r.TokensUsed), r.Over, r.FalseDenials, r.Misjudged, r.Mismatched, held)
}
