package rls_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/rls"
)

// tokenConfig is a budget of 1,000 tokens an hour per user, whose usage Envoy reports after
// the response (apply_on_stream_done): with record_over_limit when record, and a rule of 10
// requests a minute per user beside it, counted as every rule is.
func tokenConfig(record bool) string {
	return fmt.Sprintf(`
domain: ai
descriptors:
  - key: tokens
    record_over_limit: %t
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: requests
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shadow_tokens
    record_over_limit: %t
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: quota_tokens
    record_over_limit: %t
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
`, record, record, record)
}

// step is one call of a scenario and what it must answer: the descriptor's code and
// limit_remaining, its duration_until_reset when reset is set, and the events its key holds
// afterwards.
type step struct {
	what      string
	at        time.Duration // on the engine's clock, from enginetest.T0
	hits      uint64
	code      pb.RateLimitResponse_Code
	remaining uint32
	reset     time.Duration
	stored    int64
}

// runSteps sends each step's hits on descriptor kv of domain ai, at its time, and checks it.
func runSteps(t *testing.T, r running, clock *enginetest.Clock, kv []string, steps []step) {
	t.Helper()
	key := r.key("ai", kv...)
	for i, s := range steps {
		clock.Set(enginetest.T0.Add(s.at))
		what := fmt.Sprintf("step %d, %s (%d hits at %s)", i+1, s.what, s.hits, s.at)
		resp := ask(t, r.client, "ai", 0, withHits(descriptor(kv...), s.hits))
		wantCode(t, what, resp, s.code, s.code)
		st := resp.Statuses[0]
		if st.LimitRemaining != s.remaining {
			t.Fatalf("%s: limit_remaining %d, want %d", what, st.LimitRemaining, s.remaining)
		}
		if s.reset > 0 && st.DurationUntilReset.AsDuration() != s.reset {
			t.Fatalf("%s: duration_until_reset %s, want %s", what, st.DurationUntilReset.AsDuration(), s.reset)
		}
		if got := enginetest.StoredEvents(t, server.Client(t), key); got != s.stored {
			t.Fatalf("%s: the key holds %d tokens, want %d", what, got, s.stored)
		}
	}
}

// Envoy's two-phase token budget: each request is checked with hits_addend 0, and the tokens
// its response used are reported after it (apply_on_stream_done, hits_addend 5,000). With
// record_over_limit the report is recorded though it is over the budget, and answered
// OVER_LIMIT as the reference answers it; every check then answers OVER_LIMIT until the
// report leaves the hour, a microsecond early not. Without it, the rule keeps this service's
// answers: the report is refused and records nothing, and the next check is OK. The metrics
// count the recorded report's 5,000 tokens as over the limit, as the reference's do.
func TestTokenBudget(t *testing.T) {
	t.Run("record_over_limit", func(t *testing.T) {
		e, clock := enginetest.Clocked(t, server.Client(t))
		reg := prometheus.NewRegistry()
		r := start(t, e, tokenConfig(true), rls.WithMetrics(reg))
		runSteps(t, r, clock, []string{"tokens", "alice"}, []step{
			{what: "the first request's check", hits: 0, code: ok, remaining: 1000, reset: time.Hour},
			{what: "its response's report", at: time.Second, hits: 5000, code: over, remaining: 0, reset: time.Hour, stored: 5000},
			{what: "the next request's check", at: 2 * time.Second, hits: 0, code: over, remaining: 0, reset: time.Hour - time.Second, stored: 5000},
			{what: "a check a microsecond before the report leaves", at: time.Second + time.Hour - time.Microsecond, hits: 0, code: over, remaining: 0, stored: 5000},
			{what: "a check once it left", at: time.Second + time.Hour, hits: 0, code: ok, remaining: 1000, stored: 5000},
			{what: "a report that fits", at: time.Second + time.Hour, hits: 400, code: ok, remaining: 600, stored: 400},
		})
		labels := map[string]string{"domain": "ai", "key1": "tokens", "key2": ""}
		for name, want := range map[string]float64{
			"ratelimit_service_rate_limit_total_hits":   5400,
			"ratelimit_service_rate_limit_over_limit":   5000,
			"ratelimit_service_rate_limit_within_limit": 400,
			"ratelimit_service_rate_limit_near_limit":   0,
		} {
			if got := metricValue(t, reg, name, labels); got != want {
				t.Errorf("%s = %v, want %v", name, got, want)
			}
		}
	})
	t.Run("without record_over_limit", func(t *testing.T) {
		e, clock := enginetest.Clocked(t, server.Client(t))
		r := start(t, e, tokenConfig(false))
		runSteps(t, r, clock, []string{"tokens", "alice"}, []step{
			{what: "the first request's check", hits: 0, code: ok, remaining: 1000},
			{what: "its response's report, refused", at: time.Second, hits: 5000, code: over, remaining: 0, stored: 0},
			{what: "the next request's check", at: 2 * time.Second, hits: 0, code: ok, remaining: 1000, stored: 0},
		})
	})
}

// A check of 0 hits is over the limit only when the key holds more than the limit, as the
// reference compares the count after adding 0 hits with the limit (count > limit): a report
// that uses the budget exactly leaves the next check OK with nothing remaining; one token
// more makes it OVER_LIMIT. A report of 1 token once the budget is used up is recorded too.
func TestCheckAtTheBudget(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	r := start(t, e, tokenConfig(true))
	runSteps(t, r, clock, []string{"tokens", "bob"}, []step{
		{what: "a report of the whole budget", hits: 1000, code: ok, remaining: 0, stored: 1000},
		{what: "a check with the budget used exactly", hits: 0, code: ok, remaining: 0, stored: 1000},
		{what: "a report of one token more", hits: 1, code: over, remaining: 0, stored: 1001},
		{what: "a check past the budget", hits: 0, code: over, remaining: 0, stored: 1001},
	})
}

// A shadow rule with record_over_limit records the report over its budget, as shadow mode
// records what it decides, and answers OK; the shadow_mode metric counts its hits. A quota
// rule alike records it, and answers OK with nothing remaining and no reset, as quota mode
// answers an exceeded quota. Neither denies the request's other descriptors.
func TestAdvisoryRecordOverLimit(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	reg := prometheus.NewRegistry()
	r := start(t, e, tokenConfig(true), rls.WithMetrics(reg))
	runSteps(t, r, clock, []string{"shadow_tokens", "carol"}, []step{
		{what: "a report over the budget", hits: 5000, code: ok, remaining: 0, stored: 5000},
		{what: "a check past the budget", hits: 0, code: ok, remaining: 0, stored: 5000},
	})
	labels := map[string]string{"domain": "ai", "key1": "shadow_tokens", "key2": ""}
	if got := metricValue(t, reg, "ratelimit_service_rate_limit_shadow_mode", labels); got != 5000 {
		t.Errorf("shadow_mode = %v, want 5000", got)
	}

	resp := ask(t, r.client, "ai", 0, withHits(descriptor("quota_tokens", "carol"), 5000), descriptor("requests", "carol"))
	wantCode(t, "a quota report over the budget beside a request", resp, ok, ok, ok)
	if st := resp.Statuses[0]; st.LimitRemaining != 0 || st.DurationUntilReset != nil {
		t.Fatalf("the quota report: remaining %d, duration_until_reset %v; want 0 and none", st.LimitRemaining, st.DurationUntilReset)
	}
	for _, k := range []struct {
		kv   []string
		want int64
	}{{[]string{"quota_tokens", "carol"}, 5000}, {[]string{"requests", "carol"}, 1}} {
		if got := enginetest.StoredEvents(t, server.Client(t), r.key("ai", k.kv...)); got != k.want {
			t.Fatalf("%v holds %d, want %d", k.kv, got, k.want)
		}
	}
}

// gatewayConfig is a configuration as an xDS server would serve it, which cannot say
// record_over_limit: two routes of a listener, each limiting its users.
const gatewayConfig = `
domain: gw
descriptors:
  - key: route
    value: llm
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: route
    value: chat
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 1000}
`

// WithRecordOverLimit (STRICTRATE_RECORD_OVER_LIMIT) names the rules that record over their
// limit by their stats names: an exact name, or a prefix ending in '*'. A rule it names
// records a report over its budget, and the next check is OVER_LIMIT; a rule it does not
// name, and an exact name that is only a prefix of the rule's, keep refusing the report.
func TestRecordOverLimitNames(t *testing.T) {
	for _, tc := range []struct {
		names     []string
		llm, chat bool // whether each route's rule records over its limit
	}{
		{names: []string{"gw.route_llm.user"}, llm: true},
		{names: []string{"gw.route_llm*"}, llm: true},
		{names: []string{"gw.route_*"}, llm: true, chat: true},
		{names: []string{"*"}, llm: true, chat: true},
		{names: []string{"gw.route_llm", "gw.route_chat.use"}},
		{names: nil},
	} {
		t.Run(fmt.Sprint(tc.names), func(t *testing.T) {
			r := start(t, enginetest.New(t, server.Client(t)), gatewayConfig, rls.WithRecordOverLimit(tc.names...))
			for _, route := range []struct {
				name   string
				record bool
			}{{"llm", tc.llm}, {"chat", tc.chat}} {
				d := descriptor("route", route.name, "user", "alice")
				key := r.key("gw", "route", route.name, "user", "alice")
				wantCode(t, route.name+": the report", ask(t, r.client, "gw", 0, withHits(d, 5000)), over, over)
				want, code := int64(0), ok
				if route.record {
					want, code = 5000, over
				}
				if got := enginetest.StoredEvents(t, server.Client(t), key); got != want {
					t.Fatalf("%s: the key holds %d tokens after the report, want %d", route.name, got, want)
				}
				wantCode(t, route.name+": the next check", ask(t, r.client, "gw", 0, withHits(d, 0)), code, code)
			}
		})
	}
}

// The charges of a request run first, whatever its other descriptors decide: a report that
// does not fit makes the request OVER_LIMIT and its other descriptor records nothing (it
// answers with what it still admits, as a denied request's others do); a report that fits
// beside a descriptor over its limit is recorded all the same, and that one records nothing.
func TestChargeBesideOtherDescriptors(t *testing.T) {
	r := start(t, enginetest.New(t, server.Client(t)), tokenConfig(true))
	c := server.Client(t)
	tokens, requests := descriptor("tokens", "dave"), descriptor("requests", "dave")
	tokensKey, requestsKey := r.key("ai", "tokens", "dave"), r.key("ai", "requests", "dave")

	resp := ask(t, r.client, "ai", 0, withHits(tokens, 5000), requests)
	wantCode(t, "a report over the budget beside a request", resp, over, over, ok)
	if got := resp.Statuses[1].LimitRemaining; got != 10 {
		t.Fatalf("the request's descriptor reports %d remaining, want 10 (nothing recorded)", got)
	}
	if got := enginetest.StoredEvents(t, c, requestsKey); got != 0 {
		t.Fatalf("the request's descriptor holds %d events, want 0", got)
	}
	if got := enginetest.StoredEvents(t, c, tokensKey); got != 5000 {
		t.Fatalf("the tokens hold %d, want the report's 5000", got)
	}

	// The request's descriptor alone then records.
	wantCode(t, "the request's descriptor alone", ask(t, r.client, "ai", 0, requests), ok, ok)

	// A used-up request limit beside a report that fits: the report is recorded, the request
	// descriptor is not.
	other, otherKey := descriptor("tokens", "erin"), r.key("ai", "tokens", "erin")
	used := withHits(descriptor("requests", "erin"), 10)
	wantCode(t, "using up the request limit", ask(t, r.client, "ai", 0, used), ok, ok)
	resp = ask(t, r.client, "ai", 0, withHits(other, 300), descriptor("requests", "erin"))
	wantCode(t, "a report that fits beside a used-up limit", resp, over, ok, over)
	if got := resp.Statuses[0].LimitRemaining; got != 700 {
		t.Fatalf("the report answers %d remaining, want 700", got)
	}
	if got := enginetest.StoredEvents(t, c, otherKey); got != 300 {
		t.Fatalf("the tokens hold %d, want the report's 300", got)
	}
	if got := enginetest.StoredEvents(t, c, r.key("ai", "requests", "erin")); got != 10 {
		t.Fatalf("the used-up limit holds %d events, want its 10", got)
	}
}

// A charged key's looser limits in the same request (here an override of 10,000 an hour on
// the tokens' own key, beside the rule's 1,000) are answered over with the charge when it does
// not fit the tightest, though the looser one alone had room: the engine says whether the
// charge fit the limit it was decided under. When it fits, each answers its own room.
func TestChargeWithLooserLimitOnItsKey(t *testing.T) {
	r := start(t, enginetest.New(t, server.Client(t)), tokenConfig(true))
	d := descriptor("tokens", "frank")
	looser := overridden(d, 10000, typev3.RateLimitUnit_HOUR)

	resp := ask(t, r.client, "ai", 0, withHits(d, 600), withHits(looser, 0))
	wantCode(t, "a report that fits both", resp, ok, ok, ok)
	if a, b := resp.Statuses[0].LimitRemaining, resp.Statuses[1].LimitRemaining; a != 400 || b != 9400 {
		t.Fatalf("remaining %d and %d, want 400 and 9400", a, b)
	}
	resp = ask(t, r.client, "ai", 0, withHits(d, 600), withHits(looser, 0))
	wantCode(t, "a report over the rule, within the override", resp, over, over, over)
	if got := enginetest.StoredEvents(t, server.Client(t), r.key("ai", "tokens", "frank")); got != 1200 {
		t.Fatalf("the key holds %d tokens, want both reports' 1200", got)
	}
}

// Many callers spending one budget at once, each request a check of 0 and, when admitted, a
// report of what its response used: the key holds exactly the tokens reported, every report
// one entry of its cost, whatever each report answered. Nothing leaves the hour, so the count
// only grows: the reports answered OK never sum past the budget, and once a caller saw a
// check or a report over the budget, every later answer it gets is OVER_LIMIT.
func TestTokenBudgetUnderConcurrency(t *testing.T) {
	r := start(t, enginetest.New(t, server.Client(t)), tokenConfig(true))
	const callers, each, budget = 32, 25, 1000
	d := descriptor("tokens", "grace")
	var (
		mu               sync.Mutex
		reported         []int
		reportedOK       int
		checksOK, checks int
		wg               sync.WaitGroup
	)
	for g := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			sawOver := false
			for range each {
				ctx := context.Background()
				resp, err := askCtx(ctx, r.client, "ai", withHits(d, 0))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				checks++
				mu.Unlock()
				if resp.OverallCode != ok {
					sawOver = true
					continue
				}
				if sawOver {
					t.Errorf("caller %d: a check answered OK after an answer over the budget", g)
					return
				}
				cost := 1 + rng.IntN(120)
				resp, err = askCtx(ctx, r.client, "ai", withHits(d, uint64(cost)))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				checksOK++
				reported = append(reported, cost)
				if resp.OverallCode == ok {
					reportedOK += cost
				}
				mu.Unlock()
				sawOver = sawOver || resp.OverallCode != ok
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	sum := 0
	for _, c := range reported {
		sum += c
	}
	entries := enginetest.Log(t, server.Client(t), enginetest.Prefix, r.key("ai", "tokens", "grace")).Entries
	var costs []int
	stored := 0
	for _, e := range entries {
		costs = append(costs, e.Cost)
		stored += e.Cost
	}
	if stored != sum {
		t.Fatalf("the key holds %d tokens, want exactly the %d reported by %d reports", stored, sum, len(reported))
	}
	slices.Sort(costs)
	slices.Sort(reported)
	if !slices.Equal(costs, reported) {
		t.Fatalf("the key's entries cost %v, want one per report: %v", costs, reported)
	}
	if reportedOK > budget {
		t.Fatalf("reports answered OK sum to %d tokens, more than the budget of %d", reportedOK, budget)
	}
	if sum <= budget || checksOK == checks {
		t.Fatalf("%d tokens reported over %d of %d checks admitted: the budget was never spent, the test shows nothing", sum, checksOK, checks)
	}
}
