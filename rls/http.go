package rls

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/pprof"
	"strings"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxJSONBody bounds a /json request's body.
const maxJSONBody = 1 << 20

// HTTPHandler serves the reference's HTTP endpoints:
//
//   - /json: a RateLimitRequest in proto3 JSON (with any method, as the reference takes it),
//     decided as ShouldRateLimit decides it; the RateLimitResponse in proto3 JSON, with status
//     200 when OK and 429 when OVER_LIMIT. Anything else is answered as the reference answers
//     it, 400 "Bad Request": a body that is not a request, a request the service refuses, a
//     decision that could not be taken (before any configuration, or with Valkey unreachable).
//     The reason is in the answer's Strictrate-Error header, which the reference's clients do
//     not read.
//   - GET /healthcheck: 200 "OK" while the service is healthy (Healthy), else 500 with no
//     body, as the reference answers, the reason in the Strictrate-Error header.
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
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
	if err != nil {
		badRequest(w, "reading the body: "+err.Error())
		return
	}
	var req pb.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		badRequest(w, "not a RateLimitRequest: "+err.Error())
		return
	}
	resp, err := s.decide(r.Context(), &req)
	if err != nil {
		badRequest(w, status.Convert(err).Message())
		return
	}
	out, err := protojson.Marshal(resp)
	if err == nil {
		// protojson adds a space after some commas, at random from one build to another, so
		// that nothing relies on its layout; the answer is compacted so that its bytes are
		// the same from every build, as docs/rls.md shows them.
		var compact bytes.Buffer
		if err = json.Compact(&compact, out); err == nil {
			out = compact.Bytes()
		}
	}
	if err != nil {
		http.Error(w, http.StatusText(http.StatusInternalServerError), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == pb.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}

// errorHeader carries the reason of an answer whose body is the reference's, which says none:
// /json's 400 "Bad Request", /healthcheck's 500.
const errorHeader = "Strictrate-Error"

// badRequest answers a /json request as the reference answers every request it cannot
// decide, 400 "Bad Request\n", with the reason in errorHeader.
func badRequest(w http.ResponseWriter, reason string) {
	w.Header().Set(errorHeader, headerText(reason))
	http.Error(w, http.StatusText(http.StatusBadRequest), http.StatusBadRequest)
}

// maxErrorHeader bounds errorHeader's value, which can quote the request's body.
const maxErrorHeader = 256

// headerText is a reason as a header's value: printable ASCII (what a parser's message quotes
// of a body is the client's), one line, at most maxErrorHeader bytes.
func headerText(reason string) string {
	reason = strings.Map(func(r rune) rune {
		if r < ' ' || r > '~' {
			return ' '
		}
		return r
	}, reason)
	reason = strings.Join(strings.Fields(reason), " ")
	if len(reason) > maxErrorHeader {
		reason = reason[:maxErrorHeader]
	}
	return reason
}

// serveHealth answers as the reference's health check: 200 "OK", or 500 with no body, the
// reason in errorHeader.
func (s *Service) serveHealth(w http.ResponseWriter, r *http.Request) {
	if err := s.Healthy(r.Context()); err != nil {
		w.Header().Set(errorHeader, headerText(err.Error()))
		w.WriteHeader(http.StatusInternalServerError)
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
