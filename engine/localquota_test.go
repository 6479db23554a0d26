package engine_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// hammerAllow runs goroutines callers, spread over es, each calling Allow on key under l until
// deadline, and returns every Result that admitted (a shadow mode's denial, admitted anyway,
// is left out: the limit did not admit it).
func hammerAllow(t *testing.T, es []*engine.Engine, goroutines int, key string, l engine.Limit, deadline time.Time) []engine.Result {
	t.Helper()
	var (
		mu       sync.Mutex
		admitted []engine.Result
		wg       sync.WaitGroup
	)
	for g := range goroutines {
		e := es[g%len(es)]
		wg.Go(func() {
			var mine []engine.Result
			for time.Now().Before(deadline) {
				r, err := e.Allow(context.Background(), key, l)
				if err != nil {
					t.Errorf("Allow: %v", err)
					return
				}
				if r.Allowed && !r.ShadowDenied {
					mine = append(mine, r)
				}
			}
			mu.Lock()
			admitted = append(admitted, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return admitted
}

// admitEach calls Allow on key under l times times through e, fails t unless every call
// admitted, and returns the Results.
func admitEach(t *testing.T, e *engine.Engine, key string, l engine.Limit, times int) []engine.Result {
	t.Helper()
	admitted := make([]engine.Result, 0, times)
	for range times {
		r, err := e.Allow(context.Background(), key, l)
		if err != nil || !r.Allowed {
			t.Fatalf("Allow: %+v, %v", r, err)
		}
		admitted = append(admitted, r)
	}
	return admitted
}

// auditTimes fails t when some trailing window of l holds more than l.Max of the admissions'
// times (each admission one event).
func auditTimes(t *testing.T, admitted []engine.Result, l engine.Limit) {
	t.Helper()
	times := make([]time.Time, len(admitted))
	for i, r := range admitted {
		times[i] = r.At
	}
	auditTimestamps(t, times, l)
}

// Four engines of 16 goroutines on one key, with local quota, against a limit the load
// exceeds many times over: audited on the times of every admission (a local one's is when the
// process admitted it), no trailing window holds more than Max. The metrics say that
// admissions were made from reservations, and, once every hold has ended, that every event
// reserved was used or given back. Alone, beside the deny cache, under shadow mode (whose
// admitted denials are not admissions) and without batching.
func TestLocalQuotaNeverOverAdmits(t *testing.T) {
	const hold = 50 * time.Millisecond
	for name, opts := range map[string][]engine.Option{
		"alone":       nil,
		"deny cache":  {engine.WithDenyCache(1024)},
		"shadow mode": {engine.WithShadow(true)},
		"unbatched":   {engine.WithBatching(false)},
	} {
		t.Run(name, func(t *testing.T) {
			reader := sdkmetric.NewManualReader()
			es, _ := enginetest.Engines(t, exampleServer, 4, append([]engine.Option{engine.WithLocalQuota(engine.LocalQuota{Hold: hold, MinDemand: 8}),
				engine.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))}, opts...)...)
			l := engine.Limit{Max: 300, Window: 200 * time.Millisecond}
			admitted := hammerAllow(t, es, 64, enginetest.NewKey(t), l, time.Now().Add(time.Second))
			if t.Failed() {
				return
			}
			auditTimes(t, admitted, l)
			time.Sleep(4 * hold) // every hold ends, and its unused events are given back
			local := collected(t, reader)["strictrate.local.events"]
			t.Logf("%d admitted; local quota: %v", len(admitted), local)
			switch {
			case local["used"] == 0 || local["used"] > int64(len(admitted)):
				t.Fatalf("%d events used from reservations, of %d admitted; want some, at most all", local["used"], len(admitted))
			case local["reserved"] != local["used"]+local["returned"]:
				t.Fatalf("%d events reserved, %d used and %d given back; want reserved = used + given back", local["reserved"], local["used"], local["returned"])
			}
		})
	}
}

// A hot key with a high limit (1,000,000 per second) under four engines of 16 goroutines: with
// local quota, at most 0.05 script calls per admitted request.
func TestLocalQuotaHotKeyTakesFewScriptCalls(t *testing.T) {
	srv := valkeytest.New(t, valkeytest.OwnServer())
	es, c := enginetest.Engines(t, srv, 4, engine.WithLocalQuota(engine.LocalQuota{}))
	if err := c.Do(context.Background(), c.B().ConfigResetstat().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	l := engine.PerSecond(1_000_000)
	admitted := hammerAllow(t, es, 64, enginetest.NewKey(t), l, time.Now().Add(time.Second))
	if t.Failed() {
		return
	}
	calls := scriptCalls(t, c)
	perAdmission := float64(calls) / float64(len(admitted))
	t.Logf("%d admitted in %d script calls: %.4f a request", len(admitted), calls, perAdmission)
	if perAdmission > 0.05 {
		t.Fatalf("%.4f script calls per admitted request, want at most 0.05", perAdmission)
	}
}

// What a reservation did not use comes back when its hold ends, and a Refund of a locally
// admitted request gives its event back: after the hold, the key's room is exactly Max less
// what was admitted and not refunded.
func TestLocalQuotaGivesBackUnusedAndRefunds(t *testing.T) {
	const hold = 100 * time.Millisecond
	e := enginetest.New(t, exampleServer.Client(t), engine.WithLocalQuota(engine.LocalQuota{Hold: hold, MinDemand: 4}))
	ctx := context.Background()
	key, l := enginetest.NewKey(t), engine.PerMinute(100)
	admitted := admitEach(t, e, key, l, 20)
	// While held, the reservation takes room from the others: a peek sees less than 80 left.
	held, err := e.Peek(ctx, key, l)
	if err != nil {
		t.Fatal(err)
	}
	if held.Remaining >= 80 {
		t.Fatalf("while held, %d left: no reservation was taken", held.Remaining)
	}
	refunded := 0
	for _, r := range admitted[len(admitted)-3:] {
		if err := e.Refund(ctx, key, r); err != nil {
			t.Fatalf("Refund(%+v): %v", r.Entry, err)
		}
		refunded++
	}
	if err := valkeytest.WaitFor(ctx, 5*time.Second, "the reservation's unused events to come back", func() (bool, error) {
		r, err := e.Peek(ctx, key, l)
		return err == nil && r.Remaining == 100-len(admitted)+refunded, err
	}); err != nil {
		r, _ := e.Peek(ctx, key, l)
		t.Fatalf("%v: %d left, want %d", err, r.Remaining, 100-len(admitted)+refunded)
	}
}

// While the server does not answer (SIGSTOP), a process keeps admitting a hot key from
// the reservations it holds (a 5 s hold), of cost 1 and 3, under a policy of two limits that
// the load exceeds; once they are used up, it answers as configured (fail-closed: an error).
// After SIGCONT, decisions resume, no window of either limit held more than its Max, and
// within one hold every unused reserved event is back: the key counts exactly what was
// admitted.
func TestLocalQuotaThroughAnOutage(t *testing.T) {
	const hold = 5 * time.Second
	srv := valkeytest.New(t, valkeytest.OwnServer())
	t.Cleanup(func() { _ = srv.Resume() })
	e := enginetest.New(t, srv.Client(t), engine.WithLocalQuota(engine.LocalQuota{Hold: hold, MinDemand: 4}))
	ctx := context.Background()
	p := engine.Policy{engine.PerMinute(400), engine.PerHour(1000)}
	key := enginetest.NewKey(t)
	var admitted []engine.Result
	events := 0
	allow := func(ctx context.Context, n int) (engine.Result, error) {
		r, err := e.AllowPolicy(ctx, key, p, n)
		if err == nil && r.Allowed {
			for range n {
				admitted = append(admitted, r)
			}
			events += n
		}
		return r, err
	}
	for i := range 40 {
		if r, err := allow(ctx, 1+2*(i%2)); err != nil || !r.Allowed {
			t.Fatalf("Allow: %+v, %v", r, err)
		}
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	// Until the first failure, which comes once the reservation is used up; the bound is only
	// there to end a test that would never see one.
	paused := time.Now()
	during, failed := 0, 0
	for time.Since(paused) < 30*time.Second && failed == 0 {
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		r, err := allow(cctx, 1+2*(during%2))
		cancel()
		switch {
		case err == nil && r.Allowed:
			during++
		case errors.Is(err, context.DeadlineExceeded):
			failed++
		case err != nil:
			t.Fatalf("Allow during the pause: %v", err)
		}
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	t.Logf("during the pause: %d admitted locally, then %d failed", during, failed)
	if during == 0 || failed == 0 {
		t.Fatalf("during the pause: %d admitted, %d failed; want admissions from the reservation, then a failure once it was used up", during, failed)
	}
	if err := valkeytest.WaitFor(ctx, 10*time.Second, "decisions to resume", func() (bool, error) {
		_, err := allow(ctx, 1)
		return err == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, l := range p {
		auditTimes(t, admitted, l)
	}
	// One hold after the last reservation, every unused event is back. The decisions whose
	// callers gave up during the pause may have been taken when the server ran again: they
	// count (never too few), and are the only events beyond the admitted.
	if err := valkeytest.WaitFor(ctx, hold+5*time.Second, "unused reserved events to come back", func() (bool, error) {
		r, err := e.Peek(ctx, key, p[1])
		return err == nil && 1000-r.Remaining <= events+3*failed, err
	}); err != nil {
		r, _ := e.Peek(ctx, key, p[1])
		t.Fatalf("%v: the key counts %d events, %d admitted, %d timed out", err, 1000-r.Remaining, events, failed)
	}
}

// A negative Hold or MinDemand, or a Hold below a millisecond, is refused by New.
func TestLocalQuotaBadOptionsRefused(t *testing.T) {
	for _, q := range []engine.LocalQuota{{Hold: -time.Second}, {MinDemand: -1}, {Hold: time.Microsecond}} {
		if _, err := engine.New(exampleServer.Client(t), engine.WithLocalQuota(q)); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("LocalQuota %+v: %v, want ErrInvalidArgument", q, err)
		}
	}
}

// On a 3-primary cluster, four engines of 16 goroutines with local quota on six hot keys (so
// over every primary, most likely): per key, audited on the times of every admission, no
// trailing window holds more than Max, and the engines admitted from reservations.
func TestLocalQuotaClusterNeverOverAdmits(t *testing.T) {
	valkeytest.SkipIfShort(t, "starts a cluster")
	c := valkeytest.NewCluster(t, 3, 0)
	reader := sdkmetric.NewManualReader()
	es := clusterEngines(t, c, 4, engine.WithLocalQuota(engine.LocalQuota{Hold: 50 * time.Millisecond, MinDemand: 8}),
		engine.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	l := engine.Limit{Max: 200, Window: 200 * time.Millisecond}
	keys := make([]string, 6)
	for i := range keys {
		keys[i] = enginetest.NewKey(t)
	}
	deadline := time.Now().Add(1200 * time.Millisecond)
	var wg sync.WaitGroup
	perKey := make([][]engine.Result, len(keys))
	var mu sync.Mutex
	for i, key := range keys {
		wg.Go(func() {
			admitted := hammerAllow(t, es, 16, key, l, deadline)
			mu.Lock()
			perKey[i] = admitted
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for i, admitted := range perKey {
		if len(admitted) == 0 {
			t.Fatalf("key %s: nothing admitted", keys[i])
		}
		auditTimes(t, admitted, l)
	}
	if used := collected(t, reader)["strictrate.local.events"]["used"]; used == 0 {
		t.Fatal("no event was admitted from a reservation")
	}
}

// The server killed (kill -9) and restarted while a process holds a reservation: with an
// append-only file fsynced on every write, the restarted server still counts the reservation,
// the process goes on admitting from it, and its unused events come back after the hold; no
// window is over Max. Without persistence the restarted server has forgotten the
// reservation, as it forgets every entry: the key counts nothing, while the process may still
// admit what it holds (docs/production.md says so).
func TestLocalQuotaServerKilledKeepsReservationsOnlyIfPersisted(t *testing.T) {
	valkeytest.SkipIfShort(t, "kills the server (kill -9) to see what survives")
	const hold = 2 * time.Second
	l := engine.PerMinute(200)
	for _, tc := range []struct {
		name       string
		opts       []valkeytest.Option
		remembered bool
	}{
		{"appendfsync always", []valkeytest.Option{valkeytest.AppendOnly("always")}, true},
		{"no persistence", []valkeytest.Option{valkeytest.OwnServer()}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := valkeytest.New(t, tc.opts...)
			e := enginetest.New(t, srv.Client(t), engine.WithLocalQuota(engine.LocalQuota{Hold: hold, MinDemand: 4}))
			ctx := context.Background()
			key := enginetest.NewKey(t)
			admitted := admitEach(t, e, key, l, 20)
			peek := func() int {
				t.Helper()
				var r engine.Result
				if err := valkeytest.WaitFor(ctx, 10*time.Second, "a peek", func() (bool, error) {
					var err error
					r, err = e.Peek(ctx, key, l)
					return err == nil, nil
				}); err != nil {
					t.Fatal(err)
				}
				return l.Max - r.Remaining
			}
			before := peek()
			if before <= len(admitted) {
				t.Fatalf("the key counts %d events for %d admitted: no reservation held", before, len(admitted))
			}
			if err := srv.Crash(); err != nil {
				t.Fatal(err)
			}
			// While the server is down, the reservation still admits.
			r, err := e.Allow(ctx, key, l)
			if err != nil || !r.Allowed {
				t.Fatalf("Allow with the server down: %+v, %v; want an admission from the reservation", r, err)
			}
			admitted = append(admitted, r)
			if err := srv.Restart(ctx); err != nil {
				t.Fatal(err)
			}
			after := peek()
			switch {
			case tc.remembered && after != before:
				t.Fatalf("after the restart the key counts %d events, before the kill %d: the reservation was not kept", after, before)
			case !tc.remembered && after != 0:
				t.Fatalf("without persistence the restarted key counts %d events, want 0", after)
			}
			if tc.remembered {
				if err := valkeytest.WaitFor(ctx, hold+5*time.Second, "the unused events to come back", func() (bool, error) {
					return peek() == len(admitted), nil
				}); err != nil {
					t.Fatalf("%v: the key counts %d, %d admitted", err, peek(), len(admitted))
				}
				auditTimes(t, admitted, l)
			}
		})
	}
}

// Under WithFailOpen, a reservation the server could not take is admitted open, recording
// nothing: it is no reservation, and nothing is admitted locally from it. Every admission
// while the server is down is fail-open's own (BackendErr set); once it is back, the key
// admits its Max and no more, each decision the server's.
func TestLocalQuotaFailOpenTakesNoReservation(t *testing.T) {
	srv := valkeytest.New(t, valkeytest.OwnServer())
	e := enginetest.New(t, srv.Client(t), engine.WithFailOpen(true),
		engine.WithLocalQuota(engine.LocalQuota{Hold: 5 * time.Second, MinDemand: 4}))
	if err := srv.Crash(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key, l := enginetest.NewKey(t), engine.PerMinute(5)
	allow := func(i int) engine.Result {
		t.Helper()
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		r, err := e.Allow(cctx, key, l)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		return r
	}
	for i := range 10 {
		if r := allow(i); !r.Allowed || r.BackendErr == nil {
			t.Fatalf("request %d with the server down: %+v; want fail-open's admission, BackendErr set", i, r)
		}
	}
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if err := valkeytest.WaitFor(ctx, 10*time.Second, "the server to decide again", func() (bool, error) {
		r, err := e.Peek(ctx, key, l)
		return err == nil && r.BackendErr == nil, nil
	}); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for i := range 10 {
		r := allow(10 + i)
		if r.BackendErr != nil {
			t.Fatalf("request %d with the server up: %+v, a fail-open answer; want the server's decision", 10+i, r)
		}
		if r.Allowed {
			admitted++
		}
	}
	if admitted != l.Max {
		t.Fatalf("%d admitted once the server was back, want its Max %d", admitted, l.Max)
	}
}

// Reset ends the engine's reservations of the key: after it, the key admits exactly Max, none
// of them from what this process had reserved before.
func TestLocalQuotaResetEndsReservations(t *testing.T) {
	e := enginetest.New(t, exampleServer.Client(t), engine.WithLocalQuota(engine.LocalQuota{Hold: 5 * time.Second, MinDemand: 4}))
	ctx := context.Background()
	key, l := enginetest.NewKey(t), engine.PerMinute(20)
	admitEach(t, e, key, l, 8)
	if err := e.Reset(ctx, key); err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for range 40 {
		r, err := e.Allow(ctx, key, l)
		if err != nil {
			t.Fatal(err)
		}
		if r.Allowed {
			admitted++
		}
	}
	if admitted != l.Max {
		t.Fatalf("after Reset %d admitted, want Max %d", admitted, l.Max)
	}
}

// localChildEnv, when set, makes TestLocalQuotaAcrossProcessesNeverOverAdmits a child: it admits on the key
// its value names with local quota on until its time is up, and prints the time of every
// admission.
const localChildEnv = "STRICTRATE_TEST_LOCAL_QUOTA_CHILD"

// localProcessesLimit is the limit TestLocalQuotaAcrossProcessesNeverOverAdmits's processes share.
var localProcessesLimit = engine.Limit{Max: 150, Window: 200 * time.Millisecond}

// Three OS processes (this test binary run again), each with 2 engines of 8 goroutines and
// local quota on, hammer one key for 1.2 s: audited on the times of every admission of all
// three, no trailing window holds more than Max; and the processes admitted from reservations
// (each child says how many of its admissions were local).
func TestLocalQuotaAcrossProcessesNeverOverAdmits(t *testing.T) {
	if key := os.Getenv(localChildEnv); key != "" {
		runLocalChild(t, key)
		return
	}
	valkeytest.SkipIfShort(t, "starts OS processes")
	key := exampleKey("local-quota-procs")
	var (
		mu       sync.Mutex
		admitted []engine.Result
		local    int
		wg       sync.WaitGroup
	)
	for p := 0; p < 3; p++ {
		child := startChild(t, "TestLocalQuotaAcrossProcessesNeverOverAdmits", localChildEnv+"="+key)
		wg.Go(func() {
			sc := bufio.NewScanner(child.Stdout)
			var mine []engine.Result
			used := 0
			for sc.Scan() {
				var at int64
				var n int
				switch {
				case strings.HasPrefix(sc.Text(), "admitted "):
					if _, err := fmt.Sscanf(sc.Text(), "admitted %d", &at); err == nil {
						mine = append(mine, engine.Result{Allowed: true, At: time.UnixMicro(at)})
					}
				case strings.HasPrefix(sc.Text(), "local "):
					if _, err := fmt.Sscanf(sc.Text(), "local %d", &n); err == nil {
						used = n
					}
				}
			}
			if err := child.Wait(); err != nil {
				t.Errorf("child %d: %v", p, err)
			}
			mu.Lock()
			admitted, local = append(admitted, mine...), local+used
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	auditTimes(t, admitted, localProcessesLimit)
	t.Logf("%d admissions by 3 processes, %d of them from reservations", len(admitted), local)
	if local == 0 {
		t.Fatal("no process admitted from a reservation")
	}
}

// runLocalChild is a child of TestLocalQuotaAcrossProcessesNeverOverAdmits on key.
func runLocalChild(t *testing.T, key string) {
	reader := sdkmetric.NewManualReader()
	var engines []*engine.Engine
	for range 2 {
		e, err := engine.New(exampleClient(), engine.WithLocalQuota(engine.LocalQuota{Hold: 50 * time.Millisecond, MinDemand: 8}),
			engine.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
	}
	admitted := hammerAllow(t, engines, 16, key, localProcessesLimit, time.Now().Add(1200*time.Millisecond))
	out := bufio.NewWriter(os.Stdout)
	for _, r := range admitted {
		fmt.Fprintf(out, "admitted %d\n", r.At.UnixMicro())
	}
	fmt.Fprintf(out, "local %d\n", collected(t, reader)["strictrate.local.events"]["used"])
	out.Flush()
}

// dyingChildEnv, when set, makes TestLocalQuotaReservationOfAKilledProcessComesBack a child: it
// admits on the key its value names until it holds a reservation, prints the events it
// reserved and admitted directly, and kills itself, giving nothing back.
const dyingChildEnv = "STRICTRATE_TEST_LOCAL_QUOTA_DYING"

// dyingLimit and dyingHold are the limit and hold of TestLocalQuotaReservationOfAKilledProcessComesBack.
var (
	dyingLimit = engine.Limit{Max: 100, Window: time.Second}
	dyingHold  = 300 * time.Millisecond
)

// A process killed (SIGKILL) while it holds a reservation never gives it back: the key counts
// the whole reservation, used or not, until one window after its hold ends; then every event
// is back.
func TestLocalQuotaReservationOfAKilledProcessComesBack(t *testing.T) {
	if key := os.Getenv(dyingChildEnv); key != "" {
		runDyingChild(t, key)
		return
	}
	valkeytest.SkipIfShort(t, "starts an OS process that kills itself")
	key := exampleKey("local-quota-dying")
	// The child kills itself (SIGKILL) once it holds a reservation: its exit is the error.
	child := startChild(t, "TestLocalQuotaReservationOfAKilledProcessComesBack", dyingChildEnv+"="+key)
	out, _ := io.ReadAll(child.Stdout)
	if err := child.Wait(); !strings.Contains(string(out), "reserved") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	exited := time.Now()
	var reserved, direct int
	if _, err := fmt.Sscanf(string(out[strings.Index(string(out), "reserved"):]), "reserved %d direct %d", &reserved, &direct); err != nil {
		t.Fatalf("child said %q: %v", out, err)
	}
	e, err := engine.New(exampleClient(), engine.WithPreload(false))
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.Peek(t.Context(), key, dyingLimit)
	if err != nil {
		t.Fatal(err)
	}
	if counted := dyingLimit.Max - r.Remaining; counted != reserved+direct {
		t.Fatalf("after the child exited the key counts %d events, want its reservation's %d and its %d direct admissions", counted, reserved, direct)
	}
	// The reservation counts until one window after its hold ends, at most: then all is back.
	time.Sleep(time.Until(exited.Add(dyingHold + dyingLimit.Window + 100*time.Millisecond)))
	if r, err = e.Peek(t.Context(), key, dyingLimit); err != nil || r.Remaining != dyingLimit.Max {
		t.Fatalf("a window after the hold: %+v, %v; want every event back", r, err)
	}
	t.Logf("the child reserved %d events and admitted %d directly, then was killed", reserved, direct)
}

// runDyingChild is a child of TestLocalQuotaReservationOfAKilledProcessComesBack on key.
func runDyingChild(t *testing.T, key string) {
	reader := sdkmetric.NewManualReader()
	e, err := engine.New(exampleClient(), engine.WithLocalQuota(engine.LocalQuota{Hold: dyingHold, MinDemand: 4}),
		engine.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	if err != nil {
		t.Fatal(err)
	}
	admitted := 0
	for range 50 {
		r, err := e.Allow(t.Context(), key, dyingLimit)
		if err != nil || !r.Allowed {
			t.Fatalf("Allow: %+v, %v", r, err)
		}
		admitted++
		if local := collected(t, reader)["strictrate.local.events"]; local["reserved"] > 0 {
			// The requests before the reservation were decided by the server one by one; the
			// one that took it is among the reserved events.
			fmt.Printf("reserved %d direct %d\n", local["reserved"], admitted-int(local["used"]))
			self, _ := os.FindProcess(os.Getpid())
			_ = self.Kill() // dies at once, as kill -9 kills it: no timer, no give-back
			select {}
		}
	}
	t.Fatal("no reservation taken")
}
