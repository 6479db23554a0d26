package engine_test

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// A charge over the limit is recorded all the same, and every decision on the key then denies
// until enough of the window's events, the charge's included, have left it: RetryAfter exact,
// on every kind of limit. The charge's Entry refunds it.
func TestChargeOverTheLimitDeniesUntilTheWindowDrains(t *testing.T) {
	c := exampleServer.Client(t)
	ctx := context.Background()
	t0 := time.Unix(21991*86400, 0).UTC() // a day's start in UTC
	busy := engine.PerMinute(100)
	for _, tc := range []struct {
		name   string
		policy engine.Policy
		before int           // events admitted at t0, one entry (busy: one event each ms)
		charge int           // charged at t0+10s
		wait   time.Duration // then, until one event is admitted again
		after  int           // Remaining once admitted then
	}{
		// 4 + 8 = 12 of 10: 3 events must leave, the 4 of t0, at t0+60s.
		{name: "sliding", policy: engine.Policy{engine.PerMinute(10)}, before: 4, charge: 8, wait: 50 * time.Second, after: 1},
		{name: "policy", policy: engine.Policy{engine.PerSecond(5), engine.PerMinute(10)}, before: 4, charge: 8, wait: 50 * time.Second, after: 1},
		{name: "resolution", policy: engine.Policy{{Max: 10, Window: time.Minute, Resolution: time.Second}}, before: 4, charge: 8, wait: 50 * time.Second, after: 1},
		// More than Max alone: the charge itself must leave, a window after it.
		{name: "charge above max", policy: engine.Policy{engine.PerMinute(10)}, before: 4, charge: 25, wait: time.Minute, after: 9},
		// The day's counter holds 12 of 10 until the day ends.
		{name: "calendar", policy: engine.Policy{engine.Calendar(10, engine.Day, time.UTC)}, before: 4, charge: 8, wait: 24*time.Hour - 10*time.Second, after: 9},
		// 40 entries, then 70: 11 must leave, the 11th entry at t0+10ms leaves at t0+60.01s.
		{name: "busy key", policy: engine.Policy{busy}, before: 40, charge: 70, wait: 50*time.Second + 10*time.Millisecond, after: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, clock := enginetest.Clocked(t, c)
			key := enginetest.NewKey(t)
			clock.Set(t0)
			if tc.name == "busy key" {
				for i := range tc.before {
					clock.Set(t0.Add(time.Duration(i) * time.Millisecond))
					enginetest.Want(t, "busy admission", enginetest.MustAllowPolicy(t, e, key, tc.policy, 1).Allowed, true)
				}
			} else {
				enginetest.Want(t, "first admission", enginetest.MustAllowPolicy(t, e, key, tc.policy, tc.before).Allowed, true)
			}
			now := t0.Add(10 * time.Second)
			clock.Set(now)
			r, err := e.ChargePolicy(ctx, key, tc.policy, tc.charge)
			if err != nil {
				t.Fatal(err)
			}
			enginetest.Want(t, "charge fit", r.Allowed, false)
			enginetest.Want(t, "charge remaining", r.Remaining, 0)
			enginetest.Want(t, "charge retry after", r.RetryAfter, tc.wait)
			enginetest.Want(t, "charge recorded an entry", r.Entry.IsZero(), false)
			enginetest.Want(t, "charge entry cost", r.Entry.Cost, tc.charge)

			d := enginetest.MustAllowPolicy(t, e, key, tc.policy, 1)
			enginetest.Want(t, "allowed right after the charge", d.Allowed, false)
			enginetest.Want(t, "its retry after", d.RetryAfter, tc.wait)
			clock.Set(now.Add(tc.wait - time.Microsecond))
			enginetest.Want(t, "allowed a microsecond early", enginetest.MustAllowPolicy(t, e, key, tc.policy, 1).Allowed, false)
			clock.Set(now.Add(tc.wait))
			d = enginetest.MustAllowPolicy(t, e, key, tc.policy, 1)
			enginetest.Want(t, "allowed once drained", d.Allowed, true)
			enginetest.Want(t, "remaining once drained", d.Remaining, tc.after)
		})
	}
}

// A charge that fits is an admission; one that does not is refunded by its Entry, and both
// are refused when invalid before anything is written.
func TestChargeFitsRefundsAndValidates(t *testing.T) {
	c := exampleServer.Client(t)
	e, clock := enginetest.Clocked(t, c)
	ctx := context.Background()
	clock.Set(time.Unix(1_900_000_000, 0))
	key, l := enginetest.NewKey(t), engine.PerHour(10)

	r, err := e.Charge(ctx, key, l, 6)
	if err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "fitting charge allowed", r.Allowed, true)
	enginetest.Want(t, "fitting charge remaining", r.Remaining, 4)
	enginetest.Want(t, "fitting charge retry after", r.RetryAfter, time.Duration(0))
	over, err := e.Charge(ctx, key, l, 6)
	if err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "over charge allowed", over.Allowed, false)
	enginetest.Want(t, "log events with both", enginetest.StoredEvents(t, c, key), int64(12))
	enginetest.Want(t, "peek over", enginetest.MustPeek(t, e, key, l).Allowed, false)
	if err := e.Refund(ctx, key, over); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "after refunding the over charge: remaining", enginetest.MustPeek(t, e, key, l).Remaining, 4)

	for _, bad := range []struct {
		name string
		call func(key string) error
	}{
		{"zero cost", func(key string) error { _, err := e.Charge(ctx, key, l, 0); return err }},
		{"cost above MaxEvents", func(key string) error { _, err := e.Charge(ctx, key, l, engine.MaxEvents+1); return err }},
		{"bad limit", func(key string) error {
			_, err := e.Charge(ctx, key, engine.Limit{Max: 0, Window: time.Minute}, 1)
			return err
		}},
		{"empty policy", func(key string) error { _, err := e.ChargePolicy(ctx, key, nil, 1); return err }},
	} {
		k := enginetest.NewKey(t)
		if err := bad.call(k); !errors.Is(err, engine.ErrInvalidArgument) {
			t.Fatalf("%s: error %v, want ErrInvalidArgument", bad.name, err)
		}
		enginetest.Want(t, bad.name+": key written", enginetest.StoredEvents(t, c, k), int64(0))
	}
	if _, err := e.Charge(ctx, "", l, 1); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Fatalf("empty key: %v", err)
	}
}

// chargeDecision is one decision of the charge audit: the entry it recorded (or would have:
// its time, its seq among its microsecond's entries, their order; its cost), whether it was a
// charge, whether it was allowed (a charge: whether it fit), and whether it recorded.
type chargeDecision struct {
	at, seq int64
	cost    int
	charge  bool
	allowed bool
	entered bool
}

// chargeLimit is the limit of the charge audits.
var chargeLimit = engine.Limit{Max: 40, Window: 200 * time.Millisecond}

// chargeChildEnv, when set, makes TestChargesMixedInAcrossProcesses a child: it decides on the
// key its value names and prints every decision.
const chargeChildEnv = "STRICTRATE_TEST_CHARGE_CHILD"

// decideWithCharges runs allows and charges (one in ten) on key from 12 goroutines over es,
// for at least 60 calls each and four windows of the server's clock.
func decideWithCharges(t *testing.T, es []*engine.Engine, key string) []chargeDecision {
	ctx, l := context.Background(), chargeLimit
	return decideMany(t, es, 12, runFor{calls: 60, span: 4 * l.Window}, 40, func(rng *rand.Rand, e *engine.Engine) (chargeDecision, time.Time, error) {
		if rng.IntN(10) == 0 {
			n := 1 + rng.IntN(12)
			r, err := e.Charge(ctx, key, l, n)
			return chargeDecision{at: r.At.UnixMicro(), seq: int64(r.Entry.Seq), cost: n, charge: true, allowed: r.Allowed, entered: true}, r.At, err
		}
		n := 1 + rng.IntN(3)
		r, err := e.AllowN(ctx, key, l, n)
		return chargeDecision{at: r.At.UnixMicro(), seq: int64(r.Entry.Seq), cost: n, allowed: r.Allowed, entered: r.Allowed}, r.At, err
	})
}

// auditCharges checks decisions on one key under l, on the server's timestamps: no admission
// was made while its window, charges included, held more than Max less its cost (the entries
// ordered by time, then seq); admitted events alone never exceed Max in a window; a charge
// fit exactly when its window, itself included, held at most Max; and no request was denied
// while its window, every entry of its microsecond counted, had room for it. It fails t
// unless the run bound: some denials, some charges over.
func auditCharges(t *testing.T, ds []chargeDecision, l engine.Limit) {
	t.Helper()
	var entries []chargeDecision
	for _, d := range ds {
		if d.entered {
			entries = append(entries, d)
		}
	}
	order := func(a, b chargeDecision) int { return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.seq, b.seq)) }
	slices.SortFunc(entries, order)
	w := l.Window.Microseconds()
	// held sums the entries in (at - w, at] ordered at or before upto (all of at's when nil),
	// and the admissions alone among them.
	held := func(at int64, upto *chargeDecision) (all, admitted int) {
		lo, _ := slices.BinarySearchFunc(entries, at-w+1, func(e chargeDecision, t int64) int { return cmp.Compare(e.at, t) })
		for _, x := range entries[lo:] {
			if x.at > at || upto != nil && order(x, *upto) > 0 {
				break
			}
			all += x.cost
			if !x.charge {
				admitted += x.cost
			}
		}
		return all, admitted
	}
	denied, over := 0, 0
	for _, d := range ds {
		switch {
		case d.charge:
			all, _ := held(d.at, &d)
			if d.allowed != (all <= l.Max) {
				t.Fatalf("charge of %d at %d: allowed %v with %d in its window, charge included", d.cost, d.at, d.allowed, all)
			}
			if !d.allowed {
				over++
			}
		case d.allowed:
			all, admitted := held(d.at, &d)
			if all > l.Max || admitted > l.Max {
				t.Fatalf("admitted %d at %d with %d in its window (%d admitted), over Max %d", d.cost, d.at, all, admitted, l.Max)
			}
		default:
			denied++
			if all, _ := held(d.at, nil); all+d.cost <= l.Max {
				t.Fatalf("cost %d denied at %d with %d in its window: a false denial", d.cost, d.at, all)
			}
		}
	}
	if denied == 0 || over == 0 {
		t.Fatalf("the run never bound: %d denials, %d charges over: the audit checked nothing", denied, over)
	}
}

// Admissions stay exact with charges mixed in, from several clients and many goroutines on the
// server's clock (auditCharges).
func TestChargesMixedInKeepAdmissionsExact(t *testing.T) {
	es, _ := enginetest.Engines(t, exampleServer, 3)
	key := enginetest.NewKey(t)
	auditCharges(t, decideWithCharges(t, es, key), chargeLimit)
}

// The same from three OS processes (this test binary run again) of two clients each, audited
// together on the server's timestamps.
func TestChargesMixedInAcrossProcesses(t *testing.T) {
	if key := os.Getenv(chargeChildEnv); key != "" {
		var es []*engine.Engine
		for range 2 {
			e, err := engine.New(exampleClient())
			if err != nil {
				t.Fatal(err)
			}
			es = append(es, e)
		}
		out := bufio.NewWriter(os.Stdout)
		for _, d := range decideWithCharges(t, es, key) {
			fmt.Fprintf(out, "decision %d %d %d %t %t %t\n", d.at, d.seq, d.cost, d.charge, d.allowed, d.entered)
		}
		out.Flush()
		return
	}
	valkeytest.SkipIfShort(t, "starts OS processes")
	key := exampleKey("charges-procs")
	ds := childDecisions(t, 3, "TestChargesMixedInAcrossProcesses", func(int) string { return chargeChildEnv + "=" + key },
		func(line string) (d chargeDecision, ok bool) {
			_, err := fmt.Sscanf(line, "decision %d %d %d %t %t %t", &d.at, &d.seq, &d.cost, &d.charge, &d.allowed, &d.entered)
			return d, err == nil
		})
	if t.Failed() {
		return
	}
	if len(ds) < 3*12*60 {
		t.Fatalf("%d decisions from 3 processes, want at least %d", len(ds), 3*12*60)
	}
	auditCharges(t, ds, chargeLimit)
}

// Under local quota a charge ends this process's reservation of the key first, giving back
// what it did not use: the charge is decided on the events used, and local admissions stop
// at once, the server deciding what is left.
func TestChargeEndsLocalReservations(t *testing.T) {
	c := exampleServer.Client(t)
	e := enginetest.New(t, c, engine.WithLocalQuota(engine.LocalQuota{Hold: 5 * time.Second, MinDemand: 4}))
	ctx := context.Background()
	key, l := enginetest.NewKey(t), engine.PerMinute(20)
	admitEach(t, e, key, l, 8)
	r, err := e.Charge(ctx, key, l, 10)
	if err != nil {
		t.Fatal(err)
	}
	// 8 used and 10 charged: the reservation's unused events were given back before.
	enginetest.Want(t, "charge fit", r.Allowed, true)
	enginetest.Want(t, "charge remaining", r.Remaining, 2)
	admitted := 0
	for range 40 {
		d, err := e.Allow(ctx, key, l)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	enginetest.Want(t, "admitted after the charge", admitted, 2)
	enginetest.Want(t, "log events", enginetest.StoredEvents(t, c, key), int64(20))
}

// Settle above the admitted cost raises the entry once, whatever the limit says, and a
// retried or late raise changes nothing; a shared entry is refused before anything is sent.
func TestSettleAboveTheCostRaisesOnce(t *testing.T) {
	c := exampleServer.Client(t)
	e, clock := enginetest.Clocked(t, c)
	ctx := context.Background()
	t0 := time.Unix(1_900_000_000, 0)
	clock.Set(t0)
	key, l := enginetest.NewKey(t), engine.PerMinute(10)

	r := enginetest.MustAllowN(t, e, key, l, 4)
	if err := e.Settle(ctx, key, r, 9); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "raised to 9: events", enginetest.StoredEvents(t, c, key), int64(9))
	if err := e.Settle(ctx, key, r, 9); err != nil {
		t.Fatal(err)
	}
	if err := e.Settle(ctx, key, r, 12); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "retried raises: events", enginetest.StoredEvents(t, c, key), int64(9))
	if err := e.Refund(ctx, key, r); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "refund with the Result from before the raise: events", enginetest.StoredEvents(t, c, key), int64(9))

	// Lowered first, never raised after.
	low := enginetest.MustAllowN(t, e, key, l, 1)
	if err := e.Settle(ctx, key, low, 0); err != nil {
		t.Fatal(err)
	}
	if err := e.Settle(ctx, key, low, 5); err != nil {
		t.Fatal(err)
	}
	enginetest.Want(t, "refunded, then raised: events", enginetest.StoredEvents(t, c, key), int64(9))

	// Above Max: the window denies until the raised entry leaves it.
	clock.Set(t0.Add(time.Second))
	one := enginetest.MustAllowN(t, e, key, l, 1)
	if err := e.Settle(ctx, key, one, 30); err != nil {
		t.Fatal(err)
	}
	d := enginetest.MustAllowN(t, e, key, l, 1)
	enginetest.Want(t, "allowed over the raised entry", d.Allowed, false)
	enginetest.Want(t, "its retry after", d.RetryAfter, l.Window)
	clock.Set(t0.Add(time.Second + l.Window))
	enginetest.Want(t, "allowed once it left", enginetest.MustAllowN(t, e, key, l, 1).Allowed, true)

	shared := engine.Limit{Max: 10, Window: time.Minute, Resolution: time.Second}
	skey := enginetest.NewKey(t)
	s := enginetest.MustAllowN(t, e, skey, shared, 2)
	if err := e.Settle(ctx, skey, s, 3); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Fatalf("Settle above a shared entry: %v, want ErrInvalidArgument", err)
	}
	enginetest.Want(t, "shared entry untouched", enginetest.StoredEvents(t, c, skey), int64(2))
	if err := e.Settle(ctx, key, one, engine.MaxEvents+1); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Fatalf("Settle above MaxEvents: %v, want ErrInvalidArgument", err)
	}
}
