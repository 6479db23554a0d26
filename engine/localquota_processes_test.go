package engine_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/strictrate/strictrate/engine"
)

// localChildEnv, when set, makes TestLocalQuotaAcrossProcesses a child: it admits on the key
// its value names with local quota on until its time is up, and prints the time of every
// admission.
const localChildEnv = "STRICTRATE_TEST_LOCAL_QUOTA_CHILD"

// localProcessesLimit is the limit TestLocalQuotaAcrossProcesses's processes share.
var localProcessesLimit = engine.Limit{Max: 150, Window: 200 * time.Millisecond}

// Three OS processes (this test binary run again), each with 2 engines of 8 goroutines and
// local quota on, hammer one key for 1.2 s: audited on the times of every admission of all
// three, no trailing window holds more than Max; and the processes admitted from reservations
// (each child says how many of its admissions were local).
func TestLocalQuotaAcrossProcesses(t *testing.T) {
	if key := os.Getenv(localChildEnv); key != "" {
		runLocalChild(t, key)
		return
	}
	key := exampleKey("local-quota-procs")
	var (
		mu       sync.Mutex
		admitted []engine.Result
		local    int
		wg       sync.WaitGroup
	)
	for p := 0; p < 3; p++ {
		child := startChild(t, "TestLocalQuotaAcrossProcesses", localChildEnv+"="+key)
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

// runLocalChild is a child of TestLocalQuotaAcrossProcesses on key.
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

// dyingChildEnv, when set, makes TestLocalQuotaProcessDiesHoldingAReservation a child: it
// admits on the key its value names until it holds a reservation, prints the events it
// reserved and admitted directly, and kills itself, giving nothing back.
const dyingChildEnv = "STRICTRATE_TEST_LOCAL_QUOTA_DYING"

// dyingLimit and dyingHold are the limit and hold of TestLocalQuotaProcessDiesHoldingAReservation.
var (
	dyingLimit = engine.Limit{Max: 100, Window: time.Second}
	dyingHold  = 300 * time.Millisecond
)

// A process killed (SIGKILL) while it holds a reservation never gives it back: the key counts
// the whole reservation, used or not, until one window after its hold ends; then every event
// is back.
func TestLocalQuotaProcessDiesHoldingAReservation(t *testing.T) {
	if key := os.Getenv(dyingChildEnv); key != "" {
		runDyingChild(t, key)
		return
	}
	key := exampleKey("local-quota-dying")
	// The child kills itself (SIGKILL) once it holds a reservation: its exit is the error.
	child := startChild(t, "TestLocalQuotaProcessDiesHoldingAReservation", dyingChildEnv+"="+key)
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

// runDyingChild is a child of TestLocalQuotaProcessDiesHoldingAReservation on key.
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
