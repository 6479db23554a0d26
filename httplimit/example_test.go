package httplimit_test

import (
	"cmp"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/httplimit"
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

	hello := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hello\n") })
	// 2 per second and 100 per hour for each client address.
	limit := httplimit.New(e, engine.Policy{engine.PerSecond(2), engine.PerHour(100)},
		httplimit.WithKeyPrefix("example:"+uuid.NewString()+":"))
	h := limit(hello)

	for i := 0; i < 3; i++ {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if i == 0 {
			fmt.Println("RateLimit-Policy:", rec.Header().Get("RateLimit-Policy"))
		}
		fmt.Print(rec.Code, " RateLimit: ", rec.Header().Get("RateLimit"))
		if ra := rec.Header().Get("Retry-After"); ra != "" {
			fmt.Print(" Retry-After: ", ra)
		}
		fmt.Println()
	}
	// Output:
	// RateLimit-Policy: "1s";q=2;w=1, "1h";q=100;w=3600
	// 200 RateLimit: "1s";r=1;t=1
	// 200 RateLimit: "1s";r=0;t=1
	// 429 RateLimit: "1s";r=0;t=1 Retry-After: 1
}

func ExampleNewConcurrent() {
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

	// One export at a time per client address; leases of 30 s, extended while an export runs.
	var h http.Handler
	export := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A second request of the same client while this one runs:
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/export", nil))
		fmt.Println("meanwhile:", rec.Code, "Retry-After:", rec.Header().Get("Retry-After"),
			"RateLimit:", rec.Header().Get("RateLimit"))
		io.WriteString(w, "export\n")
	})
	h = httplimit.NewConcurrent(e, 1, 30*time.Second, httplimit.WithKeyPrefix("example:"+uuid.NewString()+":"))(export)

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/export", nil))
	fmt.Println("RateLimit-Policy:", rec.Header().Get("RateLimit-Policy"))
	fmt.Println(rec.Code, "RateLimit:", rec.Header().Get("RateLimit"))
	// Output:
	// meanwhile: 429 Retry-After: 30 RateLimit: "concurrency";r=0;t=30
	// RateLimit-Policy: "concurrency";q=1;qu="concurrent-requests"
	// 200 RateLimit: "concurrency";r=0
}
