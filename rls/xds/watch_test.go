package xds_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/strictrate/strictrate/rls/internal/testpki"
	"github.com/strictrate/strictrate/rls/internal/testxds"
	"github.com/strictrate/strictrate/rls/xds"
)

// node is the node id Envoy Gateway serves its rate limit configuration to.
const node = "envoy-ratelimit"

// rateLimitConfig is a one-rule configuration for domain; a domain starting with "bad" is one
// the watcher's apply rejects.
func rateLimitConfig(domain string, perMinute uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{
		Name:   domain,
		Domain: domain,
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key:       "remote_address",
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: perMinute},
		}},
	}
}

// testOptions asks cp for node, retrying quickly.
func testOptions(t *testing.T, addr string) xds.Options {
	return xds.Options{
		ServerURL:      addr,
		NodeID:         node,
		BackoffInitial: 20 * time.Millisecond,
		BackoffMax:     100 * time.Millisecond,
		Logger:         slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// watcher runs Watch for one test, and hands over every configuration it applied.
type watcher struct {
	applied  chan []*rlsconfv3.RateLimitConfig
	rejected atomic.Int32 // how many times apply rejected a configuration
}

// startWatch runs Watch with o until the end of the test, and checks that it returns ctx's error
// then. Its apply rejects a configuration with a domain starting with "bad".
func startWatch(t *testing.T, o xds.Options) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{applied: make(chan []*rlsconfv3.RateLimitConfig, 16)}
	apply := func(configs []*rlsconfv3.RateLimitConfig) error {
		for _, c := range configs {
			if strings.HasPrefix(c.GetDomain(), "bad") {
				w.rejected.Add(1)
				return fmt.Errorf("config %q: domain %q: unknown unit", c.GetName(), c.GetDomain())
			}
		}
		w.applied <- configs
		return nil
	}
	done := make(chan error, 1)
	go func() { done <- xds.Watch(ctx, o, apply) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch returned %v after its context was canceled, want context.Canceled", err)
		}
	})
	return w
}

// next waits for the next configuration applied, and returns its domains.
func (w *watcher) next(t *testing.T) []string {
	t.Helper()
	select {
	case configs := <-w.applied:
		domains := make([]string, len(configs))
		for i, c := range configs {
			domains[i] = c.GetDomain()
		}
		return domains
	case <-time.After(5 * time.Second):
		t.Fatal("no configuration applied within 5s")
		return nil
	}
}

// none checks that nothing more is applied for a while.
func (w *watcher) none(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case configs := <-w.applied:
		t.Fatalf("applied %v, want nothing", configs)
	case <-time.After(d):
	}
}

func TestWatchAppliesInitialConfigAndUpdates(t *testing.T) {
	cp := testxds.Start(t, "127.0.0.1:0", nil)
	want := rateLimitConfig("api", 10)
	cp.Set(node, "1", want)

	o := testOptions(t, cp.Addr)
	o.NodeMetadata = map[string]string{"cluster": "edge"}
	o.Headers = map[string]string{"x-tenant": "blue"}
	w := startWatch(t, o)

	select {
	case configs := <-w.applied:
		if len(configs) != 1 || !proto.Equal(configs[0], want) {
			t.Fatalf("initial configuration = %v, want [%v]", configs, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("initial configuration not applied within 5s")
	}
	ack := cp.WaitRequest("ACK of version 1", isACK("1"))
	if ack.GetTypeUrl() != resourcev3.RateLimitConfigType {
		t.Errorf("ACK type = %q, want %q", ack.GetTypeUrl(), resourcev3.RateLimitConfigType)
	}

	// The subscription: the node as the server keys it, with its metadata, for every
	// RateLimitConfig (wildcard), from the empty version.
	sub := cp.Seen()[0]
	if sub.GetResponseNonce() != "" || sub.GetVersionInfo() != "" || len(sub.GetResourceNames()) != 0 {
		t.Errorf("subscription = %v, want a wildcard request with no version or nonce", sub)
	}
	n := sub.GetNode()
	if n.GetId() != node || n.GetMetadata().GetFields()["cluster"].GetStringValue() != "edge" || n.GetUserAgentName() == "" {
		t.Errorf("node = %v, want id %q, metadata cluster=edge and a user agent", n, node)
	}
	if h := cp.StreamHeaders(); len(h) == 0 || strings.Join(h[0].Get("x-tenant"), ",") != "blue" {
		t.Errorf("stream headers = %v, want x-tenant: blue", h)
	}

	// An update replaces the whole state: two resources now.
	cp.Set(node, "2", rateLimitConfig("api", 20), rateLimitConfig("web", 5))
	if got := w.next(t); strings.Join(got, ",") != "api,web" && strings.Join(got, ",") != "web,api" {
		t.Fatalf("update applied domains %v, want api and web", got)
	}
	cp.WaitRequest("ACK of version 2", isACK("2"))

	// Removing every resource is a configuration too: an empty one.
	cp.Set(node, "3")
	if got := w.next(t); len(got) != 0 {
		t.Fatalf("empty snapshot applied %v, want no configuration", got)
	}
	cp.WaitRequest("ACK of version 3", isACK("3"))

	for _, r := range cp.Seen() {
		if r.GetErrorDetail() != nil {
			t.Errorf("request %v is a NACK; every configuration was good", r)
		}
	}
}

func TestWatchNACKsRejectedConfigAndKeepsGoing(t *testing.T) {
	cp := testxds.Start(t, "127.0.0.1:0", nil)
	cp.Set(node, "1", rateLimitConfig("api", 10))
	w := startWatch(t, testOptions(t, cp.Addr))
	if got := w.next(t); strings.Join(got, ",") != "api" {
		t.Fatalf("initial configuration domains %v, want [api]", got)
	}
	cp.WaitRequest("ACK of version 1", isACK("1"))

	cp.Set(node, "2", rateLimitConfig("bad-units", 10))
	nack := cp.WaitRequest("NACK", isNACK)
	// A NACK repeats the version last accepted, and carries apply's error.
	if nack.GetVersionInfo() != "1" {
		t.Errorf("NACK version = %q, want the last accepted version 1", nack.GetVersionInfo())
	}
	if msg := nack.GetErrorDetail().GetMessage(); !strings.Contains(msg, `domain "bad-units": unknown unit`) {
		t.Errorf("NACK error_detail message = %q, want apply's error", msg)
	}
	if nack.GetErrorDetail().GetCode() == 0 {
		t.Error("NACK error_detail code is OK, want an error code")
	}
	// go-control-plane's cache sends the rejected state again after each NACK: it is not
	// applied again, and the NACKs are paced rather than sent back at once.
	w.none(t, 500*time.Millisecond)
	if n := w.rejected.Load(); n != 1 {
		t.Errorf("apply rejected %d configurations, want the one bad version applied once", n)
	}
	nacks := 0
	for _, r := range cp.Seen() {
		if isNACK(r) {
			nacks++
			if r.GetVersionInfo() != "1" || r.GetErrorDetail().GetMessage() != nack.GetErrorDetail().GetMessage() {
				t.Errorf("NACK %v, want version 1 and the same error as the first", r)
			}
		}
	}
	if nacks < 2 || nacks > 5 {
		t.Errorf("%d NACKs of the resent version 2 in 500ms, want it NACKed again but paced (2 to 5)", nacks)
	}

	cp.Set(node, "3", rateLimitConfig("api", 30))
	if got := w.next(t); strings.Join(got, ",") != "api" {
		t.Fatalf("configuration after the NACK: domains %v, want [api]", got)
	}
	cp.WaitRequest("ACK of version 3", isACK("3"))
	for _, r := range cp.Seen() {
		if isACK("2")(r) {
			t.Errorf("version 2 was ACKed: %v", r)
		}
	}
}

func TestWatchReconnectsToARestartedServer(t *testing.T) {
	cp := testxds.Start(t, "127.0.0.1:0", nil)
	cp.Set(node, "1", rateLimitConfig("before", 10))
	w := startWatch(t, testOptions(t, cp.Addr))
	if got := w.next(t); strings.Join(got, ",") != "before" {
		t.Fatalf("initial configuration domains %v, want [before]", got)
	}

	// The restarted server starts its versions over, as Envoy Gateway's does: the same version
	// with another configuration must still reach the client.
	cp.Stop()
	restarted := testxds.Start(t, cp.Addr, nil)
	restarted.Set(node, "1", rateLimitConfig("after", 10))
	if got := w.next(t); strings.Join(got, ",") != "after" {
		t.Fatalf("configuration after the restart: domains %v, want [after]", got)
	}
	restarted.WaitRequest("ACK of version 1", isACK("1"))
}

func TestWatchRetriesUntilTheServerIsUp(t *testing.T) {
	// Reserve a port, and serve on it only after the client has failed a few times.
	cp := testxds.Start(t, "127.0.0.1:0", nil)
	addr := cp.Addr
	cp.Stop()

	w := startWatch(t, testOptions(t, addr))
	w.none(t, 200*time.Millisecond)
	late := testxds.Start(t, addr, nil)
	late.Set(node, "7", rateLimitConfig("late", 1))
	if got := w.next(t); strings.Join(got, ",") != "late" {
		t.Fatalf("configuration domains %v, want [late]", got)
	}
}

func TestWatchMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	cp := testxds.Start(t, "127.0.0.1:0", pki.serverTLS())
	cp.Set(node, "1", rateLimitConfig("secure", 10))

	t.Run("client certificate", func(t *testing.T) {
		o := testOptions(t, cp.Addr)
		o.TLS = pki.clientTLS(true)
		w := startWatch(t, o)
		if got := w.next(t); strings.Join(got, ",") != "secure" {
			t.Fatalf("configuration domains %v, want [secure]", got)
		}
		cp.WaitRequest("ACK of version 1", isACK("1"))
	})

	t.Run("no client certificate", func(t *testing.T) {
		const stranger = "no-certificate"
		cp.Set(stranger, "1", rateLimitConfig("secure", 10))
		o := testOptions(t, cp.Addr)
		o.NodeID = stranger
		o.TLS = pki.clientTLS(false)
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		applied := false
		err := xds.Watch(ctx, o, func([]*rlsconfv3.RateLimitConfig) error {
			applied = true
			return nil
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Watch returned %v, want context.DeadlineExceeded", err)
		}
		if applied {
			t.Error("a client without a certificate was given a configuration")
		}
		for _, r := range cp.Seen() {
			if r.GetNode().GetId() == stranger {
				t.Errorf("the server accepted a request from a client without a certificate: %v", r)
			}
		}
	})

	t.Run("plaintext", func(t *testing.T) {
		o := testOptions(t, cp.Addr)
		o.NodeID = "plaintext"
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		err := xds.Watch(ctx, o, func([]*rlsconfv3.RateLimitConfig) error {
			t.Error("a plaintext client was given a configuration")
			return nil
		})
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Watch returned %v, want context.DeadlineExceeded", err)
		}
	})
}

func TestWatchRefusesUnusableOptions(t *testing.T) {
	apply := func([]*rlsconfv3.RateLimitConfig) error { return nil }
	for name, o := range map[string]xds.Options{
		"no server":  {NodeID: node},
		"no node id": {ServerURL: "127.0.0.1:1"},
		"bad target": {ServerURL: "unknownscheme:///x\x00", NodeID: node},
	} {
		t.Run(name, func(t *testing.T) {
			if err := o.Validate(); !errors.Is(err, xds.ErrInvalidOptions) {
				t.Errorf("Validate = %v, want an error wrapping ErrInvalidOptions", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			if err := xds.Watch(ctx, o, apply); !errors.Is(err, xds.ErrInvalidOptions) {
				t.Errorf("Watch = %v, want an error wrapping ErrInvalidOptions", err)
			}
		})
	}
	// Options that can work, though no server answers there yet, are valid: Watch retries them.
	if err := (xds.Options{ServerURL: "127.0.0.1:1", NodeID: node}).Validate(); err != nil {
		t.Errorf("Validate of usable options = %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := xds.Watch(ctx, xds.Options{ServerURL: "127.0.0.1:1", NodeID: node}, nil); !errors.Is(err, xds.ErrInvalidOptions) {
		t.Errorf("Watch with a nil apply = %v, want an error wrapping ErrInvalidOptions", err)
	}
}

func TestTypeURLIsGoControlPlanes(t *testing.T) {
	if xds.TypeURL != resourcev3.RateLimitConfigType {
		t.Errorf("TypeURL = %q, go-control-plane serves %q", xds.TypeURL, resourcev3.RateLimitConfigType)
	}
}

func TestParseNodeMetadata(t *testing.T) {
	md, ignored := xds.ParseNodeMetadata("cluster=edge,expr=a=b,key1:val1,")
	want := map[string]string{"cluster": "edge", "expr": "a=b"}
	if len(md) != len(want) || md["cluster"] != "edge" || md["expr"] != "a=b" {
		t.Errorf("metadata = %v, want %v", md, want)
	}
	if strings.Join(ignored, "|") != "key1:val1" {
		t.Errorf("ignored = %q, want [key1:val1]", ignored)
	}
	if md, ignored := xds.ParseNodeMetadata(""); len(md) != 0 || len(ignored) != 0 {
		t.Errorf("ParseNodeMetadata(\"\") = %v, %v, want nothing", md, ignored)
	}
}

// testPKI is a certificate authority with a server certificate for 127.0.0.1 and localhost,
// and a client certificate, all made for one test.
type testPKI struct {
	ca             *testpki.CA
	server, client tls.Certificate
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	ca := testpki.New(t, "xds test CA")
	return &testPKI{
		ca:     ca,
		server: ca.Issue(t, testpki.LoopbackLeaf("xds server", x509.ExtKeyUsageServerAuth)),
		client: ca.Issue(t, testpki.Leaf{CN: "envoy-ratelimit", Usages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}),
	}
}

// serverTLS requires and verifies client certificates, as Envoy Gateway's xDS server does,
// over TLS 1.3.
func (p *testPKI) serverTLS() *tls.Config {
	c := p.ca.ServerTLS(p.server)
	c.MinVersion = tls.VersionTLS13
	return c
}

// clientTLS trusts the CA, and presents the client certificate when withCert.
func (p *testPKI) clientTLS(withCert bool) *tls.Config {
	if withCert {
		return p.ca.ClientTLS(p.client)
	}
	return p.ca.ClientTLS()
}

// isACK matches the ACK of version.
func isACK(version string) func(*discoveryv3.DiscoveryRequest) bool {
	return func(r *discoveryv3.DiscoveryRequest) bool {
		return r.GetResponseNonce() != "" && r.GetErrorDetail() == nil && r.GetVersionInfo() == version
	}
}

// isNACK matches any NACK.
func isNACK(r *discoveryv3.DiscoveryRequest) bool {
	return r.GetResponseNonce() != "" && r.GetErrorDetail() != nil
}
