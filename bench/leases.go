package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/strictrate/strictrate/engine"
)

// leaseMax is the in-flight limit of every lease case: slots per key, as in the tests' audit.
const leaseMax = 5

// leaseTTL is every lease's ttl: far longer than any hold, so that only releases free slots.
const leaseTTL = 10 * time.Second

// LeaseRow is scenario 6 for one case: acquire+release pairs of in-flight leases.
type LeaseRow struct {
	Case       string `json:"case"`
	Keys       int    `json:"keys"`
	Max        int    `json:"max_leases_per_key"`
	Goroutines int    `json:"goroutines"`
	// Hold is how long a holder keeps its slot between Acquire and Release.
	Hold     string `json:"hold"`
	Attempts int    `json:"acquire_attempts"`
	Pairs    int    `json:"pairs"`
	// PairsPerSec counts acquire+release pairs completed; AttemptsPerSec counts every Acquire,
	// denied ones included.
	PairsPerSec    float64 `json:"pairs_per_sec"`
	AttemptsPerSec float64 `json:"acquire_attempts_per_sec"`
	DeniedShare    float64 `json:"denied_fraction"`
	// P50us and P99us are the client's time for a pair: Acquire's round trip plus Release's,
	// the hold left out.
	P50us float64 `json:"pair_latency_p50_us"`
	P99us float64 `json:"pair_latency_p99_us"`
	// ServerUSPerCall is the scripts' server time (INFO commandstats) per script call.
	ServerUSPerCall float64 `json:"server_us_per_call"`
	// PeakHolders is, on one key, the most holders at once, counted on the client side: raised
	// after Acquire, lowered before Release; Overshoot is how far that exceeds Max. Both are 0
	// for many keys, where one counter would mix the keys.
	PeakHolders int64 `json:"max_holders_at_once,omitempty"`
	Overshoot   int64 `json:"overshoot"`
	// Through is how many goroutines completed at least one pair.
	Through int `json:"goroutines_through"`
}

// leaseCase is one row of the lease scenario.
type leaseCase struct {
	name string
	keys int // 0: the run's -keys
	// hold, when set, keeps each slot 1-10 ms, and a denied holder waits the denial's
	// RetryAfter or 1-4 ms, whichever is shorter, before it tries again; else holders release
	// at once and retry at once.
	hold bool
}

var leaseCases = []leaseCase{
	{name: "many keys"},
	{name: "hot key", keys: 1},
	{name: "holders audit", keys: 1, hold: true},
}

func (b *bencher) leases(ctx context.Context) ([]LeaseRow, error) {
	es, err := b.engines()
	if err != nil {
		return nil, err
	}
	var rows []LeaseRow
	for _, lc := range leaseCases {
		row, err := b.leaseCase(ctx, es, lc)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
		b.logf("leases/%s: %.0f pairs/s, %.0f attempts/s, %d of %d goroutines through; on one key, %d holders at most (max %d)",
			lc.name, row.PairsPerSec, row.AttemptsPerSec, row.Through, row.Goroutines, row.PeakHolders, row.Max)
	}
	return rows, nil
}

func (b *bencher) leaseCase(ctx context.Context, es []*engine.Engine, lc leaseCase) (LeaseRow, error) {
	nkeys := lc.keys
	if nkeys == 0 {
		nkeys = b.cfg.Keys
	}
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = "lease:" + lc.name + ":" + strconv.Itoa(i)
	}
	n := b.cfg.Concurrency
	rngs := make([]*rand.Rand, n)
	for g := range rngs {
		rngs[g] = rand.New(rand.NewPCG(uint64(g), 6))
	}
	lat := make([][]time.Duration, n)
	attempts := make([]int, n)
	var holders, peak atomic.Int64
	op := func(g int, e *engine.Engine) error {
		rng := rngs[g]
		attempts[g]++
		t := time.Now()
		l, err := e.Acquire(ctx, keys[rng.IntN(len(keys))], leaseMax, leaseTTL)
		acquired := time.Since(t)
		if denied := (*engine.LeaseDeniedError)(nil); errors.As(err, &denied) {
			if lc.hold {
				time.Sleep(min(denied.RetryAfter(), time.Duration(1+rng.IntN(4))*time.Millisecond))
			}
			return nil
		}
		if err != nil {
			return err
		}
		h := holders.Add(1)
		for p := peak.Load(); h > p && !peak.CompareAndSwap(p, h); p = peak.Load() {
		}
		if lc.hold {
			time.Sleep(time.Duration(1+rng.IntN(10)) * time.Millisecond)
		}
		holders.Add(-1)
		t = time.Now()
		if err := e.Release(ctx, l); err != nil {
			return err
		}
		lat[g] = append(lat[g], acquired+time.Since(t))
		return nil
	}
	before, err := readServerStats(ctx, b.clients[0])
	if err != nil {
		return LeaseRow{}, err
	}
	began := time.Now()
	if err := drive(ctx, b, b.cfg.Duration, op, es); err != nil {
		return LeaseRow{}, err
	}
	elapsed := time.Since(began)
	after, err := readServerStats(ctx, b.clients[0])
	if err != nil {
		return LeaseRow{}, err
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	row := LeaseRow{Case: lc.name, Keys: len(keys), Max: leaseMax, Goroutines: n, Hold: "0", Pairs: len(all),
		P50us: us(percentile(all, 50)), P99us: us(percentile(all, 99))}
	if len(keys) == 1 {
		row.PeakHolders = peak.Load()
	}
	if lc.hold {
		row.Hold = "1-10 ms"
	}
	for g := range lat {
		row.Attempts += attempts[g]
		if len(lat[g]) > 0 {
			row.Through++
		}
	}
	row.PairsPerSec = float64(row.Pairs) / elapsed.Seconds()
	row.AttemptsPerSec = float64(row.Attempts) / elapsed.Seconds()
	if row.Attempts > 0 {
		row.DeniedShare = float64(row.Attempts-row.Pairs) / float64(row.Attempts)
	}
	if calls := row.Attempts + row.Pairs; calls > 0 {
		row.ServerUSPerCall = (after.usec(dataCommands(false)) - before.usec(dataCommands(false))) / float64(calls)
	}
	row.Overshoot = max(0, row.PeakHolders-leaseMax)
	return row, nil
}
