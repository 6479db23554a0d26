package main

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/rls/internal/testxds"
)

// spend is a request of domain with one descriptor of the given key and value pairs and its
// own hits_addend: 0 is Envoy's check before a request, more a report of what its response
// used (apply_on_stream_done).
func spend(domain string, hits uint64, kv ...string) *pb.RateLimitRequest {
	req := request(domain, kv...)
	req.Descriptors[0].HitsAddend = wrapperspb.UInt64(hits)
	return req
}

// twoPhase runs Envoy's two phases on kv of domain against a budget of 1,000 an hour: a check,
// a report of 5,000, another check. It returns the three overall codes, joined.
func twoPhase(t *testing.T, p *process, domain string, kv ...string) string {
	t.Helper()
	c := dial(t, p.grpc)
	var got []string
	for _, hits := range []uint64{0, 5000, 0} {
		got = append(got, decide(t, c, spend(domain, hits, kv...)).String())
	}
	return fmt.Sprint(got)
}

// The outcomes of twoPhase: with the report recorded, the check after it is over the budget;
// refused, the check after it is OK.
var (
	recordedReport = fmt.Sprint([]string{"OK", "OVER_LIMIT", "OVER_LIMIT"})
	refusedReport  = fmt.Sprint([]string{"OK", "OVER_LIMIT", "OK"})
)

// TestRecordOverLimitFromFile: a file's record_over_limit: true, and a rule named by
// STRICTRATE_RECORD_OVER_LIMIT (an exact stats name), record a report of 5,000 tokens over a
// budget of 1,000 an hour, and the next check is OVER_LIMIT; a rule of neither refuses the
// report, and its next check is OK. /rlconfig shows the file's key, and the Prometheus
// metrics count the recorded report's tokens as over the limit.
func TestRecordOverLimitFromFile(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "ratelimit", "config", "ai.yaml"), `domain: ai
descriptors:
  - key: tokens
    record_over_limit: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: named
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 1000}
`)
	e := fileEnv(t, root)
	e["STRICTRATE_RECORD_OVER_LIMIT"] = "ai.named"
	p := start(t, e)
	p.waitConfig("ai.tokens: unit=HOUR requests_per_unit=1000, shadow_mode: false, quota_mode: false, record_over_limit: true")
	for _, tc := range []struct{ key, want string }{
		{"tokens", recordedReport}, {"named", recordedReport}, {"plain", refusedReport},
	} {
		if got := twoPhase(t, p, "ai", tc.key, "alice"); got != tc.want {
			t.Errorf("%s: check, report of 5,000, check: %s, want %s", tc.key, got, tc.want)
		}
	}
	labels := []string{`domain="ai"`, `key1="tokens"`}
	if got := p.metric("/metrics", "ratelimit_service_rate_limit_over_limit", labels...); got != 5000 {
		t.Errorf("over_limit of ai.tokens: %v, want 5000", got)
	}
}

// TestRecordOverLimitOverXDS: a configuration from an xDS server, as Envoy Gateway serves one,
// cannot say record_over_limit; STRICTRATE_RECORD_OVER_LIMIT names its rules by a prefix of
// their stats names. The route it names records the report over the budget; the other
// refuses it.
func TestRecordOverLimitOverXDS(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	cp := testxds.Start(t, "127.0.0.1:0", nil)
	domain := fmt.Sprintf("default/eg/http-%d", time.Now().UnixNano())
	const llm, web = "httproute/default/llm/rule/0/match/0/llm_example_com", "httproute/default/web/rule/0/match/0/www_example_com"
	route := func(name string) *rlsconfv3.RateLimitDescriptor {
		return &rlsconfv3.RateLimitDescriptor{Key: name, Value: name, Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key:       "x-user-id",
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_HOUR, RequestsPerUnit: 1000},
		}}}
	}
	cp.Set(gatewayNode, "1", &rlsconfv3.RateLimitConfig{Name: domain, Domain: domain,
		Descriptors: []*rlsconfv3.RateLimitDescriptor{route(llm), route(web)}})

	e := baseEnv(t)
	e["CONFIG_TYPE"] = "GRPC_XDS_SOTW"
	e["CONFIG_GRPC_XDS_SERVER_URL"] = cp.Addr
	e["CONFIG_GRPC_XDS_NODE_ID"] = gatewayNode
	e["STRICTRATE_RECORD_OVER_LIMIT"] = domain + ".httproute/default/llm/*"
	p := start(t, e)
	p.waitConfig(domain + "." + web + "_" + web + ".x-user-id: unit=HOUR requests_per_unit=1000")
	for _, tc := range []struct{ route, want string }{{llm, recordedReport}, {web, refusedReport}} {
		if got := twoPhase(t, p, domain, tc.route, tc.route, "x-user-id", "alice"); got != tc.want {
			t.Errorf("%s: check, report of 5,000, check: %s, want %s", tc.route, got, tc.want)
		}
	}
}
