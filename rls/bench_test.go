package rls_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/uuid"

	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/rls"
)

// BenchmarkShouldRateLimit is the service's own cost and allocations per request, called
// directly (no gRPC) on the shared Valkey, for one descriptor a request and for three, over
// many keys, from parallel callers: go test -run - -bench ShouldRateLimit -benchmem ./
func BenchmarkShouldRateLimit(b *testing.B) {
	e := enginetest.New(b, server.Client(b))
	svc := rls.New(e, rls.WithKeyPrefix(uuid.NewString()+":"))
	// The rules the bench (rls/bench) drives both services with.
	yaml, err := os.ReadFile(filepath.Join("bench", "config", "bench.yaml"))
	if err != nil {
		b.Fatal(err)
	}
	svc.SetConfig(mustConfig(b, string(yaml)))
	for _, n := range []int{1, 3} {
		b.Run(strconv.Itoa(n)+"-descriptors", func(b *testing.B) {
			b.RunParallel(func(pb_ *testing.PB) {
				i := 0
				for pb_.Next() {
					i++
					ds := []*rlv3.RateLimitDescriptor{descriptor("user", strconv.Itoa(i%10_000))}
					if n == 3 {
						ds = append(ds, descriptor("path", strconv.Itoa(i%1_000)), descriptor("tenant", strconv.Itoa(i%100)))
					}
					resp, err := svc.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "bench", Descriptors: ds})
					if err != nil {
						b.Error(err)
						return
					}
					if resp.OverallCode != pb.RateLimitResponse_OK {
						b.Errorf("over the limit: %v", resp)
						return
					}
				}
			})
		})
	}
}
