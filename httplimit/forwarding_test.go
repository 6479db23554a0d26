package httplimit_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/strictrate/strictrate/clientaddr"
	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/httplimit"
	"github.com/strictrate/strictrate/internal/enginetest"
)

// serveUnix serves h with a real http.Server on a Unix socket in a temporary directory until
// the test ends, and returns a client whose every request goes to that socket.
func serveUnix(t *testing.T, h http.Handler) *http.Client {
	t.Helper()
	path := filepath.Join(t.TempDir(), "http.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	var d net.Dialer
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return d.DialContext(ctx, "unix", path) },
	}}
	t.Cleanup(func() {
		client.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return client
}

// get sends a GET with header to the server c talks to and returns the status.
func get(t *testing.T, c *http.Client, header http.Header) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, "http://unix/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = header
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// On a Unix-socket listener every request has the RemoteAddr "@" (or ""): without
// WithTrustedUnixSocket it has no key, a 400 whose error says what to do; with it the
// proxy on the socket is trusted, its forwarding header keys each client, and a request
// without one is keyed clientaddr.UnixSocketKey.
func TestUnixSocket(t *testing.T) {
	c := server.Client(t)
	e := enginetest.New(t, c)
	var got error
	onError := httplimit.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
		got = err
		w.WriteHeader(http.StatusBadRequest)
	})
	plain := serveUnix(t, httplimit.Limit(e, engine.PerMinute(1), httplimit.WithKeyPrefix(uniquePrefix(t)), onError)(ok))
	if code := get(t, plain, http.Header{"X-Forwarded-For": {"203.0.113.9"}}); code != http.StatusBadRequest {
		t.Fatalf("without WithTrustedUnixSocket: status %d, want 400", code)
	}
	if !errors.Is(got, httplimit.ErrKey) || !errors.Is(got, clientaddr.ErrUnixSocket) ||
		!strings.Contains(got.Error(), "WithTrustedUnixSocket") || !strings.Contains(got.Error(), "WithKeyFunc") {
		t.Fatalf("without WithTrustedUnixSocket: error %v; want ErrKey and ErrUnixSocket, naming WithTrustedUnixSocket and WithKeyFunc", got)
	}

	for _, h := range []clientaddr.Header{clientaddr.XForwardedFor, clientaddr.Forwarded} {
		prefix := uniquePrefix(t)
		client := serveUnix(t, httplimit.Limit(e, engine.PerMinute(1), httplimit.WithKeyPrefix(prefix), onError,
			httplimit.WithTrustedUnixSocket(), httplimit.WithForwardedHeader(h),
			httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")))(ok))
		from := func(addr string) http.Header {
			if h == clientaddr.Forwarded {
				return http.Header{"Forwarded": {`for="` + addr + `"`}}
			}
			return http.Header{"X-Forwarded-For": {addr + ", 10.0.0.2"}}
		}
		for _, step := range []struct {
			what   string
			header http.Header
			code   int
		}{
			{"a client", from("203.0.113.9"), http.StatusOK},
			{"the client again", from("203.0.113.9"), http.StatusTooManyRequests},
			{"another client", from("203.0.113.10"), http.StatusOK},
			{"no forwarding header", nil, http.StatusOK},
			{"no forwarding header again", nil, http.StatusTooManyRequests},
		} {
			if code := get(t, client, step.header); code != step.code {
				t.Fatalf("%s, %s: status %d (%v), want %d", h.Name(), step.what, code, got, step.code)
			}
		}
		for _, key := range []string{"203.0.113.9", "203.0.113.10", clientaddr.UnixSocketKey} {
			if !exists(t, c, prefix, key) {
				t.Fatalf("%s: no key %q", h.Name(), key)
			}
		}
	}
}

// Behind a trusted proxy that appends to the client's own Forwarded line, what the client
// wrote cannot change the key: neither an open quote (a new key per request) nor a quoted
// string that would make its for= the key (another client's count). A malformed element the
// walk has to read is a 400 wrapping clientaddr.ErrMalformedHeader.
func TestForwardedFromClient(t *testing.T) {
	c := server.Client(t)
	e := enginetest.New(t, c)
	prefix := uniquePrefix(t)
	var got error
	h := httplimit.Limit(e, engine.PerMinute(5), httplimit.WithKeyPrefix(prefix),
		httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8")), httplimit.WithForwardedHeader(clientaddr.Forwarded),
		httplimit.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
			got = err
			w.WriteHeader(http.StatusBadRequest)
		}))(ok)
	for _, tc := range []struct{ line, want, notWant string }{
		{`for="1, for=203.0.113.9`, "203.0.113.9", `"1, for=203.0.113.9`},
		{`for=198.51.100.77;x=", for=203.0.113.10`, "203.0.113.10", "198.51.100.77"},
	} {
		wantStatus(t, tc.line, do(h, "10.0.0.1:1", http.Header{"Forwarded": {tc.line}}), http.StatusOK)
		if !exists(t, c, prefix, tc.want) || exists(t, c, prefix, tc.notWant) {
			t.Fatalf("Forwarded: %s: want the key %q, not %q", tc.line, tc.want, tc.notWant)
		}
	}
	wantStatus(t, "malformed", do(h, "10.0.0.1:1", http.Header{"Forwarded": {`for="203.0.113.11`}}), http.StatusBadRequest)
	if !errors.Is(got, httplimit.ErrKey) || !errors.Is(got, clientaddr.ErrMalformedHeader) {
		t.Fatalf("malformed Forwarded: error %v, want ErrKey and clientaddr.ErrMalformedHeader", got)
	}
}
