package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/rls/internal/compattest"
	"github.com/strictrate/strictrate/rls/internal/testpki"
)

// The reference server's own cases, run against the command: each test below takes cases of
// envoyproxy/ratelimit's tests (at the version docs/rls.md pins; the newer configuration from
// its later commits), re-expressed here (its configuration, its requests and its answers),
// and names the reference test each comes from. The service's own package ports the rest;
// rls/compat_test.go counts them all.
//
// With RLS_REFERENCE_BINARY set to the reference's service_cmd (built as docs/rls.md says),
// every case also runs against it, on loopback and the tests' Valkey, so that the answers
// written here are the reference's own; CI runs the command alone.

// referenceBinary is the reference's service_cmd, when the compat cases are to run against it
// too.
var referenceBinary = os.Getenv("RLS_REFERENCE_BINARY")

// target is one server the compat cases run against.
type target struct {
	name string
	bin  string
	env  env // added to the test's environment
}

// targets are the command, and the reference when RLS_REFERENCE_BINARY names it.
func targets() []target {
	s := []target{{name: "strictrate-rls", bin: binary}}
	if referenceBinary != "" {
		// The reference sends statsd by default; its other variables are the command's.
		s = append(s, target{name: "reference", bin: referenceBinary, env: env{"USE_STATSD": "false"}})
	}
	return s
}

// forEachServer runs f once per server, as a subtest named after it.
func forEachServer(t *testing.T, f func(t *testing.T, s target)) {
	for _, s := range targets() {
		t.Run(s.name, func(t *testing.T) { f(t, s) })
	}
}

// start starts s with the test's environment e and s's own.
func (s target) start(t *testing.T, e env) *process {
	t.Helper()
	for k, v := range s.env {
		e[k] = v
	}
	return startBinary(t, s.bin, e)
}

// serveConfig starts s on the configuration file yaml of domain's, with the extra variables
// kv (name, value pairs), and returns it.
func (s target) serveConfig(t *testing.T, yaml string, kv ...string) *process {
	t.Helper()
	root := t.TempDir()
	writeFile(t, filepath.Join(root, "ratelimit", "config", "compat.yaml"), yaml)
	e := fileEnv(t, root)
	for i := 0; i+1 < len(kv); i += 2 {
		e[kv[i]] = kv[i+1]
	}
	return s.start(t, e)
}

// descriptors is a request of domain with one descriptor per list of key and value pairs.
func descriptors(domain string, ds ...[]string) *pb.RateLimitRequest {
	req := &pb.RateLimitRequest{Domain: domain}
	for _, kv := range ds {
		req.Descriptors = append(req.Descriptors, request(domain, kv...).Descriptors[0])
	}
	return req
}

// d is a descriptor's key and value pairs, for descriptors.
func d(kv ...string) []string { return kv }

// step is one request of a case and the reference's answer to it.
type step struct {
	req  *pb.RateLimitRequest
	want string // as compattest.Answer writes it
	ref  string // the reference test the step comes from, for messages
}

// runSteps sends each step in order and checks its answer.
func runSteps(t *testing.T, c pb.RateLimitServiceClient, steps []step) {
	t.Helper()
	for i, s := range steps {
		if got := compattest.Answer(respond(t, c, s.req)); got != s.want {
			t.Errorf("step %d (%s): %s\n  want %s", i+1, s.ref, got, s.want)
		}
	}
}

// repeat is n steps of the same request, the i-th (from 0) answered want(i).
func repeat(n int, req *pb.RateLimitRequest, ref string, want func(i int) string) []step {
	steps := make([]step, n)
	for i := range steps {
		steps[i] = step{req: req, want: want(i), ref: ref}
	}
	return steps
}

// quotaConfig holds the descriptors of the reference's quota mode tests
// (test/service/ratelimit_test.go, TestServicePerDescriptorQuotaMode,
// TestServiceQuotaModeOnly, TestServiceQuotaModeWithShadowMode): a regular rule of 5 a
// minute, and quota rules of 3 and 5.
const quotaConfig = `domain: quota-domain
descriptors:
  - {key: regular, value: limit, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: quota, value: limit, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: quota1, value: limit, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: quota2, value: limit, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 3}}
`

// TestReferenceQuotaMode: a rule in quota_mode never denies. Over its limit its status is OK,
// with its limit, limit_remaining 0 and no duration_until_reset; beside a regular rule over
// its limit the request is denied by that rule alone; under SHADOW_MODE, the regular rule's
// status stays OVER_LIMIT and the quota rule's is OK. QUOTA_MODE=true puts every rule in
// quota mode.
func TestReferenceQuotaMode(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	const dom = "quota-domain"
	regular, quota := d("regular", "limit"), d("quota", "limit")
	useUp := func(kv []string, limit int, ref string) []step {
		return repeat(limit, descriptors(dom, kv), ref, func(i int) string {
			return fmt.Sprintf("OK: OK %d/MINUTE rem=%d reset", limit, limit-i-1)
		})
	}
	forEachServer(t, func(t *testing.T, s target) {
		t.Parallel()
		t.Run("per descriptor", func(t *testing.T) {
			c := dial(t, s.serveConfig(t, quotaConfig).grpc)
			const issue = "issue 32: 3 a minute in quota mode"
			steps := useUp(quota, 3, issue)
			steps = append(steps, step{descriptors(dom, quota), "OK: OK 3/MINUTE rem=0", issue})
			steps = append(steps, useUp(regular, 5, "TestServicePerDescriptorQuotaMode")...)
			steps = append(steps, step{descriptors(dom, regular, quota),
				"OVER_LIMIT: OVER_LIMIT 5/MINUTE rem=0 reset; OK 3/MINUTE rem=0", "TestServicePerDescriptorQuotaMode"})
			steps = append(steps, useUp(d("quota1", "limit"), 5, "TestServiceQuotaModeOnly")...)
			steps = append(steps, step{descriptors(dom, d("quota1", "limit"), d("quota2", "limit")),
				"OK: OK 5/MINUTE rem=0; OK 3/MINUTE rem=2 reset", "TestServiceQuotaModeOnly, the second quota with room"})
			steps = append(steps,
				step{descriptors(dom, d("quota2", "limit")), "OK: OK 3/MINUTE rem=1 reset", "TestServiceQuotaModeOnly"},
				step{descriptors(dom, d("quota2", "limit")), "OK: OK 3/MINUTE rem=0 reset", "TestServiceQuotaModeOnly"})
			steps = append(steps, step{descriptors(dom, d("quota1", "limit"), d("quota2", "limit")),
				"OK: OK 5/MINUTE rem=0; OK 3/MINUTE rem=0", "TestServiceQuotaModeOnly"})
			runSteps(t, c, steps)
		})
		t.Run("SHADOW_MODE", func(t *testing.T) {
			c := dial(t, s.serveConfig(t, quotaConfig, "SHADOW_MODE", "true").grpc)
			steps := append(useUp(regular, 5, "TestServiceQuotaModeWithShadowMode"), useUp(quota, 3, "TestServiceQuotaModeWithShadowMode")...)
			steps = append(steps, step{descriptors(dom, regular, quota),
				"OK: OVER_LIMIT 5/MINUTE rem=0 reset; OK 3/MINUTE rem=0", "TestServiceQuotaModeWithShadowMode"})
			runSteps(t, c, steps)
		})
		t.Run("QUOTA_MODE", func(t *testing.T) {
			const cfg = `domain: quota-domain
descriptors:
  - {key: foo, value: bar, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: hello, value: world, rate_limit: {unit: minute, requests_per_unit: 5}}
`
			c := dial(t, s.serveConfig(t, cfg, "QUOTA_MODE", "true").grpc)
			foo, hello := d("foo", "bar"), d("hello", "world")
			steps := append(useUp(foo, 10, "TestServiceGlobalQuotaMode"), useUp(hello, 5, "TestServiceGlobalQuotaMode")...)
			steps = append(steps, step{descriptors(dom, foo, hello),
				"OK: OK 10/MINUTE rem=0; OK 5/MINUTE rem=0", "TestServiceGlobalQuotaMode"})
			runSteps(t, c, steps)
		})
	})
}

// TestReferenceShadowMode: under SHADOW_MODE, a descriptor over its limit does not stop the
// request's others from counting its hits, as in the reference (issue 32's case: a at 1 a
// minute, b at 10; b's remaining goes 9, 8, 7), and the answer is OK with the descriptor's own
// status OVER_LIMIT (test/service/ratelimit_test.go, TestServiceGlobalShadowMode).
func TestReferenceShadowMode(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	const cfg = `domain: d
descriptors:
  - {key: a, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: b, rate_limit: {unit: minute, requests_per_unit: 10}}
`
	forEachServer(t, func(t *testing.T, s target) {
		t.Parallel()
		p := s.serveConfig(t, cfg, "SHADOW_MODE", "true")
		c := dial(t, p.grpc)
		a, b := d("a", "x"), d("b", "x")
		const issue = "issue 32: a at 1, b at 10, SHADOW_MODE"
		runSteps(t, c, []step{
			{descriptors("d", a, b), "OK: OK 1/MINUTE rem=0 reset; OK 10/MINUTE rem=9 reset", issue},
			{descriptors("d", a, b), "OK: OVER_LIMIT 1/MINUTE rem=0 reset; OK 10/MINUTE rem=8 reset", issue + "; TestServiceGlobalShadowMode"},
			{descriptors("d", b), "OK: OK 10/MINUTE rem=7 reset", issue},
		})
	})
}

// healthOf is the gRPC health status the server at addr gives service, or the error.
func healthOf(t *testing.T, addr, service string) (healthpb.HealthCheckResponse_ServingStatus, error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("grpc client for %s: %v", addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	return resp.GetStatus(), err
}

// TestReferenceGRPCHealth: the gRPC health service answers for the service name "ratelimit",
// which the reference registers and probes ask for: SERVING once serving
// (test/server/health_test.go, TestGrpcHealthCheck; test/service/ratelimit_test.go,
// TestServiceHealthStatus) and, under HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED, NOT_SERVING
// while the configuration has no domain, SERVING once it has one
// (TestGrpcHealthyWithAtLeastOneConfigLoaded, TestServiceHealthStatusAtLeastOneConfigLoaded).
func TestReferenceGRPCHealth(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	forEachServer(t, func(t *testing.T, s target) {
		t.Parallel()
		p := s.serveConfig(t, edgeConfig(3))
		p.waitFor(`gRPC health of "ratelimit" to be SERVING`, func() bool {
			st, err := healthOf(t, p.grpc, "ratelimit")
			return err == nil && st == healthpb.HealthCheckResponse_SERVING
		})

		root := t.TempDir()
		dir := filepath.Join(root, "ratelimit", "config")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		e := fileEnv(t, root)
		e["HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED"] = "true"
		empty := s.start(t, e)
		p.waitFor(`gRPC health of "ratelimit" to be NOT_SERVING without a domain`, func() bool {
			st, err := healthOf(t, empty.grpc, "ratelimit")
			return err == nil && st == healthpb.HealthCheckResponse_NOT_SERVING
		})
		writeFile(t, filepath.Join(dir, "edge.yaml"), edgeConfig(3))
		empty.waitFor(`gRPC health of "ratelimit" to be SERVING once a domain is loaded`, func() bool {
			st, err := healthOf(t, empty.grpc, "ratelimit")
			return err == nil && st == healthpb.HealthCheckResponse_SERVING
		})
	})
}

// httpAnswer is an HTTP answer as the cases write it: "400 text/plain; charset=utf-8
// \"Bad Request\\n\"", the body left out when body is false (a JSON response's field order and
// spacing vary).
func httpAnswer(t *testing.T, method, url, body string, withBody bool) string {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	got := fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	if withBody {
		got += fmt.Sprintf(" %q", b)
	}
	return got
}

// TestReferenceJSON: /json answers as the reference's handler (test/server/server_impl_test.go,
// TestJsonHandler, with the real service behind it): 400 "Bad Request\n" for an empty body,
// for one that is not JSON, for a request the service refuses ({"domain": "foo"}, without
// descriptors), for any method's empty body (GET), and before any configuration is loaded
// (FORCE_START_WITHOUT_INITIAL_CONFIG with a rejected file); 200 and 429 with the response in
// JSON.
func TestReferenceJSON(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	const badRequest = `400 text/plain; charset=utf-8 "Bad Request\n"`
	forEachServer(t, func(t *testing.T, s target) {
		t.Parallel()
		p := s.serveConfig(t, edgeConfig(1))
		url := "http://" + p.http + "/json"
		const req = `{"domain":"edge","descriptors":[{"entries":[{"key":"remote_address","value":"10.0.0.1"}]}]}`
		for _, c := range []struct {
			ref, method, body, want string
			withBody                bool
		}{
			{"TestJsonHandler: missing request body", http.MethodPost, "", badRequest, true},
			{"TestJsonHandler: request body is not valid json", http.MethodPost, "}", badRequest, true},
			{"TestJsonHandler: ratelimit service error", http.MethodPost, `{"domain": "foo"}`, badRequest, true},
			{"the handler takes any method: GET without a body", http.MethodGet, "", badRequest, true},
			{"TestJsonHandler: successful request, not rate limited", http.MethodPost, req, "200 application/json", false},
			{"TestJsonHandler: successful request, rate limited", http.MethodPost, req, "429 application/json", false},
		} {
			if got := httpAnswer(t, c.method, url, c.body, c.withBody); got != c.want {
				t.Errorf("%s: %s /json %q: %s, want %s", c.ref, c.method, c.body, got, c.want)
			}
		}

		root := t.TempDir()
		writeFile(t, filepath.Join(root, "ratelimit", "config", "bad.yaml"), badUnitConfig)
		e := fileEnv(t, root)
		e["FORCE_START_WITHOUT_INITIAL_CONFIG"] = "true"
		unconfigured := s.start(t, e)
		if got := httpAnswer(t, http.MethodPost, "http://"+unconfigured.http+"/json", req, true); got != badRequest {
			t.Errorf("/json before any configuration (TestInitialLoadError): %s, want %s", got, badRequest)
		}
	})
}

// TestReferenceCertificateRotation: a server certificate replaced by moving a new pair over the
// files is served within seconds, as the reference serves it (test/integration/
// integration_test.go, TestReloadGRPCServerCerts: a client of the first CA connects, then one
// of the second once the files are replaced, and the first no longer does), here with the
// two pairs the same size and written in the same clock tick, which a file's size and time
// cannot tell apart.
func TestReferenceCertificateRotation(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	forEachServer(t, func(t *testing.T, s target) {
		t.Parallel()
		dir := t.TempDir()
		firstCA, secondCA := testpki.New(t, "first CA"), testpki.New(t, "other CA")
		first := firstCA.Issue(t, testpki.LoopbackLeaf("rls-1"))
		second := secondCA.IssueLike(t, testpki.LoopbackLeaf("rls-2"), first)
		certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
		nextCert, nextKey := filepath.Join(dir, "next", "tls.crt"), filepath.Join(dir, "next", "tls.key")
		if err := os.Mkdir(filepath.Dir(nextCert), 0o755); err != nil {
			t.Fatal(err)
		}
		testpki.Write(t, first, certFile, keyFile)
		testpki.Write(t, second, nextCert, nextKey)
		testpki.SameTick(t, certFile, keyFile, nextCert, nextKey)

		root := t.TempDir()
		writeFile(t, filepath.Join(root, "ratelimit", "config", "edge.yaml"), edgeConfig(3))
		e := fileEnv(t, root)
		e["GRPC_SERVER_USE_TLS"], e["GRPC_SERVER_TLS_CERT"], e["GRPC_SERVER_TLS_KEY"] = "true", certFile, keyFile
		p := s.start(t, e)
		connects := func(ca *testpki.CA) error {
			conn, err := tls.Dial("tcp", p.grpc, &tls.Config{RootCAs: ca.Pool, ServerName: "localhost", NextProtos: []string{"h2"}})
			if err == nil {
				conn.Close()
			}
			return err
		}
		if err := connects(firstCA); err != nil {
			t.Fatalf("WithInitialCert: %v", err)
		}
		if err := connects(secondCA); err == nil {
			t.Fatalf("WithNewCertFail: a client of the second CA connects before the rotation")
		}
		for _, mv := range [][2]string{{nextCert, certFile}, {nextKey, keyFile}} {
			if err := os.Rename(mv[0], mv[1]); err != nil {
				t.Fatal(err)
			}
		}
		p.waitFor("WithNewCertOK: a client of the second CA to connect", func() bool { return connects(secondCA) == nil })
		if err := connects(firstCA); err == nil {
			t.Errorf("WithInitialCertFail: a client of the first CA still connects")
		}
	})
}

// TestReferenceStartWithoutValkey: a Valkey that cannot be reached at start, or that refuses
// the credentials, stops the command with a non-zero exit that names the cause, as the
// reference stops (test/redis/driver_impl_test.go, testNewClientImpl: "connection refused",
// "auth fail" with NOAUTH, "auth fail with user" with WRONGPASS), instead of retrying
// without a port open. Credentials are refused at once; an address is retried for
// REDIS_STARTUP_MAX_ELAPSED_TIME (the reference's newer name), here 2 s.
func TestReferenceStartWithoutValkey(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	ports, err := valkeytest.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	unreachable := "127.0.0.1:" + ports[0] // free a moment ago: nothing listens there
	locked := valkeytest.New(t, valkeytest.OwnServer())
	admin := locked.Client(t) // authenticated before the password is set, it stays so
	if err := admin.Do(context.Background(), admin.B().ConfigSet().ParameterValue().ParameterValue("requirepass", "default-pw").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	acl := valkeytest.New(t, valkeytest.OwnServer())
	acl.NewUser(t, "rls", "rls-pw", "+@all")
	forEachServer(t, func(t *testing.T, s target) {
		t.Parallel()
		root := t.TempDir()
		writeFile(t, filepath.Join(root, "ratelimit", "config", "edge.yaml"), edgeConfig(3))
		for _, c := range []struct {
			ref, url, auth string
			within         time.Duration // the exit comes within it
			says           string        // the output names it
		}{
			{"connection refused", unreachable, "", 10 * time.Second, unreachable},
			{"auth fail (NOAUTH)", locked.Addr, "", 5 * time.Second, "NOAUTH"},
			{"auth fail with user (WRONGPASS)", acl.Addr, "rls:wrong-pw", 5 * time.Second, "WRONGPASS"},
		} {
			e := fileEnv(t, root)
			e["REDIS_URL"], e["REDIS_AUTH"] = c.url, c.auth
			e["REDIS_STARTUP_MAX_ELAPSED_TIME"] = "2s"
			for k, v := range s.env {
				e[k] = v
			}
			p := launchBinary(t, s.bin, e)
			if code := p.wait(c.within); code == 0 {
				t.Errorf("%s: the command exited 0", c.ref)
			}
			if out := p.log.String(); !strings.Contains(out, c.says) {
				t.Errorf("%s: the output does not say %q:\n%s", c.ref, c.says, out)
			}
		}
	})
}

// newerConfig is a file in the reference's newer format: wildcards in the middle of a value
// (test/config/wildcard.yaml's midWild and multiWild, share_threshold.yaml's midpath) and
// descriptors with metadata (metadata.yaml), which the pinned reference, like this command
// before, refuses (an unknown key) or reads literally.
const newerConfig = `domain: test-domain
descriptors:
  - {key: midWild, value: bar*b, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: multiWild, value: foo*bar*baz, rate_limit: {unit: minute, requests_per_unit: 10}}
  - {key: midpath, value: /api*v1, share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 2}}
  - key: key1
    value: value1
    descriptors:
      - {key: subkey1, rate_limit: {unit: second, requests_per_unit: 5}, metadata: {name: service_1}}
  - key: key2
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      service_with_quota: {name: service_2}
`

// TestReferenceNewerConfig: a file of the reference's newer format loads, and its rules apply
// as the newer reference's tests find them (test/config/config_test.go, TestWildcardConfig,
// TestShareThreshold's middle wildcard, TestMetadata), each request answered by the rule its
// lookup finds. The pinned reference refuses the file, so these run against the command
// alone.
func TestReferenceNewerConfig(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	p := target{name: "strictrate-rls", bin: binary}.serveConfig(t, newerConfig)
	c := dial(t, p.grpc)
	const td = "test-domain"
	one := func(kv ...string) *pb.RateLimitRequest { return descriptors(td, kv) }
	runSteps(t, c, []step{
		{one("midWild", "barab"), "OK: OK 20/MINUTE rem=19 reset", "TestWildcardConfig: bar*b matches barab"},
		{one("midWild", "bar123b"), "OK: OK 20/MINUTE rem=19 reset", "TestWildcardConfig: bar*b matches bar123b, a counter of its own"},
		{one("midWild", "barb"), "OK: OK 20/MINUTE rem=19 reset", "TestWildcardConfig: '*' matches nothing too"},
		{one("midWild", "bara"), "OK: OK rem=0", "TestWildcardConfig: no suffix, no rule"},
		{one("midWild", "xbarb"), "OK: OK rem=0", "TestWildcardConfig: no prefix, no rule"},
		{one("multiWild", "foo123bar456baz"), "OK: OK 10/MINUTE rem=9 reset", "TestWildcardConfig: foo*bar*baz"},
		{one("multiWild", "bar456baz"), "OK: OK rem=0", "TestWildcardConfig: foo*bar*baz without foo"},
		{one("midpath", "/api/v1"), "OK: OK 2/MINUTE rem=1 reset", "TestShareThreshold: /api*v1 shared"},
		{one("midpath", "/apiXYZv1"), "OK: OK 2/MINUTE rem=0 reset", "TestShareThreshold: /api*v1 shared"},
		{one("midpath", "/api-beta-v1"), "OVER_LIMIT: OVER_LIMIT 2/MINUTE rem=0 reset", "TestShareThreshold: /api*v1 shared"},
		{one("midpath", "/api/v2"), "OK: OK rem=0", "TestShareThreshold: /api/v2 is not /api*v1"},
		{one("key1", "value1", "subkey1", "something"), "OK: OK 5/SECOND rem=4 reset", "TestMetadata"},
		{one("key2", "something"), "OK: OK 20/MINUTE rem=19 reset", "TestMetadata"},
	})
	if cfg := p.rlconfig(); !strings.Contains(cfg, "test-domain.midWild_bar*b: unit=MINUTE requests_per_unit=20") {
		t.Errorf("/rlconfig does not list the middle wildcard's rule:\n%s", cfg)
	}
}

// TestReferenceConfigReload: a file added to the configuration's directory is loaded, its
// rules applying to the next request, and its removal is loaded too
// (test/integration/integration_test.go, testConfigReload, with its reload.yaml).
func TestReferenceConfigReload(t *testing.T) {
	valkeytest.SkipIfShort(t, "runs the strictrate-rls command as a process")
	t.Parallel()
	const reload = `domain: reload
descriptors:
  - {key: key1, rate_limit: {unit: second, requests_per_unit: 50}}
  - {key: block, rate_limit: {unit: second, requests_per_unit: 0}}
  - {key: one_per_minute, rate_limit: {unit: minute, requests_per_unit: 1}}
`
	forEachServer(t, func(t *testing.T, s target) {
		t.Parallel()
		root := t.TempDir()
		dir := filepath.Join(root, "ratelimit", "config")
		writeFile(t, filepath.Join(dir, "basic.yaml"), edgeConfig(50))
		p := s.start(t, fileEnv(t, root))
		c := dial(t, p.grpc)
		loads := func() float64 { return p.metric("/metrics", "ratelimit_service_config_load_success") }
		const ref = "testConfigReload"
		runSteps(t, c, []step{{descriptors("reload", d("block", "foo")), "OK: OK rem=0", ref + ": before reload.yaml"}})
		before := loads()
		writeFile(t, filepath.Join(dir, "reload.yaml"), reload)
		p.waitFor("reload.yaml to be loaded", func() bool { return loads() > before })
		runSteps(t, c, []step{{descriptors("reload", d("key1", "foo")), "OK: OK 50/SECOND rem=49 reset", ref + ": with reload.yaml"}})
		before = loads()
		if err := os.Remove(filepath.Join(dir, "reload.yaml")); err != nil {
			t.Fatal(err)
		}
		p.waitFor("the removal of reload.yaml to be loaded", func() bool { return loads() > before })
	})
}
