package grpclimit_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/grpclimit"
	"github.com/strictrate/strictrate/internal/enginetest"
)

// "10 per second and 1000 a calendar month (UTC)" on the caller's clock: ratelimit-policy
// names the month "month", with w the current month's length (30 days in November, 31 in
// December); ratelimit names the tightest limit; a call denied by the full month has a
// RetryInfo delay of exactly the time to the month's end, t of it rounded up, and a
// QuotaFailure naming the month.
func TestCalendarMonthMetadata(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	p := engine.Policy{engine.PerSecond(10), engine.Calendar(1000, engine.Month, time.UTC)}
	c := dial(t, serve(t, grpclimit.New(e, p, grpclimit.WithKeyPrefix(uniquePrefix(t)))))
	y, m, _ := enginetest.T0.Date()
	start := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
	end := start.AddDate(0, 1, 0)
	policy := fmt.Sprintf(`"1s";q=10;w=1, "month";q=1000;w=%d`, int64(end.Sub(start)/time.Second))
	if policy != `"1s";q=10;w=1, "month";q=1000;w=2592000` {
		t.Fatalf("November 2026: %s", policy) // the test's own arithmetic
	}

	md, err := check(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := one(t, md, "ratelimit-policy"); got != policy {
		t.Fatalf("ratelimit-policy %q, want %q", got, policy)
	}
	if got := one(t, md, "ratelimit"); got != `"1s";r=9;t=1` {
		t.Fatalf("first call: ratelimit %q", got)
	}
	// Fill the month: 5 calls in the first second, then 10 a second.
	now := enginetest.T0
	for i := 1; i < 1000; i++ {
		if i%10 == 5 {
			now = now.Add(time.Second)
			clock.Set(now)
		}
		if md, err = check(c); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		if i == 995 { // the second has 9 left, the month 4
			want := fmt.Sprintf(`"month";r=4;t=%d`, int64(end.Sub(now)/time.Second))
			if got := one(t, md, "ratelimit"); got != want {
				t.Fatalf("call %d: ratelimit %q, want %q", i+1, got, want)
			}
		}
	}
	now = now.Add(1500*time.Millisecond + 7*time.Microsecond) // the second has room again
	clock.Set(now)
	md, err = check(c)
	retry, quota := details(t, err)
	wait := end.Sub(now)
	if got := retry.GetRetryDelay().AsDuration(); got != wait {
		t.Fatalf("RetryInfo delay %s, want %s, until the month ends", got, wait)
	}
	v := quota.GetViolations()[0]
	if v.GetQuotaId() != "month" || v.GetQuotaValue() != 1000 || v.GetDescription() != "1000 requests per month" {
		t.Fatalf("QuotaFailure violation %v: want the month's quota of 1000", v)
	}
	if got, want := one(t, md, "ratelimit"), fmt.Sprintf(`"month";r=0;t=%d`, int64(wait/time.Second)+1); got != want {
		t.Fatalf("denied call: ratelimit %q, want %q", got, want)
	}
	if got := one(t, md, "ratelimit-policy"); got != policy {
		t.Fatalf("denied call: ratelimit-policy %q", got)
	}

	clock.Set(end)
	if md, err = check(c); err != nil {
		t.Fatalf("December: %v", err)
	}
	if got := one(t, md, "ratelimit-policy"); got != `"1s";q=10;w=1, "month";q=1000;w=2678400` {
		t.Fatalf("December: ratelimit-policy %q", got)
	}
}

// A limit with a Resolution has the metadata of the same limit without it, and a denial by it
// the same details, on a clock at the start of its slots.
func TestResolutionLimitMetadata(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t)) // T0 is on a whole minute
	plain := dial(t, serve(t, grpclimit.New(e, engine.Policy{engine.PerSecond(10), {Max: 3, Window: time.Hour}},
		grpclimit.WithKeyPrefix(uniquePrefix(t)))))
	slotted := dial(t, serve(t, grpclimit.New(e, engine.Policy{engine.PerSecond(10), {Max: 3, Window: time.Hour, Resolution: time.Minute}},
		grpclimit.WithKeyPrefix(uniquePrefix(t)))))
	for i, at := range []time.Duration{0, time.Minute, time.Minute, 2 * time.Minute, time.Hour} {
		clock.Set(enginetest.T0.Add(at))
		a, errA := check(plain)
		b, errB := check(slotted)
		if fmt.Sprint(errA) != fmt.Sprint(errB) {
			t.Fatalf("call %d: error %v with a Resolution, %v without", i+1, errB, errA)
		}
		for _, key := range []string{"ratelimit-policy", "ratelimit"} {
			if got, want := one(t, b, key), one(t, a, key); got != want {
				t.Fatalf("call %d: %s %q with a Resolution, %q without", i+1, key, got, want)
			}
		}
		if got := one(t, b, "ratelimit-policy"); got != `"1s";q=10;w=1, "1h";q=3;w=3600` {
			t.Fatalf("ratelimit-policy %q", got)
		}
		if i == 3 {
			if _, quota := details(t, errB); quota.GetViolations()[0].GetQuotaId() != "1h" {
				t.Fatalf("denied by the hour: %v", quota)
			}
		}
	}
}
