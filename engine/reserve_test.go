package engine_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/inspect"
	"github.com/strictrate/strictrate/internal/enginetest"
)

// reservationModel is the reservation rule on one limit, in Go: entries (recorded time,
// cost); a request of n at now is admitted while the entries recorded after now - window,
// those in the future included, plus n stay within max; an admission is recorded at now, a
// reservation held for h at now + h; a settle lowers an entry's cost.
type reservationModel struct {
	window int64 // µs
	max    int
	costs  map[engine.EntryID]int // by the engine's entry (its time and seq)
	times  map[engine.EntryID]int64
}

func (m *reservationModel) count(now int64) int {
	c := 0
	for id, cost := range m.costs {
		if m.times[id] > now-m.window {
			c += cost
		}
	}
	return c
}

// Random admissions, reservations of 1 to 8 events held for up to a window, and settles of
// reservations to what they used, on a caller's clock that steps forward: every decision is
// the model's (admitted or not, and the room left), every admitted reservation's entry is
// recorded at its decision's time plus its hold, and the log holds the model's events.
func TestReservationAgainstModel(t *testing.T) {
	c := exampleServer.Client(t)
	e, clock := enginetest.Clocked(t, c)
	ctx := context.Background()
	const window, max = 2 * time.Second, 20
	l := engine.Limit{Max: max, Window: window}
	for seed := uint64(1); seed <= 6; seed++ {
		rng := rand.New(rand.NewPCG(seed, 21))
		key := enginetest.NewKey(t)
		m := &reservationModel{window: window.Microseconds(), max: max, costs: map[engine.EntryID]int{}, times: map[engine.EntryID]int64{}}
		var held []engine.Result
		now := enginetest.T0
		admitted, reserved, settled := 0, 0, 0
		for op := range 400 {
			now = now.Add(time.Duration(rng.Int64N(int64(150 * time.Millisecond))))
			clock.Set(now)
			us := now.UnixMicro()
			switch k := rng.IntN(10); {
			case k < 2 && len(held) > 0:
				i := rng.IntN(len(held))
				r := held[i]
				used := rng.IntN(r.Entry.Cost + 1)
				if err := e.Settle(ctx, key, r, used); err != nil {
					t.Fatalf("seed %d op %d: Settle(%+v, %d): %v", seed, op, r.Entry, used, err)
				}
				m.costs[r.Entry] = min(m.costs[r.Entry], used)
				held = slices.Delete(held, i, i+1)
				settled++
			case k < 5:
				n, hold := 1+rng.IntN(8), time.Duration(1+rng.Int64N(int64(window)))
				want := m.count(us)+n <= max
				r, err := e.Reserve(ctx, key, engine.Policy{l}, n, hold)
				if err != nil {
					t.Fatalf("seed %d op %d: Reserve(%d, %s): %v", seed, op, n, hold, err)
				}
				if r.Allowed != want || want && r.Remaining != max-m.count(us)-n {
					t.Fatalf("seed %d op %d: Reserve(%d, %s) at %s: %+v; the model: admitted %v with %d left",
						seed, op, n, hold, now, r, want, max-m.count(us)-n)
				}
				if r.Allowed {
					if got, want := r.Entry.At, time.UnixMicro(us+ceilMicrosOf(hold)); !got.Equal(want) {
						t.Fatalf("seed %d op %d: reservation recorded at %s, want the decision's time plus its hold (%s)", seed, op, got, want)
					}
					m.costs[r.Entry], m.times[r.Entry] = n, r.Entry.At.UnixMicro()
					held = append(held, r)
					reserved++
				}
			default:
				n := 1 + rng.IntN(3)
				want := m.count(us)+n <= max
				r, err := e.AllowN(ctx, key, l, n)
				if err != nil {
					t.Fatalf("seed %d op %d: AllowN(%d): %v", seed, op, n, err)
				}
				if r.Allowed != want || want && r.Remaining != max-m.count(us)-n {
					t.Fatalf("seed %d op %d: AllowN(%d) at %s: %+v; the model: admitted %v with %d left",
						seed, op, n, now, r, want, max-m.count(us)-n)
				}
				if r.Allowed {
					m.costs[r.Entry], m.times[r.Entry] = n, us
					admitted++
				}
			}
			if op%50 == 49 {
				log, err := inspect.Read(ctx, c, enginetest.Prefix+key, 0)
				if err != nil {
					t.Fatal(err)
				}
				// The log as stored may still hold entries that left the window.
				live := 0
				for _, entry := range log.Entries {
					if entry.At.UnixMicro() > us-m.window {
						live += entry.Cost
					}
				}
				if live != m.count(us) {
					t.Fatalf("seed %d op %d: the log holds %d events in the window, want the model's %d", seed, op, live, m.count(us))
				}
			}
		}
		if reserved == 0 || admitted == 0 || settled == 0 {
			t.Fatalf("seed %d: %d admissions, %d reservations, %d settles: the run did not mix them", seed, admitted, reserved, settled)
		}
	}
}

// ceilMicrosOf is d in whole microseconds, rounded up, as the engine sends a hold.
func ceilMicrosOf(d time.Duration) int64 {
	us := d.Microseconds()
	if d%time.Microsecond != 0 {
		us++
	}
	return us
}

// 64 goroutines over 4 clients on one key, on the server's clock: some admit one request at a
// time, others reserve up to 8 events for 30 ms, admit from the reservation locally at their
// own times until it is used up or its hold ends (measured from before the call was sent, so
// never after the server's time plus the hold), then settle it to what they used. Audited on
// the real times of every admission, the direct ones and the local ones alike, for every limit
// of the policy: no trailing window ever holds more than its Max. The policies: one exact
// limit; and a limit with a Resolution beside a longer exact one, reserved together.
func TestReservationsNeverOverAdmit(t *testing.T) {
	const hold = 30 * time.Millisecond
	for name, p := range map[string]engine.Policy{
		"exact":                 {{Max: 40, Window: 150 * time.Millisecond}},
		"resolution and longer": {{Max: 40, Window: 150 * time.Millisecond, Resolution: 10 * time.Millisecond}, {Max: 100, Window: time.Second}},
	} {
		t.Run(name, func(t *testing.T) {
			es, _ := enginetest.Engines(t, exampleServer, 4)
			ctx := context.Background()
			key := enginetest.NewKey(t)
			var (
				mu                  sync.Mutex
				admitted            []time.Time
				local, reservations int
				wg                  sync.WaitGroup
			)
			record := func(at time.Time) {
				mu.Lock()
				admitted = append(admitted, at)
				mu.Unlock()
			}
			deadline := time.Now().Add(time.Second)
			for g := range 64 {
				e, rng := es[g%len(es)], rand.New(rand.NewPCG(uint64(g), 5))
				wg.Go(func() {
					for time.Now().Before(deadline) {
						if g%2 == 0 {
							r, err := e.AllowPolicy(ctx, key, p, 1)
							if err != nil {
								t.Errorf("AllowPolicy: %v", err)
								return
							}
							if r.Allowed {
								record(r.At)
							}
							continue
						}
						k := 1 + rng.IntN(8)
						sent := time.Now()
						r, err := e.Reserve(ctx, key, p, k, hold)
						if err != nil {
							t.Errorf("Reserve: %v", err)
							return
						}
						if !r.Allowed {
							time.Sleep(time.Millisecond)
							continue
						}
						used := 0
						for used < k {
							now := time.Now()
							if now.Sub(sent) >= hold {
								break
							}
							record(now)
							used++
							time.Sleep(time.Duration(rng.Int64N(int64(3 * time.Millisecond))))
						}
						if err := e.Settle(ctx, key, r, used); err != nil {
							t.Errorf("Settle: %v", err)
							return
						}
						mu.Lock()
						local += used
						reservations++
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			for _, l := range p {
				auditTimestamps(t, admitted, l)
			}
			t.Logf("%d admissions, %d of them local, from %d reservations", len(admitted), local, reservations)
			if local == 0 || len(admitted)-local == 0 {
				t.Fatal("the run did not mix local and direct admissions")
			}
		})
	}
}

// A reservation is refused before anything is sent for a hold that is not positive and for a
// policy with calendar limits (its counters would count it in one period, while admissions
// made from it may fall in the next).
func TestReservationBadInputRefused(t *testing.T) {
	e := enginetest.New(t, exampleServer.Client(t))
	ctx := context.Background()
	key := enginetest.NewKey(t)
	for name, call := range map[string]func() error{
		"zero hold": func() error {
			_, err := e.Reserve(ctx, key, engine.Policy{engine.PerSecond(10)}, 2, 0)
			return err
		},
		"calendar": func() error {
			_, err := e.Reserve(ctx, key, engine.Policy{engine.PerSecond(10), engine.Calendar(100, engine.Day, time.UTC)}, 2, time.Second)
			return err
		},
		"cost over max": func() error {
			_, err := e.Reserve(ctx, key, engine.Policy{engine.PerSecond(10)}, 11, time.Second)
			return err
		},
	} {
		if err := call(); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Errorf("%s: %v, want ErrInvalidArgument", name, err)
		}
	}
	if log := enginetest.Log(t, exampleServer.Client(t), enginetest.Prefix, key); log.Events != 0 {
		t.Fatalf("refused reservations wrote %d events, want 0", log.Events)
	}
}
