package rls_test

import (
	"context"
	"errors"
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
// OK, 429 when over the limit, 400 for what is not a request.
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
	code, body = post(t, srv, req)
	if code != http.StatusTooManyRequests || !strings.Contains(body, `"OVER_LIMIT"`) {
		t.Fatalf("second: %d %s", code, body)
	}
	for _, bad := range []string{`{"domain":`, `{"domain":"edge","nope":1}`, `{"descriptors":[]}`} {
		if code, body := post(t, srv, bad); code != http.StatusBadRequest {
			t.Fatalf("%s: %d %s, want 400", bad, code, body)
		}
	}
}

// /healthcheck is 200 only with a configuration loaded (when asked), while the storage
// answers, and until Stop.
func TestHealthcheck(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	var pingErr error
	svc := rls.New(e, rls.WithKeyPrefix(uuid.NewString()+":"), rls.WithHealthyWithAtLeastOneConfigLoaded(true),
		rls.WithPing(func(context.Context) error { return pingErr }))
	srv := httptest.NewServer(svc.HTTPHandler())
	defer srv.Close()
	health := func() int {
		resp, err := http.Get(srv.URL + "/healthcheck")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := health(); got != http.StatusInternalServerError {
		t.Fatalf("without a configuration: %d", got)
	}
	svc.SetConfig(mustConfig(t, basicConfig))
	if got := health(); got != http.StatusOK {
		t.Fatalf("with a configuration: %d", got)
	}
	pingErr = errors.New("connection refused")
	if got := health(); got != http.StatusInternalServerError {
		t.Fatalf("storage down: %d", got)
	}
	pingErr = nil
	svc.Stop()
	if got := health(); got != http.StatusInternalServerError {
		t.Fatalf("after Stop: %d", got)
	}
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
