package rls_test

import (
	"context"
	"sort"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/rls"
)

// running is a service on an engine the test chose, served over gRPC, with the key prefix its
// counters are kept under.
type running struct {
	client pb.RateLimitServiceClient
	svc    *rls.Service
	prefix string
}

// requestTimeout bounds a decision whose request carries no deadline in the services the tests
// start. The tests' requests carry none, and the service's default, a second, is a slice of
// wall-clock time that a busy machine can overrun: a slow decision then came back UNAVAILABLE,
// "context deadline exceeded" (TestAdvisoryModesCountExactly failed so once, its first 64
// concurrent requests on a cold service under -race). A test of what a timeout does sets its
// own, after this one.
const requestTimeout = time.Minute

// start runs a service on e with a key prefix of its own, requestTimeout, and the configuration
// yaml (none when empty), served over gRPC until the test ends.
func start(t testing.TB, e *engine.Engine, yaml string, opts ...rls.Option) running {
	t.Helper()
	prefix := uuid.NewString() + ":"
	svc := rls.New(e, append([]rls.Option{rls.WithKeyPrefix(prefix), rls.WithRequestTimeout(requestTimeout)}, opts...)...)
	if yaml != "" {
		svc.SetConfig(mustConfig(t, yaml))
	}
	return running{client: serve(t, svc), svc: svc, prefix: prefix}
}

// key is the engine key (under the engine's default prefix) of the counter of the descriptor
// of key/value pairs kv in domain.
func (r running) key(domain string, kv ...string) string {
	return rls.CounterKey(r.prefix, domain, kv...)
}

// withHits is d with a hits_addend of its own.
func withHits(d *rlv3.RateLimitDescriptor, hits uint64) *rlv3.RateLimitDescriptor {
	return &rlv3.RateLimitDescriptor{Entries: d.Entries, Limit: d.Limit, HitsAddend: wrapperspb.UInt64(hits)}
}

// askCtx is ask with the caller's context, returning the error instead of failing.
func askCtx(ctx context.Context, c pb.RateLimitServiceClient, domain string, ds ...*rlv3.RateLimitDescriptor) (*pb.RateLimitResponse, error) {
	return c.ShouldRateLimit(ctx, &pb.RateLimitRequest{Domain: domain, Descriptors: ds})
}

// admission is one admitted request's hits on one counter, at the time it was answered.
type admission struct {
	at   time.Time
	hits int
}

// auditWindow fails t when the hits admitted on a counter in some trailing window, of the
// times in adm, exceed limit.
func auditWindow(t testing.TB, what string, adm []admission, window time.Duration, limit int) {
	t.Helper()
	sorted := append([]admission(nil), adm...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].at.Before(sorted[j].at) })
	sum, first := 0, 0
	for _, a := range sorted {
		sum += a.hits
		for !sorted[first].at.After(a.at.Add(-window)) {
			sum -= sorted[first].hits
			first++
		}
		if sum > limit {
			t.Fatalf("%s: %d hits admitted in the %s up to %s, more than %d", what, sum, window, a.at, limit)
		}
	}
}

// metricValue is the value of the counter name with exactly the labels given in the metrics
// gathered from reg; 0 when it has no such series.
func metricValue(t testing.TB, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	series:
		for _, m := range f.GetMetric() {
			if len(m.GetLabel()) != len(labels) {
				continue
			}
			for _, l := range m.GetLabel() {
				if v, ok := labels[l.GetName()]; !ok || v != l.GetValue() {
					continue series
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}
