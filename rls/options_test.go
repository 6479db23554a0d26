package rls_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/rls"
)

// limit_remaining and duration_until_reset are exact, on the engine's clock: three per minute
// asked at 0 s, 10 s and 20 s leave 2, 1 and 0, with the first event leaving the window at
// 60 s; a denial at 30 s waits 30 s, and one 1 ms before the first event leaves waits 1 ms; at
// 60 s the request is admitted, and the next quota comes back when the 10 s event leaves.
func TestRemainingAndResetExact(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	r := start(t, e, basicConfig)
	d := descriptor("three_per_minute", "exact")
	for i, step := range []struct {
		at        time.Duration
		hits      uint64
		code      pb.RateLimitResponse_Code
		remaining uint32
		reset     time.Duration
	}{
		{0, 1, ok, 2, time.Minute},
		{10 * time.Second, 1, ok, 1, 50 * time.Second},
		{20 * time.Second, 1, ok, 0, 40 * time.Second},
		{30 * time.Second, 1, over, 0, 30 * time.Second},
		{time.Minute - time.Millisecond, 1, over, 0, time.Millisecond},
		{time.Minute, 1, ok, 0, 10 * time.Second},
		{65 * time.Second, 0, ok, 0, 5 * time.Second}, // a check
		{70 * time.Second, 0, ok, 1, 10 * time.Second},
		{75 * time.Second, 2, over, 0, 5 * time.Second}, // 2 hits wait for the 20 s event too
	} {
		clock.Set(enginetest.T0.Add(step.at))
		resp := ask(t, r.client, "edge", 0, withHits(d, step.hits))
		what := fmt.Sprintf("step %d (%s, %d hits)", i+1, step.at, step.hits)
		wantCode(t, what, resp, step.code, step.code)
		st := resp.Statuses[0]
		if st.LimitRemaining != step.remaining || st.DurationUntilReset.AsDuration() != step.reset {
			t.Fatalf("%s: remaining %d, duration_until_reset %s; want %d, %s", what, st.LimitRemaining, st.DurationUntilReset.AsDuration(), step.remaining, step.reset)
		}
	}
}

// Global shadow mode answers OK to what is over a limit and counts it
// (global_shadow_mode), but still decides every request: one within its limit is recorded,
// one over it is not, and the descriptors' own statuses say OVER_LIMIT. A descriptor over its
// limit does not stop the request's others from recording theirs (the reference records
// them), and records nothing itself.
func TestGlobalShadowMode(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := start(t, enginetest.New(t, server.Client(t)), basicConfig, rls.WithShadowMode(true), rls.WithMetrics(reg))
	c := server.Client(t)
	d := descriptor("three_per_minute", "shadow")
	key := r.key("edge", "three_per_minute", "shadow")
	for i := range 5 {
		resp := ask(t, r.client, "edge", 0, d)
		want := ok
		if i >= 3 {
			want = over
		}
		wantCode(t, fmt.Sprintf("request %d", i+1), resp, ok, want)
		if got, want := enginetest.StoredEvents(t, c, key), int64(min(i+1, 3)); got != want {
			t.Fatalf("request %d: the counter holds %d events, want %d", i+1, got, want)
		}
	}
	if got := metricValue(t, reg, "ratelimit_service_global_shadow_mode", nil); got != 2 {
		t.Fatalf("global_shadow_mode = %v, want 2", got)
	}
	// The full descriptor, over its limit, does not stop the other one from recording its
	// hit, and records nothing itself.
	other := descriptor("ten_per_minute", "shadow")
	resp := ask(t, r.client, "edge", 0, d, other)
	wantCode(t, "the full descriptor beside another", resp, ok, over, ok)
	if got := enginetest.StoredEvents(t, c, r.key("edge", "ten_per_minute", "shadow")); got != 1 {
		t.Fatalf("the other descriptor holds %d events after a shadow-admitted request, want 1", got)
	}
	if got := enginetest.StoredEvents(t, c, key); got != 3 {
		t.Fatalf("the full descriptor holds %d events after a shadow-admitted request, want its 3", got)
	}
	if got := metricValue(t, reg, "ratelimit_service_global_shadow_mode", nil); got != 3 {
		t.Fatalf("global_shadow_mode = %v, want 3", got)
	}
}

// Under global shadow mode, and for descriptors in quota mode, 64 concurrent requests carrying
// a small limit and a larger one are all answered OK, and each counter holds exactly the hits
// its own limit admits: the small one its 5, the larger one its 20 (the small one's denials do
// not stop it), never more. Turned off (a
// service on the same counters without the mode), both deny at once: the counts are the ones
// the limits would have kept.
func TestAdvisoryModesCountExactly(t *testing.T) {
	const quotaConfig = `
domain: edge
descriptors:
  - {key: five_per_minute, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: twenty_per_minute, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 20}}
`
	const plainConfig = `
domain: edge
descriptors:
  - {key: five_per_minute, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: twenty_per_minute, rate_limit: {unit: minute, requests_per_unit: 20}}
`
	for _, mode := range []struct {
		name string
		yaml string
		opts []rls.Option
	}{
		{"SHADOW_MODE", plainConfig, []rls.Option{rls.WithShadowMode(true)}},
		{"QUOTA_MODE", plainConfig, []rls.Option{rls.WithQuotaMode(true)}},
		{"quota_mode", quotaConfig, nil},
	} {
		t.Run(mode.name, func(t *testing.T) {
			e := enginetest.New(t, server.Client(t))
			r := start(t, e, mode.yaml, mode.opts...)
			small, large := descriptor("five_per_minute", "x"), descriptor("twenty_per_minute", "x")
			var wg sync.WaitGroup
			errs := make(chan error, 64)
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 8 {
						resp, err := askCtx(context.Background(), r.client, "edge", small, large)
						if err == nil && resp.OverallCode != ok {
							err = fmt.Errorf("overall %s, want OK: %v", resp.OverallCode, resp)
						}
						if err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			c := server.Client(t)
			for key, want := range map[string]int64{r.key("edge", "five_per_minute", "x"): 5, r.key("edge", "twenty_per_minute", "x"): 20} {
				if got := enginetest.StoredEvents(t, c, key); got != want {
					t.Errorf("%s holds %d events after 64 requests, want %d", key, got, want)
				}
			}
			off := start(t, e, plainConfig, rls.WithKeyPrefix(r.prefix))
			wantCode(t, "the small limit with the mode off", ask(t, off.client, "edge", 0, small), over, over)
			wantCode(t, "the large limit with the mode off", ask(t, off.client, "edge", 0, large), over, over)
		})
	}
}

// headerMap is a response's header fields by name, failing t on a name given twice.
func headerMap(t testing.TB, hs []*corev3.HeaderValue) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, h := range hs {
		if _, dup := m[h.Key]; dup {
			t.Fatalf("header %s twice in %v", h.Key, hs)
		}
		m[h.Key] = h.Value
	}
	return m
}

// With header fields on, response_headers_to_add speaks for the descriptor closest to its
// limit (an over-limit one first): the IETF fields as package fields writes them (q and w of
// the rule, r its room, t the seconds until it gets quota back, or, denied, until the request
// would be admitted), or the reference's trio under the names set. Off, there are none.
func TestResponseHeaders(t *testing.T) {
	three, ten := descriptor("three_per_minute", "h"), descriptor("ten_per_minute", "h")
	steps := []struct {
		at      time.Duration
		code    pb.RateLimitResponse_Code
		fields  string // the RateLimit field
		legacy  [3]string
		descrip []*rlv3.RateLimitDescriptor
	}{
		{0, ok, `"1m";r=2;t=60`, [3]string{"3", "2", "60"}, []*rlv3.RateLimitDescriptor{three, ten}},
		{10 * time.Second, ok, `"1m";r=1;t=50`, [3]string{"3", "1", "50"}, []*rlv3.RateLimitDescriptor{ten, three}},
		{20 * time.Second, ok, `"1m";r=0;t=40`, [3]string{"3", "0", "40"}, []*rlv3.RateLimitDescriptor{three, ten}},
		{30 * time.Second, over, `"1m";r=0;t=30`, [3]string{"3", "0", "30"}, []*rlv3.RateLimitDescriptor{ten, three}},
		{45 * time.Second, over, `"1m";r=0;t=15`, [3]string{"3", "0", "15"}, []*rlv3.RateLimitDescriptor{three}},
	}
	t.Run("fields", func(t *testing.T) {
		e, clock := enginetest.Clocked(t, server.Client(t))
		r := start(t, e, basicConfig, rls.WithResponseHeaders(rls.HeadersFields))
		for i, s := range steps {
			clock.Set(enginetest.T0.Add(s.at))
			resp := ask(t, r.client, "edge", 0, s.descrip...)
			wantCode(t, fmt.Sprintf("step %d", i+1), resp, s.code)
			h := headerMap(t, resp.ResponseHeadersToAdd)
			if len(h) != 2 || h["RateLimit-Policy"] != `"1m";q=3;w=60` || h["RateLimit"] != s.fields {
				t.Fatalf("step %d: headers %v, want RateLimit-Policy \"1m\";q=3;w=60 and RateLimit %s", i+1, h, s.fields)
			}
		}
		// The 10-per-minute descriptor with 1 left is tighter than the 3-per-minute with 3.
		clock.Set(enginetest.T0.Add(time.Hour))
		resp := ask(t, r.client, "edge", 0, descriptor("three_per_minute", "h2"), withHits(descriptor("ten_per_minute", "h2"), 9))
		h := headerMap(t, resp.ResponseHeadersToAdd)
		if h["RateLimit-Policy"] != `"1m";q=10;w=60` || h["RateLimit"] != `"1m";r=1;t=60` {
			t.Fatalf("the tighter descriptor: headers %v", h)
		}
	})
	t.Run("legacy", func(t *testing.T) {
		e, clock := enginetest.Clocked(t, server.Client(t))
		r := start(t, e, basicConfig, rls.WithResponseHeaders(rls.HeadersLegacy),
			rls.WithLegacyHeaderNames("X-RL-Limit", "X-RL-Remaining", "X-RL-Reset"))
		for i, s := range steps {
			clock.Set(enginetest.T0.Add(s.at))
			resp := ask(t, r.client, "edge", 0, s.descrip...)
			wantCode(t, fmt.Sprintf("step %d", i+1), resp, s.code)
			h := headerMap(t, resp.ResponseHeadersToAdd)
			if got := [3]string{h["X-RL-Limit"], h["X-RL-Remaining"], h["X-RL-Reset"]}; len(h) != 3 || got != s.legacy {
				t.Fatalf("step %d: headers %v, want limit, remaining and reset %v", i+1, h, s.legacy)
			}
		}
	})
	t.Run("off", func(t *testing.T) {
		c, _ := newService(t, basicConfig, nil)
		if resp := ask(t, c, "edge", 0, three); len(resp.ResponseHeadersToAdd) != 0 {
			t.Fatalf("headers by default: %v", resp.ResponseHeadersToAdd)
		}
	})
}

// With header fields on, the fields of a configured rule's limit are made once and kept, but
// not those of a request's own limit (an override), which a client may vary at will: 60,000
// requests of distinct overrides each get their fields, and the service keeps the fields of
// the configuration's rules alone, until a new configuration drops them.
func TestOverrideFieldsNotKept(t *testing.T) {
	valkeytest.SkipIfShort(t, "sends 60,000 requests")
	e := enginetest.New(t, server.Client(t))
	svc := rls.New(e, rls.WithKeyPrefix(t.Name()+uuid.NewString()+":"), rls.WithResponseHeaders(rls.HeadersFields), rls.WithRequestTimeout(requestTimeout))
	svc.SetConfig(mustConfig(t, basicConfig))
	ctx := context.Background()
	ask := func(d *rlv3.RateLimitDescriptor) map[string]string {
		resp, err := svc.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{withHits(d, 0)}})
		if err != nil {
			t.Error(err)
			return nil
		}
		return headerMap(t, resp.ResponseHeadersToAdd)
	}
	for _, k := range []string{"one_per_minute", "three_per_minute", "five_per_minute", "ten_per_minute"} {
		ask(descriptor(k, "kept"))
	}
	const overrides, goroutines = 60_000, 8
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := g; i < overrides && !t.Failed(); i += goroutines {
				n := uint32(100 + i)
				h := ask(overridden(descriptor("five_per_minute", "override"), n, typev3.RateLimitUnit_MINUTE))
				if want := fmt.Sprintf(`"1m";q=%d;w=60`, n); h["RateLimit-Policy"] != want {
					t.Errorf("override %d: headers %v, want RateLimit-Policy %s", n, h, want)
				}
			}
		})
	}
	wg.Wait()
	if got := rls.FieldsKept(svc); got != 4 {
		t.Fatalf("after %d distinct overrides the service keeps the fields of %d limits, want the 4 rules'", overrides, got)
	}
	svc.SetConfig(mustConfig(t, basicConfig))
	if got := rls.FieldsKept(svc); got != 0 {
		t.Fatalf("after a new configuration the service keeps the fields of %d limits, want none", got)
	}
}

// A descriptor's limit override (descriptor.limit, from Envoy's route) applies instead of the
// configuration's rule, whether tighter or looser, and limits a descriptor no rule matches in
// a configured domain; in a domain the configuration does not know, nothing applies.
func TestLimitOverride(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	r := start(t, e, basicConfig)
	tighter := overridden(descriptor("five_per_minute", "o"), 2, typev3.RateLimitUnit_HOUR)
	for i := range 2 {
		resp := ask(t, r.client, "edge", 0, tighter)
		wantCode(t, fmt.Sprintf("2 per hour instead of 5 per minute, %d", i+1), resp, ok, ok)
		st := resp.Statuses[0]
		if l := st.CurrentLimit; l.GetRequestsPerUnit() != 2 || l.GetUnit() != pb.RateLimitResponse_RateLimit_HOUR || l.GetName() != "" {
			t.Fatalf("the override's current_limit: %v", l)
		}
		if st.LimitRemaining != uint32(1-i) || st.DurationUntilReset.AsDuration() != time.Hour {
			t.Fatalf("request %d: remaining %d, duration_until_reset %s; want %d, 1h", i+1, st.LimitRemaining, st.DurationUntilReset.AsDuration(), 1-i)
		}
	}
	clock.Set(enginetest.T0.Add(30 * time.Minute)) // the rule's minute is long over, the hour is not
	resp := ask(t, r.client, "edge", 0, tighter)
	wantCode(t, "2 per hour, third", resp, over, over)
	if got := resp.Statuses[0].DurationUntilReset.AsDuration(); got != 30*time.Minute {
		t.Fatalf("the third waits %s, want 30m", got)
	}

	looser := overridden(descriptor("one_per_minute", "o"), 4, typev3.RateLimitUnit_MINUTE)
	for i := range 4 {
		wantCode(t, fmt.Sprintf("4 per minute instead of 1, %d", i+1), ask(t, r.client, "edge", 0, looser), ok, ok)
	}
	wantCode(t, "4 per minute, fifth", ask(t, r.client, "edge", 0, looser), over, over)

	unmatched := overridden(descriptor("no_rule", "o"), 1, typev3.RateLimitUnit_MINUTE)
	wantCode(t, "an override without a rule, first", ask(t, r.client, "edge", 0, unmatched), ok, ok)
	wantCode(t, "an override without a rule, second", ask(t, r.client, "edge", 0, unmatched), over, over)

	elsewhere := overridden(descriptor("five_per_minute", "o"), 1, typev3.RateLimitUnit_MINUTE)
	for i := range 3 {
		resp := ask(t, r.client, "unknown-domain", 0, elsewhere)
		wantCode(t, fmt.Sprintf("an override in an unknown domain, %d", i+1), resp, ok, ok)
		if resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("an override in an unknown domain: current_limit %v", resp.Statuses[0].CurrentLimit)
		}
	}
}

const calendarConfig = `
domain: billing
descriptors:
  - key: account
    rate_limit: {unit: month, requests_per_unit: 3}
`

// Under WithCalendar, a month rule counts since the start of the calendar month: its
// duration_until_reset is the time to the next month's start, and the quota comes back whole
// at midnight on the 1st, where the default 30-day sliding window still holds the events.
func TestCalendarMonth(t *testing.T) {
	nextMonth := func(t0 time.Time) time.Time {
		return time.Date(t0.Year(), t0.Month()+1, 1, 0, 0, 0, 0, time.UTC)
	}
	t.Run("server clock", func(t *testing.T) {
		r := start(t, enginetest.New(t, server.Client(t)), calendarConfig, rls.WithCalendar(time.UTC))
		resp := ask(t, r.client, "billing", 0, descriptor("account", "now"))
		wantCode(t, "first", resp, ok, ok)
		want := time.Until(nextMonth(time.Now().UTC()))
		if got := resp.Statuses[0].DurationUntilReset.AsDuration(); got < want-time.Second || got > want+time.Second {
			t.Fatalf("duration_until_reset %s, want %s (to the next month) within a second", got, want)
		}
		if u := resp.Statuses[0].CurrentLimit.GetUnit(); u != pb.RateLimitResponse_RateLimit_MONTH {
			t.Fatalf("current_limit unit %s", u)
		}
	})
	for _, calendar := range []bool{true, false} {
		t.Run(fmt.Sprintf("calendar %t", calendar), func(t *testing.T) {
			e, clock := enginetest.Clocked(t, server.Client(t))
			opts := []rls.Option{rls.WithResponseHeaders(rls.HeadersFields)}
			if calendar {
				opts = append(opts, rls.WithCalendar(time.UTC))
			}
			r := start(t, e, calendarConfig, opts...)
			d := descriptor("account", "a1")
			// A check of the empty counter: the whole period (or window) ahead.
			resp := ask(t, r.client, "billing", 0, withHits(d, 0))
			want := 30 * 24 * time.Hour
			if calendar {
				want = 12 * time.Hour
			}
			if got := resp.Statuses[0].DurationUntilReset.AsDuration(); got != want {
				t.Fatalf("a check of the empty counter: duration_until_reset %s, want %s", got, want)
			}
			for i := range 3 { // 2026-11-30 12:00, 13:00, 14:00
				clock.Set(enginetest.T0.Add(time.Duration(i) * time.Hour))
				resp := ask(t, r.client, "billing", 0, d)
				wantCode(t, fmt.Sprintf("request %d", i+1), resp, ok, ok)
				want := 30 * 24 * time.Hour
				if calendar {
					want = nextMonth(enginetest.T0).Sub(clock.Now())
				} else if i > 0 {
					want -= time.Duration(i) * time.Hour
				}
				if got := resp.Statuses[0].DurationUntilReset.AsDuration(); got != want {
					t.Fatalf("request %d: duration_until_reset %s, want %s", i+1, got, want)
				}
				// The fields name a calendar month by its period, w its length (November's
				// 30 days); a sliding one by its window.
				wantFields := map[string]string{"RateLimit-Policy": `"720h";q=3;w=2592000`,
					"RateLimit": fmt.Sprintf(`"720h";r=%d;t=%d`, 2-i, int(want/time.Second))}
				if calendar {
					wantFields = map[string]string{"RateLimit-Policy": `"month";q=3;w=2592000`,
						"RateLimit": fmt.Sprintf(`"month";r=%d;t=%d`, 2-i, int(want/time.Second))}
				}
				if h := headerMap(t, resp.ResponseHeadersToAdd); fmt.Sprint(h) != fmt.Sprint(wantFields) {
					t.Fatalf("request %d: headers %v, want %v", i+1, h, wantFields)
				}
			}
			resp = ask(t, r.client, "billing", 0, d)
			wantCode(t, "fourth", resp, over, over)
			want = 30*24*time.Hour - 2*time.Hour
			if calendar {
				want = 10 * time.Hour // to December 1st
			}
			if got := resp.Statuses[0].DurationUntilReset.AsDuration(); got != want {
				t.Fatalf("fourth: duration_until_reset %s, want %s", got, want)
			}
			clock.Set(nextMonth(enginetest.T0))
			code := over
			if calendar {
				code = ok
			}
			wantCode(t, "on the 1st", ask(t, r.client, "billing", 0, d), code, code)
		})
	}
}

// WithSlotsPerWindow(10) keeps a rule of 1000 per hour in about 10 entries however many
// requests it admits, and still never admits more than 1000 in any trailing hour.
func TestSlotsPerWindow(t *testing.T) {
	const hourly = `
domain: slots
descriptors:
  - key: api
    rate_limit: {unit: hour, requests_per_unit: 1000}
`
	e, clock := enginetest.Clocked(t, server.Client(t))
	r := start(t, e, hourly, rls.WithSlotsPerWindow(10))
	c := server.Client(t)
	d, key := descriptor("api", "k"), r.key("slots", "api", "k")
	var admitted []admission
	const step = 1800 * time.Millisecond // 2000 an hour against 1000
	for i := range 3000 {
		at := enginetest.T0.Add(time.Duration(i) * step)
		clock.Set(at)
		resp := ask(t, r.client, "slots", 0, d)
		if resp.OverallCode == ok {
			admitted = append(admitted, admission{at, 1})
		}
		if i < 1000 && resp.OverallCode != ok {
			t.Fatalf("request %d, with fewer than 1000 in the hour, denied", i+1)
		}
		if i == 1000 && resp.OverallCode == ok {
			t.Fatalf("request 1001, the hour holding 1000, admitted")
		}
		if i%100 == 99 {
			if n := len(enginetest.StoredEntries(t, c, key)); n > 11 {
				t.Fatalf("after %d requests the key holds %d entries, want at most 11", i+1, n)
			}
		}
	}
	auditWindow(t, "1000 per hour in 10 slots", admitted, time.Hour, 1000)
	if len(admitted) < 1750 {
		t.Fatalf("%d admitted in 90 minutes at 1000 per hour, want at least 1750 (the slots hand the room back up to 6 minutes late)", len(admitted))
	}
	l := enginetest.Log(t, c, enginetest.Prefix, key)
	t.Logf("%d admitted of 3000; the log holds %d entries, %d events", len(admitted), len(l.Entries), l.Events)
}
