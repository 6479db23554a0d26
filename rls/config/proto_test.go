package config_test

import (
	"errors"
	"testing"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/strictrate/strictrate/rls/config"
)

const parityYAML = `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 10, name: per_ip}
  - key: remote_address
    value: 10.0.0.1
  - key: path
    value: /api/*
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: tenant
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit:
          unit: hour
          requests_per_unit: 1000
          name: per_user
          replaces: [{name: per_ip}]
  - key: free
    rate_limit: {unlimited: true}
`

func parityProto() *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{
		Name:   "edge-resource",
		Domain: "edge",
		Descriptors: []*rlsconfv3.RateLimitDescriptor{
			{Key: "remote_address", RateLimit: &rlsconfv3.RateLimitPolicy{
				Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 10, Name: "per_ip"}},
			{Key: "remote_address", Value: "10.0.0.1"},
			{Key: "path", Value: "/api/*", ShadowMode: true, RateLimit: &rlsconfv3.RateLimitPolicy{
				Unit: rlsconfv3.RateLimitUnit_SECOND, RequestsPerUnit: 100}},
			{Key: "tenant", Descriptors: []*rlsconfv3.RateLimitDescriptor{
				{Key: "user", DetailedMetric: true, RateLimit: &rlsconfv3.RateLimitPolicy{
					Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 1000, Name: "per_user",
					Replaces: []*rlsconfv3.RateLimitReplace{{Name: "per_ip"}}}},
			}},
			{Key: "free", RateLimit: &rlsconfv3.RateLimitPolicy{Unlimited: true}},
		},
	}
}

func TestFromProtoParity(t *testing.T) {
	fromYAML := parse(t, yamlFile("edge.yaml", parityYAML))
	fromProto, err := config.FromProto([]*rlsconfv3.RateLimitConfig{parityProto()})
	if err != nil {
		t.Fatal(err)
	}
	if fromYAML.String() != fromProto.String() {
		t.Errorf("String differs:\nyaml:\n%s\nproto:\n%s", fromYAML, fromProto)
	}
	for _, req := range [][]config.Entry{
		e("remote_address", "1.2.3.4"), e("remote_address", "10.0.0.1"), e("path", "/api/x"),
		e("path", "/other"), e("tenant", "t", "user", "u"), e("tenant", "t"), e("free", "x"),
	} {
		a, b := fromYAML.Match("edge", req), fromProto.Match("edge", req)
		if (a.Limit == nil) != (b.Limit == nil) || a.StatKey != b.StatKey {
			t.Errorf("%v: yaml %+v, proto %+v", req, a, b)
			continue
		}
		if a.Limit != nil {
			la, lb := *a.Limit, *b.Limit
			if la.FullKey != lb.FullKey || la.RequestsPerUnit != lb.RequestsPerUnit || la.Unit != lb.Unit ||
				la.Unlimited != lb.Unlimited || la.Name != lb.Name || la.ShadowMode != lb.ShadowMode ||
				la.DetailedMetric != lb.DetailedMetric || len(la.Replaces) != len(lb.Replaces) {
				t.Errorf("%v: yaml %+v, proto %+v", req, la, lb)
			}
		}
	}
}

func TestFromProtoUnits(t *testing.T) {
	for n, want := range map[int32]config.Unit{1: config.Second, 2: config.Minute, 3: config.Hour, 4: config.Day,
		5: config.Month, 6: config.Year, 7: config.Week} {
		c, err := config.FromProto([]*rlsconfv3.RateLimitConfig{{Name: "r", Domain: "d",
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k", RateLimit: &rlsconfv3.RateLimitPolicy{
				Unit: rlsconfv3.RateLimitUnit(n), RequestsPerUnit: 1}}}}})
		if err != nil {
			t.Errorf("unit %d: %v", n, err)
			continue
		}
		if m := c.Match("d", e("k", "v")); m.Limit == nil || m.Limit.Unit != want {
			t.Errorf("unit %d: %+v", n, m.Limit)
		}
	}
}

func TestFromProtoRejects(t *testing.T) {
	rule := func(p *rlsconfv3.RateLimitPolicy) []*rlsconfv3.RateLimitDescriptor {
		return []*rlsconfv3.RateLimitDescriptor{{Key: "k", RateLimit: p}}
	}
	cases := []struct {
		name   string
		cfgs   []*rlsconfv3.RateLimitConfig
		merge  bool
		file   string
		reason string
	}{
		{name: "no domain", cfgs: []*rlsconfv3.RateLimitConfig{{Name: "r1"}},
			file: "r1", reason: "config file cannot have empty domain"},
		{name: "duplicate domain", cfgs: []*rlsconfv3.RateLimitConfig{{Name: "r1", Domain: "d"}, {Name: "r2", Domain: "d"}},
			file: "r2", reason: "duplicate domain 'd' in config file"},
		{name: "unknown unit", cfgs: []*rlsconfv3.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: rule(&rlsconfv3.RateLimitPolicy{RequestsPerUnit: 1})}},
			file: "r", reason: "invalid rate limit unit 'UNKNOWN'"},
		{name: "unit out of the enum", cfgs: []*rlsconfv3.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: rule(&rlsconfv3.RateLimitPolicy{Unit: 8})}},
			file: "r", reason: "invalid rate limit unit '8'"},
		{name: "unlimited with unit", cfgs: []*rlsconfv3.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: rule(&rlsconfv3.RateLimitPolicy{Unlimited: true, Unit: rlsconfv3.RateLimitUnit_DAY})}},
			file: "r", reason: "should not specify rate limit unit when unlimited"},
		{name: "replaces itself", cfgs: []*rlsconfv3.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: rule(&rlsconfv3.RateLimitPolicy{
			Unit: rlsconfv3.RateLimitUnit_DAY, Name: "n", Replaces: []*rlsconfv3.RateLimitReplace{{Name: "n"}}})}},
			file: "r", reason: "replaces should not contain name of same descriptor"},
		{name: "replaces without a name", cfgs: []*rlsconfv3.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: rule(&rlsconfv3.RateLimitPolicy{
			Unit: rlsconfv3.RateLimitUnit_DAY, Replaces: []*rlsconfv3.RateLimitReplace{{}}})}},
			file: "r", reason: "should not have an empty replaces entry"},
		{name: "requests_per_unit over the engine's largest limit", cfgs: []*rlsconfv3.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: rule(&rlsconfv3.RateLimitPolicy{
			Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: config.MaxRequestsPerUnit + 1})}},
			file: "r", reason: "requests_per_unit 2147483648 of 'd.k' is more than 2147483647, the most a rule can limit exactly; lower it, or use unlimited: true for no limit"},
		{name: "empty key", cfgs: []*rlsconfv3.RateLimitConfig{{Name: "r", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Value: "v"}}}},
			file: "r", reason: "descriptor has empty key"},
		{name: "duplicate key when merged", merge: true, cfgs: []*rlsconfv3.RateLimitConfig{
			{Name: "r1", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k"}}},
			{Name: "r2", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "k"}}}},
			file: "r2", reason: "duplicate descriptor composite key 'd.k'"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.FromProto(tc.cfgs, config.WithMergeDomains(tc.merge))
			var ce *config.Error
			if !errors.Is(err, config.ErrInvalid) || !errors.As(err, &ce) {
				t.Fatalf("err = %v", err)
			}
			if ce.File != tc.file || ce.Reason != tc.reason || ce.Line != 0 {
				t.Errorf("err = %+v, want file %q reason %q", *ce, tc.file, tc.reason)
			}
		})
	}
	// Merged, two resources make one domain.
	c, err := config.FromProto([]*rlsconfv3.RateLimitConfig{
		{Name: "r1", Domain: "d", Descriptors: rule(&rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: 1})},
		{Name: "r2", Domain: "d", Descriptors: []*rlsconfv3.RateLimitDescriptor{{Key: "other", RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_DAY, RequestsPerUnit: 2}}}},
	}, config.WithMergeDomains(true))
	if err != nil {
		t.Fatal(err)
	}
	if m := c.Match("d", e("other", "x")); m.Limit == nil || m.Limit.RequestsPerUnit != 2 {
		t.Errorf("merged: %+v", m.Limit)
	}
}
