package main

import (
	"context"
	"crypto/tls"
	"net"
	"testing"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// controlPlane is go-control-plane's own xDS server on 127.0.0.1, set up as Envoy Gateway sets
// up the one for its rate limit deployment: a SnapshotCache (not in ADS mode) keyed by node id,
// served over ADS with mutual TLS.
type controlPlane struct {
	t     *testing.T
	cache cachev3.SnapshotCache
	addr  string
}

// startControlPlane serves over TLS with serverTLS until the end of the test.
func startControlPlane(t *testing.T, serverTLS *tls.Config) *controlPlane {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	cp := &controlPlane{t: t, cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil), addr: lis.Addr().String()}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(serverTLS)))
	ctx, cancel := context.WithCancel(context.Background())
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(g, serverv3.NewServer(ctx, cp.cache, nil))
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(lis)
	}()
	t.Cleanup(func() {
		cancel()
		g.Stop()
		<-done
	})
	return cp
}

// set publishes configs as the snapshot version of node.
func (cp *controlPlane) set(node, version string, configs ...*rlsconfv3.RateLimitConfig) {
	cp.t.Helper()
	resources := make([]types.Resource, len(configs))
	for i, c := range configs {
		resources[i] = c
	}
	snapshot, err := cachev3.NewSnapshot(version, map[resourcev3.Type][]types.Resource{
		resourcev3.RateLimitConfigType: resources,
	})
	if err != nil {
		cp.t.Fatalf("snapshot %s: %v", version, err)
	}
	if err := cp.cache.SetSnapshot(context.Background(), node, snapshot); err != nil {
		cp.t.Fatalf("set snapshot %s: %v", version, err)
	}
}
