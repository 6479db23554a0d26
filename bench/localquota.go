package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/strictrate/strictrate/engine"
)

// The local quota scenario (engine.WithLocalQuota): one hot key, every goroutine, with and
// without local quota, and a server that stops answering for a while under a limit the load
// exceeds.

// LocalQuotaRow is one row of the local quota scenario.
type LocalQuotaRow struct {
	Row      string  `json:"row"`
	Limit    int     `json:"limit_max"`
	WindowMS float64 `json:"window_ms"`
	// AdmittedPerSec is admitted requests per second over the row's run.
	AdmittedPerSec float64 `json:"admitted_per_sec"`
	// ServerCalls is the script calls the server ran for the row.
	ServerCalls int64 `json:"server_calls"`
	// DuringOutage is the requests admitted while the server was paused (outage row).
	DuringOutage int `json:"admitted_during_outage,omitempty"`
	// HeldAfter is, one hold after the run, the events the key still counts beyond those the
	// callers were told were admitted (outage row; -1 elsewhere): reserved events not given
	// back, and decisions whose callers gave up during the pause but that the server took
	// when it answered again.
	HeldAfter int `json:"events_held_one_hold_after"`
	Exactness
}

const (
	localHotMax     = 1_000_000 // the hot key's limit per second
	localOutageMax  = 2_000_000 // the outage row's limit per 10 s: the run's load exceeds it, but not before the pause
	localOutageHold = 5 * time.Second
	localOutage     = 2 * time.Second
)

// localCase is one row of the scenario: key under limit, from every goroutine, for d.
type localCase struct {
	name  string
	limit engine.Limit
	opts  []engine.Option
	d     time.Duration
	// shift moves the demand between engines: in each quarter of the run only half of them
	// ask (the first half, then the other, in turn), so that what a process reserved is left
	// unused when its demand stops.
	shift bool
	// pauseAt > 0 stops the server (CLIENT PAUSE) for localOutage from pauseAt into the run;
	// a decision then waits 100 ms at most, and one that fails counts as denied.
	pauseAt time.Duration
}

// localQuota runs the scenario's rows, each with and without local quota where it compares.
func (b *bencher) localQuota(ctx context.Context) ([]LocalQuotaRow, error) {
	local := append(slices.Clone(batched), engine.WithLocalQuota(engine.LocalQuota{}))
	hot, shifting := engine.PerSecond(localHotMax), engine.Limit{Max: 2000, Window: time.Second}
	cases := []localCase{
		{name: "batched, one key of 1,000,000/s", limit: hot, opts: batched, d: b.cfg.Duration},
		{name: "batched + local quota (default hold: 100 ms here), one key of 1,000,000/s", limit: hot, opts: local, d: b.cfg.Duration},
		{name: "batched, demand shifting between engines", limit: shifting, opts: batched, d: b.cfg.Duration, shift: true},
		{name: "batched + local quota (default hold: 100 ms here), demand shifting between engines", limit: shifting, opts: local,
			d: b.cfg.Duration, shift: true},
		{name: fmt.Sprintf("local quota (hold %s), the server paused %s", localOutageHold, localOutage),
			limit: engine.Limit{Max: localOutageMax, Window: 10 * time.Second},
			opts:  append(slices.Clone(batched), engine.WithLocalQuota(engine.LocalQuota{Hold: localOutageHold})),
			d:     4 * time.Second, pauseAt: time.Second},
	}
	rows := make([]LocalQuotaRow, 0, len(cases))
	for i, c := range cases {
		row, err := b.localRow(ctx, "local:"+fmt.Sprint(i), c)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name, err)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// localRow runs c on key. Its false denials are the requests denied while the admitted events
// of their trailing window were fewer than Max: what an exact log without reservations would
// have admitted (in the outage row, the decisions that timed out too).
func (b *bencher) localRow(ctx context.Context, key string, c localCase) (LocalQuotaRow, error) {
	es, err := b.engines(c.opts...)
	if err != nil {
		return LocalQuotaRow{}, err
	}
	before, err := readServerStats(ctx, b.clients[0])
	if err != nil {
		return LocalQuotaRow{}, err
	}
	began := time.Now()
	var pausedFrom, pausedTo time.Time
	var wg sync.WaitGroup
	if c.pauseAt > 0 {
		wg.Go(func() {
			time.Sleep(c.pauseAt)
			admin := b.clients[0]
			pausedFrom = time.Now()
			_ = admin.Do(ctx, admin.B().ClientPause().Timeout(localOutage.Milliseconds()).All().Build()).Error()
			pausedTo = pausedFrom.Add(localOutage)
		})
	}
	perG := make([][]Decision, b.cfg.Concurrency)
	err = drive(ctx, b, c.d, func(g int, e *engine.Engine) error {
		if quarter := int(4 * time.Since(began) / c.d); c.shift && (g%len(es) < len(es)/2) != (quarter%2 == 0) {
			time.Sleep(time.Millisecond) // this engine's demand is elsewhere now
			return nil
		}
		dctx, cancel := ctx, context.CancelFunc(func() {})
		if c.pauseAt > 0 {
			dctx, cancel = context.WithTimeout(ctx, 100*time.Millisecond)
		}
		r, err := e.Allow(dctx, key, c.limit)
		cancel()
		switch {
		case err == nil:
			perG[g] = append(perG[g], Decision{AtMicros: r.At.UnixMicro(), Allowed: r.Allowed})
		case c.pauseAt > 0:
			perG[g] = append(perG[g], Decision{AtMicros: time.Now().UnixMicro()})
		default:
			return err
		}
		return nil
	}, es)
	wg.Wait()
	if err != nil {
		return LocalQuotaRow{}, err
	}
	elapsed := time.Since(began)
	// Once paused, the server answers nothing until the pause ends.
	time.Sleep(time.Until(pausedTo))
	after, err := readServerStats(ctx, b.clients[0])
	if err != nil {
		return LocalQuotaRow{}, err
	}
	l := c.limit
	decisions := slices.Concat(perG...)
	row := LocalQuotaRow{Row: c.name, Limit: l.Max, WindowMS: ms(l.Window), Exactness: analyze(decisions, l.Max, l.Window),
		ServerCalls: after.calls(dataCommands(false)) - before.calls(dataCommands(false)), HeldAfter: -1}
	if c.pauseAt > 0 {
		// Every hold ends within one hold of the run's end; then the key counts exactly what
		// was admitted (the run and the wait lie within one window).
		time.Sleep(localOutageHold + 200*time.Millisecond)
		r, err := es[0].Peek(ctx, key, l)
		if err != nil {
			return LocalQuotaRow{}, err
		}
		row.HeldAfter = l.Max - r.Remaining - row.Admitted
	}
	row.AdmittedPerSec = float64(row.Admitted) / elapsed.Seconds()
	for _, dn := range decisions {
		at := time.UnixMicro(dn.AtMicros)
		if dn.Allowed && !pausedFrom.IsZero() && !at.Before(pausedFrom) && at.Before(pausedTo) {
			row.DuringOutage++
		}
	}
	b.logf("localquota/%s: %d admitted, %d script calls, max in any window %d of %d, %d false denials",
		c.name, row.Admitted, row.ServerCalls, row.MaxInAnyWindow, l.Max, row.FalseDenials)
	return row, nil
}

// writeLocalQuota prints the local quota scenario's table, and the ratios its targets
// name: admitted/s with local quota over without, and script calls per admitted request.
func writeLocalQuota(w io.Writer, rows []LocalQuotaRow) {
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(w, "\n### Local quota: one hot key, every goroutine (`-scenario localquota`)\n\n")
	table(w, []string{"row", "limit", "window", "admitted/s", "script calls", "calls per admitted", "admitted during the outage",
		"counted beyond the admitted, one hold after", "max in any window", "overshoot", "false denials"})
	for _, r := range rows {
		during, held := "-", "-"
		if r.HeldAfter >= 0 || r.DuringOutage > 0 {
			during, held = strconv.Itoa(r.DuringOutage), strconv.Itoa(r.HeldAfter)
		}
		row(w, r.Row, strconv.Itoa(r.Limit), fmt.Sprintf("%.0f ms", r.WindowMS), f0(r.AdmittedPerSec), strconv.FormatInt(r.ServerCalls, 10),
			fmt.Sprintf("%.4f", float64(r.ServerCalls)/float64(max(r.Admitted, 1))), during, held, strconv.Itoa(r.MaxInAnyWindow), strconv.Itoa(r.Overshoot), strconv.Itoa(r.FalseDenials))
	}
	if len(rows) >= 2 && rows[0].AdmittedPerSec > 0 {
		fmt.Fprintf(w, "\nadmitted/s on the hot key, same run: with local quota / without %.2f\n", rows[1].AdmittedPerSec/rows[0].AdmittedPerSec)
	}
}
