package rls

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/pprof"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxJSONBody bounds a /json request's body.
const maxJSONBody = 1 << 20

// HTTPHandler serves the reference's HTTP endpoints:
//
//   - POST /json: a RateLimitRequest in proto3 JSON, decided as ShouldRateLimit decides it;
//     the RateLimitResponse in proto3 JSON, with status 200 when OK, 429 when OVER_LIMIT, 400
//     for a body that is not a request, and 500 (or 503 when Valkey cannot answer) for an
//     error.
//   - GET /healthcheck: 200 "OK" while the service is healthy (Healthy), else 500.
func (s *Service) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/json", s.serveJSON)
	mux.HandleFunc("/healthcheck", s.serveHealth)
	return mux
}

// DebugHandler serves the debug port: /rlconfig, the configuration in use as text (one line
// per rule), and Go's profiles under /debug/pprof/.
func (s *Service) DebugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/rlconfig", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if c := s.config.Load(); c != nil {
			io.WriteString(w, c.String())
		}
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

func (s *Service) serveJSON(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST a RateLimitRequest in JSON", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		http.Error(w, "reading the body: "+err.Error(), http.StatusBadRequest)
		return
	}
	var req pb.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		http.Error(w, "not a RateLimitRequest: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := s.decide(r.Context(), &req)
	if err != nil {
		code := http.StatusInternalServerError
		switch st, _ := status.FromError(err); st.Code() {
		case codes.InvalidArgument:
			code = http.StatusBadRequest
		case codes.Unavailable:
			code = http.StatusServiceUnavailable
		}
		http.Error(w, err.Error(), code)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}

func (s *Service) serveHealth(w http.ResponseWriter, r *http.Request) {
	if err := s.Healthy(r.Context()); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	io.WriteString(w, "OK")
}

// Healthy reports why the service should not get requests, or nil: it has been stopped (Stop),
// no configuration with a domain is loaded under WithHealthyWithAtLeastOneConfigLoaded, or the
// WithPing check fails within a second.
func (s *Service) Healthy(ctx context.Context) error {
	if s.stopping.Load() {
		return errStopping
	}
	if s.opts.healthyWithConfig {
		if c := s.config.Load(); c == nil || len(c.Domains()) == 0 {
			return errNoConfig
		}
	}
	if s.opts.ping != nil {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if err := s.opts.ping(ctx); err != nil {
			return &healthError{err}
		}
	}
	return nil
}

type healthError struct{ err error }

func (e *healthError) Error() string { return "storage unreachable: " + e.err.Error() }
func (e *healthError) Unwrap() error { return e.err }

// errStopping is the health of a service that was stopped.
var errStopping = errors.New("shutting down")
