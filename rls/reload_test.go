package rls_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/rls/config"
)

const (
	fivePerMinute = `
domain: reload
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
`
	fiftyPerMinute = `
domain: reload
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 50}
`
)

// 8 goroutines ask continuously while the configuration is swapped between 5 and 50 per
// minute on the descriptor they ask for: no call fails, and every decision follows the
// configuration in effect: 5 admitted under the first, up to 50 once it is swapped for the
// second, none once it is swapped back, and never more than 50 however often it is swapped.
func TestReloadWhileServing(t *testing.T) {
	r := start(t, enginetest.New(t, server.Client(t)), "")
	five, fifty := mustConfig(t, fivePerMinute), mustConfig(t, fiftyPerMinute)
	r.svc.SetConfig(five)
	d := descriptor("user", "u1")

	var (
		admitted, asked atomic.Int64
		stop            = make(chan struct{})
		wg              sync.WaitGroup
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := askCtx(context.Background(), r.client, "reload", d)
				if err != nil {
					t.Error(err)
					return
				}
				asked.Add(1)
				if resp.OverallCode == ok {
					admitted.Add(1)
				}
				if l := resp.Statuses[0].CurrentLimit.GetRequestsPerUnit(); l != 5 && l != 50 {
					t.Errorf("current_limit %d, neither config's", l)
					return
				}
			}
		}()
	}
	defer func() { close(stop); wg.Wait() }()
	// askFor lets the goroutines ask at least n more times.
	askFor := func(n int64) {
		t.Helper()
		target := asked.Load() + n
		deadline := time.Now().Add(10 * time.Second)
		for asked.Load() < target && !t.Failed() {
			if time.Now().After(deadline) {
				t.Fatalf("only %d requests answered in 10 s", asked.Load())
			}
			time.Sleep(time.Millisecond)
		}
	}

	askFor(100)
	if got := admitted.Load(); got != 5 {
		t.Fatalf("under 5 per minute: %d admitted", got)
	}
	r.svc.SetConfig(fifty)
	askFor(200)
	if got := admitted.Load(); got != 50 {
		t.Fatalf("after the swap to 50 per minute: %d admitted in all, want 50", got)
	}
	r.svc.SetConfig(five)
	askFor(100)
	if got := admitted.Load(); got != 50 {
		t.Fatalf("after the swap back to 5 per minute: %d admitted in all, want still 50", got)
	}
	if resp := ask(t, r.client, "reload", 0, withHits(d, 0)); resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 5 || resp.OverallCode != over {
		t.Fatalf("after the swap back: %v, want the 5-per-minute rule, over its limit", resp)
	}
	for i := range 50 { // swapping as fast as it can: never more than the larger limit
		if i%2 == 0 {
			r.svc.SetConfig(fifty)
		} else {
			r.svc.SetConfig(five)
		}
		time.Sleep(time.Millisecond)
	}
	askFor(50)
	if got := admitted.Load(); got != 50 {
		t.Fatalf("after swapping back and forth: %d admitted in all, want still 50", got)
	}
	// Under 50 again, a fresh descriptor gets its 50.
	r.svc.SetConfig(fifty)
	fresh := descriptor("user", "u2")
	for i := range 50 {
		wantCode(t, fmt.Sprintf("fresh descriptor, request %d", i+1), ask(t, r.client, "reload", 0, fresh), ok, ok)
	}
	wantCode(t, "fresh descriptor, request 51", ask(t, r.client, "reload", 0, fresh), over, over)
}

const sharedRules = `
domain: gateway
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: path
        value: /api/*
        rate_limit: {unit: hour, requests_per_unit: 2}
      - key: path
        value: /free
  - key: internal
    rate_limit: {unlimited: true}
  - key: user
    rate_limit: {unit: day, requests_per_unit: 2, name: per_user}
  - key: plan
    value: premium
    rate_limit:
      unit: minute
      requests_per_unit: 4
      replaces:
        - name: per_user
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tenant
    detailed_metric: true
    rate_limit: {unit: week, requests_per_unit: 2}
`

// sharedRulesProto is sharedRules as Envoy Gateway sends it over xDS.
func sharedRulesProto() []*rlsconfv3.RateLimitConfig {
	policy := func(unit rlsconfv3.RateLimitUnit, n uint32) *rlsconfv3.RateLimitPolicy {
		return &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: n}
	}
	return []*rlsconfv3.RateLimitConfig{{
		Name:   "gateway-config",
		Domain: "gateway",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "remote_address", RateLimit: policy(rlsconfv3.RateLimitUnit_MINUTE, 3), Descriptors: []*rlsconfv3.RateLimitDescriptor{
				{Key: "path", Value: "/login", RateLimit: policy(rlsconfv3.RateLimitUnit_SECOND, 1)},
				{Key: "path", Value: "/api/*", RateLimit: policy(rlsconfv3.RateLimitUnit_HOUR, 2)},
				{Key: "path", Value: "/free"},
			}},
			{Key: "internal", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true}},
			{Key: "user", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: 2, Name: "per_user"}},
			{Key: "plan", Value: "premium", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 4,
				Replaces: []*rlsconfv3.RateLimitReplace{{Name: "per_user"}}}},
			{Key: "trial", ShadowMode: true, RateLimit: policy(rlsconfv3.RateLimitUnit_MINUTE, 1)},
			{Key: "tenant", DetailedMetric: true, RateLimit: policy(rlsconfv3.RateLimitUnit_WEEK, 2)},
		},
	}}
}

// The same rules, read from YAML and built from xDS RateLimitConfig resources
// (config.FromProto), load as the same rules and decide every request alike: two services,
// one on each, on one clock, give equal responses to the same sequence.
func TestProtoConfigDecidesAsYAML(t *testing.T) {
	fromYAML := mustConfig(t, sharedRules)
	fromProto, err := config.FromProto(sharedRulesProto())
	if err != nil {
		t.Fatalf("FromProto: %v", err)
	}
	if a, b := fromYAML.String(), fromProto.String(); a != b {
		t.Fatalf("the rules differ:\nYAML:\n%s\nxDS:\n%s", a, b)
	}
	clock := enginetest.NewClock(enginetest.T0)
	services := make([]running, 2)
	for i, c := range []*config.Config{fromYAML, fromProto} {
		services[i] = start(t, enginetest.New(t, server.Client(t), engine.WithClock(clock.Now)), "")
		services[i].svc.SetConfig(c)
	}
	requests := [][]*rlv3.RateLimitDescriptor{
		{descriptor("remote_address", "10.0.0.1", "path", "/login")},
		{descriptor("remote_address", "10.0.0.1", "path", "/api/users")},
		{descriptor("remote_address", "10.0.0.1", "path", "/free")},
		{descriptor("remote_address", "10.0.0.1")},
		{descriptor("internal", "x")},
		{descriptor("user", "u1"), descriptor("plan", "premium")},
		{descriptor("user", "u1")},
		{descriptor("trial", "t1"), descriptor("user", "u2")},
		{descriptor("tenant", "acme")},
		{descriptor("nothing", "here")},
	}
	counts := map[pb.RateLimitResponse_Code]int{}
	for round := range 6 {
		clock.Set(enginetest.T0.Add(time.Duration(round) * 700 * time.Millisecond))
		for i, ds := range requests {
			var resps [2]*pb.RateLimitResponse
			for j, s := range services {
				resps[j] = ask(t, s.client, "gateway", 0, ds...)
			}
			if !proto.Equal(resps[0], resps[1]) {
				t.Fatalf("round %d, request %d: YAML's service answers\n%v\nxDS's\n%v", round, i, resps[0], resps[1])
			}
			for _, st := range resps[0].Statuses {
				counts[st.Code]++
			}
		}
	}
	if counts[ok] == 0 || counts[over] == 0 {
		t.Fatalf("descriptor codes %v: want both OK and OVER_LIMIT for the comparison to mean something", counts)
	}
}
