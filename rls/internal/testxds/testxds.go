// Package testxds runs go-control-plane's own xDS server in the test's process, as Envoy
// Gateway runs the one that configures its rate limit deployment, for the tests of the xDS
// client and of the command: it publishes RateLimitConfig snapshots and records what it is
// asked.
package testxds

import (
	"context"
	"crypto/tls"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// ControlPlane is go-control-plane's own xDS server on 127.0.0.1, set up as Envoy Gateway sets
// up the one for its rate limit deployment: a SnapshotCache (not in ADS mode) keyed by node id,
// served over ADS. It records every request and the metadata of every stream it sees.
type ControlPlane struct {
	t     testing.TB
	cache cachev3.SnapshotCache
	Addr  string
	grpc  *grpc.Server
	done  chan struct{}

	mu       sync.Mutex
	requests []*discoveryv3.DiscoveryRequest
	headers  []metadata.MD
}

// Start serves on addr ("127.0.0.1:0" for any port), over TLS when serverTLS is
// not nil. It is stopped at the end of the test, or earlier with stop.
func Start(t testing.TB, addr string, serverTLS *tls.Config) *ControlPlane {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen on %s: %v", addr, err)
	}
	cp := &ControlPlane{
		t:     t,
		cache: cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil),
		Addr:  lis.Addr().String(),
		done:  make(chan struct{}),
	}
	var opts []grpc.ServerOption
	if serverTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(serverTLS)))
	}
	cp.grpc = grpc.NewServer(opts...)
	callbacks := serverv3.CallbackFuncs{
		StreamOpenFunc: func(ctx context.Context, _ int64, _ string) error {
			md, _ := metadata.FromIncomingContext(ctx)
			cp.mu.Lock()
			cp.headers = append(cp.headers, md)
			cp.mu.Unlock()
			return nil
		},
		StreamRequestFunc: func(_ int64, req *discoveryv3.DiscoveryRequest) error {
			cp.mu.Lock()
			cp.requests = append(cp.requests, proto.Clone(req).(*discoveryv3.DiscoveryRequest))
			cp.mu.Unlock()
			return nil
		},
	}
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(cp.grpc, serverv3.NewServer(t.Context(), cp.cache, callbacks))
	go func() {
		defer close(cp.done)
		_ = cp.grpc.Serve(lis)
	}()
	t.Cleanup(cp.Stop)
	return cp
}

// Stop closes every stream and the listener, and waits for the server to be gone.
func (cp *ControlPlane) Stop() {
	cp.grpc.Stop()
	<-cp.done
}

// Set publishes configs as the snapshot version of node.
func (cp *ControlPlane) Set(node, version string, configs ...*rlsconfv3.RateLimitConfig) {
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

// WaitRequest waits until the server has seen a request that match accepts, and returns it.
func (cp *ControlPlane) WaitRequest(what string, match func(*discoveryv3.DiscoveryRequest) bool) *discoveryv3.DiscoveryRequest {
	cp.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		cp.mu.Lock()
		i := slices.IndexFunc(cp.requests, match)
		var req *discoveryv3.DiscoveryRequest
		if i >= 0 {
			req = cp.requests[i]
		}
		cp.mu.Unlock()
		if req != nil {
			return req
		}
		if time.Now().After(deadline) {
			cp.t.Fatalf("the server saw no %s; requests: %v", what, cp.Seen())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Seen is a copy of the requests the server saw so far.
func (cp *ControlPlane) Seen() []*discoveryv3.DiscoveryRequest {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return slices.Clone(cp.requests)
}

// StreamHeaders is a copy of the metadata of every stream the server saw so far.
func (cp *ControlPlane) StreamHeaders() []metadata.MD {
	cp.mu.Lock()
	defer cp.mu.Unlock()
	return slices.Clone(cp.headers)
}
