package grpclimit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/strictrate/strictrate/clientaddr"
	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/grpclimit"
	"github.com/strictrate/strictrate/httplimit"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// server is the Valkey the tests and the example share (the example finds it through
// VALKEY_ADDR); they keep apart by key prefix. Tests that stop a server start their own.
var server *valkeytest.Server

func TestMain(m *testing.M) {
	os.Exit(valkeytest.RunWithServer(m, func(s *valkeytest.Server) {
		server = s
		// The examples find the server where a reader's copy of them would: in VALKEY_ADDR.
		// Tests that need a server of their own ask for one with valkeytest.OwnServer.
		os.Setenv(valkeytest.EnvAddr, s.Addr)
	}))
}

// uniquePrefix is a key prefix no other test or run uses.
func uniquePrefix(tb testing.TB) string { return tb.Name() + ":" + uuid.NewString() + ":" }

// serve starts a real gRPC server on loopback with l's interceptors in front of the standard
// health service (unary Check, server-streaming Watch), and returns its address. It stops when
// the test ends.
func serve(t *testing.T, l *grpclimit.Limiter) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serveOn(t, l, ln)
	return ln.Addr().String()
}

// serveOn is serve on the listener ln.
func serveOn(t *testing.T, l *grpclimit.Limiter, ln net.Listener) {
	t.Helper()
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(l.UnaryServerInterceptor()), grpc.ChainStreamInterceptor(l.StreamServerInterceptor()))
	healthpb.RegisterHealthServer(s, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); s.Serve(ln) }()
	t.Cleanup(func() { s.Stop(); <-done })
}

// dial returns a client of the health service at addr, closed when the test ends.
func dial(t *testing.T, addr string) healthpb.HealthClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// check makes one unary call with the given outgoing metadata (name, value pairs) and returns
// its error and the header metadata it got.
func check(c healthpb.HealthClient, kv ...string) (metadata.MD, error) {
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), kv...), 10*time.Second)
	defer cancel()
	var header metadata.MD
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
	return header, err
}

// details reads a denial's RetryInfo and QuotaFailure as a client sees them.
func details(t *testing.T, err error) (*errdetails.RetryInfo, *errdetails.QuotaFailure) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		t.Fatalf("error %v, want ResourceExhausted", err)
	}
	var retry *errdetails.RetryInfo
	var quota *errdetails.QuotaFailure
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.RetryInfo:
			retry = d
		case *errdetails.QuotaFailure:
			quota = d
		}
	}
	if retry == nil || quota == nil || len(quota.GetViolations()) != 1 {
		t.Fatalf("details %v: want a RetryInfo and a QuotaFailure with one violation", st.Details())
	}
	return retry, quota
}

func one(t *testing.T, md metadata.MD, key string) string {
	t.Helper()
	if v := md.Get(key); len(v) == 1 {
		return v[0]
	}
	t.Fatalf("metadata %s: %q, want one value (all: %v)", key, md.Get(key), md)
	return ""
}

// Keyed by the peer's address on the caller's clock: the metadata on admitted and denied calls
// carries the RateLimit values (t when admitted: until the oldest event leaves the window), and
// a denial's details, read back by a real client, give the exact RetryAfter and name the limit.
func TestDenialDetailsAndMetadata(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	c := dial(t, serve(t, grpclimit.New(e, engine.Policy{{Max: 2, Window: time.Minute}}, grpclimit.WithKeyPrefix(uniquePrefix(t)))))

	md, err := check(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := one(t, md, "ratelimit-policy"); got != `"1m";q=2;w=60` {
		t.Fatalf("ratelimit-policy %q", got)
	}
	if got := one(t, md, "ratelimit"); got != `"1m";r=1;t=60` {
		t.Fatalf("first call: ratelimit %q", got)
	}
	clock.Set(enginetest.T0.Add(20 * time.Second))
	if md, err = check(c); err != nil || one(t, md, "ratelimit") != `"1m";r=0;t=40` {
		t.Fatalf("second call: %v, ratelimit %q; want t=40, when the first event leaves", err, md.Get("ratelimit"))
	}
	clock.Set(enginetest.T0.Add(30*time.Second + 123*time.Microsecond))
	md, err = check(c)
	retry, quota := details(t, err)
	if got := retry.GetRetryDelay().AsDuration(); got != 30*time.Second-123*time.Microsecond {
		t.Fatalf("RetryInfo delay %s, want exactly 29.999877s", got)
	}
	v := quota.GetViolations()[0]
	if v.GetQuotaId() != "1m" || v.GetQuotaValue() != 2 || v.GetSubject() != "clientip:127.0.0.1" || v.GetDescription() == "" {
		t.Fatalf("QuotaFailure violation %v: want quota 1m of 2 for clientip:127.0.0.1", v)
	}
	if got := one(t, md, "ratelimit"); got != `"1m";r=0;t=30` {
		t.Fatalf("denied call: ratelimit %q", got)
	}
	if got := one(t, md, "ratelimit-policy"); got != `"1m";q=2;w=60` {
		t.Fatalf("denied call: ratelimit-policy %q", got)
	}
}

// Streams are decided when they open: an admitted Watch streams with the metadata, a denied
// one ends with ResourceExhausted and its details before any message.
func TestStreamInterceptor(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	c := dial(t, serve(t, grpclimit.New(e, engine.Policy{engine.PerHour(1)}, grpclimit.WithKeyPrefix(uniquePrefix(t)))))
	watch := func() (metadata.MD, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		stream, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return nil, err
		}
		if _, err := stream.Recv(); err != nil {
			md, _ := stream.Header()
			return md, err
		}
		return stream.Header()
	}
	md, err := watch()
	if err != nil || one(t, md, "ratelimit") != `"1h";r=0;t=3600` {
		t.Fatalf("first stream: %v, ratelimit %q", err, md.Get("ratelimit"))
	}
	md, err = watch()
	retry, quota := details(t, err)
	if d := retry.GetRetryDelay().AsDuration(); d <= 0 || d > time.Hour || quota.GetViolations()[0].GetQuotaId() != "1h" {
		t.Fatalf("denied stream: retry %s, %v", d, quota)
	}
	if !strings.HasPrefix(one(t, md, "ratelimit"), `"1h";r=0;t=`) {
		t.Fatalf("denied stream: ratelimit %q", md.Get("ratelimit"))
	}
}

// Many clients at once, on separate connections, for one key: exactly Max calls are admitted,
// each with a different r, and every other gets ResourceExhausted with its details.
func TestExactUnderConcurrentClients(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	p := engine.Policy{{Max: 20, Window: time.Hour}, {Max: 30, Window: 2 * time.Hour}}
	addr := serve(t, grpclimit.New(e, p, grpclimit.WithKeyPrefix(uniquePrefix(t)), grpclimit.WithKeyMetadata("X-Tenant")))
	const conns, workers, calls = 4, 16, 200
	var clients []healthpb.HealthClient
	for range conns {
		clients = append(clients, dial(t, addr))
	}
	var (
		mu        sync.Mutex
		remaining []int
		denied    int
		wg        sync.WaitGroup
		jobs      = make(chan int, calls)
		errs      = make(chan error, calls)
	)
	for i := range calls {
		jobs <- i
	}
	close(jobs)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				md, err := check(clients[w%conns], "x-tenant", "acme")
				rl := md.Get("ratelimit")
				if len(rl) != 1 {
					errs <- fmt.Errorf("ratelimit metadata %q (error %v)", rl, err)
					return
				}
				if err == nil {
					r, convErr := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(rl[0], `"1h";r=`), ";t=3600"))
					if convErr != nil {
						errs <- fmt.Errorf("admitted ratelimit %q", rl[0])
						return
					}
					mu.Lock()
					remaining = append(remaining, r)
					mu.Unlock()
					continue
				}
				st := status.Convert(err)
				if st.Code() != codes.ResourceExhausted || len(st.Details()) != 2 {
					errs <- fmt.Errorf("denied call: %v with %d details", err, len(st.Details()))
					return
				}
				mu.Lock()
				denied++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	sort.Ints(remaining)
	if len(remaining) != 20 || denied != calls-20 {
		t.Fatalf("%d admitted, %d denied; want 20 and %d", len(remaining), denied, calls-20)
	}
	for i, r := range remaining {
		if r != i {
			t.Fatalf("admitted r values %v: want each of 0..19 once", remaining)
		}
	}
}

// Keys: metadata, a function, and the forwarded address behind a trusted proxy (an IPv6
// client by its /64); a call without a key is InvalidArgument.
func TestKeys(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	l := engine.PerHour(1)
	byMeta := dial(t, serve(t, grpclimit.New(e, engine.Policy{l}, grpclimit.WithKeyPrefix(uniquePrefix(t)), grpclimit.WithKeyMetadata("x-api-key"))))
	if _, err := check(byMeta, "x-api-key", "a"); err != nil {
		t.Fatal(err)
	}
	_, err := check(byMeta, "x-api-key", "a")
	if _, quota := details(t, err); quota.GetViolations()[0].GetSubject() != "metadata:x-api-key" {
		t.Fatalf("subject %q: want the metadata's name, not its value", quota.GetViolations()[0].GetSubject())
	}
	if _, err := check(byMeta, "x-api-key", "b"); err != nil {
		t.Fatalf("another key: %v", err)
	}
	if _, err := check(byMeta); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("no key: %v, want InvalidArgument", err)
	}

	errNoUser := errors.New("no user")
	byFunc := dial(t, serve(t, grpclimit.New(e, engine.Policy{l}, grpclimit.WithKeyPrefix(uniquePrefix(t)),
		grpclimit.WithKeyFunc(func(ctx context.Context, method string) (string, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			if u := md.Get("user"); len(u) == 1 {
				return method + ":" + u[0], nil
			}
			return "", errNoUser
		}))))
	if _, err := check(byFunc, "user", "ann"); err != nil {
		t.Fatal(err)
	}
	if _, err := check(byFunc, "user", "ann"); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("ann again: %v", err)
	}
	if _, err := check(byFunc); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "no user") {
		t.Fatalf("key function error: %v, want InvalidArgument naming it", err)
	}

	proxied := dial(t, serve(t, grpclimit.New(e, engine.Policy{l}, grpclimit.WithKeyPrefix(uniquePrefix(t)),
		grpclimit.WithTrustedProxies(netip.MustParsePrefix("127.0.0.0/8")))))
	if _, err := check(proxied, "x-forwarded-for", "2001:db8:5:5::1"); err != nil {
		t.Fatal(err)
	}
	_, err = check(proxied, "x-forwarded-for", "2001:db8:5:5:9::9, 127.0.0.2")
	if _, quota := details(t, err); quota.GetViolations()[0].GetSubject() != "clientip:2001:db8:5:5::/64" {
		t.Fatalf("the same /64 behind the proxy: subject %q", quota.GetViolations()[0].GetSubject())
	}
	if _, err := check(proxied, "x-forwarded-for", "2001:db8:5:6::1"); err != nil {
		t.Fatalf("another /64: %v", err)
	}
}

// With the server down a fail-closed engine answers Unavailable; a fail-open one lets the
// call through with ratelimit-policy but no ratelimit, and the hook sees the error.
func TestBackendDown(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	p := engine.Policy{engine.PerSecond(5), engine.PerHour(100)}
	closed := dial(t, serve(t, grpclimit.New(enginetest.New(t, c), p)))
	var hookErr error
	var hookMethod string
	open := dial(t, serve(t, grpclimit.New(enginetest.New(t, c, engine.WithFailOpen(true)), p,
		grpclimit.WithFailOpenHook(func(_ context.Context, method string, err error) { hookMethod, hookErr = method, err }))))
	if _, err := check(closed); err != nil {
		t.Fatalf("server up: %v", err)
	}
	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := check(closed); status.Code(err) != codes.Unavailable {
		t.Fatalf("fail-closed, server down: %v, want Unavailable", err)
	}
	md, err := check(open)
	if err != nil {
		t.Fatalf("fail-open, server down: %v", err)
	}
	if len(md.Get("ratelimit")) != 0 || one(t, md, "ratelimit-policy") != `"1s";q=5;w=1, "1h";q=100;w=3600` {
		t.Fatalf("fail-open metadata %v: want ratelimit-policy and no ratelimit", md)
	}
	if !errors.Is(hookErr, engine.ErrUnavailable) || hookMethod != "/grpc.health.v1.Health/Check" {
		t.Fatalf("fail-open hook got %q, %v", hookMethod, hookErr)
	}
}

// New refuses a nil engine, an invalid policy and out-of-range options at once.
func TestNewPanics(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	for name, f := range map[string]func(){
		"nil engine":       func() { grpclimit.New(nil, engine.Policy{engine.PerSecond(1)}) },
		"empty policy":     func() { grpclimit.New(e, nil) },
		"IPv6 prefix 0":    func() { grpclimit.New(e, engine.Policy{engine.PerSecond(1)}, grpclimit.WithIPv6Prefix(0)) },
		"unknown revision": func() { grpclimit.New(e, engine.Policy{engine.PerSecond(1)}, grpclimit.WithFieldsVersion(3)) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: New did not panic", name)
				}
			}()
			f()
		}()
	}
}

// A key of MaxKeyLength bytes is taken; one byte more is InvalidArgument, whose message is
// ErrKey's and the reason (the same as httplimit's but for ErrKey, which is not httplimit's).
func TestKeyLength(t *testing.T) {
	if errors.Is(grpclimit.ErrKey, httplimit.ErrKey) || errors.Is(httplimit.ErrKey, grpclimit.ErrKey) {
		t.Fatal("grpclimit.ErrKey and httplimit.ErrKey match each other")
	}
	e := enginetest.New(t, server.Client(t))
	c := dial(t, serve(t, grpclimit.New(e, engine.Policy{engine.PerHour(5)}, grpclimit.WithKeyPrefix(uniquePrefix(t)),
		grpclimit.WithKeyMetadata("x-api-key"))))
	if _, err := check(c, "x-api-key", strings.Repeat("k", grpclimit.MaxKeyLength)); err != nil {
		t.Fatalf("a key of MaxKeyLength bytes: %v", err)
	}
	_, err := check(c, "x-api-key", strings.Repeat("k", grpclimit.MaxKeyLength+1))
	want := grpclimit.ErrKey.Error() + ": key of 513 bytes, more than 512"
	if st := status.Convert(err); st.Code() != codes.InvalidArgument || st.Message() != want {
		t.Fatalf("a key of MaxKeyLength+1 bytes: %v; want InvalidArgument %q", err, want)
	}
}

// On a Unix-socket listener the peer has no IP address: without WithTrustedUnixSocket a call
// is InvalidArgument with a message that says what to do; with it the proxy on the socket is
// trusted and its forwarding metadata keys each client, or UnixSocketKey when it sends none.
func TestUnixSocket(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	unix := func(opts ...grpclimit.Option) healthpb.HealthClient {
		path := filepath.Join(t.TempDir(), "grpc.sock")
		ln, err := net.Listen("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		serveOn(t, grpclimit.New(e, engine.Policy{engine.PerHour(1)}, append(opts, grpclimit.WithKeyPrefix(uniquePrefix(t)))...), ln)
		return dial(t, "unix://"+path)
	}
	plain := unix()
	_, err := check(plain, "x-forwarded-for", "203.0.113.9")
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "WithTrustedUnixSocket") ||
		!strings.Contains(err.Error(), "WithKeyMetadata") {
		t.Fatalf("without WithTrustedUnixSocket: %v; want InvalidArgument naming WithTrustedUnixSocket and WithKeyMetadata", err)
	}

	trusted := unix(grpclimit.WithTrustedUnixSocket())
	for _, step := range []struct {
		what    string
		md      []string
		subject string // of the denial; "" when admitted
	}{
		{"a client", []string{"x-forwarded-for", "203.0.113.9"}, ""},
		{"the client again", []string{"x-forwarded-for", "203.0.113.9"}, "clientip:203.0.113.9"},
		{"another client", []string{"x-forwarded-for", "203.0.113.10"}, ""},
		{"no forwarding metadata", nil, ""},
		{"no forwarding metadata again", nil, "clientip:" + clientaddr.UnixSocketKey},
	} {
		_, err := check(trusted, step.md...)
		if step.subject == "" {
			if err != nil {
				t.Fatalf("%s: %v", step.what, err)
			}
			continue
		}
		if _, quota := details(t, err); quota.GetViolations()[0].GetSubject() != step.subject {
			t.Fatalf("%s: subject %q, want %q", step.what, quota.GetViolations()[0].GetSubject(), step.subject)
		}
	}
}

// Under fail-open, a client's own deadline never reaches the handler past a used-up limit,
// through the interceptor called directly with a context whose deadline has passed (what
// grpc-go hands it once a call's grpc-timeout has run out) and through a real gRPC server on
// the loopback, called with deadlines of 0.1 to 3 ms: the handler runs 0 times, with Valkey
// healthy all along.
func TestFailOpenShortDeadlinesNeverReachTheHandler(t *testing.T) {
	c := server.Client(t)
	e := enginetest.New(t, c, engine.WithFailOpen(true))
	p := engine.Policy{engine.PerHour(3)}
	var hooked atomic.Int64
	l := grpclimit.New(e, p, grpclimit.WithKeyMetadata("x-api-key"),
		grpclimit.WithKeyPrefix(uniquePrefix(t)), grpclimit.WithFailOpenHook(func(context.Context, string, error) { hooked.Add(1) }))
	var handled atomic.Int64
	handler := func(context.Context, any) (any, error) { handled.Add(1); return &healthpb.HealthCheckResponse{}, nil }
	info := &grpc.UnaryServerInfo{FullMethod: "/grpc.health.v1.Health/Check"}
	incoming := func(ctx context.Context) context.Context {
		return metadata.NewIncomingContext(ctx, metadata.Pairs("x-api-key", "victim"))
	}
	for range p[0].Max {
		if _, err := l.UnaryServerInterceptor()(incoming(context.Background()), nil, info, handler); err != nil {
			t.Fatal(err)
		}
	}
	handled.Store(0)

	expired, cancel := context.WithDeadline(incoming(context.Background()), time.Now().Add(-time.Microsecond))
	defer cancel()
	for i := range 100 {
		if _, err := l.UnaryServerInterceptor()(expired, nil, info, handler); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("call %d with a passed deadline: %v, want DeadlineExceeded", i, err)
		}
	}
	if n := handled.Load(); n != 0 {
		t.Fatalf("the handler ran %d times of 100 for calls whose deadline had passed, on a used-up limit; want 0", n)
	}

	// A real server: its handler counts every call that gets past the limiter.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	counting := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		handled.Add(1)
		return next(ctx, req)
	}
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(l.UnaryServerInterceptor(), counting))
	healthpb.RegisterHealthServer(s, health.NewServer())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ln) }()
	t.Cleanup(func() { s.Stop(); <-done })
	client := dial(t, ln.Addr().String())
	const calls = 2000
	var wg sync.WaitGroup
	var ok, exhausted, short atomic.Int64
	for g := range 16 {
		wg.Go(func() {
			for i := g; i < calls; i += 16 {
				deadline := 100*time.Microsecond + time.Duration(i%30)*100*time.Microsecond
				ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "victim"), deadline)
				_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
				cancel()
				switch status.Code(err) {
				case codes.OK:
					ok.Add(1)
				case codes.ResourceExhausted:
					exhausted.Add(1)
				case codes.DeadlineExceeded, codes.Canceled:
					short.Add(1)
				default:
					t.Errorf("call with a %s deadline: %v", deadline, err)
				}
			}
		})
	}
	wg.Wait()
	if n := handled.Load(); n != 0 || ok.Load() != 0 {
		t.Fatalf("over a real server, %d calls with deadlines of 0.1-3 ms ran the handler %d times and answered OK %d times, on a used-up limit; want 0",
			calls, n, ok.Load())
	}
	if hooked.Load() != 0 {
		t.Fatalf("the fail-open hook ran %d times with Valkey healthy; want 0", hooked.Load())
	}
	t.Logf("%d calls: %d denied, %d past their deadline", calls, exhausted.Load(), short.Load())
}
