package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/httplimit"
	"github.com/strictrate/strictrate/internal/enginetest"
)

// BenchmarkMiddleware measures what the middleware adds to a bare handler: one admitted
// decision against a real Valkey (the two-limit policy script) plus the header fields.
func BenchmarkMiddleware(b *testing.B) {
	bare := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	e := enginetest.New(b, server.Client(b))
	// Limits no benchmark reaches, so every request is admitted; the 1s window keeps the log short.
	p := engine.Policy{{Max: engine.MaxEvents, Window: time.Second}, {Max: engine.MaxEvents, Window: 2 * time.Second}}
	for _, bc := range []struct {
		name string
		h    http.Handler
	}{
		{"bare", bare},
		{"limited", httplimit.New(e, p, httplimit.WithKeyPrefix(uniquePrefix(b)))(bare)},
		{"limited-one-limit", httplimit.Limit(e, p[0], httplimit.WithKeyPrefix(uniquePrefix(b)))(bare)},
		// A calendar limit's fields are made once per period: a response only checks the period.
		{"limited-calendar", httplimit.New(e, engine.Policy{p[0], engine.Calendar(engine.MaxEvents, engine.Month, time.UTC)},
			httplimit.WithKeyPrefix(uniquePrefix(b)))(bare)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.RemoteAddr = "192.0.2.1:1234"
			b.ReportAllocs()
			for b.Loop() {
				rec := httptest.NewRecorder()
				bc.h.ServeHTTP(rec, req)
				if rec.Code != http.StatusNoContent {
					b.Fatalf("status %d", rec.Code)
				}
			}
		})
	}
}
