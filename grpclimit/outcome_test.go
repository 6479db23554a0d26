package grpclimit_test

// Tests of WithRefundOn, WithResetOn and WithOutcomeErrorHook (outcome.go), through a real
// gRPC server on loopback and a real Valkey, and through the interceptors called directly
// where a real server cannot go (a panicking handler).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/strictrate/strictrate/clientkey"
	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/grpclimit"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// loginLimit is the limit of the outcome tests: 5 attempts per 15 minutes.
var loginLimit = engine.Limit{Max: 5, Window: 15 * time.Minute}

// checkMethod is the health service's unary method, as the interceptors see it.
const checkMethod = "/grpc.health.v1.Health/Check"

// loginServer is a health service whose calls are logins: the service name "right" is the
// right password and the call ends OK (Watch after one message), any other is Unauthenticated.
// reached counts the calls its handlers got; before, when set, runs first in each.
type loginServer struct {
	healthpb.UnimplementedHealthServer
	reached atomic.Int64
	before  func(ctx context.Context)
}

func (s *loginServer) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	s.reached.Add(1)
	if s.before != nil {
		s.before(ctx)
	}
	if req.GetService() != "right" {
		return nil, status.Error(codes.Unauthenticated, "wrong password")
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (s *loginServer) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	s.reached.Add(1)
	if req.GetService() != "right" {
		return status.Error(codes.Unauthenticated, "wrong password")
	}
	return stream.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

// serveLogin serves s behind l's interceptors on loopback until the test ends, and returns a
// client.
func serveLogin(t *testing.T, l *grpclimit.Limiter, s *loginServer) healthpb.HealthClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(l.UnaryServerInterceptor()), grpc.ChainStreamInterceptor(l.StreamServerInterceptor()))
	healthpb.RegisterHealthServer(srv, s)
	done := make(chan struct{})
	go func() { defer close(done); srv.Serve(ln) }()
	t.Cleanup(func() { srv.Stop(); <-done })
	return dial(t, ln.Addr().String())
}

// loginLimiter is a Limiter of loginLimit keyed by the "account" metadata, under prefix.
func loginLimiter(e *engine.Engine, prefix string, opts ...grpclimit.Option) *grpclimit.Limiter {
	return grpclimit.New(e, engine.Policy{loginLimit},
		append([]grpclimit.Option{grpclimit.WithKeyPrefix(prefix), grpclimit.WithKeyMetadata("account")}, opts...)...)
}

// attempt makes one unary login and returns its code: the call has ended, and the
// interceptor's refund or reset is done, by then.
func attempt(c healthpb.HealthClient, account, password string) codes.Code {
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "account", account), 10*time.Second)
	defer cancel()
	_, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: password})
	return status.Code(err)
}

// watch makes one streaming login and returns the code the stream ended with, read to its end.
func watch(c healthpb.HealthClient, account, password string) codes.Code {
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "account", account), 10*time.Second)
	defer cancel()
	stream, err := c.Watch(ctx, &healthpb.HealthCheckRequest{Service: password})
	if err != nil {
		return status.Code(err)
	}
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return codes.OK
			}
			return status.Code(err)
		}
	}
}

// attemptAll makes n logins at once with call and returns how many ended with each code.
func attemptAll(call func(healthpb.HealthClient, string, string) codes.Code, c healthpb.HealthClient, account, password string, n int) map[codes.Code]int {
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		got   = map[codes.Code]int{}
		start = make(chan struct{})
	)
	for range n {
		wg.Go(func() {
			<-start
			code := call(c, account, password)
			mu.Lock()
			got[code]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	return got
}

// wantAttempts fails t unless n logins in a row with call all end with want.
func wantAttempts(t *testing.T, call func(healthpb.HealthClient, string, string) codes.Code, c healthpb.HealthClient, account, password string, n int, want codes.Code) {
	t.Helper()
	for i := range n {
		if got := call(c, account, password); got != want {
			t.Fatalf("%s, %s, login %d: %s, want %s", account, password, i+1, got, want)
		}
	}
}

// wantRemaining fails t unless the account's key under prefix admits want more.
func wantRemaining(t *testing.T, e *engine.Engine, prefix, account string, want int) {
	t.Helper()
	key := clientkey.Prefix(prefix, engine.Policy{loginLimit}) + account
	if got := enginetest.MustPeek(t, e, key, loginLimit).Remaining; got != want {
		t.Fatalf("%s: %d remaining, want %d", account, got, want)
	}
}

// The core properties, unary and streaming: 100 wrong passwords at once reach the handler
// exactly Max times; OK is refunded, so any number of successful logins leave the count as it
// was; WithResetOn(OK) clears it.
func TestOutcomes(t *testing.T) {
	for _, kind := range []struct {
		name string
		call func(healthpb.HealthClient, string, string) codes.Code
	}{{"unary", attempt}, {"stream", watch}} {
		t.Run(kind.name+"/refund", func(t *testing.T) {
			e := enginetest.New(t, server.Client(t))
			prefix := uniquePrefix(t)
			var s loginServer
			c := serveLogin(t, loginLimiter(e, prefix, grpclimit.WithRefundOn(func(c codes.Code) bool { return c == codes.OK })), &s)

			got := attemptAll(kind.call, c, "alice", "wrong", 100)
			if s.reached.Load() != 5 || got[codes.Unauthenticated] != 5 || got[codes.ResourceExhausted] != 95 {
				t.Fatalf("100 wrong passwords at once: handler reached %d times, codes %v; want 5 Unauthenticated, 95 ResourceExhausted",
					s.reached.Load(), got)
			}
			wantAttempts(t, kind.call, c, "alice", "right", 1, codes.ResourceExhausted)

			s.reached.Store(0)
			wantAttempts(t, kind.call, c, "bob", "right", 20, codes.OK)
			wantRemaining(t, e, prefix, "bob", 5)
			wantAttempts(t, kind.call, c, "bob", "wrong", 2, codes.Unauthenticated)
			wantAttempts(t, kind.call, c, "bob", "right", 10, codes.OK)
			wantRemaining(t, e, prefix, "bob", 3)
			got = attemptAll(kind.call, c, "bob", "wrong", 100)
			if reached := s.reached.Load() - 32; reached != 3 || got[codes.Unauthenticated] != 3 || got[codes.ResourceExhausted] != 97 {
				t.Fatalf("after 30 successes and 2 failures, 100 wrong passwords at once: handler reached %d times, codes %v; want 3",
					reached, got)
			}
		})
		t.Run(kind.name+"/reset", func(t *testing.T) {
			e := enginetest.New(t, server.Client(t))
			prefix := uniquePrefix(t)
			var s loginServer
			c := serveLogin(t, loginLimiter(e, prefix, grpclimit.WithResetOn(func(c codes.Code) bool { return c == codes.OK })), &s)
			wantAttempts(t, kind.call, c, "alice", "wrong", 3, codes.Unauthenticated)
			wantRemaining(t, e, prefix, "alice", 2)
			wantAttempts(t, kind.call, c, "alice", "right", 1, codes.OK)
			wantRemaining(t, e, prefix, "alice", 5)
			s.reached.Store(0)
			got := attemptAll(kind.call, c, "alice", "wrong", 100)
			if s.reached.Load() != 5 || got[codes.Unauthenticated] != 5 {
				t.Fatalf("after the reset, 100 wrong passwords at once: handler reached %d times, codes %v; want 5",
					s.reached.Load(), got)
			}
		})
	}
}

// When both options match a code the key is reset: a refund alone would leave the failures.
func TestResetWinsOverRefund(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	prefix := uniquePrefix(t)
	ok := func(c codes.Code) bool { return c == codes.OK }
	c := serveLogin(t, loginLimiter(e, prefix, grpclimit.WithRefundOn(ok), grpclimit.WithResetOn(ok)), &loginServer{})
	wantAttempts(t, attempt, c, "alice", "wrong", 3, codes.Unauthenticated)
	wantAttempts(t, attempt, c, "alice", "right", 1, codes.OK)
	wantRemaining(t, e, prefix, "alice", 5)
}

// The code is the one the client gets: OK for nil, a status error's (wrapped or not), a
// context error's, else Unknown.
func TestOutcomeCode(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	info := &grpc.UnaryServerInfo{FullMethod: checkMethod}
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{nil, codes.OK},
		{status.Error(codes.PermissionDenied, "no"), codes.PermissionDenied},
		{fmt.Errorf("login: %w", status.Error(codes.NotFound, "no such account")), codes.NotFound},
		{context.Canceled, codes.Canceled},
		{fmt.Errorf("login: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{errors.New("plain"), codes.Unknown},
	} {
		var got []codes.Code
		l := loginLimiter(e, uniquePrefix(t), grpclimit.WithRefundOn(func(c codes.Code) bool { got = append(got, c); return false }))
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("account", "alice"))
		_, err := l.UnaryServerInterceptor()(ctx, nil, info, func(context.Context, any) (any, error) { return nil, tc.err })
		if err != tc.err {
			t.Fatalf("the interceptor returned %v, want the handler's %v", err, tc.err)
		}
		if len(got) != 1 || got[0] != tc.want {
			t.Fatalf("handler error %v: refund asked about %v, want [%s]", tc.err, got, tc.want)
		}
	}
}

// Never refunded: a panicking handler (the panic goes on), a call shadow mode admitted over
// the limit, one a fail-open engine admitted without deciding.
func TestOutcomeNeverForUncountedCalls(t *testing.T) {
	always := func(asked *atomic.Int64) func(codes.Code) bool {
		return func(codes.Code) bool { asked.Add(1); return true }
	}
	info := &grpc.UnaryServerInfo{FullMethod: checkMethod}
	incoming := metadata.NewIncomingContext(context.Background(), metadata.Pairs("account", "alice"))

	t.Run("panic", func(t *testing.T) {
		e := enginetest.New(t, server.Client(t))
		prefix := uniquePrefix(t)
		var asked atomic.Int64
		l := loginLimiter(e, prefix, grpclimit.WithRefundOn(always(&asked)), grpclimit.WithResetOn(always(&asked)))
		boom := errors.New("boom")
		func() {
			defer func() {
				if p := recover(); p != boom {
					t.Fatalf("recovered %v, want the handler's panic", p)
				}
			}()
			l.UnaryServerInterceptor()(incoming, nil, info, func(context.Context, any) (any, error) { panic(boom) })
		}()
		func() {
			defer func() {
				if p := recover(); p != boom {
					t.Fatalf("stream: recovered %v, want the handler's panic", p)
				}
			}()
			l.StreamServerInterceptor()(nil, fakeStream{ctx: incoming}, &grpc.StreamServerInfo{FullMethod: "/grpc.health.v1.Health/Watch"},
				func(any, grpc.ServerStream) error { panic(boom) })
		}()
		if asked.Load() != 0 {
			t.Fatal("outcome asked about a panicking handler")
		}
		wantRemaining(t, e, prefix, "alice", 3)
	})

	t.Run("shadow", func(t *testing.T) {
		e := enginetest.New(t, server.Client(t), engine.WithShadow(true))
		prefix := uniquePrefix(t)
		var got []codes.Code
		var hooked error
		one := engine.Limit{Max: 1, Window: loginLimit.Window}
		l := grpclimit.New(e, engine.Policy{one}, grpclimit.WithKeyPrefix(prefix), grpclimit.WithKeyMetadata("account"),
			grpclimit.WithRefundOn(func(c codes.Code) bool { got = append(got, c); return c == codes.OK }),
			grpclimit.WithOutcomeErrorHook(func(_ context.Context, _ string, err error) { hooked = err }))
		c := serveLogin(t, l, &loginServer{})
		wantAttempts(t, attempt, c, "alice", "wrong", 1, codes.Unauthenticated)
		wantAttempts(t, attempt, c, "alice", "right", 1, codes.OK) // shadow-admitted over the limit
		if len(got) != 1 || got[0] != codes.Unauthenticated || hooked != nil {
			t.Fatalf("refund asked about %v, hook %v: want the recorded failure only", got, hooked)
		}
		if r := enginetest.MustPeek(t, e, clientkey.Prefix(prefix, engine.Policy{one})+"alice", one); r.Remaining != 0 {
			t.Fatalf("after a shadow admission: %+v, want the failure still counted", r)
		}
	})

	t.Run("fail-open", func(t *testing.T) {
		own := valkeytest.New(t, valkeytest.OwnServer())
		e := enginetest.New(t, own.Client(t), engine.WithFailOpen(true))
		var asked atomic.Int64
		var hooked error
		l := loginLimiter(e, uniquePrefix(t), grpclimit.WithRefundOn(always(&asked)), grpclimit.WithResetOn(always(&asked)),
			grpclimit.WithOutcomeErrorHook(func(_ context.Context, _ string, err error) { hooked = err }))
		c := serveLogin(t, l, &loginServer{})
		if err := own.Stop(); err != nil {
			t.Fatal(err)
		}
		wantAttempts(t, attempt, c, "alice", "right", 1, codes.OK)
		wantAttempts(t, watch, c, "alice", "right", 1, codes.OK)
		if asked.Load() != 0 || hooked != nil {
			t.Fatalf("fail-open admissions: outcome asked %d times, hook %v; want neither", asked.Load(), hooked)
		}
	})
}

// fakeStream is a server stream with a context and nothing else, for the stream interceptor
// called directly.
type fakeStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (f fakeStream) Context() context.Context    { return f.ctx }
func (f fakeStream) SetHeader(metadata.MD) error { return nil }

// A call whose client went away still gets its refund: it runs on the call's context without
// its cancellation.
func TestRefundAfterTheClientWentAway(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	prefix := uniquePrefix(t)
	var hooked error
	l := loginLimiter(e, prefix, grpclimit.WithRefundOn(func(c codes.Code) bool { return c == codes.OK }),
		grpclimit.WithOutcomeErrorHook(func(_ context.Context, _ string, err error) { hooked = err }))
	ctx, goAway := context.WithCancel(metadata.NewIncomingContext(context.Background(), metadata.Pairs("account", "alice")))
	defer goAway()
	_, err := l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: checkMethod},
		func(ctx context.Context, _ any) (any, error) {
			goAway()
			<-ctx.Done()
			return &healthpb.HealthCheckResponse{}, nil
		})
	if err != nil || hooked != nil {
		t.Fatalf("call: %v, hook %v", err, hooked)
	}
	wantRemaining(t, e, prefix, "alice", 5)
}

// A refund or a reset that fails goes to the hook, with the call's method and an error that
// wraps ErrRefund or ErrReset and the engine's; the call ends as its handler said.
func TestOutcomeFailure(t *testing.T) {
	t.Run("refund", func(t *testing.T) {
		c := server.Client(t)
		e := enginetest.New(t, c)
		prefix := uniquePrefix(t)
		var (
			mu      sync.Mutex
			methods []string
			hooked  []error
		)
		// The handler overwrites the key's log with a string, which Refund refuses to read.
		s := &loginServer{before: func(ctx context.Context) {
			full := enginetest.Prefix + clientkey.Prefix(prefix, engine.Policy{loginLimit}) + "alice"
			if err := c.Do(ctx, c.B().Set().Key(full).Value("not a log").Build()).Error(); err != nil {
				t.Error(err)
			}
		}}
		client := serveLogin(t, loginLimiter(e, prefix, grpclimit.WithRefundOn(func(c codes.Code) bool { return c == codes.OK }),
			grpclimit.WithOutcomeErrorHook(func(_ context.Context, method string, err error) {
				mu.Lock()
				defer mu.Unlock()
				methods, hooked = append(methods, method), append(hooked, err)
			})), s)
		wantAttempts(t, attempt, client, "alice", "right", 1, codes.OK)
		mu.Lock()
		defer mu.Unlock()
		if len(hooked) != 1 || methods[0] != checkMethod || !errors.Is(hooked[0], grpclimit.ErrRefund) ||
			errors.Is(hooked[0], grpclimit.ErrReset) || !errors.Is(hooked[0], engine.ErrUnknownLayout) {
			t.Fatalf("hook got %v for %v, want one error wrapping ErrRefund and engine.ErrUnknownLayout for %s", hooked, methods, checkMethod)
		}
	})

	t.Run("reset", func(t *testing.T) {
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{server.Addr}})
		if err != nil {
			t.Fatal(err)
		}
		e := enginetest.New(t, c)
		var hooked []error
		// The handler closes the engine's client: the reset cannot be sent.
		l := loginLimiter(e, uniquePrefix(t), grpclimit.WithResetOn(func(c codes.Code) bool { return c == codes.OK }),
			grpclimit.WithOutcomeErrorHook(func(_ context.Context, method string, err error) { hooked = append(hooked, err) }))
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("account", "alice"))
		want := &healthpb.HealthCheckResponse{}
		resp, err := l.UnaryServerInterceptor()(ctx, nil, &grpc.UnaryServerInfo{FullMethod: checkMethod},
			func(context.Context, any) (any, error) { c.Close(); return want, nil })
		if resp != want || err != nil {
			t.Fatalf("call: %v, %v; want the handler's answer", resp, err)
		}
		if len(hooked) != 1 || !errors.Is(hooked[0], grpclimit.ErrReset) || errors.Is(hooked[0], grpclimit.ErrRefund) ||
			!errors.Is(hooked[0], valkey.ErrClosing) {
			t.Fatalf("hook got %v, want one error wrapping ErrReset and the client's", hooked)
		}
	})
}
