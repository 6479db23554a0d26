package main

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
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

// seriesOf counts the series of metric name on p's Prometheus endpoint whose labels hold every
// one of labels, and sums their values.
func (p *process) seriesOf(name string, labels ...string) (series int, sum float64) {
	p.t.Helper()
	code, body, err := get("http://" + p.prometheus + "/metrics")
	if err != nil || code != http.StatusOK {
		p.t.Fatalf("GET /metrics: %d %v", code, err)
	}
	for _, line := range strings.Split(body, "\n") {
		metric, rest, ok := strings.Cut(line, "{")
		if !ok || metric != name || !containsAll(rest, labels) {
			continue
		}
		fields := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			p.t.Fatalf("metric line %q: %v", line, err)
		}
		series, sum = series+1, sum+v
	}
	return series, sum
}

// TestSeriesNamedByRequestValuesAreBounded: 20,000 requests, each of a user of its own with a
// limit override (named by its values, as the reference names it), and as many of a
// detailed_metric rule's, add at most 1,000 series each; past that they count under the
// bounded names (the override's domain.limit_override, the rule's stats key without the
// values), so every hit is still counted.
func TestSeriesNamedByRequestValuesAreBounded(t *testing.T) {
	valkeytest.SkipIfShort(t, "sends 40,000 requests to the strictrate-rls command")
	t.Parallel()
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "ratelimit", "config", "edge.yaml"), itemsConfig+`  - key: tenant
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 10}
`)
	p := start(t, fileEnv(t, root))
	c := dial(t, p.grpc)
	const distinct, goroutines = 20_000, 8
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := g; i < distinct && !t.Failed(); i += goroutines {
				user := withLimit(request("edge", "user", fmt.Sprint("u", i)).Descriptors[0], 100, typev3.RateLimitUnit_MINUTE)
				tenant := request("edge", "tenant", fmt.Sprint("t", i)).Descriptors[0]
				for _, d := range []*rlv3.RateLimitDescriptor{user, tenant} {
					if got := decide(t, c, &pb.RateLimitRequest{Domain: "edge", Descriptors: []*rlv3.RateLimitDescriptor{d}}); got != pb.RateLimitResponse_OK {
						t.Errorf("request %d: %s, want OK", i, got)
					}
				}
			}
		})
	}
	wg.Wait()
	users, userHits := p.seriesOf("ratelimit_service_rate_limit_total_hits", `key1="user_u`)
	overflow, overflowHits := p.seriesOf("ratelimit_service_rate_limit_total_hits", `domain="edge"`, `key1="limit_override"`)
	tenants, tenantHits := p.seriesOf("ratelimit_service_rate_limit_total_hits", `key1="tenant_t`)
	bounded, boundedHits := p.seriesOf("ratelimit_service_rate_limit_total_hits", `key1="tenant"`)
	if users+tenants > 1000 || overflow != 1 || bounded != 1 {
		t.Fatalf("after %d distinct overrides and detailed rules' values: %d and %d series by value, %d and %d bounded; want at most 1,000 by value, one bounded each",
			distinct, users, tenants, overflow, bounded)
	}
	if userHits+overflowHits != distinct || tenantHits+boundedHits != distinct {
		t.Fatalf("hits counted: overrides %v + %v, detailed %v + %v; want %d each", userHits, overflowHits, tenantHits, boundedHits, distinct)
	}
}
