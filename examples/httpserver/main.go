// Command httpserver is a small HTTP server rate-limited by strictrate: each client address
// may make 5 requests per second and 100 per hour, and every response carries the RateLimit
// header fields. The engine's metrics are on /metrics, in Prometheus' text format, through
// OpenTelemetry's Prometheus exporter (/metrics itself is not limited).
//
//	cd examples && go run ./httpserver -addr 127.0.0.1:8080 -valkey 127.0.0.1:6379
//	curl -i http://127.0.0.1:8080/
//	curl http://127.0.0.1:8080/metrics
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valkey-io/valkey-go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/httplimit"
)

func main() {
	defaultValkey := os.Getenv("VALKEY_ADDR")
	if defaultValkey == "" {
		defaultValkey = "127.0.0.1:6379"
	}
	addr := flag.String("addr", "127.0.0.1:8080", "address to listen on")
	valkeyAddr := flag.String("valkey", defaultValkey, "Valkey address, host:port (default $VALKEY_ADDR or 127.0.0.1:6379)")
	flag.Parse()
	if err := run(*addr, *valkeyAddr); err != nil {
		log.Fatal(err)
	}
}

func run(addr, valkeyAddr string) error {
	client, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{valkeyAddr}})
	if err != nil {
		return fmt.Errorf("connect to Valkey at %s: %w", valkeyAddr, err)
	}
	defer client.Close()
	handler, shutdownMetrics, err := newHandler(client)
	if err != nil {
		return err
	}
	defer shutdownMetrics(context.Background())
	srv := &http.Server{Addr: addr, Handler: handler, ReadHeaderTimeout: 10 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() {
		log.Printf("listening on http://%s, limits in Valkey at %s", addr, valkeyAddr)
		errc <- srv.ListenAndServe()
	}()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("shutdown: %w", err)
	}
	return nil
}

// newHandler returns the server's handler on client: "/" limited, /metrics not; and the
// function that stops the metrics pipeline. The test serves it without a listener.
func newHandler(client valkey.Client) (http.Handler, func(context.Context) error, error) {
	// The engine records through the OpenTelemetry metric API; this program exports what it
	// records to Prometheus.
	exporter, err := otelprom.New()
	if err != nil {
		return nil, nil, fmt.Errorf("metrics exporter: %w", err)
	}
	meters := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	e, err := engine.New(client, engine.WithMeterProvider(meters))
	if err != nil {
		meters.Shutdown(context.Background())
		return nil, nil, fmt.Errorf("rate-limit engine: %w", err)
	}

	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "hello\n")
	})
	limit := httplimit.New(e, engine.Policy{engine.PerSecond(5), engine.PerHour(100)},
		httplimit.WithKeyPrefix("httpserver:"))
	root := http.NewServeMux()
	root.Handle("GET /metrics", promhttp.Handler())
	root.Handle("/", limit(mux))
	return root, meters.Shutdown, nil
}
