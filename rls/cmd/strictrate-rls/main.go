// Command strictrate-rls is Envoy's rate limit service on strictrate: a drop-in for the
// reference server (envoyproxy/ratelimit) that reads its environment variables and its
// configuration, and decides every limit exactly on a sliding window in Valkey.
//
// Run it as the reference is run: the same variables (REDIS_URL, RUNTIME_ROOT, CONFIG_TYPE,
// GRPC_PORT, USE_PROMETHEUS, ...), the same ports (gRPC 8081, HTTP 8080 with /json and
// /healthcheck, debug 6070 with /rlconfig). docs/rls-settings.md lists every variable, the
// reference's and strictrate's own. A reference setting it does not support is named in a
// warning at start; one whose absence would change what is limited stops it.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// A second signal ends the process at once, without waiting for the drain.
	context.AfterFunc(ctx, stop)
	if err := run(ctx, os.LookupEnv, os.Stderr); err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "strictrate-rls:", err)
		os.Exit(1)
	}
}

// newLogger makes the logger LOG_FORMAT asks for, text or json, at level.
func newLogger(level slog.Level, format string, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
