package rls_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/rls"
	"github.com/strictrate/strictrate/rls/config"
	"github.com/strictrate/strictrate/rls/internal/compattest"
)

// The reference server's own tests, ported: envoyproxy/ratelimit at the version docs/rls.md
// pins (its newer versions for the newer configuration), each case re-expressed as the
// reference's configuration, requests and answers (compattest.Answer), run against the
// service and a real Valkey, and named after the reference test it comes from. Where the
// reference's test fed its service a mocked cache's statuses, the case brings the counters to
// those statuses with requests of its own first (steps without an answer). An answer that
// differs from the reference's names the item of docs/rls.md's difference list that says why.
//
// The cases ported, by the reference's file, where they run (config: rls/config/compat_test.go;
// service: here; command: rls/cmd/strictrate-rls/compat_test.go, against the built binary,
// and against the reference's with RLS_REFERENCE_BINARY), and how they answer: as the
// reference does, or differently as an item of docs/rls.md's difference list says. A case is
// an answer checked: a step's response, a lookup's rule, a refused file's reason, a metric, a
// health status.
//
//	reference test file                               where     ported  same  documented (items)
//	test/config/config_test.go                         config      117   117
//	                                                   command      14    14
//	test/provider/xds_grpc_sotw_provider_test.go       config        5     5
//	test/service/ratelimit_test.go                     service      23    17     6 (4, 14, 19)
//	                                                   command      40    40
//	src/service/ratelimit_test.go                      service       4     4
//	test/redis/fixed_cache_impl_test.go                service      16    15     1 (2)
//	test/redis/driver_impl_test.go                     command       3     3
//	test/server/server_impl_test.go                    command       5     5
//	test/server/health_test.go                         service       7     7
//	                                                   command       3     3
//	test/integration/integration_test.go               service     193   178    15 (3, 7)
//	                                                   command       8     8
//	issue 32's cases (quota_mode, SHADOW_MODE, /json)  command       9     9
//	total                                                          447   425    22
//
// None answers otherwise.
//
// Not ported: the reference's tests of what this service does not have (statsd and
// DogStatsD sinks, memcached, a per-second Redis, its radix client's pool and pipeline, the
// local cache's freecache statistics, the runner's flags), of its mocks alone (a /json
// service returning nil, an UNKNOWN overall code), and the Redis cluster and sentinel
// integration variants, whose cases are the standalone ones (the service's own cluster tests
// cover a cluster).

// refStep is one request of a ported case: its answer (compattest.Answer), or none for a step
// that brings the counters to where the reference's mocked cache started; diff names the
// difference list's item when the answer (or the counts) differ from the reference's, in
// which case want is this service's answer. counts are what the step adds to its rules'
// counters, by stats key.
type refStep struct {
	ref    string
	req    *pb.RateLimitRequest
	want   string
	diff   int
	counts map[string]ruleCounts
}

// ruleCounts are a rule's per-rule metrics: total_hits, over_limit, near_limit, within_limit
// and over_limit_with_local_cache.
type ruleCounts struct{ total, over, near, within, localCache float64 }

// refRequest is a request of domain with the request's hits_addend (0: none) and descriptors.
func refRequest(domain string, hits uint32, ds ...*rlv3.RateLimitDescriptor) *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: ds}
}

// countsOf reads the counters of the rule whose stats key is statKey from reg.
func countsOf(t testing.TB, reg *prometheus.Registry, statKey string) ruleCounts {
	t.Helper()
	parts := strings.SplitN(statKey, ".", 3)
	for len(parts) < 3 {
		parts = append(parts, "")
	}
	labels := map[string]string{"domain": parts[0], "key1": parts[1], "key2": parts[2]}
	read := func(name string) float64 {
		return metricValue(t, reg, "ratelimit_service_rate_limit_"+name, labels)
	}
	return ruleCounts{read("total_hits"), read("over_limit"), read("near_limit"), read("within_limit"), read("over_limit_with_local_cache")}
}

// runRef sends each step in order, and checks its answer and what it added to its rules'
// counters.
func runRef(t *testing.T, c pb.RateLimitServiceClient, reg *prometheus.Registry, steps []refStep) {
	t.Helper()
	for i, s := range steps {
		before := map[string]ruleCounts{}
		for key := range s.counts {
			before[key] = countsOf(t, reg, key)
		}
		resp, err := c.ShouldRateLimit(context.Background(), s.req)
		if err != nil {
			t.Fatalf("step %d (%s): %v", i+1, s.ref, err)
		}
		note := ""
		if s.diff != 0 {
			note = fmt.Sprintf(" (the reference's differs: docs/rls.md's difference %d)", s.diff)
		}
		if got := compattest.Answer(resp); s.want != "" && got != s.want {
			t.Errorf("step %d (%s): %s\n  want %s%s", i+1, s.ref, got, s.want, note)
		}
		for key, want := range s.counts {
			after, b := countsOf(t, reg, key), before[key]
			got := ruleCounts{after.total - b.total, after.over - b.over, after.near - b.near, after.within - b.within, after.localCache - b.localCache}
			if got != want {
				t.Errorf("step %d (%s): %s counted %+v, want %+v%s", i+1, s.ref, key, got, want, note)
			}
		}
	}
}

// refService is a service on a clocked engine (decisions on a clock the case moves, so that a
// per-second window does not slide under a slow test) with metrics, and cfg's files.
type refService struct {
	running
	reg   *prometheus.Registry
	clock *enginetest.Clock
}

func newRefService(t *testing.T, files []config.File, opts []rls.Option, eopts ...engine.Option) refService {
	t.Helper()
	e, clock := enginetest.Clocked(t, server.Client(t), eopts...)
	reg := prometheus.NewRegistry()
	r := start(t, e, "", append([]rls.Option{rls.WithMetrics(reg)}, opts...)...)
	if files != nil {
		c, err := config.Parse(files)
		if err != nil {
			t.Fatalf("config: %v", err)
		}
		r.svc.SetConfig(c)
	}
	return refService{running: r, reg: reg, clock: clock}
}

func yamlFiles(yaml ...string) []config.File {
	files := make([]config.File, len(yaml))
	for i, y := range yaml {
		files[i] = config.File{Name: fmt.Sprintf("file%d.yaml", i), Data: []byte(y)}
	}
	return files
}

// serviceConfig holds test/service/ratelimit_test.go's descriptors, with the rules its mocked
// configuration returned for them.
const serviceConfig = `domain: different-domain
descriptors:
  - {key: foo, value: bar, rate_limit: {unit: minute, requests_per_unit: 10, name: key_name}}
  - {key: hello, value: world}
  - {key: shadow, value: first, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: shadow, value: second, shadow_mode: true, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: plain, value: limit, rate_limit: {unit: minute, requests_per_unit: 10}}
`

// TestReferenceService ports test/service/ratelimit_test.go's decisions; its quota mode
// cases, its health cases and its global quota mode run against the command
// (cmd/strictrate-rls/compat_test.go).
func TestReferenceService(t *testing.T) {
	const dom = "different-domain"
	foo, hello := descriptor("foo", "bar"), descriptor("hello", "world")
	shadow1, shadow2, plain := descriptor("shadow", "first"), descriptor("shadow", "second"), descriptor("plain", "limit")
	useUp := func(ref string, d *rlv3.RateLimitDescriptor) refStep {
		return refStep{ref: ref + ": using it up", req: refRequest(dom, 10, d)}
	}
	t.Run("TestService", func(t *testing.T) {
		r := newRefService(t, yamlFiles(serviceConfig), nil)
		runRef(t, r.client, r.reg, []refStep{
			{ref: "TestService: no rule", req: refRequest(dom, 0, hello), want: "OK: OK rem=0"},
			useUp("TestService", foo),
			{ref: "TestService: one over its limit", req: refRequest(dom, 0, foo, hello), want: "OVER_LIMIT: OVER_LIMIT 10/MINUTE name=key_name rem=0 reset; OK rem=0"},
		})
		// A reload, then a rejected configuration: the last good one stays, whatever the order.
		r.svc.SetConfig(mustConfig(t, serviceConfig))
		r.svc.ConfigError(errors.New("load error"))
		runRef(t, r.client, r.reg, []refStep{
			{ref: "TestService: after a load error", req: refRequest(dom, 0, hello, foo), want: "OVER_LIMIT: OK rem=0; OVER_LIMIT 10/MINUTE name=key_name rem=0 reset"},
		})
		for name, want := range map[string]float64{"config_load_success": 2, "config_load_error": 1, "global_shadow_mode": 0} {
			if got := metricValue(t, r.reg, "ratelimit_service_"+name, nil); got != want {
				t.Errorf("TestService: %s = %v, want %v", name, got, want)
			}
		}
	})
	t.Run("TestServiceGlobalShadowMode", func(t *testing.T) {
		r := newRefService(t, yamlFiles(serviceConfig), []rls.Option{rls.WithShadowMode(true)})
		runRef(t, r.client, r.reg, []refStep{
			useUp("TestServiceGlobalShadowMode", plain),
			{ref: "TestServiceGlobalShadowMode", req: refRequest(dom, 0, plain, hello), want: "OK: OVER_LIMIT 10/MINUTE rem=0 reset; OK rem=0"},
		})
		if got := metricValue(t, r.reg, "ratelimit_service_global_shadow_mode", nil); got != 1 {
			t.Errorf("TestServiceGlobalShadowMode: global_shadow_mode = %v, want 1", got)
		}
	})
	t.Run("TestRuleShadowMode", func(t *testing.T) {
		r := newRefService(t, yamlFiles(serviceConfig), nil)
		runRef(t, r.client, r.reg, []refStep{
			useUp("TestRuleShadowMode", shadow1), useUp("TestRuleShadowMode", shadow2),
			{ref: "TestRuleShadowMode", req: refRequest(dom, 0, shadow1, shadow2), want: "OK: OK 10/MINUTE rem=0 reset; OK 10/MINUTE rem=0 reset"},
		})
		if got := metricValue(t, r.reg, "ratelimit_service_global_shadow_mode", nil); got != 0 {
			t.Errorf("TestRuleShadowMode: global_shadow_mode = %v, want 0", got)
		}
	})
	t.Run("TestMixedRuleShadowMode", func(t *testing.T) {
		r := newRefService(t, yamlFiles(serviceConfig), nil)
		runRef(t, r.client, r.reg, []refStep{
			useUp("TestMixedRuleShadowMode", shadow1), useUp("TestMixedRuleShadowMode", plain),
			{ref: "TestMixedRuleShadowMode", req: refRequest(dom, 0, shadow1, plain), want: "OVER_LIMIT: OK 10/MINUTE rem=0 reset; OVER_LIMIT 10/MINUTE rem=0 reset"},
		})
	})
	t.Run("TestUnlimited", func(t *testing.T) {
		r := newRefService(t, yamlFiles(`domain: some-domain
descriptors:
  - {key: foo, value: bar, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: baz, value: qux, rate_limit: {unlimited: true}}
`), nil)
		runRef(t, r.client, r.reg, []refStep{
			{ref: "TestUnlimited", req: refRequest("some-domain", 0, descriptor("foo", "bar"), hello, descriptor("baz", "qux")),
				want: "OK: OK 10/MINUTE rem=9 reset; OK rem=0; OK rem=4294967295"},
		})
	})
	t.Run("TestServiceQuotaModeWithMetadata", func(t *testing.T) {
		// QUOTA_MODE and RESPONSE_DYNAMIC_METADATA: the exceeded quota descriptor answers OK,
		// and the dynamic metadata names it, in the reference's shape.
		r := newRefService(t, yamlFiles(`domain: quota-domain
descriptors:
  - {key: regular, value: limit, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: quota, value: limit, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 5}}
`), []rls.Option{rls.WithQuotaMode(true), rls.WithDynamicMetadata(true)})
		regular, quota := descriptor("regular", "limit"), descriptor("quota", "limit")
		runRef(t, r.client, r.reg, []refStep{
			{ref: "TestServiceQuotaModeWithMetadata: setting up", req: refRequest("quota-domain", 0, withHits(regular, 4), withHits(quota, 5))},
		})
		const ref = "TestServiceQuotaModeWithMetadata"
		resp := ask(t, r.client, "quota-domain", 0, regular, quota)
		if got, want := compattest.Answer(resp), "OK: OK 10/MINUTE rem=5 reset; OK 5/MINUTE rem=0"; got != want {
			t.Errorf("%s: %s, want %s", ref, got, want)
		}
		wantMetadata(t, ref, resp, map[string]any{
			"domain":              "quota-domain",
			"descriptors":         []any{map[string]any{"entries": []any{"regular=limit"}}, map[string]any{"entries": []any{"quota=limit"}}},
			"quotaModeViolations": []any{1},
			"quotaModeEnabled":    true,
		})
	})
}

// TestReferenceDynamicMetadata ports the reference's cases of RESPONSE_DYNAMIC_METADATA: the
// pinned version's src/service/ratelimit_test.go, TestRatelimitToMetadata (whose mocked rules
// and quota violations are brought about here by rules and requests), and its later
// versions' test/service/ratelimit_test.go (TestMetadataReturnedForPassedDescriptors,
// TestMetadataReturnedForAllPassedDescriptors, TestOverlappingMetadataReturnsTheFirstValue),
// of which the metadata is compared (their statuses are the later quota mode's, difference
// 13).
func TestReferenceDynamicMetadata(t *testing.T) {
	const pinnedConfig = `domain: quota-domain
descriptors:
  - {key: quota_key, value: quota_val, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
`
	const mixedConfig = `domain: mixed-domain
descriptors:
  - {key: regular_key, value: regular_val, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: quota_key, value: quota_val, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: another_quota, value: another_val, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}
`
	const addendConfig = `domain: addend-domain
descriptors:
  - {key: test_key, value: test_val, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 4}}
`
	entries := func(kv string) map[string]any { return map[string]any{"entries": []any{kv}} }
	const ref = "TestRatelimitToMetadata: "
	t.Run("TestRatelimitToMetadata", func(t *testing.T) {
		r := newRefService(t, yamlFiles(pinnedConfig, mixedConfig, addendConfig), []rls.Option{rls.WithDynamicMetadata(true)})
		resp := ask(t, r.client, "fake-domain", 0, descriptor("key1", "val1"))
		wantMetadata(t, ref+"Single descriptor with single entry, no quota violations", resp, map[string]any{
			"descriptors": []any{entries("key1=val1")}, "domain": "fake-domain", "quotaModeEnabled": false,
		})

		ask(t, r.client, "quota-domain", 0, descriptor("quota_key", "quota_val")) // using it up
		resp = ask(t, r.client, "quota-domain", 0, descriptor("quota_key", "quota_val"))
		wantMetadata(t, ref+"Single descriptor with quota mode violation", resp, map[string]any{
			"descriptors": []any{entries("quota_key=quota_val")}, "domain": "quota-domain",
			"quotaModeEnabled": true, "quotaModeViolations": []any{0},
		})

		ask(t, r.client, "mixed-domain", 0, descriptor("quota_key", "quota_val"), descriptor("another_quota", "another_val"))
		resp = ask(t, r.client, "mixed-domain", 0, descriptor("regular_key", "regular_val"), descriptor("quota_key", "quota_val"), descriptor("another_quota", "another_val"))
		wantMetadata(t, ref+"Multiple descriptors with mixed quota violations", resp, map[string]any{
			"descriptors": []any{entries("regular_key=regular_val"), entries("quota_key=quota_val"), entries("another_quota=another_val")},
			"domain":      "mixed-domain", "quotaModeEnabled": true, "quotaModeViolations": []any{1, 2},
		})

		resp = ask(t, r.client, "addend-domain", 5, descriptor("test_key", "test_val"))
		wantMetadata(t, ref+"Request with hits addend", resp, map[string]any{
			"descriptors": []any{entries("test_key=test_val")}, "domain": "addend-domain", "hitsAddend": 5,
			"quotaModeEnabled": true, "quotaModeViolations": []any{0},
		})
	})

	// The later versions' cases: QUOTA_MODE, a regular rule of 10 and a quota rule of 5 a
	// minute, each with metadata.
	later := func(meta1, meta2 string) []config.File {
		return yamlFiles(`domain: quota-domain
descriptors:
  - {key: regular, value: limit, rate_limit: {unit: minute, requests_per_unit: 10}, metadata: ` + meta1 + `}
  - {key: quota, value: limit, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 5}, metadata: ` + meta2 + `}
`)
	}
	opts := []rls.Option{rls.WithQuotaMode(true), rls.WithDynamicMetadata(true)}
	regular, quota := descriptor("regular", "limit"), descriptor("quota", "limit")
	for _, c := range []struct {
		ref          string
		meta1, meta2 string
		quotaUsed    bool // the quota rule is over its limit
		want         map[string]any
	}{
		{"TestMetadataReturnedForPassedDescriptors", "{name: service_1}", "{name: service_2}", true,
			map[string]any{"name": "service_1"}},
		{"TestMetadataReturnedForAllPassedDescriptors", "{name: service_1}", "{some_other_name: service_2}", false,
			map[string]any{"name": "service_1", "some_other_name": "service_2"}},
		{"TestOverlappingMetadataReturnsTheFirstValue", "{name: service_1}", "{name: service_2}", false,
			map[string]any{"name": "service_1"}},
	} {
		t.Run(c.ref, func(t *testing.T) {
			r := newRefService(t, later(c.meta1, c.meta2), opts)
			if c.quotaUsed {
				ask(t, r.client, "quota-domain", 0, withHits(quota, 5))
			}
			resp := ask(t, r.client, "quota-domain", 0, regular, quota)
			want, err := structpb.NewStruct(c.want)
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.GetDynamicMetadata().GetFields()["metadata"].GetStructValue(); !proto.Equal(got, want) {
				t.Errorf("%s: metadata %v, want %v", c.ref, got, want)
			}
		})
	}
}

// TestReferenceServiceErrors: a request without a domain or descriptors, one before any
// configuration, and one Valkey cannot answer fail with the reference's messages, counted as
// it counts them (test/service/ratelimit_test.go, TestEmptyDomain, TestEmptyDescriptors,
// TestInitialLoadError, TestCacheError); their gRPC codes say what failed, where the
// reference's are all UNKNOWN (difference 19).
func TestReferenceServiceErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := start(t, enginetest.New(t, server.Client(t)), "", rls.WithMetrics(reg))
	own := valkeytest.New(t, valkeytest.OwnServer())
	down := start(t, enginetest.New(t, own.Client(t)), serviceConfig, rls.WithMetrics(prometheus.NewRegistry()),
		rls.WithRequestTimeout(200*time.Millisecond))
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ref     string
		client  pb.RateLimitServiceClient
		req     *pb.RateLimitRequest
		code    codes.Code
		message string // "" when it is Valkey's own
	}{
		{"TestInitialLoadError", r.client, refRequest("test-domain", 0, descriptor("hello", "world")), codes.FailedPrecondition, "no rate limit configuration loaded"},
		{"TestEmptyDomain", r.client, refRequest("", 0, descriptor("hello", "world")), codes.InvalidArgument, "rate limit domain must not be empty"},
		{"TestEmptyDescriptors", r.client, refRequest("test-domain", 0), codes.InvalidArgument, "rate limit descriptor list must not be empty"},
		{"TestCacheError", down.client, refRequest("different-domain", 0, descriptor("foo", "bar")), codes.Unavailable, ""},
	} {
		resp, err := c.client.ShouldRateLimit(context.Background(), c.req)
		st := status.Convert(err)
		if err == nil || st.Code() != c.code || c.message != "" && st.Message() != c.message {
			t.Errorf("%s: %v, %v; want %s %q (the reference: UNKNOWN, difference 19)", c.ref, resp, err, c.code, c.message)
		}
	}
	if got := metricValue(t, reg, "ratelimit_service_should_rate_limit_error", map[string]string{"err_type": "service_error"}); got != 3 {
		t.Errorf("should_rate_limit_error{service_error} = %v, want 3", got)
	}
}

// TestReferenceHeaders: with LIMIT_RESPONSE_HEADERS_ENABLED, the reference adds its three
// headers for the descriptor closest to its limit (test/service/ratelimit_test.go,
// TestServiceWithCustomRatelimitHeaders, TestServiceWithDefaultRatelimitHeaders). Here they
// are the IETF fields unless STRICTRATE_LEGACY_HEADERS (difference 14), and the reset is the
// time until the oldest hit leaves the window, not to the clock's minute (difference 4).
func TestReferenceHeaders(t *testing.T) {
	const dom = "different-domain"
	for _, c := range []struct {
		ref  string
		opts []rls.Option
		want string
	}{
		{"TestServiceWithCustomRatelimitHeaders", []rls.Option{rls.WithResponseHeaders(rls.HeadersLegacy),
			rls.WithLegacyHeaderNames("A-Ratelimit-Limit", "A-Ratelimit-Remaining", "A-Ratelimit-Reset")},
			"A-Ratelimit-Limit: 10, A-Ratelimit-Remaining: 0, A-Ratelimit-Reset: 60"},
		{"TestServiceWithDefaultRatelimitHeaders", []rls.Option{rls.WithResponseHeaders(rls.HeadersFields)},
			`RateLimit-Policy: "1m";q=10;w=60, RateLimit: "1m";r=0;t=60`},
	} {
		r := newRefService(t, yamlFiles(serviceConfig), c.opts)
		runRef(t, r.client, r.reg, []refStep{{ref: c.ref + ": using it up", req: refRequest(dom, 10, descriptor("plain", "limit"))}})
		resp := ask(t, r.client, dom, 0, descriptor("plain", "limit"), descriptor("hello", "world"))
		var got []string
		for _, h := range resp.ResponseHeadersToAdd {
			got = append(got, h.Key+": "+h.Value)
		}
		if strings.Join(got, ", ") != c.want {
			t.Errorf("%s: %q, want %q (the reference: its trio, with the seconds to the minute's end)", c.ref, got, c.want)
		}
	}
}

// TestReferenceTracer: a decision is one span, named as the reference names it
// (test/service/ratelimit_test.go, TestServiceTracer).
func TestReferenceTracer(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer tp.Shutdown(context.Background())
	r := newRefService(t, yamlFiles(serviceConfig), []rls.Option{rls.WithTracerProvider(tp)})
	runRef(t, r.client, r.reg, []refStep{{ref: "TestServiceTracer", req: refRequest("test-domain", 0, descriptor("hello", "world")), want: "OK: OK rem=0"}})
	if ended := spans.Ended(); len(ended) != 1 || ended[0].Name() != "ShouldRateLimit Execution" {
		t.Errorf("TestServiceTracer: spans %v, want one named ShouldRateLimit Execution", ended)
	}
}

// TestReferenceHealthcheck: /healthcheck is 200 "OK" while every part is healthy, 500 while
// one is not (test/server/health_test.go, TestHealthCheck, TestHealthyWithAtLeastOneConfigLoaded).
func TestReferenceHealthcheck(t *testing.T) {
	for _, c := range []struct {
		ref        string
		withConfig bool
	}{{"TestHealthCheck", false}, {"TestHealthyWithAtLeastOneConfigLoaded", true}} {
		var pingErr error
		svc := rls.New(enginetest.New(t, server.Client(t)), rls.WithHealthyWithAtLeastOneConfigLoaded(c.withConfig),
			rls.WithPing(func(context.Context) error { return pingErr }))
		srv := httptest.NewServer(svc.HTTPHandler())
		defer srv.Close()
		check := func(step, want string) {
			t.Helper()
			resp, err := http.Get(srv.URL + "/healthcheck")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if got := fmt.Sprintf("%d %q", resp.StatusCode, b); got != want {
				t.Errorf("%s, %s: %s, want %s", c.ref, step, got, want)
			}
		}
		if c.withConfig {
			check("before a configuration", `500 ""`)
			svc.SetConfig(mustConfig(t, serviceConfig))
		}
		check("healthy", `200 "OK"`)
		pingErr = errors.New("connection refused")
		check("Redis failing", `500 ""`)
		pingErr = nil
		check("Redis back", `200 "OK"`)
	}
}

// The reference's integration test's files (test/integration/runtime/current/ratelimit/config).
const (
	integrationBasic = `domain: basic
descriptors:
  - {key: key1, rate_limit: {unit: second, requests_per_unit: 50}}
  - {key: one_per_minute, rate_limit: {unit: minute, requests_per_unit: 1}}
`
	integrationAnother = `domain: another
descriptors:
  - {key: key2, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: key3, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: key4, rate_limit: {unit: day, requests_per_unit: 20}}
`
	integrationShare = `domain: share-threshold-test
descriptors:
  - {key: files, value: files/*, share_threshold: true, rate_limit: {unit: hour, requests_per_unit: 10}}
  - {key: files_no_share, value: files_no_share/*, rate_limit: {unit: hour, requests_per_unit: 10}}
`
)

// TestReferenceIntegration runs test/integration/integration_test.go's testBasicBaseConfig, in
// its variants this service has (the deny cache for LOCAL_CACHE_SIZE_IN_BYTES, a
// CACHE_KEY_PREFIX, STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT), and testShareThreshold.
func TestReferenceIntegration(t *testing.T) {
	for _, v := range []struct {
		name  string
		opts  []rls.Option
		eopts []engine.Option
		stop  bool // STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT: the reference stops counting a denied request
		cache bool // a local cache: denials after the first are answered from it
	}{
		{name: "WithoutPerSecondRedis"},
		{name: "WithoutPerSecondRedisWithLocalCache", eopts: []engine.Option{engine.WithDenyCache(1000 / 256)}, cache: true},
		{name: "WithoutPerSecondRedisWithCachePrefix", opts: []rls.Option{rls.WithKeyPrefix(fmt.Sprintf("prefix:%d:", time.Now().UnixNano()))}},
		{name: "WithoutPerSecondRedisWithstopCacheKeyIncrementWhenOverlimitConfig", stop: true},
	} {
		t.Run(v.name, func(t *testing.T) {
			r := newRefService(t, yamlFiles(integrationBasic, integrationAnother), v.opts, v.eopts...)
			ref := "testBasicBaseConfig (" + v.name + ")"
			steps := []refStep{
				{ref: ref + ": an unknown domain", req: refRequest("foo", 0, descriptor("hello", "world")), want: "OK: OK rem=0"},
				{ref: ref + ": key1", req: refRequest("basic", 0, descriptor("key1", "foo")), want: "OK: OK 50/SECOND rem=49 reset",
					counts: map[string]ruleCounts{"basic.key1": {total: 1, within: 1}}},
			}
			value := fmt.Sprint(time.Now().UnixNano())
			for i := range 25 {
				want, counts := fmt.Sprintf("OK: OK 20/MINUTE rem=%d reset", 19-i), ruleCounts{total: 1, within: 1}
				if i >= 16 { // above 0.8 of the limit
					counts.near = 1
				}
				if i >= 20 {
					want, counts = "OVER_LIMIT: OVER_LIMIT 20/MINUTE rem=0 reset", ruleCounts{total: 1, over: 1}
					if v.cache && i >= 21 {
						counts.localCache = 1
					}
				}
				steps = append(steps, refStep{ref: fmt.Sprintf("%s: key2, request %d", ref, i+1), req: refRequest("another", 0, descriptor("key2", value)),
					want: want, counts: map[string]ruleCounts{"another.key2": counts}})
			}
			value += "-2"
			for i := range 15 {
				s := refStep{ref: fmt.Sprintf("%s: key2 and key3, request %d", ref, i+1),
					req:  refRequest("another", 0, descriptor("key2", value), descriptor("key3", value)),
					want: fmt.Sprintf("OK: OK 20/MINUTE rem=%d reset; OK 10/HOUR rem=%d reset", 19-i, 9-i)}
				if i >= 10 {
					// The reference counts key2's hit of a request key3 denies (its remaining goes
					// on down), unless STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, always on here.
					s.want = "OVER_LIMIT: OK 20/MINUTE rem=10 reset; OVER_LIMIT 10/HOUR rem=0 reset"
					if !v.stop {
						s.diff = 3
					}
					// The reference's local cache answers key3's later denials; the deny cache
					// is not asked for requests of several descriptors (difference 7).
					s.counts = map[string]ruleCounts{"another.key3": {total: 1, over: 1}}
				}
				steps = append(steps, s)
			}
			runRef(t, r.client, r.reg, steps)

			// DurationUntilReset counts down.
			durTest := descriptor("key4", "durTest")
			first := ask(t, r.client, "another", 0, durTest).Statuses[0].DurationUntilReset.AsDuration()
			r.clock.Set(r.clock.Now().Add(2 * time.Second))
			if second := ask(t, r.client, "another", 0, durTest).Statuses[0].DurationUntilReset.AsDuration(); second >= first {
				t.Errorf("%s: duration_until_reset %s 2 s after %s, want it lower", ref, second, first)
			}
		})
	}

	t.Run("testShareThreshold", func(t *testing.T) {
		r := newRefService(t, yamlFiles(integrationShare), nil)
		const dom = "share-threshold-test"
		var steps []refStep
		for i := range 10 {
			steps = append(steps, refStep{ref: "testShareThreshold: files/a.pdf", req: refRequest(dom, 0, descriptor("files", "files/a.pdf")),
				want: fmt.Sprintf("OK: OK 10/HOUR rem=%d reset", 9-i)})
		}
		steps = append(steps, refStep{ref: "testShareThreshold: files/b.csv shares files/*", req: refRequest(dom, 0, descriptor("files", "files/b.csv")),
			want: "OVER_LIMIT: OVER_LIMIT 10/HOUR rem=0 reset"})
		for i := range 10 {
			steps = append(steps, refStep{ref: "testShareThreshold: files_no_share/* does not share", req: refRequest(dom, 0, descriptor("files_no_share", fmt.Sprintf("files_no_share/%d", i))),
				want: "OK: OK 10/HOUR rem=9 reset"})
		}
		runRef(t, r.client, r.reg, steps)
	})
}

// TestReferenceFixedCache ports test/redis/fixed_cache_impl_test.go's decisions and counts:
// the reference's mocked Redis answered a count; here requests first bring the counter there
// (steps without an answer), on a clock that does not move.
func TestReferenceFixedCache(t *testing.T) {
	const dom = "domain"
	const cfg = `domain: domain
descriptors:
  - {key: key4, value: value4, rate_limit: {unit: hour, requests_per_unit: 15}}
  - {key: key5, value: value5, rate_limit: {unit: hour, requests_per_unit: 14}}
  - {key: key6, value: value6, rate_limit: {unit: second, requests_per_unit: 8}}
  - {key: key7, value: value7, rate_limit: {unit: second, requests_per_unit: 20}}
  - {key: key8, value: value8, rate_limit: {unit: second, requests_per_unit: 20}}
  - {key: key9, value: value9, rate_limit: {unit: second, requests_per_unit: 20}}
  - {key: key10, value: value10, rate_limit: {unit: second, requests_per_unit: 10}}
  - {key: key11, value: value11, rate_limit: {unit: second, requests_per_unit: 20}}
`
	d := func(n int) *rlv3.RateLimitDescriptor {
		return descriptor(fmt.Sprint("key", n), fmt.Sprint("value", n))
	}
	stat := func(n int) string { return fmt.Sprintf("domain.key%d_value%d", n, n) }
	fill := func(ref string, n int, hits uint32) refStep {
		return refStep{ref: ref + ": setting the counter up", req: refRequest(dom, hits, d(n))}
	}
	t.Run("TestNearLimit", func(t *testing.T) {
		r := newRefService(t, yamlFiles(cfg), nil)
		const ref = "TestNearLimit"
		one := func(n int, hits uint32, want string, c ruleCounts) refStep {
			return refStep{ref: fmt.Sprintf("%s: key%d", ref, n), req: refRequest(dom, hits, d(n)), want: want, counts: map[string]ruleCounts{stat(n): c}}
		}
		runRef(t, r.client, r.reg, []refStep{
			fill(ref, 4, 10), one(4, 1, "OK: OK 15/HOUR rem=4 reset", ruleCounts{total: 1, within: 1}),
			fill(ref, 4, 1), one(4, 1, "OK: OK 15/HOUR rem=2 reset", ruleCounts{total: 1, near: 1, within: 1}),
			fill(ref, 4, 2), one(4, 1, "OVER_LIMIT: OVER_LIMIT 15/HOUR rem=0 reset", ruleCounts{total: 1, over: 1}),
			fill(ref, 11, 2), one(11, 3, "OK: OK 20/SECOND rem=15 reset", ruleCounts{total: 3, within: 3}),
			fill(ref, 6, 5), one(6, 2, "OK: OK 8/SECOND rem=1 reset", ruleCounts{total: 2, near: 1, within: 2}),
			fill(ref, 7, 16), one(7, 3, "OK: OK 20/SECOND rem=1 reset", ruleCounts{total: 3, near: 3, within: 3}),
			fill(ref, 8, 19), one(8, 3, "OVER_LIMIT: OVER_LIMIT 20/SECOND rem=0 reset", ruleCounts{total: 3, over: 2, near: 1}),
			fill(ref, 9, 15), one(9, 7, "OVER_LIMIT: OVER_LIMIT 20/SECOND rem=0 reset", ruleCounts{total: 7, over: 2, near: 4}),
			fill(ref, 10, 10), one(10, 3, "OVER_LIMIT: OVER_LIMIT 10/SECOND rem=0 reset", ruleCounts{total: 3, over: 3}),
		})
	})
	t.Run("TestOverLimitWithLocalCache", func(t *testing.T) {
		r := newRefService(t, yamlFiles(cfg), nil, engine.WithDenyCache(100))
		const ref = "TestOverLimitWithLocalCache"
		step := func(want string, c ruleCounts) refStep {
			return refStep{ref: ref, req: refRequest(dom, 0, d(4)), want: want, counts: map[string]ruleCounts{stat(4): c}}
		}
		runRef(t, r.client, r.reg, []refStep{
			fill(ref, 4, 10), step("OK: OK 15/HOUR rem=4 reset", ruleCounts{total: 1, within: 1}),
			fill(ref, 4, 1), step("OK: OK 15/HOUR rem=2 reset", ruleCounts{total: 1, near: 1, within: 1}),
			fill(ref, 4, 2), step("OVER_LIMIT: OVER_LIMIT 15/HOUR rem=0 reset", ruleCounts{total: 1, over: 1}),
			step("OVER_LIMIT: OVER_LIMIT 15/HOUR rem=0 reset", ruleCounts{total: 1, over: 1, localCache: 1}),
		})
	})
	t.Run("TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig", func(t *testing.T) {
		r := newRefService(t, yamlFiles(cfg), nil)
		const ref = "TestOverLimitWithStopCacheKeyIncrementWhenOverlimitConfig"
		pair := func(hits uint64) *pb.RateLimitRequest {
			return refRequest(dom, 0, withHits(d(4), hits), withHits(d(5), hits))
		}
		runRef(t, r.client, r.reg, []refStep{
			fill(ref, 4, 10), fill(ref, 5, 10),
			{ref: ref, req: pair(1), want: "OK: OK 15/HOUR rem=4 reset; OK 14/HOUR rem=3 reset",
				counts: map[string]ruleCounts{stat(4): {total: 1, within: 1}, stat(5): {total: 1, within: 1}}},
			{ref: ref, req: pair(2), want: "OK: OK 15/HOUR rem=2 reset; OK 14/HOUR rem=1 reset",
				counts: map[string]ruleCounts{stat(4): {total: 2, near: 1, within: 2}, stat(5): {total: 2, near: 2, within: 2}}},
			// The reference counts key4's 2 hits of the denied request within its limit (and 1
			// near it); here a denied request admits nothing, so they count in total_hits alone
			// (difference 2).
			{ref: ref, req: pair(2), want: "OVER_LIMIT: OK 15/HOUR rem=2 reset; OVER_LIMIT 14/HOUR rem=0 reset", diff: 2,
				counts: map[string]ruleCounts{stat(4): {total: 2}, stat(5): {total: 2, over: 1, near: 1}}},
		})
	})
}
