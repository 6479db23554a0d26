package rls_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/rls"
)

const meteredConfig = `
domain: metered
descriptors:
  - key: ten
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: plan
    value: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
`

// The per-rule counters split each request's hits as the reference's base limiter does, on
// the count of the rule's window before and after the request (near-limit threshold
// floor(limit × 0.8)): admitted hits are within_limit, those of them above the threshold
// near_limit too; of a denied request, the hits that take the count over the limit are
// over_limit and those between the threshold and the limit near_limit; a shadow rule's
// over_limit hits are counted in shadow_mode too. The service's counters count loads, load
// errors, calls and their errors.
func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := start(t, enginetest.New(t, server.Client(t)), meteredConfig, rls.WithMetrics(reg))

	// 10 per minute, threshold 8. Window count before -> after each request:
	//   7 hits: 0 -> 7, admitted: within 7
	//   2 hits: 7 -> 9, admitted: within 2, near 9-8 = 1
	//   3 hits: 9 -> 12, denied: over 12-10 = 2, near 10-9 = 1
	//   1 hit:  9 -> 10, admitted: within 1, near 10-9 = 1
	//   1 hit:  10 -> 11, denied: over 1 (the count was already at the limit)
	ten := descriptor("ten", "x")
	for i, step := range []struct {
		hits uint64
		code pb.RateLimitResponse_Code
	}{{7, ok}, {2, ok}, {3, over}, {1, ok}, {1, over}} {
		wantCode(t, fmt.Sprintf("ten, step %d", i+1), ask(t, r.client, "metered", 0, withHits(ten, step.hits)), step.code, step.code)
	}
	// The shadow rule, 2 per minute, threshold 1, always OK:
	//   1 hit:  0 -> 1: within 1
	//   1 hit:  1 -> 2: within 1, near 2-1 = 1
	//   1 hit:  2 -> 3: over 1, shadow 1 (not recorded)
	//   2 hits: 2 -> 4: over 2, shadow 2
	trial := descriptor("plan", "trial")
	for i, hits := range []uint64{1, 1, 1, 2} {
		wantCode(t, fmt.Sprintf("shadow rule, step %d", i+1), ask(t, r.client, "metered", 0, withHits(trial, hits)), ok, ok)
	}
	// A check counts in total_hits only.
	ask(t, r.client, "metered", 0, withHits(ten, 0))

	for rule, want := range map[string]map[string]float64{
		"ten":        {"total_hits": 14, "within_limit": 10, "near_limit": 3, "over_limit": 3, "shadow_mode": 0},
		"plan_trial": {"total_hits": 5, "within_limit": 2, "near_limit": 1, "over_limit": 3, "shadow_mode": 3},
	} {
		labels := map[string]string{"domain": "metered", "key1": rule, "key2": ""}
		for counter, n := range want {
			if got := metricValue(t, reg, "ratelimit_service_rate_limit_"+counter, labels); got != n {
				t.Errorf("rule %s: %s = %v, want %v", rule, counter, got, n)
			}
		}
	}

	if _, err := r.client.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Descriptors: []*rlv3.RateLimitDescriptor{ten}}); err == nil {
		t.Fatal("a request without a domain answered")
	}
	r.svc.ConfigError(errors.New("test.yaml: bad unit"))
	r.svc.SetConfig(mustConfig(t, meteredConfig))
	for name, want := range map[string]float64{
		"ratelimit_service_config_load_success": 2,
		"ratelimit_service_config_load_error":   1,
	} {
		if got := metricValue(t, reg, name, nil); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if got := metricValue(t, reg, "ratelimit_service_should_rate_limit_error", map[string]string{"err_type": "service_error"}); got != 1 {
		t.Errorf("should_rate_limit_error{service_error} = %v, want 1", got)
	}
	// 10 requests answered, 1 refused: every call is counted and timed.
	if got := metricValue(t, reg, "ratelimit_service_total_requests", map[string]string{"grpc_method": "ShouldRateLimit"}); got != 11 {
		t.Errorf("total_requests{ShouldRateLimit} = %v, want 11", got)
	}
	if n, err := testutil.GatherAndCount(reg, "ratelimit_service_response_time_seconds"); err != nil || n != 1 {
		t.Errorf("response_time_seconds has %d series (%v), want 1", n, err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "ratelimit_service_response_time_seconds" {
			if got := f.GetMetric()[0].GetHistogram().GetSampleCount(); got != 11 {
				t.Errorf("response_time_seconds counts %d calls, want 11", got)
			}
		}
	}
}
