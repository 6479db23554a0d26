// The helpers httplimit_test.go (New and Limit, httplimit.go) and concurrent_test.go
// (NewConcurrent) share: the package's one server (TestMain), requests sent by hand or through
// a real server on loopback, and a parser of the RateLimit fields' Structured Field syntax,
// tested itself (TestParseSFList).

package httplimit_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/strictrate/strictrate/internal/valkeytest"
)

// server is the Valkey every test and example of this package shares (the examples find it
// through VALKEY_ADDR); they keep apart by key prefix. Tests that stop a server start their
// own.
var server *valkeytest.Server

func TestMain(m *testing.M) {
	os.Exit(valkeytest.RunWithServer(m, func(s *valkeytest.Server) {
		server = s
		// The examples find the server where a reader's copy of them would: in VALKEY_ADDR.
		// Tests that need a server of their own ask for one with valkeytest.OwnServer.
		os.Setenv(valkeytest.EnvAddr, s.Addr)
	}))
}

// uniquePrefix is a key prefix no other test or run uses.
func uniquePrefix(tb testing.TB) string { return tb.Name() + ":" + uuid.NewString() + ":" }

// sfItem is one member of a Structured Field List whose items are Strings with Integer or
// String parameters, the shape of both RateLimit fields.
type sfItem struct {
	name   string
	params map[string]int64  // the Integer parameters
	strs   map[string]string // the String parameters
	keys   []string          // parameter names in order
}

var (
	sfString = regexp.MustCompile(`^"((?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*)"`)
	sfParam  = regexp.MustCompile(`^;[ ]*([a-z*][a-z0-9_\-.*]*)=(-?[0-9]{1,15}|"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*")`)
)

// parseSFList parses a field value as RFC 9651 sf-list of sf-string items with sf-integer or
// sf-string parameters, strictly: any other syntax is an error.
func parseSFList(v string) ([]sfItem, error) {
	var items []sfItem
	rest := v
	for {
		m := sfString.FindStringSubmatch(rest)
		if m == nil {
			return nil, fmt.Errorf("%q: want an sf-string at %q", v, rest)
		}
		it := sfItem{name: unescapeSF(m[1]), params: map[string]int64{}, strs: map[string]string{}}
		rest = rest[len(m[0]):]
		for {
			p := sfParam.FindStringSubmatch(rest)
			if p == nil {
				break
			}
			if slices.Contains(it.keys, p[1]) {
				return nil, fmt.Errorf("%q: parameter %s twice", v, p[1])
			}
			if quoted, ok := strings.CutPrefix(p[2], `"`); ok {
				it.strs[p[1]] = unescapeSF(strings.TrimSuffix(quoted, `"`))
			} else {
				n, err := strconv.ParseInt(p[2], 10, 64)
				if err != nil {
					return nil, err
				}
				it.params[p[1]] = n
			}
			it.keys = append(it.keys, p[1])
			rest = rest[len(p[0]):]
		}
		items = append(items, it)
		if rest == "" {
			return items, nil
		}
		trimmed := strings.TrimLeft(rest, " \t")
		if !strings.HasPrefix(trimmed, ",") {
			return nil, fmt.Errorf("%q: want ',' at %q", v, rest)
		}
		rest = strings.TrimLeft(trimmed[1:], " \t")
		if rest == "" {
			return nil, fmt.Errorf("%q: trailing comma", v)
		}
	}
}

// unescapeSF is the text of an sf-string's inside.
func unescapeSF(s string) string { return strings.NewReplacer(`\"`, `"`, `\\`, `\`).Replace(s) }

func TestParseSFList(t *testing.T) {
	items, err := parseSFList(`"1s";q=5;w=1, "1h";q=100;w=3600`)
	if err != nil || len(items) != 2 || items[1].name != "1h" || items[1].params["w"] != 3600 || items[0].params["q"] != 5 {
		t.Fatalf("parse: %+v, %v", items, err)
	}
	items, err = parseSFList(`"concurrency";q=5;qu="concurrent-requests"`)
	if err != nil || len(items) != 1 || items[0].params["q"] != 5 || items[0].strs["qu"] != "concurrent-requests" ||
		fmt.Sprint(items[0].keys) != "[q qu]" {
		t.Fatalf("parse with a string parameter: %+v, %v", items, err)
	}
	for _, bad := range []string{``, `1s;q=5`, `"1s";Q=5`, `"1s";q=5,`, `"1s";q=5 "x"`, `"1s";q=1.5`, `"1s";q=5;q=6`,
		`"c";qu="a`, `"c";qu=x`, `"c";q=5;q="5"`} {
		if _, err := parseSFList(bad); err == nil {
			t.Errorf("parseSFList(%q) accepted", bad)
		}
	}
}

// ok is the handler the middleware guards: it answers 200 "ok".
var ok = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })

// do sends one request from remote through h and returns the recorded response.
func do(h http.Handler, remote string, header http.Header) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = remote
	for k, v := range header {
		req.Header[k] = v
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// wantStatus fails t unless rec has the status code.
func wantStatus(t *testing.T, what string, rec *httptest.ResponseRecorder, code int) {
	t.Helper()
	if rec.Code != code {
		t.Fatalf("%s: status %d (%q), want %d", what, rec.Code, rec.Body.String(), code)
	}
}

// serveLoopback serves h on a loopback port with a real http.Server until the test ends, and
// returns its URL and a client that keeps up to 16 connections to it.
func serveLoopback(t *testing.T, h http.Handler) (string, *http.Client) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	t.Cleanup(func() {
		client.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return "http://" + ln.Addr().String() + "/", client
}

// concurrentPolicy is the RateLimit-Policy field of an in-flight limit of 2.
const concurrentPolicy = `"concurrency";q=2;qu="concurrent-requests"`
