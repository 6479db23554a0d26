package fields

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
)

// Calendar names are unique within a policy and valid Structured Field Strings, whatever a
// zone is called.
func TestLimitName(t *testing.T) {
	odd := time.FixedZone("Zürich \"x\\y\" 100%", 3600)
	month := engine.Calendar(10, engine.Month, time.UTC)
	p := engine.Policy{month, engine.Calendar(20, engine.Month, odd), engine.Calendar(30, engine.Day, odd), engine.PerSecond(5)}
	for i, want := range []string{"month@UTC", `month@Z%C3%BCrich %22x%5Cy%22 100%25`, "day", "1s"} {
		if got := LimitName(p[i], p); got != want {
			t.Errorf("LimitName(%s) = %q, want %q", p[i], got, want)
		}
	}
	if got := LimitName(month, engine.Policy{month}); got != "month" {
		t.Errorf("alone: %q, want month", got)
	}
	for day, want := range map[int]string{0: "month", 1: "month", 2: "month-2", 31: "month-31"} {
		if got := LimitName(month.WithBillingDay(day), nil); got != want {
			t.Errorf("billing day %d: %q, want %q", day, got, want)
		}
	}
}

// A policy with a calendar month: the month is named "month" with w the length of the month
// the decision fell in; RateLimit names the limit of r.Window, the month under its name; a
// fail-open Result reports nothing.
func TestDatedCalendar(t *testing.T) {
	p := engine.Policy{engine.PerSecond(10), engine.Calendar(1000, engine.Month, time.UTC)}
	f, err := NewDated(p, DefaultVersion)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Names(); !slices.Equal(got, []string{"RateLimit-Policy", "RateLimit"}) {
		t.Errorf("Names() = %q", got)
	}
	nov := time.Date(2026, time.November, 15, 12, 0, 0, 0, time.UTC)
	dec := time.Date(2026, time.December, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		at   time.Time
		want string
	}{
		{nov, `"1s";q=10;w=1, "month";q=1000;w=2592000`},
		{dec, `"1s";q=10;w=1, "month";q=1000;w=2678400`},
		{nov, `"1s";q=10;w=1, "month";q=1000;w=2592000`}, // a clock that went back
	} {
		want := []Field{{Name: "RateLimit-Policy", Value: tc.want}}
		if got := f.Policy(tc.at); !slices.Equal(got, want) {
			t.Errorf("Policy(%s) = %q, want %q", tc.at, got, want)
		}
	}
	month := 30 * 24 * time.Hour
	for _, tc := range []struct {
		r    engine.Result
		want string
		name string
	}{
		{engine.Result{At: nov, Allowed: true, Remaining: 9, QuotaAfter: time.Second, Window: time.Second}, `"1s";r=9;t=1`, "1s"},
		{engine.Result{At: nov, Allowed: true, Remaining: 4, QuotaAfter: dec.Sub(nov), Window: month}, `"month";r=4;t=1339200`, "month"},
		{engine.Result{At: nov, Remaining: 0, RetryAfter: dec.Sub(nov), Window: month}, `"month";r=0;t=1339200`, "month"},
		{engine.Result{At: nov, Allowed: true, Remaining: 2, QuotaAfter: time.Second, Window: time.Minute}, `"1s";r=2;t=1`, "1s"}, // no such window: the smallest quota
	} {
		got := f.AppendDecision(nil, tc.r)
		if len(got) != 1 || got[0].Name != "RateLimit" || got[0].Value != tc.want {
			t.Errorf("AppendDecision(%+v) = %q, want RateLimit: %s", tc.r, got, tc.want)
		}
		if l, name := f.Named(tc.r); name != tc.name || LimitName(l, p) != tc.name {
			t.Errorf("Named(%+v) = %v, %q, want %q", tc.r, l, name, tc.name)
		}
	}
	if got := f.AppendDecision(nil, engine.Result{At: nov, Allowed: true, BackendErr: errors.New("down")}); len(got) != 0 {
		t.Errorf("fail-open Result: %q, want no fields", got)
	}
}

// A policy of sliding limits alone has New's fields, and Named gives the window's name.
func TestDatedSliding(t *testing.T) {
	p := engine.Policy{engine.PerHour(100), {Max: 5, Window: time.Second}}
	f, err := NewDated(p, DefaultVersion)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := New(p, DefaultVersion)
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Policy(time.Time{}); !slices.Equal(got, plain.Policy()) {
		t.Errorf("Policy = %q, want %q", got, plain.Policy())
	}
	r := engine.Result{Allowed: true, Remaining: 90, QuotaAfter: time.Minute, Window: time.Hour}
	if got, want := f.AppendDecision(nil, r), plain.AppendDecision(nil, r); !slices.Equal(got, want) {
		t.Errorf("AppendDecision = %q, want %q", got, want)
	}
	if l, name := f.Named(r); l != p[0] || name != "1h" {
		t.Errorf("Named = %v, %q, want %v, 1h", l, name, p[0])
	}
	if _, err := NewDated(p, Version(99)); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Errorf("revision 99: %v, want ErrInvalidArgument", err)
	}
	if _, err := NewDated(nil, Draft10); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Errorf("empty policy: %v, want ErrInvalidArgument", err)
	}
}
