package rls_test

import (
	"fmt"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/rls"
)

const multiplierConfig = `
domain: windows
descriptors:
  - key: two_seconds
    rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 3}
  - key: one_second
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: fortnight
    rate_limit: {unit: week, unit_multiplier: 2, requests_per_unit: 1}
`

// currentLimit is a current_limit of requests per n units (none when n is 1, as the
// reference answers).
func currentLimit(requests uint32, unit pb.RateLimitResponse_RateLimit_Unit, n uint32) *pb.RateLimitResponse_RateLimit {
	l := &pb.RateLimitResponse_RateLimit{RequestsPerUnit: requests, Unit: unit}
	if n > 1 {
		l.UnitMultiplier = wrapperspb.UInt32(n)
	}
	return l
}

// A rule of 3 per 2 seconds (unit second, unit_multiplier 2) is a sliding window of 2 seconds:
// on the engine's clock, hits at 0, 0.5 s and 1 s are admitted, a fourth at 1.75 s is denied
// (where a rule of 3 per second, asked at the same times, admits it) and waits until the first
// leaves the window at 2 s.
// current_limit is the rule's requests_per_unit and unit, as the reference answers, with its
// unit_multiplier (Envoy's newer field; left out for one unit, as the reference leaves it);
// the header fields name the 2-second window.
func TestUnitMultiplier(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	r := start(t, e, multiplierConfig, rls.WithResponseHeaders(rls.HeadersFields))
	two, one := descriptor("two_seconds", "alice"), descriptor("one_second", "alice")
	for i, step := range []struct {
		at        time.Duration
		code      pb.RateLimitResponse_Code // the 2-second rule's
		remaining uint32
		reset     time.Duration
		oneCode   pb.RateLimitResponse_Code // the 1-second rule's, asked alone at the same time
		fields    string                    // the 2-second rule's RateLimit field
	}{
		{0, ok, 2, 2 * time.Second, ok, `"2s";r=2;t=2`},
		{500 * time.Millisecond, ok, 1, 1500 * time.Millisecond, ok, `"2s";r=1;t=2`},
		{time.Second, ok, 0, time.Second, ok, `"2s";r=0;t=1`},
		{1750 * time.Millisecond, over, 0, 250 * time.Millisecond, ok, `"2s";r=0;t=1`},
		{2*time.Second - time.Millisecond, over, 0, time.Millisecond, ok, `"2s";r=0;t=1`},
		{2 * time.Second, ok, 0, 500 * time.Millisecond, ok, `"2s";r=0;t=1`},
	} {
		clock.Set(enginetest.T0.Add(step.at))
		what := fmt.Sprintf("step %d (%s)", i+1, step.at)
		resp := ask(t, r.client, "windows", 0, two)
		wantCode(t, what, resp, step.code, step.code)
		st := resp.Statuses[0]
		if st.LimitRemaining != step.remaining || st.DurationUntilReset.AsDuration() != step.reset {
			t.Fatalf("%s: remaining %d, duration_until_reset %s; want %d, %s", what, st.LimitRemaining, st.DurationUntilReset.AsDuration(), step.remaining, step.reset)
		}
		if want := currentLimit(3, pb.RateLimitResponse_RateLimit_SECOND, 2); !proto.Equal(st.CurrentLimit, want) {
			t.Fatalf("%s: current_limit %v, want %v", what, st.CurrentLimit, want)
		}
		h := headerMap(t, resp.ResponseHeadersToAdd)
		if h["RateLimit-Policy"] != `"2s";q=3;w=2` || h["RateLimit"] != step.fields {
			t.Fatalf("%s: headers %v, want RateLimit-Policy \"2s\";q=3;w=2 and RateLimit %s", what, h, step.fields)
		}
		resp = ask(t, r.client, "windows", 0, one)
		wantCode(t, what+", one second", resp, step.oneCode, step.oneCode)
		if want := currentLimit(3, pb.RateLimitResponse_RateLimit_SECOND, 1); !proto.Equal(resp.Statuses[0].CurrentLimit, want) {
			t.Fatalf("%s: the 1-second rule's current_limit %v, want %v", what, resp.Statuses[0].CurrentLimit, want)
		}
	}
}

// A multiplied calendar unit is a sliding window of its length (2 weeks: 14 days), and stays
// one under WithCalendar, which counts single periods only (the command refuses such a rule
// at load: config.WithCalendar).
func TestUnitMultiplierOfCalendarUnit(t *testing.T) {
	for _, calendar := range []bool{false, true} {
		t.Run(fmt.Sprintf("calendar %t", calendar), func(t *testing.T) {
			e, clock := enginetest.Clocked(t, server.Client(t))
			var opts []rls.Option
			if calendar {
				opts = append(opts, rls.WithCalendar(time.UTC))
			}
			r := start(t, e, multiplierConfig, opts...)
			d := descriptor("fortnight", "bob")
			resp := ask(t, r.client, "windows", 0, d)
			wantCode(t, "first", resp, ok, ok)
			if got := resp.Statuses[0].DurationUntilReset.AsDuration(); got != 14*24*time.Hour {
				t.Fatalf("first: duration_until_reset %s, want 336h", got)
			}
			if want := currentLimit(1, pb.RateLimitResponse_RateLimit_WEEK, 2); !proto.Equal(resp.Statuses[0].CurrentLimit, want) {
				t.Fatalf("current_limit %v, want %v", resp.Statuses[0].CurrentLimit, want)
			}
			clock.Set(enginetest.T0.Add(10 * 24 * time.Hour)) // past a calendar week's end
			wantCode(t, "ten days on", ask(t, r.client, "windows", 0, d), over, over)
			clock.Set(enginetest.T0.Add(14 * 24 * time.Hour))
			wantCode(t, "fourteen days on", ask(t, r.client, "windows", 0, d), ok, ok)
		})
	}
}

// multiplied is d with a limit override of n per m units (Envoy's newer unit_multiplier).
func multiplied(d *rlv3.RateLimitDescriptor, n uint32, unit typev3.RateLimitUnit, m uint32) *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: d.Entries, Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{
		RequestsPerUnit: n, Unit: unit, UnitMultiplier: wrapperspb.UInt32(m)}}
}

// A request's override with a unit_multiplier (Envoy's newer API) is a window of that many
// units: of the same window as the rule of its entries, it counts on the rule's counter; of
// another, on its own; one longer than the engine's longest window is ignored, and the rule
// applies, as an override of an unknown unit is.
func TestOverrideUnitMultiplier(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	r := start(t, e, multiplierConfig)
	rule := descriptor("two_seconds", "carol")
	for i := range 3 {
		wantCode(t, fmt.Sprintf("rule %d", i+1), ask(t, r.client, "windows", 0, rule), ok, ok)
	}
	// 5 per 2 seconds: the rule's window, the rule's counter, 3 hits already.
	resp := ask(t, r.client, "windows", 0, multiplied(rule, 5, typev3.RateLimitUnit_SECOND, 2))
	wantCode(t, "override of the rule's window", resp, ok, ok)
	if st := resp.Statuses[0]; st.LimitRemaining != 1 || !proto.Equal(st.CurrentLimit, currentLimit(5, pb.RateLimitResponse_RateLimit_SECOND, 2)) {
		t.Fatalf("override of the rule's window: %v, want 1 remaining of 5 per 2 seconds", st)
	}
	// 2 per 3 seconds: a counter of its own.
	three := multiplied(rule, 2, typev3.RateLimitUnit_SECOND, 3)
	for i, step := range []struct {
		at    time.Duration
		code  pb.RateLimitResponse_Code
		reset time.Duration
	}{
		{0, ok, 3 * time.Second},
		{time.Second, ok, 2 * time.Second},
		{2500 * time.Millisecond, over, 500 * time.Millisecond},
		{3 * time.Second, ok, time.Second},
	} {
		clock.Set(enginetest.T0.Add(step.at))
		resp := ask(t, r.client, "windows", 0, three)
		what := fmt.Sprintf("2 per 3 seconds, step %d", i+1)
		wantCode(t, what, resp, step.code, step.code)
		st := resp.Statuses[0]
		if st.DurationUntilReset.AsDuration() != step.reset || !proto.Equal(st.CurrentLimit, currentLimit(2, pb.RateLimitResponse_RateLimit_SECOND, 3)) {
			t.Fatalf("%s: %v, want 2 per 3 seconds, reset in %s", what, st, step.reset)
		}
	}
	// 100 per 1000 years: ignored, and the rule applies.
	resp = ask(t, r.client, "windows", 0, multiplied(rule, 100, typev3.RateLimitUnit_YEAR, 1000))
	if st := resp.Statuses[0]; !proto.Equal(st.CurrentLimit, currentLimit(3, pb.RateLimitResponse_RateLimit_SECOND, 2)) {
		t.Fatalf("an override longer than any window: %v, want the rule's 3 per 2 seconds", st)
	}
}
