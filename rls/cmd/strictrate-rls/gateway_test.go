package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/rls/internal/testpki"
	"github.com/strictrate/strictrate/rls/internal/testxds"
)

// gatewayNode is the node id Envoy Gateway serves its rate limit configuration to.
const gatewayNode = "envoy-ratelimit"

// gatewayRoute is a descriptor key (and value) as Envoy Gateway names a route's rule.
const gatewayRoute = "httproute/default/backend/rule/0/match/0/www_example_com"

// gatewayConfig is a RateLimitConfig as Envoy Gateway translates a BackendTrafficPolicy that
// limits each client address of a route: the listener's name as domain, the route as a
// generic key, the address beneath it.
func gatewayConfig(domain string, unit rlsconfv3.RateLimitUnit, perUnit uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{
		Name:   domain,
		Domain: domain,
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key:   gatewayRoute,
			Value: gatewayRoute,
			Descriptors: []*rlsconfv3.RateLimitDescriptor{{
				Key:       "remote_address",
				RateLimit: &rlsconfv3.RateLimitPolicy{Unit: unit, RequestsPerUnit: perUnit},
			}},
		}},
	}
}

// TestEnvoyGatewayDeployment runs the command with the environment of Envoy Gateway's rate
// limit Deployment (internal/infrastructure/kubernetes/ratelimit/resource.go, with its
// Prometheus on), unchanged but for the Valkey's address, the xDS server's and the listeners'
// loopback ports: the configuration comes from go-control-plane's xDS server over mutual TLS,
// the gRPC server requires Envoy's client certificate, and the Prometheus endpoint serves the
// reference's metrics.
func TestEnvoyGatewayDeployment(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	pki := testpki.New(t, "strictrate-rls test CA")
	// One certificate for serving and for presenting as a client, as Envoy Gateway issues them.
	issue := func(ca *testpki.CA, name string) tls.Certificate {
		return ca.Issue(t, testpki.LoopbackLeaf(name, x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth))
	}
	certs := t.TempDir() // the envoy-rate-limit Secret, mounted at /certs
	pki.WriteSecret(t, certs, issue(pki, "envoy-ratelimit"))
	cp := testxds.Start(t, "127.0.0.1:0", pki.ServerTLS(issue(pki, "envoy-gateway")))
	domain := fmt.Sprintf("default/eg/http-%d", time.Now().UnixNano())
	cp.Set(gatewayNode, "1", gatewayConfig(domain, rlsconfv3.RateLimitUnit_MINUTE, 2))

	p := start(t, env{
		"RUNTIME_ROOT":                       "/data",
		"RUNTIME_SUBDIRECTORY":               "ratelimit",
		"RUNTIME_IGNOREDOTFILES":             "true",
		"RUNTIME_WATCH_ROOT":                 "false",
		"LOG_LEVEL":                          "info",
		"USE_STATSD":                         "false",
		"CONFIG_TYPE":                        "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL":         cp.Addr,
		"CONFIG_GRPC_XDS_NODE_ID":            gatewayNode,
		"GRPC_SERVER_USE_TLS":                "true",
		"GRPC_SERVER_TLS_CERT":               filepath.Join(certs, "tls.crt"),
		"GRPC_SERVER_TLS_KEY":                filepath.Join(certs, "tls.key"),
		"GRPC_SERVER_TLS_CA_CERT":            filepath.Join(certs, "ca.crt"),
		"CONFIG_GRPC_XDS_SERVER_USE_TLS":     "true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":    filepath.Join(certs, "tls.crt"),
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":     filepath.Join(certs, "tls.key"),
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT":  filepath.Join(certs, "ca.crt"),
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
		"REDIS_SOCKET_TYPE":                  "tcp",
		"REDIS_URL":                          server.Addr,
		"USE_PROMETHEUS":                     "true",
		// PROMETHEUS_ADDR (":19001" in the Deployment) is a loopback port of the test's.
		"PROMETHEUS_MAPPER_YAML": "/etc/statsd-exporter/conf.yaml",
	})
	if code := p.health(); code != http.StatusOK {
		t.Errorf("/healthcheck: %d, want 200", code)
	}
	p.waitConfig(domain + "." + gatewayRoute + "_" + gatewayRoute + ".remote_address: unit=MINUTE requests_per_unit=2")
	// The log names the xDS server as the configuration's source, at start and with each
	// configuration it sends (the start does not wait for one: it may come before or after).
	p.waitLog("msg=serving")
	if r := findRecord(p.log.String(), "serving"); r == nil || r["config"] != "xds:"+cp.Addr {
		t.Errorf("the serving line %v does not name the xDS server, %s", r, cp.Addr)
	}
	p.waitFor("a log line of the configuration the xDS server sent", func() bool {
		r := findRecord(p.log.String(), "rate limit configuration received from the xds server")
		return r != nil && r["config"] == "xds:"+cp.Addr && r["domains"] == domain && r["rules"] == "1"
	})
	// Envoy Gateway sets PROMETHEUS_MAPPER_YAML, for the reference's statsd exporter: named in
	// a warning, not silently ignored.
	if !strings.Contains(p.log.String(), "PROMETHEUS_MAPPER_YAML") {
		t.Errorf("no warning names PROMETHEUS_MAPPER_YAML")
	}

	envoy := issue(pki, "envoy")
	c := dial(t, p.grpc, grpc.WithTransportCredentials(credentials.NewTLS(pki.ClientTLS(envoy))))
	req := request(domain, gatewayRoute, gatewayRoute, "remote_address", "10.0.0.1")
	if got := decisions(t, c, req, 3); got != want(2, 1) {
		t.Errorf("3 requests against 2 a minute: %s, want %s", got, want(2, 1))
	}

	// A client without a certificate of the CA is refused, and so is one without TLS.
	for name, creds := range map[string]credentials.TransportCredentials{
		"without a client certificate":     credentials.NewTLS(pki.ClientTLS()),
		"with a certificate of another CA": credentials.NewTLS(pki.ClientTLS(issue(testpki.New(t, "another CA"), "envoy"))),
		"in plaintext":                     insecure.NewCredentials(),
	} {
		other := dial(t, p.grpc, grpc.WithTransportCredentials(creds))
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := other.ShouldRateLimit(ctx, req)
		cancel()
		if status.Code(err) != codes.Unavailable {
			t.Errorf("ShouldRateLimit %s: %v, %v; want the connection refused (Unavailable)", name, resp, err)
		}
	}

	// A new snapshot changes the limit while serving: the address's 2 admissions leave 2 of 4.
	cp.Set(gatewayNode, "2", gatewayConfig(domain, rlsconfv3.RateLimitUnit_MINUTE, 4))
	p.waitConfig("requests_per_unit=4")
	if got := decisions(t, c, req, 3); got != want(2, 1) {
		t.Errorf("3 more requests after the limit was raised to 4: %s, want %s", got, want(2, 1))
	}

	// A snapshot the reference would refuse is rejected (NACK): counted, and the 4 stay.
	errorsBefore := p.metric("/metrics", "ratelimit_service_config_load_error")
	cp.Set(gatewayNode, "3", gatewayConfig(domain, rlsconfv3.RateLimitUnit_UNKNOWN, 1))
	p.waitFor("config_load_error to count the refused snapshot", func() bool {
		return p.metric("/metrics", "ratelimit_service_config_load_error") > errorsBefore
	})
	if cfg := p.rlconfig(); !strings.Contains(cfg, "requests_per_unit=4") {
		t.Errorf("/rlconfig after a refused snapshot: %q, want the last good configuration", cfg)
	}
	other := request(domain, gatewayRoute, gatewayRoute, "remote_address", "10.0.0.2")
	if got := decisions(t, c, other, 5); got != want(4, 1) {
		t.Errorf("5 requests of another address after a refused snapshot: %s, want %s", got, want(4, 1))
	}

	// The Prometheus endpoint (PROMETHEUS_ADDR, PROMETHEUS_PATH's default /metrics) serves the
	// reference's per-rule counters: 11 hits, 3 over the limit, 8 within.
	labels := fmt.Sprintf("domain=%q", domain)
	for name, want := range map[string]float64{
		"ratelimit_service_rate_limit_total_hits":   11,
		"ratelimit_service_rate_limit_over_limit":   3,
		"ratelimit_service_rate_limit_within_limit": 8,
	} {
		if got := p.metric("/metrics", name, labels); got != want {
			t.Errorf("%s{%s}: %v, want %v", name, labels, got, want)
		}
	}
	if got := p.metric("/metrics", "ratelimit_service_config_load_success"); got < 2 {
		t.Errorf("ratelimit_service_config_load_success: %v, want at least 2", got)
	}
}

// TestXDSUnusableServerAddress: an xDS server address gRPC cannot parse will never work, so
// the command refuses to start on it, naming it, with or without
// FORCE_START_WITHOUT_INITIAL_CONFIG (without it, it used to wait for a first configuration
// that could never come).
func TestXDSUnusableServerAddress(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	for _, force := range []string{"false", "true"} {
		e := baseEnv(t)
		e["CONFIG_TYPE"] = "GRPC_XDS_SOTW"
		e["CONFIG_GRPC_XDS_SERVER_URL"] = "dns:///%zz"
		e["CONFIG_GRPC_XDS_NODE_ID"] = gatewayNode
		e["FORCE_START_WITHOUT_INITIAL_CONFIG"] = force
		p := launch(t, e)
		if code := p.wait(10 * time.Second); code == 0 {
			t.Errorf("FORCE_START_WITHOUT_INITIAL_CONFIG=%s: the command exited 0", force)
		}
		if out := p.log.String(); !strings.Contains(out, "%zz") {
			t.Errorf("FORCE_START_WITHOUT_INITIAL_CONFIG=%s: the output does not name the address:\n%s", force, out)
		}
	}
}
