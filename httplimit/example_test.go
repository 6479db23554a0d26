package httplimit_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/google/uuid"
	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/httplimit"
)

func ExampleNew() {
	client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{server.Addr}})
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
