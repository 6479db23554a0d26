package engine_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
	"github.com/strictrate/strictrate/internal/enginetest"
)

// quotaChildEnv, when set, makes TestQuotasAcrossProcesses a child: it decides on the keys its
// value names until its time is up, and prints every decision.
const quotaChildEnv = "STRICTRATE_TEST_QUOTA_CHILD"

// The quota scenarios of TestQuotasAcrossProcesses: a limit with a resolution, with weighted
// costs; and a sliding limit beside a calendar one, in one policy.
var (
	quotaSlotted = engine.Limit{Max: 40, Window: 300 * time.Millisecond, Resolution: 50 * time.Millisecond}
	quotaSliding = engine.Limit{Max: 30, Window: 200 * time.Millisecond}
)

// quotaCalendar is a calendar limit whose period does not end in the next ten minutes.
func quotaCalendar() engine.Limit {
	l := engine.Calendar(100, engine.Day, time.UTC)
	if _, end := l.PeriodAt(time.Now()); time.Until(end) < 10*time.Minute {
		l = engine.Calendar(100, engine.Year, time.UTC)
	}
	return l
}

// quotaDecision is one decision a child printed: on key "slotted" or "calendar", admitted or
// not, at the server's time, of cost n.
type quotaDecision struct {
	key     string
	allowed bool
	at      int64
	n       int
}

// Three OS processes (this test binary run again), each with 2 clients and 16 goroutines,
// decide for 1.5 s on two shared keys, on the server's clock: a limit with a resolution, and
// a policy of a sliding limit and a calendar one. Audited on the decisions' times: no
// trailing window holds more than Max, every denial of the slotted limit is one the exact log
// would have given within a resolution of it, and the calendar's counter holds exactly the
// events admitted, at most its Max, and is full by the end.
func TestQuotasAcrossProcesses(t *testing.T) {
	if spec := os.Getenv(quotaChildEnv); spec != "" {
		runQuotaChild(t, spec)
		return
	}
	slotted, calendarKey := exampleKey("quota-procs-slotted"), exampleKey("quota-procs-calendar")
	cal := quotaCalendar()
	var mu sync.Mutex
	var decisions []quotaDecision
	var wg sync.WaitGroup
	for p := 0; p < 3; p++ {
		child := startChild(t, "TestQuotasAcrossProcesses", quotaChildEnv+"="+slotted+" "+calendarKey+" "+fmt.Sprint(p))
		wg.Go(func() {
			sc := bufio.NewScanner(child.Stdout)
			var mine []quotaDecision
			for sc.Scan() {
				var d quotaDecision
				var verdict string
				if _, err := fmt.Sscanf(sc.Text(), "decision %s %s %d %d", &d.key, &verdict, &d.at, &d.n); err == nil {
					d.allowed = verdict == "admitted"
					mine = append(mine, d)
				}
			}
			if err := child.Wait(); err != nil {
				t.Errorf("child %d: %v", p, err)
			}
			mu.Lock()
			decisions = append(decisions, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	byKey := map[string][]quotaDecision{}
	for _, d := range decisions {
		byKey[d.key] = append(byKey[d.key], d)
	}
	for _, k := range []string{"slotted", "calendar"} {
		slices.SortFunc(byKey[k], func(a, b quotaDecision) int { return int(a.at - b.at) })
	}
	w, g := quotaSlotted.Window.Microseconds(), quotaSlotted.Resolution.Microseconds()
	auditWindows(t, "slotted", byKey["slotted"], w, quotaSlotted.Max, g)
	auditWindows(t, "calendar", byKey["calendar"], quotaSliding.Window.Microseconds(), quotaSliding.Max, -1)

	admitted := 0
	for _, d := range byKey["calendar"] {
		if d.allowed {
			admitted += d.n
		}
	}
	log, err := inspect.Read(context.Background(), exampleClient(), enginetest.Prefix+calendarKey, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(log.Periods) != 1 || log.Periods[0].Events != admitted || admitted != cal.Max {
		t.Fatalf("calendar: %d events admitted, counters %+v; want the counter to hold exactly the %d admitted, and %d",
			admitted, log.Periods, admitted, cal.Max)
	}
	t.Logf("%d decisions by 3 processes: slotted %d, calendar %d (%d admitted)", len(decisions),
		len(byKey["slotted"]), len(byKey["calendar"]), admitted)
}

// auditWindows checks decisions sorted by time against a limit of max per window w (µs): no
// admission sees more than max admitted in (t-w, t]; with g >= 0, every denial at t of n sees
// more than max-n admitted in (t-w-g, t] (the exact log would have denied it at t-g).
func auditWindows(t *testing.T, name string, ds []quotaDecision, w int64, max int, g int64) {
	t.Helper()
	var adm []quotaDecision
	denials := 0
	for _, d := range ds {
		if d.allowed {
			adm = append(adm, d)
		}
	}
	sumIn := func(from, to int64) int { // admitted events with from < at <= to
		s := 0
		for _, a := range adm {
			if a.at > from && a.at <= to {
				s += a.n
			}
		}
		return s
	}
	for _, d := range ds {
		switch {
		case d.allowed:
			if s := sumIn(d.at-w, d.at); s > max {
				t.Fatalf("%s: %d events admitted in the window ending at %d, over %d", name, s, d.at, max)
			}
		case g >= 0:
			denials++
			if s := sumIn(d.at-w-g, d.at); s+d.n <= max {
				t.Fatalf("%s: a denial of %d at %d with %d admitted within a window and a resolution before it: a false denial", name, d.n, d.at, s)
			}
		default:
			denials++
		}
	}
	if len(adm) == 0 || denials == 0 {
		t.Fatalf("%s: %d admissions and %d denials: the audit saw no contention", name, len(adm), denials)
	}
}

// runQuotaChild is a child of TestQuotasAcrossProcesses: spec is the two keys and its number.
func runQuotaChild(t *testing.T, spec string) {
	var slotted, calendarKey string
	var id uint64
	if _, err := fmt.Sscanf(spec, "%s %s %d", &slotted, &calendarKey, &id); err != nil {
		t.Fatal(err)
	}
	policy := engine.Policy{quotaSliding, quotaCalendar()}
	var engines []*engine.Engine
	for range 2 {
		e, err := engine.New(exampleClient())
		if err != nil {
			t.Fatal(err)
		}
		engines = append(engines, e)
	}
	var mu sync.Mutex
	out := bufio.NewWriter(os.Stdout)
	deadline := time.Now().Add(1500 * time.Millisecond)
	ctx := context.Background()
	var wg sync.WaitGroup
	for g := 0; g < 16; g++ {
		e, rng := engines[g%2], rand.New(rand.NewPCG(id, uint64(g)))
		wg.Go(func() {
			for time.Now().Before(deadline) {
				key, name, n := slotted, "slotted", 1+rng.IntN(3)
				var r engine.Result
				var err error
				if rng.IntN(2) == 0 {
					r, err = e.AllowN(ctx, key, quotaSlotted, n)
				} else {
					key, name, n = calendarKey, "calendar", 1
					r, err = e.AllowPolicy(ctx, key, policy, n)
				}
				if err != nil {
					t.Error(err)
					return
				}
				verdict := "denied"
				if r.Allowed {
					verdict = "admitted"
				}
				mu.Lock()
				fmt.Fprintf(out, "decision %s %s %d %d\n", name, verdict, r.At.UnixMicro(), n)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	out.Flush()
}
