package rls_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
	"github.com/strictrate/strictrate/rls"
	"github.com/strictrate/strictrate/rls/config"
)

// server is the Valkey the tests share; they keep apart by key prefix. Tests that stop a
// server start their own.
var server *valkeytest.Server

func TestMain(m *testing.M) {
	os.Exit(valkeytest.RunWithServer(m, func(s *valkeytest.Server) { server = s }))
}

// mustConfig parses one YAML configuration file or fails the test.
func mustConfig(t testing.TB, yaml string) *config.Config {
	t.Helper()
	c, err := config.Parse([]config.File{{Name: "test.yaml", Data: []byte(yaml)}})
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return c
}

// serve starts svc on a real gRPC server on loopback and returns Envoy's client for it; both
// stop when the test ends.
func serve(t testing.TB, svc *rls.Service) pb.RateLimitServiceClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterRateLimitServiceServer(g, svc)
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pb.NewRateLimitServiceClient(conn)
}

// newService is a service on the shared server with the given configuration, a key prefix of
// its own and requestTimeout, served over gRPC; the engine takes e's options.
func newService(t testing.TB, yaml string, opts []rls.Option, eopts ...engine.Option) (pb.RateLimitServiceClient, *rls.Service) {
	t.Helper()
	e := enginetest.New(t, server.Client(t), eopts...)
	svc := rls.New(e, append([]rls.Option{rls.WithKeyPrefix(t.Name() + uuid.NewString() + ":"), rls.WithRequestTimeout(requestTimeout)}, opts...)...)
	svc.SetConfig(mustConfig(t, yaml))
	return serve(t, svc), svc
}

// descriptor is a descriptor of key/value pairs.
func descriptor(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// ask sends one request as Envoy does and fails the test on an error.
func ask(t testing.TB, c pb.RateLimitServiceClient, domain string, hits uint32, ds ...*rlv3.RateLimitDescriptor) *pb.RateLimitResponse {
	t.Helper()
	resp, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

func wantCode(t testing.TB, what string, resp *pb.RateLimitResponse, want pb.RateLimitResponse_Code, descriptors ...pb.RateLimitResponse_Code) {
	t.Helper()
	if resp.OverallCode != want {
		t.Fatalf("%s: overall %s, want %s (%v)", what, resp.OverallCode, want, resp)
	}
	for i, w := range descriptors {
		if got := resp.Statuses[i].Code; got != w {
			t.Fatalf("%s: descriptor %d %s, want %s (%v)", what, i, got, w, resp)
		}
	}
}

const (
	ok   = pb.RateLimitResponse_OK
	over = pb.RateLimitResponse_OVER_LIMIT
)

const basicConfig = `
domain: edge
descriptors:
  - key: one_per_minute
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: three_per_minute
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: five_per_minute
    rate_limit: {unit: minute, requests_per_unit: 5, name: five}
  - key: ten_per_minute
    rate_limit: {unit: minute, requests_per_unit: 10}
`

// A request that one descriptor denies consumes nothing of the others (envoyproxy/ratelimit
// #1060): three requests carrying a full 1-per-minute descriptor and a 3-per-minute one are
// denied, and the 3-per-minute descriptor still has all of its room.
func TestDeniedRequestConsumesNothing(t *testing.T) {
	c, _ := newService(t, basicConfig, nil)
	full, three := descriptor("one_per_minute", "a"), descriptor("three_per_minute", "a")
	wantCode(t, "first", ask(t, c, "edge", 0, full), ok, ok)
	for i := range 3 {
		resp := ask(t, c, "edge", 0, full, three)
		wantCode(t, fmt.Sprintf("request %d with the full descriptor", i+1), resp, over, over, ok)
		if got := resp.Statuses[1].LimitRemaining; got != 3 {
			t.Fatalf("request %d: the 3-per-minute descriptor reports %d remaining, want 3 (nothing consumed)", i+1, got)
		}
	}
	for i := range 3 {
		resp := ask(t, c, "edge", 0, three)
		wantCode(t, fmt.Sprintf("3-per-minute alone, %d", i+1), resp, ok, ok)
		if got := resp.Statuses[0].LimitRemaining; got != uint32(2-i) {
			t.Fatalf("3-per-minute alone, %d: %d remaining, want %d", i+1, got, 2-i)
		}
	}
	wantCode(t, "3-per-minute, fourth", ask(t, c, "edge", 0, three), over, over)
}

// hits_addend is the cost: 4 then 4 then 1 against 5 per minute admits the first and the
// third; the denied 4 is not counted. A descriptor's own hits_addend overrides the request's,
// and 0 checks without counting.
func TestHitsAddend(t *testing.T) {
	c, _ := newService(t, basicConfig, nil)
	d := descriptor("five_per_minute", "x")
	for i, step := range []struct {
		hits      uint32
		code      pb.RateLimitResponse_Code
		remaining uint32
	}{{4, ok, 1}, {4, over, 0}, {1, ok, 0}, {1, over, 0}} {
		resp := ask(t, c, "edge", step.hits, d)
		wantCode(t, fmt.Sprintf("step %d (%d hits)", i+1, step.hits), resp, step.code, step.code)
		if got := resp.Statuses[0].LimitRemaining; got != step.remaining {
			t.Fatalf("step %d: remaining %d, want %d", i+1, got, step.remaining)
		}
		if l := resp.Statuses[0].CurrentLimit; l.GetRequestsPerUnit() != 5 || l.GetUnit() != pb.RateLimitResponse_RateLimit_MINUTE || l.GetName() != "five" {
			t.Fatalf("step %d: current_limit %v", i+1, l)
		}
	}

	d = descriptor("ten_per_minute", "y")
	check := &rlv3.RateLimitDescriptor{Entries: d.Entries, HitsAddend: wrapperspb.UInt64(0)}
	heavy := &rlv3.RateLimitDescriptor{Entries: d.Entries, HitsAddend: wrapperspb.UInt64(7)}
	for range 3 {
		wantCode(t, "check only", ask(t, c, "edge", 5, check), ok, ok)
	}
	resp := ask(t, c, "edge", 1, heavy) // the descriptor's 7, not the request's 1
	if got := resp.Statuses[0].LimitRemaining; got != 3 {
		t.Fatalf("after a descriptor hits_addend of 7: remaining %d, want 3", got)
	}
	if got := ask(t, c, "edge", 0, check).Statuses[0].LimitRemaining; got != 3 {
		t.Fatalf("a check: remaining %d, want 3", got)
	}
	wantCode(t, "11 hits against 10", ask(t, c, "edge", 11, descriptor("ten_per_minute", "z")), over, over)
}

// Requests carrying an unknown domain, or descriptors no rule matches, are OK and limit
// nothing; an empty domain or descriptor list is an error.
func TestUnmatchedAndInvalid(t *testing.T) {
	c, _ := newService(t, basicConfig, nil)
	for range 3 {
		wantCode(t, "unknown domain", ask(t, c, "nowhere", 0, descriptor("one_per_minute", "a")), ok, ok)
		resp := ask(t, c, "edge", 0, descriptor("no_such_key", "a"))
		wantCode(t, "no rule", resp, ok, ok)
		if resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("no rule: current_limit %v", resp.Statuses[0].CurrentLimit)
		}
	}
	for _, req := range []*pb.RateLimitRequest{
		{Descriptors: []*rlv3.RateLimitDescriptor{descriptor("a", "b")}},
		{Domain: "edge"},
	} {
		if _, err := c.ShouldRateLimit(context.Background(), req); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("%v: %v, want InvalidArgument", req, err)
		}
	}
}

// 64 concurrent callers on one descriptor: exactly the limit is admitted, and never more than
// the limit in any trailing minute of the decisions' times.
func TestExactUnderConcurrency(t *testing.T) {
	c, _ := newService(t, basicConfig, nil)
	const callers, each, limit = 64, 4, 10
	var (
		mu       sync.Mutex
		admitted []time.Time
		wg       sync.WaitGroup
	)
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				resp, err := c.ShouldRateLimit(context.Background(), &pb.RateLimitRequest{Domain: "edge",
					Descriptors: []*rlv3.RateLimitDescriptor{descriptor("ten_per_minute", "hot")}})
				if err != nil {
					t.Error(err)
					return
				}
				if resp.OverallCode == ok {
					mu.Lock()
					admitted = append(admitted, time.Now())
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if len(admitted) != limit {
		t.Fatalf("%d of %d requests admitted, want exactly %d", len(admitted), callers*each, limit)
	}
}

// sortTimes sorts times in place.
func sortTimes(ts []time.Time) { sort.Slice(ts, func(i, j int) bool { return ts[i].Before(ts[j]) }) }

// 10 requests in the last second before a minute boundary and 10 in the first second after
// it, against 10 per minute: the reference admits 20 within about a second; the sliding window
// admits the first 10 and denies the next 10, and admits again only a minute after the first.
func TestMinuteBoundary(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	svc := rls.New(e, rls.WithKeyPrefix(t.Name()+uuid.NewString()+":"), rls.WithRequestTimeout(requestTimeout))
	svc.SetConfig(mustConfig(t, basicConfig))
	c := serve(t, svc)
	boundary := enginetest.T0.Truncate(time.Minute).Add(time.Minute)
	d := descriptor("ten_per_minute", "boundary")
	var admitted []time.Time
	for i := range 20 {
		at := boundary.Add(-time.Second + time.Duration(i)*100*time.Millisecond) // 10 before, 10 after
		clock.Set(at)
		if ask(t, c, "edge", 0, d).OverallCode == ok {
			admitted = append(admitted, at)
		}
	}
	if len(admitted) != 10 {
		t.Fatalf("%d admitted across the boundary, want 10: %v", len(admitted), admitted)
	}
	clock.Set(admitted[0].Add(time.Minute - time.Millisecond))
	wantCode(t, "just before the first leaves the window", ask(t, c, "edge", 0, d), over, over)
	clock.Set(admitted[0].Add(time.Minute))
	wantCode(t, "a minute after the first", ask(t, c, "edge", 0, d), ok, ok)
	// The audit: never more than 10 in any trailing minute.
	all := append(admitted, admitted[0].Add(time.Minute))
	for i := range all {
		n := 0
		for _, u := range all {
			if !u.After(all[i]) && u.After(all[i].Add(-time.Minute)) {
				n++
			}
		}
		if n > 10 {
			t.Fatalf("%d admitted in the minute up to %s", n, all[i])
		}
	}
}

const rulesConfig = `
domain: rules
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: minute, requests_per_unit: 1}
      - key: path
        value: /api/*
        rate_limit: {unit: minute, requests_per_unit: 2}
      - key: path
        value: /shared/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 2}
      - key: path
        value: /free
  - key: internal
    rate_limit: {unlimited: true}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per_user}
  - key: plan
    value: premium
    rate_limit:
      unit: minute
      requests_per_unit: 4
      replaces:
        - name: per_user
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// Nested descriptors, the most specific entry, wildcards with and without share_threshold,
// a value without rate_limit, unlimited, replaces and shadow rules behave as the reference
// matches them, and are decided exactly.
func TestRules(t *testing.T) {
	c, _ := newService(t, rulesConfig, nil)
	t.Run("nested", func(t *testing.T) {
		login := descriptor("remote_address", "10.0.0.1", "path", "/login")
		wantCode(t, "first login", ask(t, c, "rules", 0, login), ok, ok)
		wantCode(t, "second login", ask(t, c, "rules", 0, login), over, over)
		other := descriptor("remote_address", "10.0.0.2", "path", "/login")
		wantCode(t, "another address", ask(t, c, "rules", 0, other), ok, ok)
	})
	t.Run("wildcard", func(t *testing.T) {
		for _, p := range []string{"/api/a", "/api/b"} { // a counter per value
			d := descriptor("remote_address", "10.0.0.3", "path", p)
			wantCode(t, p+" 1", ask(t, c, "rules", 0, d), ok, ok)
			wantCode(t, p+" 2", ask(t, c, "rules", 0, d), ok, ok)
			wantCode(t, p+" 3", ask(t, c, "rules", 0, d), over, over)
		}
		wantCode(t, "shared 1", ask(t, c, "rules", 0, descriptor("remote_address", "10.0.0.3", "path", "/shared/a")), ok)
		wantCode(t, "shared 2", ask(t, c, "rules", 0, descriptor("remote_address", "10.0.0.3", "path", "/shared/b")), ok)
		wantCode(t, "shared 3", ask(t, c, "rules", 0, descriptor("remote_address", "10.0.0.3", "path", "/shared/c")), over)
	})
	t.Run("no rate_limit", func(t *testing.T) {
		d := descriptor("remote_address", "10.0.0.4", "path", "/free")
		for range 5 {
			resp := ask(t, c, "rules", 0, d)
			wantCode(t, "/free", resp, ok, ok)
		}
	})
	t.Run("unlimited", func(t *testing.T) {
		for range 5 {
			resp := ask(t, c, "rules", 0, descriptor("internal", "x"))
			wantCode(t, "unlimited", resp, ok, ok)
			if resp.Statuses[0].LimitRemaining != 1<<32-1 {
				t.Fatalf("unlimited: remaining %d", resp.Statuses[0].LimitRemaining)
			}
		}
	})
	t.Run("replaces", func(t *testing.T) {
		user, premium := descriptor("user", "u1"), descriptor("plan", "premium")
		for i := range 4 {
			wantCode(t, fmt.Sprintf("premium user %d", i+1), ask(t, c, "rules", 0, user, premium), ok, ok, ok)
		}
		wantCode(t, "premium user 5", ask(t, c, "rules", 0, user, premium), over, ok, over)
		// Replaced, the per-user rule counted nothing: u1 alone still has its 2.
		wantCode(t, "u1 alone 1", ask(t, c, "rules", 0, user), ok)
		wantCode(t, "u1 alone 2", ask(t, c, "rules", 0, user), ok)
		wantCode(t, "u1 alone 3", ask(t, c, "rules", 0, user), over)
	})
	t.Run("shadow", func(t *testing.T) {
		trial := descriptor("trial", "t1")
		for i := range 3 {
			wantCode(t, fmt.Sprintf("shadow %d", i+1), ask(t, c, "rules", 0, trial), ok, ok)
		}
		// A shadow rule over its limit does not deny the request's other descriptors.
		other := descriptor("user", "u-shadow")
		wantCode(t, "shadow beside a limited one", ask(t, c, "rules", 0, trial, other), ok, ok, ok)
		wantCode(t, "the limited one counted", ask(t, c, "rules", 0, other), ok)
		wantCode(t, "the limited one full", ask(t, c, "rules", 0, other), over)
	})
}
