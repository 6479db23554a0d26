package grpclimit_test

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/grpclimit"
)

// The examples connect to Valkey as a program would, each with a client of its own: at the
// address in VALKEY_ADDR (which examples/httpserver reads too), else 127.0.0.1:6379. TestMain
// sets VALKEY_ADDR to the tests' server (valkeytest starts a throwaway one unless VALKEY_ADDR
// already names a server), so that the examples run and their Output is checked. Each example
// keys its counts by a UUID prefix, so its output is the same on every run.

func ExampleNew() {
	// Valkey at $VALKEY_ADDR, else on this host's default port.
	client, err := valkey.NewClient(valkey.ClientOption{
		InitAddress: []string{cmp.Or(os.Getenv("VALKEY_ADDR"), "127.0.0.1:6379")},
	})
	if err != nil {
		panic(err)
	}
	defer client.Close()
	// A fixed clock makes the numbers below exact; by default the server's clock decides.
	noon := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	e, err := engine.New(client, engine.WithClock(func() time.Time { return noon }))
	if err != nil {
		panic(err)
	}

	// 2 per second and 100 per hour for each client address.
	limiter := grpclimit.New(e, engine.Policy{engine.PerSecond(2), engine.PerHour(100)},
		grpclimit.WithKeyPrefix("example:"+uuid.NewString()+":"))
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(limiter.UnaryServerInterceptor()),
		grpc.ChainStreamInterceptor(limiter.StreamServerInterceptor()),
	)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	go srv.Serve(ln)
	defer srv.Stop()

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		panic(err)
	}
	defer conn.Close()
	checker := healthpb.NewHealthClient(conn)
	for i := 0; i < 3; i++ {
		var header metadata.MD
		_, err := checker.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		if i == 0 {
			fmt.Println("ratelimit-policy:", header.Get("ratelimit-policy")[0])
		}
		fmt.Println("ratelimit:", header.Get("ratelimit")[0])
		if st, ok := status.FromError(err); ok && err != nil {
			fmt.Println(st.Code(), st.Message())
			for _, d := range st.Details() {
				switch d := d.(type) {
				case *errdetails.RetryInfo:
					fmt.Println("retry in", d.GetRetryDelay().AsDuration())
				case *errdetails.QuotaFailure:
					fmt.Println("limit", d.GetViolations()[0].GetQuotaId(), "of", d.GetViolations()[0].GetQuotaValue())
				}
			}
		}
	}
	// Output:
	// ratelimit-policy: "1s";q=2;w=1, "1h";q=100;w=3600
	// ratelimit: "1s";r=1;t=1
	// ratelimit: "1s";r=0;t=1
	// ratelimit: "1s";r=0;t=1
	// ResourceExhausted rate limit exceeded: 2 per 1s, retry after 1s
	// retry in 1s
	// limit 1s of 2
}
