package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/clientaddr"
	"github.com/strictrate/strictrate/clientkey"
	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/fields"
	"github.com/strictrate/strictrate/httplimit"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// rateLimit parses the response's RateLimit field: one item, with r and t, in that order.
func rateLimit(t *testing.T, h http.Header) (name string, r, reset int64) {
	t.Helper()
	vals := h.Values("RateLimit")
	if len(vals) != 1 {
		t.Fatalf("RateLimit fields %q, want one", vals)
	}
	items, err := parseSFList(vals[0])
	if err != nil {
		t.Fatalf("RateLimit: %v", err)
	}
	if len(items) != 1 || fmt.Sprint(items[0].keys) != "[r t]" {
		t.Fatalf("RateLimit %q: want one item with r and t", vals[0])
	}
	if items[0].params["r"] < 0 || items[0].params["t"] < 0 {
		t.Fatalf("RateLimit %q: negative value", vals[0])
	}
	return items[0].name, items[0].params["r"], items[0].params["t"]
}

// checkPolicyField checks RateLimit-Policy against the draft's syntax and the policy.
func checkPolicyField(t *testing.T, h http.Header, want string) {
	t.Helper()
	got := h.Get("RateLimit-Policy")
	if got != want {
		t.Fatalf("RateLimit-Policy %q, want %q", got, want)
	}
	items, err := parseSFList(got)
	if err != nil {
		t.Fatalf("RateLimit-Policy: %v", err)
	}
	for _, it := range items {
		if fmt.Sprint(it.keys) != "[q w]" || it.params["q"] < 1 || it.params["w"] < 1 {
			t.Fatalf("RateLimit-Policy item %+v: want q >= 1 and w >= 1", it)
		}
	}
}

// "3 per second and 5 per hour" through the middleware: the fields on admissions and denials,
// whichever limit binds, with exact values from a fixed clock.
func TestHeadersAdmittedAndDenied(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	p := engine.Policy{{Max: 3, Window: time.Second}, {Max: 5, Window: time.Hour}}
	h := httplimit.New(e, p, httplimit.WithKeyPrefix(uniquePrefix(t)))(ok)
	const policyField = `"1s";q=3;w=1, "1h";q=5;w=3600`
	const client = "192.0.2.1:40000"

	for i := 0; i < 3; i++ {
		rec := do(h, client, nil)
		wantStatus(t, fmt.Sprintf("request %d", i+1), rec, http.StatusOK)
		checkPolicyField(t, rec.Header(), policyField)
		name, r, reset := rateLimit(t, rec.Header())
		if name != "1s" || r != int64(2-i) || reset != 1 {
			t.Fatalf("request %d: RateLimit %q, want \"1s\";r=%d;t=1", i+1, rec.Header().Get("RateLimit"), 2-i)
		}
		if rec.Header().Get("Retry-After") != "" {
			t.Fatalf("Retry-After on an admitted request")
		}
	}
	rec := do(h, client, nil)
	wantStatus(t, "4th in the second", rec, http.StatusTooManyRequests)
	checkPolicyField(t, rec.Header(), policyField)
	if got := rec.Header().Get("RateLimit"); got != `"1s";r=0;t=1` {
		t.Fatalf("denied RateLimit %q", got)
	}
	if got := rec.Header().Get("Retry-After"); got != "1" {
		t.Fatalf("Retry-After %q, want 1", got)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "text/plain; charset=utf-8" || rec.Body.Len() == 0 {
		t.Fatalf("denied body %q of type %q, want short plain text", rec.Body.String(), ct)
	}

	clock.Set(enginetest.T0.Add(1500 * time.Millisecond))
	for i := 0; i < 2; i++ {
		wantStatus(t, "next second", do(h, client, nil), http.StatusOK)
	}
	rec = do(h, client, nil)
	wantStatus(t, "hour full", rec, http.StatusTooManyRequests)
	wantRetry := time.Hour - 1500*time.Millisecond // the first events leave the hour
	if got := rec.Header().Get("Retry-After"); got != strconv.FormatInt(int64(wantRetry/time.Second)+1, 10) {
		t.Fatalf("Retry-After %q, want %s rounded up", got, wantRetry)
	}
	// The second has room for one more; the hour has none: RateLimit names the hour.
	if got := rec.Header().Get("RateLimit"); got != `"1h";r=0;t=3599` {
		t.Fatalf("RateLimit %q when the hour binds, want the hour named", got)
	}
	clock.Set(enginetest.T0.Add(time.Hour))
	wantStatus(t, "after Retry-After", do(h, client, nil), http.StatusOK)
}

// Windows that are not whole seconds: w and t are rounded up, never down; Retry-After is never
// earlier than the engine's RetryAfter.
func TestSubSecondWindowsRoundUp(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	p := engine.Policy{{Max: 2, Window: 500 * time.Millisecond}, {Max: 10, Window: 1500 * time.Millisecond}}
	var engineRetry time.Duration
	h := httplimit.New(e, p, httplimit.WithKeyPrefix(uniquePrefix(t)),
		httplimit.WithDeniedHandler(func(w http.ResponseWriter, _ *http.Request, res engine.Result) {
			engineRetry = res.RetryAfter
			w.WriteHeader(http.StatusTooManyRequests)
		}))(ok)
	do(h, "192.0.2.1:1", nil)
	clock.Set(enginetest.T0.Add(100 * time.Millisecond))
	rec := do(h, "192.0.2.1:1", nil)
	checkPolicyField(t, rec.Header(), `"500ms";q=2;w=1, "1500ms";q=10;w=2`)
	if _, r, reset := rateLimit(t, rec.Header()); r != 0 || reset != 1 {
		t.Fatalf("RateLimit %q, want r=0 and t=1 (500ms rounded up)", rec.Header().Get("RateLimit"))
	}
	clock.Set(enginetest.T0.Add(100*time.Millisecond + 3*time.Microsecond))
	rec = do(h, "192.0.2.1:1", nil)
	wantStatus(t, "third", rec, http.StatusTooManyRequests)
	if engineRetry != 400*time.Millisecond-3*time.Microsecond {
		t.Fatalf("engine RetryAfter %s", engineRetry)
	}
	if got := rec.Header().Get("Retry-After"); got != "1" {
		t.Fatalf("Retry-After %q, want 1 (rounded up)", got)
	}
}

// The legacy X-RateLimit-* fields carry the same numbers when asked for, and only then.
func TestLegacyHeaders(t *testing.T) {
	e, _ := enginetest.Clocked(t, server.Client(t))
	prefix := uniquePrefix(t)
	l := engine.PerMinute(2)
	legacy := httplimit.Limit(e, l, httplimit.WithKeyPrefix(prefix), httplimit.WithLegacyHeaders(true))(ok)
	plain := httplimit.Limit(e, l, httplimit.WithKeyPrefix(prefix+"plain:"))(ok)
	for i, want := range [][3]string{{"2", "1", "60"}, {"2", "0", "60"}, {"2", "0", "60"}} {
		rec := do(legacy, "192.0.2.7:1", nil)
		got := [3]string{rec.Header().Get("X-RateLimit-Limit"), rec.Header().Get("X-RateLimit-Remaining"), rec.Header().Get("X-RateLimit-Reset")}
		if got != want {
			t.Fatalf("request %d: X-RateLimit-Limit/Remaining/Reset %q, want %q", i+1, got, want)
		}
	}
	rec := do(plain, "192.0.2.7:1", nil)
	if rec.Header().Get("X-RateLimit-Limit") != "" || rec.Header().Get("RateLimit") != `"1m";r=1;t=60` {
		t.Fatalf("without legacy headers: %v", rec.Header())
	}
}

// A real http.Server on loopback and a real http.Client, 16 connections at once, one client
// address: exactly Max answers are 2xx, each with a different r; every other is a 429 whose
// Retry-After is never earlier than the engine's RetryAfter.
func TestRealServerUnderConcurrency(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	p := engine.Policy{{Max: 20, Window: time.Hour}, {Max: 30, Window: 2 * time.Hour}}
	h := httplimit.New(e, p, httplimit.WithKeyPrefix(uniquePrefix(t)),
		httplimit.WithDeniedHandler(func(w http.ResponseWriter, _ *http.Request, res engine.Result) {
			w.Header().Set("X-Test-Retry-After-Us", strconv.FormatInt(res.RetryAfter.Microseconds(), 10))
			http.Error(w, "slow down", http.StatusTooManyRequests)
		}))(ok)
	url, client := serveLoopback(t, h)

	const requests, workers = 200, 16
	type answer struct {
		code       int
		r          int64
		retryAfter string
		engineUs   string
		rateLimit  string
		policy     string
	}
	var (
		mu      sync.Mutex
		answers []answer
		wg      sync.WaitGroup
		errs    = make(chan error, workers)
		jobs    = make(chan struct{}, requests)
	)
	for range requests {
		jobs <- struct{}{}
	}
	close(jobs)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				resp, err := client.Get(url)
				if err != nil {
					errs <- err
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				a := answer{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"),
					engineUs: resp.Header.Get("X-Test-Retry-After-Us"), rateLimit: resp.Header.Get("RateLimit"),
					policy: resp.Header.Get("RateLimit-Policy")}
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	var remaining []int
	denied := 0
	for _, a := range answers {
		if a.policy != `"1h";q=20;w=3600, "2h";q=30;w=7200` {
			t.Fatalf("RateLimit-Policy %q", a.policy)
		}
		items, err := parseSFList(a.rateLimit)
		if err != nil || len(items) != 1 || items[0].name != "1h" {
			t.Fatalf("RateLimit %q: %v", a.rateLimit, err)
		}
		switch a.code {
		case http.StatusOK:
			remaining = append(remaining, int(items[0].params["r"]))
			if a.retryAfter != "" {
				t.Fatalf("Retry-After %q on a 200", a.retryAfter)
			}
		case http.StatusTooManyRequests:
			denied++
			secs, err := strconv.ParseInt(a.retryAfter, 10, 64)
			if err != nil || secs < 1 {
				t.Fatalf("Retry-After %q: want delta seconds", a.retryAfter)
			}
			us, err := strconv.ParseInt(a.engineUs, 10, 64)
			if err != nil || secs*1_000_000 < us || (secs-1)*1_000_000 >= us {
				t.Fatalf("Retry-After %ds for an engine RetryAfter of %sµs: want it rounded up", secs, a.engineUs)
			}
			if items[0].params["r"] != 0 || items[0].params["t"] != secs {
				t.Fatalf("denied RateLimit %q, want r=0 and t=%d", a.rateLimit, secs)
			}
		default:
			t.Fatalf("status %d", a.code)
		}
	}
	if len(answers) != requests || len(remaining) != 20 || denied != requests-20 {
		t.Fatalf("%d answers, %d admitted, %d denied; want %d, 20, %d", len(answers), len(remaining), denied, requests, requests-20)
	}
	sort.Ints(remaining)
	for i, r := range remaining {
		if r != i {
			t.Fatalf("admitted r values %v: want each of 0..19 once", remaining)
		}
	}
}

// exists reports whether the engine's key for the middleware key k exists.
// exists reports whether the middleware with key prefix prefix keeps a log for client: the
// key is the prefix, the policy's tag (engine.Policy.Tag), then the client.
func exists(t *testing.T, c valkey.Client, prefix, client string) bool {
	t.Helper()
	keys, err := c.Do(context.Background(), c.B().Keys().Pattern(globEscape("strictrate:"+prefix)+"*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		rest := strings.TrimPrefix(k, "strictrate:"+prefix)
		if tag, found := strings.CutSuffix(rest, ":"+client); found && !strings.Contains(tag, ":") {
			return true
		}
	}
	return false
}

// globEscape escapes the characters KEYS patterns give a meaning.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// The key is the client's address: RemoteAddr, unless it is a trusted proxy, and then the
// first untrusted hop of the chosen forwarding header, right to left. Anything a client writes
// itself is never read.
func TestClientIPKey(t *testing.T) {
	c := server.Client(t)
	e := enginetest.New(t, c)
	trusted := httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8:ffff::/48"))
	perAddress := httplimit.WithIPv6Prefix(128) // these cases check whose address; TestIPv6Prefix checks the prefix
	for _, tc := range []struct {
		name   string
		opts   []httplimit.Option
		remote string
		header http.Header
		want   string
	}{
		{"RemoteAddr", nil, "192.0.2.1:5555", nil, "192.0.2.1"},
		{"RemoteAddr IPv6", []httplimit.Option{perAddress}, "[2001:db8::7]:5555", nil, "2001:db8::7"},
		{"RemoteAddr IPv4-mapped", nil, "[::ffff:192.0.2.9]:5555", nil, "192.0.2.9"},
		{"XFF ignored without trusted proxies", nil, "10.0.0.1:1",
			http.Header{"X-Forwarded-For": {"203.0.113.9"}}, "10.0.0.1"},
		{"XFF from an untrusted peer ignored", []httplimit.Option{trusted}, "192.0.2.1:1",
			http.Header{"X-Forwarded-For": {"203.0.113.9"}}, "192.0.2.1"},
		{"XFF through two trusted proxies", []httplimit.Option{trusted}, "10.0.0.1:1",
			http.Header{"X-Forwarded-For": {"203.0.113.9, 10.0.0.2"}}, "203.0.113.9"},
		{"XFF spoofed leftmost entry skipped", []httplimit.Option{trusted}, "10.0.0.1:1",
			http.Header{"X-Forwarded-For": {"198.51.100.1, 203.0.113.9"}}, "203.0.113.9"},
		{"XFF over several lines", []httplimit.Option{trusted}, "10.0.0.1:1",
			http.Header{"X-Forwarded-For": {"198.51.100.1", "203.0.113.9,10.1.2.3"}}, "203.0.113.9"},
		{"XFF every hop trusted: the leftmost", []httplimit.Option{trusted}, "10.0.0.1:1",
			http.Header{"X-Forwarded-For": {"10.9.9.9, 10.0.0.2"}}, "10.9.9.9"},
		{"XFF absent: the proxy itself", []httplimit.Option{trusted}, "10.0.0.1:1", nil, "10.0.0.1"},
		{"XFF with ports and IPv6", []httplimit.Option{trusted, perAddress}, "[2001:db8:ffff::1]:1",
			http.Header{"X-Forwarded-For": {"[2001:db8::42]:1234, 10.0.0.3:80"}}, "2001:db8::42"},
		{"Forwarded not read in XFF mode", []httplimit.Option{trusted}, "10.0.0.1:1",
			http.Header{"Forwarded": {"for=203.0.113.9"}}, "10.0.0.1"},
		{"Forwarded", []httplimit.Option{trusted, httplimit.WithForwardedHeader(clientaddr.Forwarded), perAddress}, "10.0.0.1:1",
			http.Header{"Forwarded": {`for=198.51.100.1;proto=http, For="[2001:db8::1]:4711";by=10.0.0.2, for=10.0.0.5`}}, "2001:db8::1"},
		{"Forwarded ignores XFF", []httplimit.Option{trusted, httplimit.WithForwardedHeader(clientaddr.Forwarded)}, "10.0.0.1:1",
			http.Header{"X-Forwarded-For": {"203.0.113.9"}}, "10.0.0.1"},
		{"Forwarded unknown hop from a trusted proxy", []httplimit.Option{trusted, httplimit.WithForwardedHeader(clientaddr.Forwarded)}, "10.0.0.1:1",
			http.Header{"Forwarded": {`for=198.51.100.1, for=unknown`}}, "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := uniquePrefix(t)
			h := httplimit.Limit(e, engine.PerMinute(5), append(tc.opts, httplimit.WithKeyPrefix(prefix))...)(ok)
			wantStatus(t, "request", do(h, tc.remote, tc.header), http.StatusOK)
			if !exists(t, c, prefix, tc.want) {
				keys, _ := c.Do(context.Background(), c.B().Keys().Pattern("strictrate:"+prefix+"*").Build()).AsStrSlice()
				t.Fatalf("no key for %s; keys: %q", tc.want, keys)
			}
		})
	}
}

// An unusable RemoteAddr is refused with 400 and counts nothing.
func TestBadRemoteAddr(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	h := httplimit.Limit(e, engine.PerMinute(5), httplimit.WithKeyPrefix(uniquePrefix(t)))(ok)
	rec := do(h, "not-an-address", nil)
	wantStatus(t, "bad RemoteAddr", rec, http.StatusBadRequest)
	if rec.Header().Get("RateLimit") != "" {
		t.Fatalf("RateLimit set on a request that was not decided")
	}
}

// Keys from a header: each value has its own count; a request without it is a 400, as is a
// value longer than MaxKeyLength.
func TestHeaderKey(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	h := httplimit.Limit(e, engine.PerMinute(2), httplimit.WithKeyPrefix(uniquePrefix(t)), httplimit.WithKeyHeader("x-api-key"))(ok)
	a, b := http.Header{"X-Api-Key": {"a"}}, http.Header{"X-Api-Key": {"b"}}
	wantStatus(t, "a 1", do(h, "192.0.2.1:1", a), http.StatusOK)
	wantStatus(t, "a 2 from elsewhere", do(h, "192.0.2.2:1", a), http.StatusOK)
	wantStatus(t, "a 3", do(h, "192.0.2.3:1", a), http.StatusTooManyRequests)
	wantStatus(t, "b 1 from the same address", do(h, "192.0.2.1:1", b), http.StatusOK)
	wantStatus(t, "no header", do(h, "192.0.2.1:1", nil), http.StatusBadRequest)
	long := http.Header{"X-Api-Key": {strings.Repeat("k", clientkey.MaxLength+1)}}
	wantStatus(t, "too long", do(h, "192.0.2.1:1", long), http.StatusBadRequest)
}

// A key function's error is a 400 by default; a custom error handler receives it wrapped in
// ErrKey and chooses the answer.
func TestKeyFuncError(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	errNoUser := errors.New("no user")
	keyFunc := httplimit.WithKeyFunc(func(r *http.Request) (string, error) {
		if u := r.URL.Query().Get("user"); u != "" {
			return "user:" + u, nil
		}
		return "", errNoUser
	})
	prefix := uniquePrefix(t)
	h := httplimit.Limit(e, engine.PerMinute(1), httplimit.WithKeyPrefix(prefix), keyFunc)(ok)
	rec := do(h, "192.0.2.1:1", nil)
	wantStatus(t, "key func error", rec, http.StatusBadRequest)

	var got error
	custom := httplimit.Limit(e, engine.PerMinute(1), httplimit.WithKeyPrefix(prefix), keyFunc,
		httplimit.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
			got = err
			w.WriteHeader(http.StatusUnauthorized)
		}))(ok)
	wantStatus(t, "custom handler", do(custom, "192.0.2.1:1", nil), http.StatusUnauthorized)
	if !errors.Is(got, httplimit.ErrKey) || !errors.Is(got, errNoUser) {
		t.Fatalf("error handler got %v, want ErrKey wrapping the key func's error", got)
	}

	req := httptest.NewRequest(http.MethodGet, "/?user=ann", nil)
	for i, code := range []int{http.StatusOK, http.StatusTooManyRequests} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		wantStatus(t, fmt.Sprintf("ann %d", i+1), rec, code)
	}
}

// Middlewares on one engine with different prefixes count apart; with the same prefix they
// share the clients' counts.
func TestKeyPrefixes(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	prefix := uniquePrefix(t)
	l := engine.PerMinute(1)
	a := httplimit.Limit(e, l, httplimit.WithKeyPrefix(prefix+"a:"))(ok)
	a2 := httplimit.Limit(e, l, httplimit.WithKeyPrefix(prefix+"a:"))(ok)
	b := httplimit.Limit(e, l, httplimit.WithKeyPrefix(prefix+"b:"))(ok)
	wantStatus(t, "a", do(a, "192.0.2.1:1", nil), http.StatusOK)
	wantStatus(t, "b", do(b, "192.0.2.1:1", nil), http.StatusOK)
	wantStatus(t, "a again, through another middleware with a's prefix", do(a2, "192.0.2.1:1", nil), http.StatusTooManyRequests)
}

// A custom denied handler answers denials, with the fields already set, and the next handler
// is not called.
func TestDeniedHandler(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	called := 0
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { called++ })
	h := httplimit.Limit(e, engine.PerMinute(1), httplimit.WithKeyPrefix(uniquePrefix(t)),
		httplimit.WithDeniedHandler(func(w http.ResponseWriter, _ *http.Request, res engine.Result) {
			if res.Allowed || res.RetryAfter <= 0 || w.Header().Get("Retry-After") == "" || w.Header().Get("RateLimit") == "" {
				t.Errorf("denied handler got %+v with header %v", res, w.Header())
			}
			w.WriteHeader(http.StatusServiceUnavailable)
		}))(next)
	wantStatus(t, "first", do(h, "192.0.2.1:1", nil), http.StatusOK)
	wantStatus(t, "second", do(h, "192.0.2.1:1", nil), http.StatusServiceUnavailable)
	if called != 1 {
		t.Fatalf("next handler called %d times, want 1", called)
	}
}

// With the server down, a fail-closed engine gives 503 (the next handler is not called); a
// fail-open engine lets the request through without RateLimit, and the hook sees the error.
// Rate and in-flight middleware alike.
func TestBackendDown(t *testing.T) {
	p := engine.Policy{engine.PerSecond(5), engine.PerHour(100)}
	for _, kind := range []struct {
		name        string
		middleware  func(*engine.Engine, ...httplimit.Option) func(http.Handler) http.Handler
		policyField string
	}{
		{"rate", func(e *engine.Engine, opts ...httplimit.Option) func(http.Handler) http.Handler {
			return httplimit.New(e, p, opts...)
		}, `"1s";q=5;w=1, "1h";q=100;w=3600`},
		{"in-flight", func(e *engine.Engine, opts ...httplimit.Option) func(http.Handler) http.Handler {
			return httplimit.NewConcurrent(e, 2, time.Minute, opts...)
		}, concurrentPolicy},
	} {
		t.Run(kind.name, func(t *testing.T) { testBackendDown(t, kind.middleware, kind.policyField) })
	}
}

func testBackendDown(t *testing.T, middleware func(*engine.Engine, ...httplimit.Option) func(http.Handler) http.Handler, policyField string) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	c := own.Client(t)
	closed := enginetest.New(t, c)
	open := enginetest.New(t, c, engine.WithFailOpen(true))
	called := 0
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { called++ })
	hClosed := middleware(closed)(next)
	var hookErr error
	hOpen := middleware(open, httplimit.WithFailOpenHook(func(_ *http.Request, err error) { hookErr = err }))(next)
	wantStatus(t, "closed, server up", do(hClosed, "192.0.2.1:1", nil), http.StatusOK)

	if err := own.Stop(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
	req.RemoteAddr = "192.0.2.1:1"

	rec := httptest.NewRecorder()
	hClosed.ServeHTTP(rec, req)
	wantStatus(t, "closed, server down", rec, http.StatusServiceUnavailable)
	if called != 1 {
		t.Fatalf("next handler called %d times, want 1", called)
	}
	var custom error
	withHandler := middleware(closed, httplimit.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
		custom = err
		w.WriteHeader(http.StatusBadGateway)
	}))(next)
	rec = httptest.NewRecorder()
	withHandler.ServeHTTP(rec, req)
	wantStatus(t, "closed, custom handler", rec, http.StatusBadGateway)
	if !errors.Is(custom, engine.ErrUnavailable) || errors.Is(custom, httplimit.ErrKey) {
		t.Fatalf("error handler got %v, want engine.ErrUnavailable", custom)
	}

	rec = httptest.NewRecorder()
	hOpen.ServeHTTP(rec, req)
	wantStatus(t, "open, server down", rec, http.StatusOK)
	if called != 2 {
		t.Fatalf("next handler called %d times, want 2", called)
	}
	if rec.Header().Get("RateLimit") != "" || rec.Header().Get("RateLimit-Policy") != policyField {
		t.Fatalf("fail-open header %v: want RateLimit-Policy and no RateLimit", rec.Header())
	}
	if !errors.Is(hookErr, engine.ErrUnavailable) {
		t.Fatalf("fail-open hook got %v", hookErr)
	}
}

// New refuses a nil engine and an invalid policy at once, naming the problem.
func TestNewPanicsOnInvalidPolicy(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	for name, f := range map[string]func(){
		"nil engine":       func() { httplimit.New(nil, engine.Policy{engine.PerSecond(1)}) },
		"empty policy":     func() { httplimit.New(e, nil) },
		"duplicate window": func() { httplimit.New(e, engine.Policy{engine.PerSecond(1), engine.PerSecond(2)}) },
		"Max 0":            func() { httplimit.Limit(e, engine.Limit{Window: time.Second}) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: New did not panic", name)
				}
			}()
			f()
		}()
	}
}

// In shadow mode the middleware never answers 429: a request the limit denies goes through,
// with the RateLimit fields of the real decision (no room: r=0) and no Retry-After, and the
// log keeps only what the limit admitted.
func TestShadowMode(t *testing.T) {
	c := server.Client(t)
	e, _ := enginetest.Clocked(t, c, engine.WithShadow(true))
	h := httplimit.New(e, engine.Policy{engine.PerSecond(2)}, httplimit.WithKeyPrefix(uniquePrefix(t)))(ok)
	const client = "192.0.2.7:40000"
	for i := 0; i < 5; i++ {
		rec := do(h, client, nil)
		wantStatus(t, fmt.Sprintf("request %d", i+1), rec, http.StatusOK)
		name, r, _ := rateLimit(t, rec.Header())
		if wantR := int64(max(1-i, 0)); name != "1s" || r != wantR {
			t.Fatalf("request %d: RateLimit %q, want r=%d", i+1, rec.Header().Get("RateLimit"), wantR)
		}
		if rec.Header().Get("Retry-After") != "" {
			t.Fatalf("request %d: Retry-After in shadow mode", i+1)
		}
	}
}

// t on an admitted response is draft -10's: the wait until the named limit next gets quota
// back, when the oldest event of its window leaves, long before the newest does. On a denial
// it stays the wait until the request would be admitted.
func TestTIsWhenQuotaComesBack(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	h := httplimit.Limit(e, engine.Limit{Max: 3, Window: time.Minute}, httplimit.WithKeyPrefix(uniquePrefix(t)),
		httplimit.WithLegacyHeaders(true))(ok)
	for _, step := range []struct {
		at        time.Duration
		code      int
		rateLimit string
	}{
		{0, http.StatusOK, `"1m";r=2;t=60`},                                     // the only event
		{20 * time.Second, http.StatusOK, `"1m";r=1;t=40`},                      // the first leaves at +60s, the newest at +80s
		{30*time.Second + 500*time.Millisecond, http.StatusOK, `"1m";r=0;t=30`}, // 29.5s, rounded up
		{45 * time.Second, http.StatusTooManyRequests, `"1m";r=0;t=15`},         // until admitted
		{61 * time.Second, http.StatusOK, `"1m";r=0;t=19`},                      // the +20s event is the oldest now
	} {
		clock.Set(enginetest.T0.Add(step.at))
		rec := do(h, "192.0.2.1:1", nil)
		wantStatus(t, fmt.Sprintf("at +%s", step.at), rec, step.code)
		if got := rec.Header().Get("RateLimit"); got != step.rateLimit {
			t.Fatalf("at +%s: RateLimit %q, want %q", step.at, got, step.rateLimit)
		}
		_, _, reset := rateLimit(t, rec.Header())
		if got := rec.Header().Get("X-RateLimit-Reset"); got != strconv.FormatInt(reset, 10) {
			t.Fatalf("at +%s: X-RateLimit-Reset %q, want t (%d)", step.at, got, reset)
		}
	}
}

// IPv6 clients are keyed by their /64 by default: two addresses in one /64 share a count,
// addresses in another /64 do not; WithIPv6Prefix widens or narrows it; IPv4-mapped addresses
// count as their IPv4 address.
func TestIPv6Prefix(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	l := engine.PerMinute(1)
	def := httplimit.Limit(e, l, httplimit.WithKeyPrefix(uniquePrefix(t)))(ok)
	wantStatus(t, "first address of a /64", do(def, "[2001:db8:1:2::1]:1", nil), http.StatusOK)
	wantStatus(t, "another address of that /64", do(def, "[2001:db8:1:2:ffff:ffff:ffff:ffff]:1", nil), http.StatusTooManyRequests)
	wantStatus(t, "the next /64", do(def, "[2001:db8:1:3::1]:1", nil), http.StatusOK)
	wantStatus(t, "IPv4", do(def, "192.0.2.9:1", nil), http.StatusOK)
	wantStatus(t, "IPv4-mapped: the same client", do(def, "[::ffff:192.0.2.9]:1", nil), http.StatusTooManyRequests)

	wide := httplimit.Limit(e, l, httplimit.WithKeyPrefix(uniquePrefix(t)), httplimit.WithIPv6Prefix(48))(ok)
	wantStatus(t, "/48: first", do(wide, "[2001:db8:1:2::1]:1", nil), http.StatusOK)
	wantStatus(t, "/48: another /64 of it", do(wide, "[2001:db8:1:3::1]:1", nil), http.StatusTooManyRequests)
	wantStatus(t, "/48: another /48", do(wide, "[2001:db8:2::1]:1", nil), http.StatusOK)

	each := httplimit.Limit(e, l, httplimit.WithKeyPrefix(uniquePrefix(t)), httplimit.WithIPv6Prefix(128))(ok)
	wantStatus(t, "/128: first", do(each, "[2001:db8:1:2::1]:1", nil), http.StatusOK)
	wantStatus(t, "/128: another address", do(each, "[2001:db8:1:2::2]:1", nil), http.StatusOK)

	for _, bits := range []int{0, 129} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("WithIPv6Prefix(%d): New did not panic", bits)
				}
			}()
			httplimit.Limit(e, l, httplimit.WithIPv6Prefix(bits))
		}()
	}
}

// A cost from the request is admitted and recorded as that many events; a cost the function
// cannot give, or one no request could ever be admitted with, is a 400 and records nothing.
func TestCost(t *testing.T) {
	c := server.Client(t)
	e := enginetest.New(t, c)
	prefix := uniquePrefix(t)
	errNoCost := errors.New("no X-Cost")
	cost := httplimit.WithCost(func(r *http.Request) (int, error) {
		v := r.Header.Get("X-Cost")
		if v == "" {
			return 0, errNoCost
		}
		return strconv.Atoi(v)
	})
	p := engine.Policy{{Max: 5, Window: time.Minute}, {Max: 8, Window: time.Hour}}
	var handled error
	h := httplimit.New(e, p, httplimit.WithKeyPrefix(prefix), cost)(ok)
	withHandler := httplimit.New(e, p, httplimit.WithKeyPrefix(prefix), cost,
		httplimit.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
			handled = err
			w.WriteHeader(http.StatusUnprocessableEntity)
		}))(ok)
	costs := func(v string) http.Header { return http.Header{"X-Cost": {v}} }
	const client = "192.0.2.1"
	logged := func() int64 { return enginetest.Events(t, c, "strictrate:", prefix+p.Tag()+":"+client) }

	rec := do(h, client+":1", costs("3"))
	wantStatus(t, "cost 3", rec, http.StatusOK)
	if got := rec.Header().Get("RateLimit"); got != `"1m";r=2;t=60` {
		t.Fatalf("cost 3: RateLimit %q", got)
	}
	if got := logged(); got != 3 {
		t.Fatalf("after a cost of 3 the log holds %d events", got)
	}
	wantStatus(t, "cost 3 more: over the minute's 5", do(h, client+":1", costs("3")), http.StatusTooManyRequests)
	for _, bad := range []http.Header{costs("abc"), costs("0"), costs("-2"), costs("6"), nil} {
		wantStatus(t, fmt.Sprintf("cost %q", bad.Get("X-Cost")), do(h, client+":1", bad), http.StatusBadRequest)
	}
	wantStatus(t, "cost 9, custom handler", do(withHandler, client+":1", costs("9")), http.StatusUnprocessableEntity)
	if !errors.Is(handled, httplimit.ErrCost) || errors.Is(handled, httplimit.ErrKey) {
		t.Fatalf("error handler got %v, want ErrCost", handled)
	}
	wantStatus(t, "no cost, custom handler", do(withHandler, client+":1", nil), http.StatusUnprocessableEntity)
	if !errors.Is(handled, httplimit.ErrCost) || !errors.Is(handled, errNoCost) {
		t.Fatalf("error handler got %v, want ErrCost wrapping the function's error", handled)
	}
	if got := logged(); got != 3 {
		t.Fatalf("after refused costs the log holds %d events, want 3", got)
	}
	wantStatus(t, "cost 2: the rest of the minute", do(h, client+":1", costs("2")), http.StatusOK)
	if got := logged(); got != 5 {
		t.Fatalf("the log holds %d events, want 5", got)
	}
}

// WithFieldsVersion(fields.Draft10) is the default syntax; a revision the fields package does
// not write is refused when the middleware is made.
func TestFieldsVersion(t *testing.T) {
	e, _ := enginetest.Clocked(t, server.Client(t))
	p := engine.Policy{engine.PerSecond(5), engine.PerHour(100)}
	def := httplimit.New(e, p, httplimit.WithKeyPrefix(uniquePrefix(t)))(ok)
	v10 := httplimit.New(e, p, httplimit.WithKeyPrefix(uniquePrefix(t)), httplimit.WithFieldsVersion(fields.Draft10))(ok)
	a, b := do(def, "192.0.2.1:1", nil).Header(), do(v10, "192.0.2.1:1", nil).Header()
	for _, name := range []string{"RateLimit", "RateLimit-Policy"} {
		if a.Get(name) == "" || a.Get(name) != b.Get(name) {
			t.Fatalf("%s: default %q, draft -10 %q", name, a.Get(name), b.Get(name))
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("an unknown revision did not panic")
		}
	}()
	httplimit.New(e, p, httplimit.WithFieldsVersion(99))
}

// Two middlewares of different policies on one engine, with the default key prefix (a login
// limit and a search limit): each holds on its own requests. They used to share each client's
// key, and the search limit's short window trimmed what the login limit counted: 20 of 20
// logins went through a limit of 5 per hour.
func TestMiddlewaresOfDifferentPoliciesCountApart(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	login := httplimit.Limit(e, engine.PerHour(5))(ok)
	search := httplimit.Limit(e, engine.Limit{Max: 100, Window: 10 * time.Millisecond})(ok)
	client := "198.51.100.23:4000"
	logins, searches := 0, 0
	for i := 0; i < 20; i++ {
		if do(login, client, nil).Code == http.StatusOK {
			logins++
		}
		time.Sleep(12 * time.Millisecond)
		if do(search, client, nil).Code == http.StatusOK {
			searches++
		}
	}
	if logins != 5 || searches != 20 {
		t.Fatalf("%d logins and %d searches admitted, want 5 and 20", logins, searches)
	}
}

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

// utcMonth returns the UTC month that holds t.
func utcMonth(t time.Time) (start, end time.Time) {
	y, m, _ := t.UTC().Date()
	start = time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
	return start, start.AddDate(0, 1, 0)
}

// secondsUntil is d in whole seconds, rounded up, as the fields and Retry-After write it.
func secondsUntil(from, to time.Time) int64 {
	d := to.Sub(from)
	return int64((d + time.Second - 1) / time.Second)
}

// "10 per second and 1000 a calendar month (UTC)" on the caller's clock: RateLimit-Policy
// names the month "month", with w the current month's length (30 days in November, 31 in
// December: the field follows the period); RateLimit names the tightest limit, the second
// while it has less room, the month once it has; a full month's denial has Retry-After and t
// the time to the month's end.
func TestCalendarMonthFields(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t))
	p := engine.Policy{engine.PerSecond(10), engine.Calendar(1000, engine.Month, time.UTC)}
	h := httplimit.New(e, p, httplimit.WithKeyPrefix(uniquePrefix(t)), httplimit.WithLegacyHeaders(true))(ok)
	const client = "192.0.2.1:1"
	start, end := utcMonth(enginetest.T0)
	monthSeconds := int64(end.Sub(start) / time.Second)
	if monthSeconds != 30*24*3600 {
		t.Fatalf("November 2026 is %d seconds long", monthSeconds) // the test's own arithmetic
	}
	policyField := fmt.Sprintf(`"1s";q=10;w=1, "month";q=1000;w=%d`, monthSeconds)

	rec := do(h, client, nil)
	wantStatus(t, "first", rec, http.StatusOK)
	checkPolicyField(t, rec.Header(), policyField)
	if name, r, reset := rateLimit(t, rec.Header()); name != "1s" || r != 9 || reset != 1 {
		t.Fatalf("first: RateLimit %q, want the second named: \"1s\";r=9;t=1", rec.Header().Get("RateLimit"))
	}
	if got := rec.Header().Get("X-RateLimit-Limit"); got != "10" {
		t.Fatalf("first: X-RateLimit-Limit %q, want 10", got)
	}

	// Fill the month, 5 in the first second, then 10 a second (the first request took one
	// already).
	now := enginetest.T0
	for i := 1; i < 1000; i++ {
		if i%10 == 5 {
			now = now.Add(time.Second)
			clock.Set(now)
		}
		rec = do(h, client, nil)
		wantStatus(t, fmt.Sprintf("request %d", i+1), rec, http.StatusOK)
		if i == 995 {
			// A new second: the second has 9 left, the month 4; the month binds, and its
			// quota comes back when it ends.
			checkPolicyField(t, rec.Header(), policyField)
			want := fmt.Sprintf(`"month";r=4;t=%d`, secondsUntil(now, end))
			if got := rec.Header().Get("RateLimit"); got != want {
				t.Fatalf("request %d: RateLimit %q, want %q", i+1, got, want)
			}
			if got := rec.Header().Get("X-RateLimit-Limit"); got != "1000" {
				t.Fatalf("request %d: X-RateLimit-Limit %q, want the month's 1000", i+1, got)
			}
		}
	}

	now = now.Add(1500 * time.Millisecond) // the second has room again; the month has none
	clock.Set(now)
	rec = do(h, client, nil)
	wantStatus(t, "month full", rec, http.StatusTooManyRequests)
	checkPolicyField(t, rec.Header(), policyField)
	wait := secondsUntil(now, end)
	if got := rec.Header().Get("Retry-After"); got != strconv.FormatInt(wait, 10) {
		t.Fatalf("month full: Retry-After %q, want %d, the seconds until the month ends", got, wait)
	}
	if name, r, reset := rateLimit(t, rec.Header()); name != "month" || r != 0 || reset != wait {
		t.Fatalf("month full: RateLimit %q, want \"month\";r=0;t=%d", rec.Header().Get("RateLimit"), wait)
	}

	// December: a new count, and the policy field gives December's 31 days.
	clock.Set(end)
	rec = do(h, client, nil)
	wantStatus(t, "next month", rec, http.StatusOK)
	checkPolicyField(t, rec.Header(), fmt.Sprintf(`"1s";q=10;w=1, "month";q=1000;w=%d`, 31*24*3600))
	if got := rec.Header().Get("RateLimit"); got != `"1s";r=9;t=1` {
		t.Fatalf("next month: RateLimit %q", got)
	}
	// And back in November (a clock that went back): November's fields again.
	clock.Set(now)
	checkPolicyField(t, do(h, client, nil).Header(), policyField)
}

// On the server's clock: w is the current UTC month's length, and a month that is full (a
// small one, so that the test fills it at once) is denied with Retry-After and t within a
// second of the time until the month ends.
func TestCalendarMonthOnServerClock(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	p := engine.Policy{engine.PerSecond(10), engine.Calendar(3, engine.Month, time.UTC)}
	var denial engine.Result
	h := httplimit.New(e, p, httplimit.WithKeyPrefix(uniquePrefix(t)),
		httplimit.WithDeniedHandler(func(w http.ResponseWriter, _ *http.Request, res engine.Result) {
			denial = res
			w.WriteHeader(http.StatusTooManyRequests)
		}))(ok)
	before := time.Now()
	for i := range 3 {
		wantStatus(t, fmt.Sprintf("request %d", i+1), do(h, "192.0.2.1:1", nil), http.StatusOK)
	}
	rec := do(h, "192.0.2.1:1", nil)
	after := time.Now()
	wantStatus(t, "4th", rec, http.StatusTooManyRequests)
	start, end := utcMonth(denial.At)
	if s, _ := utcMonth(before); !s.Equal(start) {
		t.Skipf("the month changed during the test (%s to %s)", before, denial.At)
	}
	checkPolicyField(t, rec.Header(), fmt.Sprintf(`"1s";q=10;w=1, "month";q=3;w=%d`, int64(end.Sub(start)/time.Second)))
	ra, err := strconv.ParseInt(rec.Header().Get("Retry-After"), 10, 64)
	if err != nil {
		t.Fatalf("Retry-After %q: %v", rec.Header().Get("Retry-After"), err)
	}
	// The server's clock and this one may differ a little; a second covers the rounding.
	if lo, hi := int64(end.Sub(after)/time.Second), secondsUntil(before, end)+1; ra < lo || ra > hi {
		t.Fatalf("Retry-After %d, want the time until the month ends, %d to %d", ra, lo, hi)
	}
	if name, r, reset := rateLimit(t, rec.Header()); name != "month" || r != 0 || reset != ra {
		t.Fatalf("RateLimit %q, want \"month\";r=0;t=%d", rec.Header().Get("RateLimit"), ra)
	}
	if want := secondsUntil(denial.At, end); ra != want {
		t.Fatalf("Retry-After %d, want %d, the time from the decision to the month's end", ra, want)
	}
}

// A limit with a Resolution has the fields of the same limit without it: its window's name and
// w, and on a clock at the start of its slots, the same r and t.
func TestResolutionLimitFields(t *testing.T) {
	e, clock := enginetest.Clocked(t, server.Client(t)) // T0 is on a whole minute
	plain := engine.Policy{engine.PerSecond(10), {Max: 5, Window: time.Hour}}
	slotted := engine.Policy{engine.PerSecond(10), {Max: 5, Window: time.Hour, Resolution: time.Minute}}
	hp := httplimit.New(e, plain, httplimit.WithKeyPrefix(uniquePrefix(t)))(ok)
	hs := httplimit.New(e, slotted, httplimit.WithKeyPrefix(uniquePrefix(t)))(ok)
	for i, at := range []time.Duration{0, 0, time.Minute, time.Minute, 2 * time.Minute, 2 * time.Minute, time.Hour} {
		clock.Set(enginetest.T0.Add(at))
		a, b := do(hp, "192.0.2.1:1", nil), do(hs, "192.0.2.1:1", nil)
		checkPolicyField(t, b.Header(), `"1s";q=10;w=1, "1h";q=5;w=3600`)
		for _, name := range []string{"RateLimit-Policy", "RateLimit", "Retry-After"} {
			if got, want := b.Header().Get(name), a.Header().Get(name); got != want {
				t.Fatalf("request %d: %s %q with a Resolution, %q without", i+1, name, got, want)
			}
		}
		if a.Code != b.Code {
			t.Fatalf("request %d: status %d with a Resolution, %d without", i+1, b.Code, a.Code)
		}
	}
}

// Every calendar period has a name of its own in a policy, and w its current length: a day, an
// ISO week, a year, a billing month; two months in different zones are told apart by their
// zones.
func TestCalendarNames(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Skipf("no zone data: %v", err)
	}
	e, _ := enginetest.Clocked(t, server.Client(t)) // 2026-11-30 12:00 UTC, a Monday
	p := engine.Policy{
		engine.PerMinute(50),
		engine.Calendar(100, engine.Day, time.UTC),
		engine.Calendar(200, engine.Week, time.UTC),
		engine.Calendar(300, engine.Month, time.UTC),
		engine.Calendar(400, engine.Month, berlin),
		engine.Calendar(500, engine.Month, time.UTC).WithBillingDay(15),
		engine.Calendar(600, engine.Year, time.UTC),
	}
	rec := do(httplimit.New(e, p, httplimit.WithKeyPrefix(uniquePrefix(t)))(ok), "192.0.2.1:1", nil)
	wantStatus(t, "request", rec, http.StatusOK)
	const day = 24 * 3600
	checkPolicyField(t, rec.Header(), fmt.Sprintf(`"1m";q=50;w=60, "day";q=100;w=%d, "week";q=200;w=%d, `+
		`"month@UTC";q=300;w=%d, "month@Europe/Berlin";q=400;w=%d, "month-15";q=500;w=%d, "year";q=600;w=%d`,
		day, 7*day, 30*day, 30*day, 30*day, 365*day))
	if got := rec.Header().Get("RateLimit"); got != `"1m";r=49;t=60` {
		t.Fatalf("RateLimit %q", got)
	}
}

// Under fail-open, a request whose context has ended (a client that hung up, a deadline the
// server set that passed) never reaches the handler: past a used-up rate limit, or on an
// in-flight limit whatever its slots, it is the error handler's, with the context's error.
func TestFailOpenEndedRequestsNeverReachTheHandler(t *testing.T) {
	c := server.Client(t)
	open := enginetest.New(t, c, engine.WithFailOpen(true))
	for _, kind := range []struct {
		name       string
		middleware func(...httplimit.Option) func(http.Handler) http.Handler
	}{
		{"rate", func(opts ...httplimit.Option) func(http.Handler) http.Handler {
			return httplimit.New(open, engine.Policy{engine.PerHour(3)}, opts...)
		}},
		{"in-flight", func(opts ...httplimit.Option) func(http.Handler) http.Handler {
			return httplimit.NewConcurrent(open, 3, time.Hour, opts...)
		}},
	} {
		t.Run(kind.name, func(t *testing.T) {
			handled, hooked := 0, 0
			var got error
			h := kind.middleware(httplimit.WithKeyPrefix(enginetest.NewKey(t)+":"),
				httplimit.WithFailOpenHook(func(*http.Request, error) { hooked++ }),
				httplimit.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
					got = err
					w.WriteHeader(http.StatusServiceUnavailable)
				}))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { handled++ }))
			// Three requests: the rate limit's whole quota.
			for range 3 {
				wantStatus(t, "filling", do(h, "192.0.2.7:1", nil), http.StatusOK)
			}
			handled = 0
			expired, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Millisecond))
			defer cancel()
			cancelled, cancelNow := context.WithCancel(context.Background())
			cancelNow()
			for _, ctx := range []context.Context{expired, cancelled} {
				for range 50 {
					req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
					req.RemoteAddr = "192.0.2.7:1"
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, req)
					if rec.Code != http.StatusServiceUnavailable || !errors.Is(got, ctx.Err()) {
						t.Fatalf("a request whose context ended (%v): %d, error %v; want the error handler with the context's error", ctx.Err(), rec.Code, got)
					}
				}
			}
			if handled != 0 || hooked != 0 {
				t.Fatalf("100 requests whose context ended ran the handler %d times and the fail-open hook %d times; want 0", handled, hooked)
			}
		})
	}
}
