package fields

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
)

// The fields of a policy and of decisions, in draft -10's syntax: t is the wait for the named
// limit's next quota when admitted, the wait until admission when denied; a fail-open Result
// reports nothing.
func TestDraft10(t *testing.T) {
	p := engine.Policy{engine.PerHour(100), {Max: 5, Window: time.Second}, {Max: 7, Window: 1500 * time.Millisecond}}
	f, err := New(p, DefaultVersion)
	if err != nil {
		t.Fatal(err)
	}
	want := []Field{{Name: "RateLimit-Policy", Value: `"1h";q=100;w=3600, "1s";q=5;w=1, "1500ms";q=7;w=2`}}
	if !slices.Equal(f.Policy(), want) {
		t.Fatalf("Policy() = %q, want %q", f.Policy(), want)
	}
	for _, tc := range []struct {
		r    engine.Result
		want string
	}{
		{engine.Result{Allowed: true, Remaining: 3, QuotaAfter: 400 * time.Millisecond, ResetAfter: time.Hour, Window: time.Second}, `"1s";r=3;t=1`},
		{engine.Result{Allowed: true, Remaining: 90, QuotaAfter: 61*time.Minute + time.Microsecond, ResetAfter: time.Hour, Window: time.Hour}, `"1h";r=90;t=3661`},
		{engine.Result{Remaining: 0, RetryAfter: 1200 * time.Millisecond, QuotaAfter: 100 * time.Millisecond, Window: 1500 * time.Millisecond}, `"1500ms";r=0;t=2`},
		{engine.Result{Allowed: true, Remaining: 2, QuotaAfter: time.Second, Window: time.Minute}, `"1s";r=2;t=1`}, // no such window: the smallest quota
	} {
		got := f.AppendDecision(nil, tc.r)
		if len(got) != 1 || got[0].Name != "RateLimit" || got[0].Value != tc.want {
			t.Errorf("AppendDecision(%+v) = %q, want RateLimit: %s", tc.r, got, tc.want)
		}
	}
	if got := f.AppendDecision(nil, engine.Result{Allowed: true, BackendErr: errors.New("down")}); len(got) != 0 {
		t.Errorf("fail-open Result: %q, want no fields", got)
	}
	if got := f.Named(engine.Result{Window: time.Second}); got != p[1] {
		t.Errorf("Named = %v, want %v", got, p[1])
	}
	if _, err := New(p, Version(99)); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Errorf("revision 99: %v, want ErrInvalidArgument", err)
	}
	if _, err := New(nil, Draft10); !errors.Is(err, engine.ErrInvalidArgument) {
		t.Errorf("empty policy: %v, want ErrInvalidArgument", err)
	}
}

// A revision that renames the parameters is its syntax alone: the values follow it.
func TestRenamedSyntax(t *testing.T) {
	f := build(engine.Policy{engine.PerSecond(5)}, syntax{policyField: "RateLimit-Policy", rateLimitField: "RateLimit",
		quota: "quota", window: "window", remaining: "remaining", reset: "until"})
	if got := f.Policy()[0].Value; got != `"1s";quota=5;window=1` {
		t.Errorf("policy %q", got)
	}
	got := f.AppendDecision(nil, engine.Result{Allowed: true, Remaining: 4, QuotaAfter: time.Second, Window: time.Second})
	if got[0].Value != `"1s";remaining=4;until=1` {
		t.Errorf("decision %q", got)
	}
}

func TestSecondsAndNames(t *testing.T) {
	for d, want := range map[time.Duration]int64{0: 0, -time.Second: 0, time.Microsecond: 1, time.Second: 1, time.Second + 1: 2} {
		if got := Seconds(d); got != want {
			t.Errorf("Seconds(%s) = %d, want %d", d, got, want)
		}
	}
	for d, want := range map[time.Duration]string{time.Hour: "1h", 90 * time.Minute: "90m", 500 * time.Millisecond: "500ms", 1500 * time.Microsecond: "1500us"} {
		if got := WindowName(d); got != want {
			t.Errorf("WindowName(%s) = %q, want %q", d, got, want)
		}
	}
	if got := Draft10.String(); got != "draft-ietf-httpapi-ratelimit-headers-10" {
		t.Errorf("Draft10 = %q", got)
	}
}
