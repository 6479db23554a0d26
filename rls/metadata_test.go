package rls_test

import (
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/rls"
	"github.com/strictrate/strictrate/rls/config"
)

// wantMetadata fails t unless resp's dynamic_metadata is want (as structpb.NewStruct reads
// it: numbers may be ints).
func wantMetadata(t testing.TB, what string, resp *pb.RateLimitResponse, want map[string]any) {
	t.Helper()
	w, err := structpb.NewStruct(want)
	if err != nil {
		t.Fatalf("%s: the wanted metadata: %v", what, err)
	}
	if !proto.Equal(resp.GetDynamicMetadata(), w) {
		t.Errorf("%s: dynamic_metadata\n  %s\nwant\n  %s", what, protojson.Format(resp.GetDynamicMetadata()), protojson.Format(w))
	}
}

const metadataConfig = `
domain: meta
descriptors:
  - key: svc1
    rate_limit: {unit: minute, requests_per_unit: 10}
    metadata: {name: service_1, route: {zone: a}}
  - key: svc2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {name: service_2, other: x, route: {zone: b, tier: gold}}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {shadowed: true}
  - key: hard
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {hard: 1}
  - key: free
    rate_limit: {unlimited: true}
    metadata: {free: true}
`

// Without WithDynamicMetadata (RESPONSE_DYNAMIC_METADATA=false, the default), no response
// carries dynamic metadata, whatever its rules' metadata and quota mode say.
func TestDynamicMetadataOff(t *testing.T) {
	e, _ := enginetest.Clocked(t, server.Client(t))
	r := start(t, e, metadataConfig)
	for i := range 2 { // within, then over, the quota rule's limit
		resp := ask(t, r.client, "meta", 0, descriptor("svc1", "a"), descriptor("svc2", "a"))
		wantCode(t, "a request", resp, ok, ok, ok)
		if resp.DynamicMetadata != nil {
			t.Fatalf("request %d: dynamic_metadata %v, want none", i+1, resp.DynamicMetadata)
		}
	}
}

// With WithDynamicMetadata, every response carries the reference's shape: the request's
// domain, descriptors and hits_addend; the descriptors over their limit in quota mode
// (quotaModeViolations) and whether a limited descriptor's rule has quota_mode
// (quotaModeEnabled), as the pinned reference writes them; and the metadata of the rules of
// the descriptors that passed, merged in the request's order (the first value of a key wins,
// maps are merged), as its later versions write it. The rules' own metadata is never changed
// by a merge.
func TestDynamicMetadata(t *testing.T) {
	e, _ := enginetest.Clocked(t, server.Client(t))
	r := start(t, e, metadataConfig, rls.WithDynamicMetadata(true))
	entries := func(kv ...string) map[string]any {
		es := make([]any, len(kv))
		for i, s := range kv {
			es[i] = s
		}
		return map[string]any{"entries": es}
	}

	// Both pass: both rules' metadata, svc1's first.
	resp := ask(t, r.client, "meta", 0, descriptor("svc1", "a"), descriptor("svc2", "a"))
	wantCode(t, "both pass", resp, ok, ok, ok)
	wantMetadata(t, "both pass", resp, map[string]any{
		"domain":           "meta",
		"descriptors":      []any{entries("svc1=a"), entries("svc2=a")},
		"quotaModeEnabled": true,
		"metadata":         map[string]any{"name": "service_1", "other": "x", "route": map[string]any{"zone": "a", "tier": "gold"}},
	})

	// svc2 over its limit in quota mode: answered OK, named in quotaModeViolations, and its
	// metadata left out. svc1's route is its own still: the merge above copied svc2's tier.
	resp = ask(t, r.client, "meta", 0, descriptor("svc1", "a"), descriptor("svc2", "a"))
	wantCode(t, "the quota exceeded", resp, ok, ok, ok)
	wantMetadata(t, "the quota exceeded", resp, map[string]any{
		"domain":              "meta",
		"descriptors":         []any{entries("svc1=a"), entries("svc2=a")},
		"quotaModeViolations": []any{1},
		"quotaModeEnabled":    true,
		"metadata":            map[string]any{"name": "service_1", "route": map[string]any{"zone": "a"}},
	})

	// The shadow and hard rules within their limits: both pass.
	resp = ask(t, r.client, "meta", 0, descriptor("shadow", "a"), descriptor("hard", "a"))
	wantCode(t, "shadow and hard within", resp, ok, ok, ok)
	wantMetadata(t, "shadow and hard within", resp, map[string]any{
		"domain":           "meta",
		"descriptors":      []any{entries("shadow=a"), entries("hard=a")},
		"quotaModeEnabled": false,
		"metadata":         map[string]any{"shadowed": true, "hard": 1},
	})

	// Over both: the shadow rule answers OK and passes (as the reference's cache answers a
	// shadow rule), the hard one denies and does not; an unlimited rule, a descriptor no rule
	// matches and an override pass, but have no rule metadata. The descriptors carry their own
	// limit (as its proto text) and hits_addend, the request its hits_addend.
	override := &rlv3.RateLimitDescriptor{
		Entries:    descriptor("svc1", "o").Entries,
		Limit:      &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(2)},
		HitsAddend: wrapperspb.UInt64(0),
	}
	resp = ask(t, r.client, "meta", 1, descriptor("shadow", "a"), descriptor("hard", "a"), descriptor("free", "a"), descriptor("nothing", "a"), override)
	wantCode(t, "shadow and hard over", resp, over, ok, over, ok, ok, ok)
	over := entries("svc1=o")
	over["limit"] = override.Limit.String()
	over["hitsAddend"] = 0
	wantMetadata(t, "shadow and hard over", resp, map[string]any{
		"domain":           "meta",
		"descriptors":      []any{entries("shadow=a"), entries("hard=a"), entries("free=a"), entries("nothing=a"), over},
		"hitsAddend":       1,
		"quotaModeEnabled": false,
		"metadata":         map[string]any{"shadowed": true},
	})

	// The rules' metadata is as loaded.
	for key, want := range map[string]map[string]any{
		"svc1": {"name": "service_1", "route": map[string]any{"zone": "a"}},
		"svc2": {"name": "service_2", "other": "x", "route": map[string]any{"zone": "b", "tier": "gold"}},
	} {
		got := r.svc.Config().Match("meta", []config.Entry{{Key: key, Value: "a"}}).Limit.Metadata
		w, _ := structpb.NewStruct(want)
		if !proto.Equal(got, w) {
			t.Errorf("%s's metadata after the requests: %v, want %v", key, got, w)
		}
	}
}

// Under WithQuotaMode, every descriptor over its limit is a quota violation, and
// quotaModeEnabled still says only whether a rule has quota_mode of its own, as the
// reference reads it (its TestServiceQuotaModeWithMetadata and TestRatelimitToMetadata).
func TestDynamicMetadataGlobalQuotaMode(t *testing.T) {
	e, _ := enginetest.Clocked(t, server.Client(t))
	r := start(t, e, metadataConfig, rls.WithDynamicMetadata(true), rls.WithQuotaMode(true))
	ask(t, r.client, "meta", 0, descriptor("hard", "q"))
	resp := ask(t, r.client, "meta", 0, descriptor("svc1", "q"), descriptor("hard", "q"))
	wantCode(t, "hard over, in quota mode", resp, ok, ok, ok)
	wantMetadata(t, "hard over, in quota mode", resp, map[string]any{
		"domain":              "meta",
		"descriptors":         []any{map[string]any{"entries": []any{"svc1=q"}}, map[string]any{"entries": []any{"hard=q"}}},
		"quotaModeViolations": []any{1},
		"quotaModeEnabled":    false,
		"metadata":            map[string]any{"name": "service_1", "route": map[string]any{"zone": "a"}},
	})
}
