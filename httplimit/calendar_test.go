package httplimit_test

import (
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/httplimit"
	"github.com/strictrate/strictrate/internal/enginetest"
)

// utcMonth returns the UTC month that holds t.
func utcMonth(t time.Time) (start, end time.Time) {
	y, m, _ := t.UTC().Date()
	start = time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
	return start, start.AddDate(0, 1, 0)
}

// secondsUntil is d in whole seconds, rounded up, as the fields and Retry-After write it.
func secondsUntil(from, to time.Time) int64 {
	d := to.Sub(from)
	return int64((d + time.Second - 1) / time.Second)
}

// "10 per second and 1000 a calendar month (UTC)" on the caller's clock: RateLimit-Policy
// names the month "month", with w the current month's length (30 days in November, 31 in
// December: the field follows the period); RateLimit names the tightest limit, the second
// while it has less room, the month once it has; a full month's denial has Retry-After and t
// the time to the month's end.
func TestCalendarMonthFields(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	p := engine.Policy{engine.PerSecond(10), engine.Calendar(1000, engine.Month, time.UTC)}
	h := httplimit.New(e, p, httplimit.WithKeyPrefix(uniquePrefix(t)), httplimit.WithLegacyHeaders(true))(ok)
	const client = "192.0.2.1:1"
	start, end := utcMonth(enginetest.T0)
	monthSeconds := int64(end.Sub(start) / time.Second)
	if monthSeconds != 30*24*3600 {
		t.Fatalf("November 2026 is %d seconds long", monthSeconds) // the test's own arithmetic
	}
	policyField := fmt.Sprintf(`"1s";q=10;w=1, "month";q=1000;w=%d`, monthSeconds)

	rec := do(h, client, nil)
	wantStatus(t, "first", rec, http.StatusOK)
	checkPolicyField(t, rec.Header(), policyField)
	if name, r, reset := rateLimit(t, rec.Header()); name != "1s" || r != 9 || reset != 1 {
		t.Fatalf("first: RateLimit %q, want the second named: \"1s\";r=9;t=1", rec.Header().Get("RateLimit"))
	}
	if got := rec.Header().Get("X-RateLimit-Limit"); got != "10" {
		t.Fatalf("first: X-RateLimit-Limit %q, want 10", got)
	}

	// Fill the month, 5 in the first second, then 10 a second (the first request took one
	// already).
	now := enginetest.T0
	for i := 1; i < 1000; i++ {
		if i%10 == 5 {
			now = now.Add(time.Second)
			clock.Set(now)
		}
		rec = do(h, client, nil)
		wantStatus(t, fmt.Sprintf("request %d", i+1), rec, http.StatusOK)
		if i == 995 {
			// A new second: the second has 9 left, the month 4; the month binds, and its
			// quota comes back when it ends.
			checkPolicyField(t, rec.Header(), policyField)
			want := fmt.Sprintf(`"month";r=4;t=%d`, secondsUntil(now, end))
			if got := rec.Header().Get("RateLimit"); got != want {
				t.Fatalf("request %d: RateLimit %q, want %q", i+1, got, want)
			}
			if got := rec.Header().Get("X-RateLimit-Limit"); got != "1000" {
				t.Fatalf("request %d: X-RateLimit-Limit %q, want the month's 1000", i+1, got)
			}
		}
	}

	now = now.Add(1500 * time.Millisecond) // the second has room again; the month has none
	clock.Set(now)
	rec = do(h, client, nil)
	wantStatus(t, "month full", rec, http.StatusTooManyRequests)
	checkPolicyField(t, rec.Header(), policyField)
	wait := secondsUntil(now, end)
	if got := rec.Header().Get("Retry-After"); got != strconv.FormatInt(wait, 10) {
		t.Fatalf("month full: Retry-After %q, want %d, the seconds until the month ends", got, wait)
	}
	if name, r, reset := rateLimit(t, rec.Header()); name != "month" || r != 0 || reset != wait {
		t.Fatalf("month full: RateLimit %q, want \"month\";r=0;t=%d", rec.Header().Get("RateLimit"), wait)
	}

	// December: a new count, and the policy field gives December's 31 days.
	clock.Set(end)
	rec = do(h, client, nil)
	wantStatus(t, "next month", rec, http.StatusOK)
	checkPolicyField(t, rec.Header(), fmt.Sprintf(`"1s";q=10;w=1, "month";q=1000;w=%d`, 31*24*3600))
	if got := rec.Header().Get("RateLimit"); got != `"1s";r=9;t=1` {
		t.Fatalf("next month: RateLimit %q", got)
	}
	// And back in November (a clock that went back): November's fields again.
	clock.Set(now)
	checkPolicyField(t, do(h, client, nil).Header(), policyField)
}

// On the server's clock: w is the current UTC month's length, and a month that is full (a
// small one, so that the test fills it at once) is denied with Retry-After and t within a
// second of the time until the month ends.
func TestCalendarMonthOnServerClock(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	p := engine.Policy{engine.PerSecond(10), engine.Calendar(3, engine.Month, time.UTC)}
	var denial engine.Result
	h := httplimit.New(e, p, httplimit.WithKeyPrefix(uniquePrefix(t)),
		httplimit.WithDeniedHandler(func(w http.ResponseWriter, _ *http.Request, res engine.Result) {
			denial = res
			w.WriteHeader(http.StatusTooManyRequests)
		}))(ok)
	before := time.Now()
	for i := range 3 {
		wantStatus(t, fmt.Sprintf("request %d", i+1), do(h, "192.0.2.1:1", nil), http.StatusOK)
	}
	rec := do(h, "192.0.2.1:1", nil)
	after := time.Now()
	wantStatus(t, "4th", rec, http.StatusTooManyRequests)
	start, end := utcMonth(denial.At)
	if s, _ := utcMonth(before); !s.Equal(start) {
		t.Skipf("the month changed during the test (%s to %s)", before, denial.At)
	}
	checkPolicyField(t, rec.Header(), fmt.Sprintf(`"1s";q=10;w=1, "month";q=3;w=%d`, int64(end.Sub(start)/time.Second)))
	ra, err := strconv.ParseInt(rec.Header().Get("Retry-After"), 10, 64)
	if err != nil {
		t.Fatalf("Retry-After %q: %v", rec.Header().Get("Retry-After"), err)
	}
	// The server's clock and this one may differ a little; a second covers the rounding.
	if lo, hi := int64(end.Sub(after)/time.Second), secondsUntil(before, end)+1; ra < lo || ra > hi {
		t.Fatalf("Retry-After %d, want the time until the month ends, %d to %d", ra, lo, hi)
	}
	if name, r, reset := rateLimit(t, rec.Header()); name != "month" || r != 0 || reset != ra {
		t.Fatalf("RateLimit %q, want \"month\";r=0;t=%d", rec.Header().Get("RateLimit"), ra)
	}
	if want := secondsUntil(denial.At, end); ra != want {
		t.Fatalf("Retry-After %d, want %d, the time from the decision to the month's end", ra, want)
	}
}

// A limit with a Resolution has the fields of the same limit without it: its window's name and
// w, and on a clock at the start of its slots, the same r and t.
func TestResolutionLimitFields(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t)) // T0 is on a whole minute
	plain := engine.Policy{engine.PerSecond(10), {Max: 5, Window: time.Hour}}
	slotted := engine.Policy{engine.PerSecond(10), {Max: 5, Window: time.Hour, Resolution: time.Minute}}
	hp := httplimit.New(e, plain, httplimit.WithKeyPrefix(uniquePrefix(t)))(ok)
	hs := httplimit.New(e, slotted, httplimit.WithKeyPrefix(uniquePrefix(t)))(ok)
	for i, at := range []time.Duration{0, 0, time.Minute, time.Minute, 2 * time.Minute, 2 * time.Minute, time.Hour} {
		clock.Set(enginetest.T0.Add(at))
		a, b := do(hp, "192.0.2.1:1", nil), do(hs, "192.0.2.1:1", nil)
		checkPolicyField(t, b.Header(), `"1s";q=10;w=1, "1h";q=5;w=3600`)
		for _, name := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
			if got, want := b.Header().Get(name), a.Header().Get(name); got != want {
				t.Fatalf("request %d: %s %q with a Resolution, %q without", i+1, name, got, want)
			}
		}
		if a.Code != b.Code {
			t.Fatalf("request %d: status %d with a Resolution, %d without", i+1, b.Code, a.Code)
		}
	}
}

// Every calendar period has a name of its own in a policy, and w its current length: a day, an
// ISO week, a year, a billing month; two months in different zones are told apart by their
// zones.
func TestCalendarNames(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no zone data: %v", err)
	}
	e, _ := enginetest.Clocked(t, server.Client(t)) // 2026-11-30 12:00 UTC, a Monday
	p := engine.Policy{
		engine.PerMinute(50),
		engine.Calendar(100, engine.Day, time.UTC),
		engine.Calendar(200, engine.Week, time.UTC),
		engine.Calendar(300, engine.Month, time.UTC),
		engine.Calendar(400, engine.Month, berlin),
		engine.Calendar(500, engine.Month, time.UTC).WithBillingDay(15),
		engine.Calendar(600, engine.Year, time.UTC),
	}
	rec := do(httplimit.New(e, p, httplimit.WithKeyPrefix(uniquePrefix(t)))(ok), "192.0.2.1:1", nil)
	wantStatus(t, "request", rec, http.StatusOK)
	const day = 24 * 3600
	checkPolicyField(t, rec.Header(), fmt.Sprintf(`"1m";q=50;w=60, "day";q=100;w=%d, "week";q=200;w=%d, `+
		`"month@UTC";q=300;w=%d, "month@Europe/Berlin";q=400;w=%d, "month-15";q=500;w=%d, "year";q=600;w=%d`,
		day, 7*day, 30*day, 30*day, 30*day, 365*day))
	if got := rec.Header().Get("RateLimit"); got != `"1m";r=49;t=60` {
		t.Fatalf("RateLimit %q", got)
	}
}
