package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// The server does what its doc and docs/http-grpc.md show: "/" admits a client's first five
// requests with the RateLimit fields, then refuses with 429 and Retry-After; /metrics is not
// limited and reports the engine's decisions. The keys are fixed (the program's prefix and
// httptest's client address), so the test starts a server of its own.
func TestLimitedServer(t *testing.T) {
	srv := valkeytest.New(t, valkeytest.OwnServer())
	client := valkeytest.NewClient(t, srv.Addr)
	handler, shutdown, err := newHandler(client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { shutdown(context.Background()) })
	get := func(path string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		return w
	}

	for i := 1; i <= 5; i++ {
		w := get("/")
		if w.Code != http.StatusOK || w.Body.String() != "hello\n" || w.Header().Get("RateLimit") == "" {
			t.Fatalf("request %d: %d %q, RateLimit %q; want 200 hello with the fields", i, w.Code, w.Body, w.Header().Get("RateLimit"))
		}
		if got, want := w.Header().Get("RateLimit-Policy"), `"1s";q=5;w=1, "1h";q=100;w=3600`; got != want {
			t.Fatalf("request %d: RateLimit-Policy %q, want %q", i, got, want)
		}
	}
	// The sixth is refused unless a second has passed since the first: on a slow machine, go
	// on until the limit refuses one, within a generous bound (100 per hour ends it anyway).
	denied := false
	for i := 6; i <= 101 && !denied; i++ {
		w := get("/")
		switch w.Code {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			if w.Header().Get("Retry-After") == "" {
				t.Fatalf("request %d: 429 without Retry-After", i)
			}
			denied = true
		default:
			t.Fatalf("request %d: %d %q", i, w.Code, w.Body)
		}
	}
	if !denied {
		t.Fatal("101 requests from one client, none refused")
	}

	for range 10 {
		if w := get("/metrics"); w.Code != http.StatusOK {
			t.Fatalf("/metrics: %d %q; it is not limited", w.Code, w.Body)
		}
	}
	body := get("/metrics").Body.String()
	for _, want := range []string{"strictrate_decisions", `strictrate_outcome="allowed"`, `strictrate_outcome="denied"`} {
		if !strings.Contains(body, want) {
			t.Fatalf("/metrics lacks %s:\n%s", want, body)
		}
	}
}
