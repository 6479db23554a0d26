package main

import (
	"fmt"
	"path/filepath"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// itemsConfig limits each item to 1 a minute and each user to 10.
const itemsConfig = `domain: edge
descriptors:
  - key: item
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`

// items is a request of n descriptors, each of an item of its own named after prefix.
func items(prefix string, n int) *pb.RateLimitRequest {
	req := &pb.RateLimitRequest{Domain: "edge"}
	for i := range n {
		req.Descriptors = append(req.Descriptors, request("edge", "item", fmt.Sprintf("%s-%d", prefix, i)).Descriptors[0])
	}
	return req
}

// withLimit is d with a limit override (descriptor.limit, from Envoy's route).
func withLimit(d *rlv3.RateLimitDescriptor, n uint32, unit typev3.RateLimitUnit) *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: d.Entries, Limit: &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: unit}}
}

// TestWhatEnvoySees: requests a client can shape get a decision, never an error that Envoy's
// default (failure_mode_deny: false) would let through, and admit nothing over a limit: a
// request of 65 or 200 limited descriptors with one used up, one whose override has a unit
// the service does not know beside a used-up descriptor, and a rule's descriptor sent with
// and without an override of its unit, in either order.
func TestWhatEnvoySees(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "ratelimit", "config", "edge.yaml"), itemsConfig)
	p := start(t, fileEnv(t, root))
	c := dial(t, p.grpc)

	t.Run("many descriptors", func(t *testing.T) {
		for _, n := range []int{65, 200} {
			req := items(fmt.Sprint("many-", n), n)
			used := &pb.RateLimitRequest{Domain: "edge", Descriptors: req.Descriptors[n-1:]}
			if got := decide(t, c, used); got != pb.RateLimitResponse_OK {
				t.Fatalf("using up the last item: %s", got)
			}
			if got := decide(t, c, req); got != pb.RateLimitResponse_OVER_LIMIT {
				t.Fatalf("%d descriptors, the last used up: %s, want OVER_LIMIT", n, got)
			}
			// Nothing was counted: the others still have their one.
			others := &pb.RateLimitRequest{Domain: "edge", Descriptors: req.Descriptors[:n-1]}
			if got := decisions(t, c, others, 2); got != want(1, 1) {
				t.Fatalf("the %d others after the denial: %s, want %s", n-1, got, want(1, 1))
			}
		}
	})

	t.Run("an override of unknown unit", func(t *testing.T) {
		used := request("edge", "item", "unknown-unit").Descriptors[0]
		if got := decide(t, c, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{used}}); got != pb.RateLimitResponse_OK {
			t.Fatalf("using up an item: %s", got)
		}
		odd := withLimit(request("edge", "user", "unknown-unit").Descriptors[0], 1000, typev3.RateLimitUnit_UNKNOWN)
		if got := decide(t, c, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{odd, used}}); got != pb.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("an override of unit UNKNOWN beside a used-up descriptor: %s, want OVER_LIMIT", got)
		}
	})

	t.Run("an override beside its rule", func(t *testing.T) {
		for _, overrideFirst := range []bool{true, false} {
			user := request("edge", "user", fmt.Sprint("override-first-", overrideFirst)).Descriptors[0]
			loose := withLimit(user, 1000, typev3.RateLimitUnit_MINUTE)
			pair := &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{user, loose}}
			if overrideFirst {
				pair.Descriptors = []*rlv3.RateLimitDescriptor{loose, user}
			}
			plain := &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{user}}
			if got := decisions(t, c, plain, 10); got != want(10, 0) {
				t.Fatalf("10 plain requests against 10 a minute: %s", got)
			}
			if got := decisions(t, c, pair, 10); got != want(0, 10) {
				t.Fatalf("then 10 with a 1,000-per-minute override beside the rule (override first %v): %s, want %s", overrideFirst, got, want(0, 10))
			}
		}
	})
}
