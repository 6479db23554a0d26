package rls_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/google/uuid"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/rls"
)

// post sends body to /json of srv and returns the status and the body of the answer.
func post(t *testing.T, srv *httptest.Server, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(srv.URL+"/json", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// /json takes the request in proto3 JSON and answers the response the same way: 200 when
// OK, 429 when over the limit, 400 "Bad Request" for what is not a request or is refused, as
// the reference answers, with the reason in a header of its own (one line of printable ASCII,
// whatever the body quoted). The answer is compact JSON, the same bytes from every build
// (protojson's own spacing changes at random from one build to another).
func TestJSON(t *testing.T) {
	_, svc := newService(t, basicConfig, nil)
	srv := httptest.NewServer(svc.HTTPHandler())
	defer srv.Close()
	const req = `{"domain":"edge","descriptors":[{"entries":[{"key":"one_per_minute","value":"json"}]}]}`
	code, body := post(t, srv, req)
	if code != http.StatusOK {
		t.Fatalf("first: %d %s", code, body)
	}
	var resp pb.RateLimitResponse
	if err := protojson.Unmarshal([]byte(body), &resp); err != nil || resp.OverallCode != ok || resp.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 {
		t.Fatalf("first: %v %v", &resp, err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, []byte(body)); err != nil || compact.String() != body {
		t.Errorf("first: %q is not compact JSON (%v)", body, err)
	}
	code, body = post(t, srv, req)
	if code != http.StatusTooManyRequests || !strings.Contains(body, `"OVER_LIMIT"`) {
		t.Fatalf("second: %d %s", code, body)
	}
	for bad, reason := range map[string]string{
		`{"domain":`:                   "not a RateLimitRequest: proto: unexpected EOF",
		`{"domain":"edge","nope":1}`:   `not a RateLimitRequest: proto: (line 1:18): unknown field "nope"`,
		`{"descriptors":[]}`:           "rate limit domain must not be empty",
		"{\"domain\":\"\x01\u00e9\n\"": "not a RateLimitRequest: proto: syntax error (line 1:11): invalid character",
	} {
		resp, err := http.Post(srv.URL+"/json", "application/json", strings.NewReader(bad))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if got := resp.Header.Get("Strictrate-Error"); resp.StatusCode != http.StatusBadRequest || string(b) != "Bad Request\n" || !strings.HasPrefix(got, reason) {
			t.Errorf("%q: %d %q, reason %q; want 400 \"Bad Request\" as the reference answers, the reason starting %q", bad, resp.StatusCode, b, got, reason)
		}
	}
}

// /healthcheck is 200 "OK" only with a configuration loaded (when asked), while the storage
// answers, and until Stop; else 500 with no body, as the reference answers, and the reason in a
// header.
func TestHealthcheck(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	var pingErr error
	svc := rls.New(e, rls.WithKeyPrefix(uuid.NewString()+":"), rls.WithHealthyWithAtLeastOneConfigLoaded(true),
		rls.WithPing(func(context.Context) error { return pingErr }))
	srv := httptest.NewServer(svc.HTTPHandler())
	defer srv.Close()
	check := func(what string, want string) {
		t.Helper()
		resp, err := http.Get(srv.URL + "/healthcheck")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		got := fmt.Sprintf("%d %q", resp.StatusCode, b)
		if reason := resp.Header.Get("Strictrate-Error"); reason != "" {
			got += " (" + reason + ")"
		}
		if got != want {
			t.Fatalf("/healthcheck %s: %s, want %s", what, got, want)
		}
	}
	check("without a configuration", `500 "" (no rate limit configuration loaded)`)
	svc.SetConfig(mustConfig(t, basicConfig))
	check("with a configuration", `200 "OK"`)
	pingErr = errors.New("connection refused")
	check("storage down", `500 "" (storage unreachable: connection refused)`)
	pingErr = nil
	svc.Stop()
	check("after Stop", `500 "" (shutting down)`)
}

// The debug handler's /rlconfig prints the loaded rules.
func TestRLConfig(t *testing.T) {
	_, svc := newService(t, basicConfig, nil)
	srv := httptest.NewServer(svc.DebugHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/rlconfig")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), "edge.ten_per_minute") {
		t.Fatalf("/rlconfig: %q", b)
	}
}
