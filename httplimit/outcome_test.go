package httplimit_test

// Tests of WithRefundOn, WithResetOn and WithOutcomeErrorHook (outcome.go), through a real
// server on loopback where the writer's interfaces or concurrency matter, and a real Valkey.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/clientkey"
	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/httplimit"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// loginLimit is the limit of the outcome tests: 5 attempts per 15 minutes.
var loginLimit = engine.Limit{Max: 5, Window: 15 * time.Minute}

// login is a login handler: 200 "welcome" for the password "right", 401 for any other; reached
// counts the requests it got.
type login struct{ reached atomic.Int64 }

func (l *login) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	l.reached.Add(1)
	if r.PostFormValue("password") == "right" {
		io.WriteString(w, "welcome\n")
		return
	}
	http.Error(w, "wrong password", http.StatusUnauthorized)
}

// byAccount keys a login by its form's account.
var byAccount = httplimit.WithKeyFunc(func(r *http.Request) (string, error) {
	if a := r.PostFormValue("account"); a != "" {
		return a, nil
	}
	return "", errors.New("no account")
})

// succeeded is the refund of "count only failed logins".
func succeeded(status int) bool { return status < 400 }

// loginRequest is a login of account with password, from one address.
func loginRequest(ctx context.Context, account, password string) *http.Request {
	form := url.Values{"account": {account}, "password": {password}}.Encode()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/login", strings.NewReader(form))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.RemoteAddr = "192.0.2.1:40000"
	return req
}

// post sends one login through h and returns the recorded response.
func post(h http.Handler, account, password string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, loginRequest(context.Background(), account, password))
	return rec
}

// postTo sends one login to a real server at addr and returns its status, once the whole
// response has been read: the middleware's refund or reset is done by then.
func postTo(client *http.Client, addr, account, password string) (int, error) {
	resp, err := client.PostForm(addr, url.Values{"account": {account}, "password": {password}})
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, err
}

// postAll sends n logins at once to addr and returns how many answers had each status.
func postAll(t *testing.T, client *http.Client, addr, account, password string, n int) map[int]int {
	t.Helper()
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		codes = map[int]int{}
		start = make(chan struct{})
	)
	for range n {
		wg.Go(func() {
			<-start
			code, err := postTo(client, addr, account, password)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			codes[code]++
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return codes
}

// wantPosts fails t unless n sequential logins to addr all answer code.
func wantPosts(t *testing.T, client *http.Client, addr, account, password string, n, code int) {
	t.Helper()
	for i := range n {
		got, err := postTo(client, addr, account, password)
		if err != nil || got != code {
			t.Fatalf("%s, %s, login %d: %d, %v; want %d", account, password, i+1, got, err, code)
		}
	}
}

// remaining is what Peek says the account's key under prefix still admits of loginLimit.
func remaining(t *testing.T, e *engine.Engine, prefix, account string) int {
	t.Helper()
	return enginetest.MustPeek(t, e, clientkey.Prefix(prefix, engine.Policy{loginLimit})+account, loginLimit).Remaining
}

// wantRemaining fails t unless the account's key admits want more.
func wantRemaining(t *testing.T, e *engine.Engine, prefix, account string, want int) {
	t.Helper()
	if got := remaining(t, e, prefix, account); got != want {
		t.Fatalf("%s: %d remaining, want %d", account, got, want)
	}
}

// 100 wrong passwords at once through a real server reach the handler exactly Max times:
// each is counted when admitted, before its handler answers. Successful logins are admitted
// and given back: after any number of them the key admits exactly as many failures as before.
func TestRefundOnCountsOnlyFailedLogins(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	prefix := uniquePrefix(t)
	var asked atomic.Int64
	var h login
	addr, client := serveLoopback(t, httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(prefix), byAccount,
		httplimit.WithRefundOn(func(s int) bool { asked.Add(1); return succeeded(s) }))(&h))

	got := postAll(t, client, addr, "alice", "wrong", 100)
	if h.reached.Load() != 5 || got[http.StatusUnauthorized] != 5 || got[http.StatusTooManyRequests] != 95 {
		t.Fatalf("100 wrong passwords at once: handler reached %d times, answers %v; want 5 401s and 95 429s",
			h.reached.Load(), got)
	}
	if asked.Load() != 5 {
		t.Fatalf("the refund was asked about %d answers, want the 5 the handler gave", asked.Load())
	}
	wantRemaining(t, e, prefix, "alice", 0)
	// The right password of a full account is refused: it is counted before it is checked.
	wantPosts(t, client, addr, "alice", "right", 1, http.StatusTooManyRequests)

	h.reached.Store(0)
	wantPosts(t, client, addr, "bob", "right", 20, http.StatusOK)
	wantRemaining(t, e, prefix, "bob", 5)
	wantPosts(t, client, addr, "bob", "wrong", 2, http.StatusUnauthorized)
	wantPosts(t, client, addr, "bob", "right", 10, http.StatusOK)
	wantRemaining(t, e, prefix, "bob", 3)
	got = postAll(t, client, addr, "bob", "wrong", 100)
	if reached := h.reached.Load() - 32; reached != 3 || got[http.StatusUnauthorized] != 3 || got[http.StatusTooManyRequests] != 97 {
		t.Fatalf("after 30 successes and 2 failures, 100 wrong passwords at once: handler reached %d times, answers %v; want 3 401s",
			reached, got)
	}
}

// A successful login clears the account's count: failures get the full Max again.
func TestResetOnClearsTheKey(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	prefix := uniquePrefix(t)
	var h login
	addr, client := serveLoopback(t, httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(prefix), byAccount,
		httplimit.WithResetOn(func(s int) bool { return s == http.StatusOK }))(&h))

	wantPosts(t, client, addr, "alice", "wrong", 3, http.StatusUnauthorized)
	wantRemaining(t, e, prefix, "alice", 2)
	wantPosts(t, client, addr, "alice", "right", 1, http.StatusOK)
	wantRemaining(t, e, prefix, "alice", 5)
	h.reached.Store(0)
	got := postAll(t, client, addr, "alice", "wrong", 100)
	if h.reached.Load() != 5 || got[http.StatusUnauthorized] != 5 || got[http.StatusTooManyRequests] != 95 {
		t.Fatalf("after the reset, 100 wrong passwords at once: handler reached %d times, answers %v; want 5 401s",
			h.reached.Load(), got)
	}
}

// When both options match a status, the key is reset: a refund alone would leave the earlier
// failures counted.
func TestResetWinsOverRefund(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	prefix := uniquePrefix(t)
	h := httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(prefix), byAccount,
		httplimit.WithRefundOn(succeeded), httplimit.WithResetOn(func(s int) bool { return s == http.StatusOK }))(&login{})
	for range 3 {
		wantStatus(t, "wrong password", post(h, "alice", "wrong"), http.StatusUnauthorized)
	}
	wantStatus(t, "right password", post(h, "alice", "right"), http.StatusOK)
	wantRemaining(t, e, prefix, "alice", 5)
}

// The status is what the handler wrote: nothing is 200, a Write or a Flush without WriteHeader
// is 200, WriteHeader's first final status wins.
func TestOutcomeStatus(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	for _, tc := range []struct {
		name    string
		handler func(http.ResponseWriter)
		want    int
		flushed bool
	}{
		{"nothing written", func(http.ResponseWriter) {}, 200, false},
		{"Write only", func(w http.ResponseWriter) { io.WriteString(w, "ok") }, 200, false},
		{"WriteHeader then Write", func(w http.ResponseWriter) { w.WriteHeader(401); io.WriteString(w, "no") }, 401, false},
		{"first WriteHeader wins", func(w http.ResponseWriter) { w.WriteHeader(403); w.WriteHeader(200) }, 403, false},
		{"Write then WriteHeader", func(w http.ResponseWriter) { io.WriteString(w, "ok"); w.WriteHeader(500) }, 200, false},
		{"1xx before the final status", func(w http.ResponseWriter) { w.WriteHeader(103); w.WriteHeader(401) }, 401, false},
		{"Flush", func(w http.ResponseWriter) { w.(http.Flusher).Flush(); w.WriteHeader(401) }, 200, true},
		{"ResponseController Flush", func(w http.ResponseWriter) {
			if err := http.NewResponseController(w).Flush(); err != nil {
				panic(err)
			}
		}, 200, true},
		{"io.Copy", func(w http.ResponseWriter) { io.Copy(w, onlyReader{strings.NewReader("ok")}) }, 200, false},
		{"io.Copy of nothing, then WriteHeader", func(w http.ResponseWriter) {
			io.Copy(w, onlyReader{strings.NewReader("")})
			w.WriteHeader(401)
		}, 401, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int
			h := httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(uniquePrefix(t)), byAccount,
				httplimit.WithRefundOn(func(s int) bool { got = append(got, s); return false }),
			)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { tc.handler(w) }))
			rec := post(h, "alice", "right")
			if len(got) != 1 || got[0] != tc.want {
				t.Fatalf("refund asked about %v, want [%d]", got, tc.want)
			}
			if rec.Flushed != tc.flushed {
				t.Fatalf("Flushed %t, want %t", rec.Flushed, tc.flushed)
			}
		})
	}
}

// The handler's writer keeps the interfaces of the one it wraps: http.Flusher when that one
// flushes, http.Hijacker only when it hijacks, Unwrap for http.ResponseController. Without an
// outcome option it is not wrapped at all.
func TestOutcomeWriterInterfaces(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	type seen struct {
		flusher, hijacker, unwraps bool
		deadline, fullDuplex       error
		same                       bool
	}
	look := func(into *seen, under *http.ResponseWriter) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, into.flusher = w.(http.Flusher)
			_, into.hijacker = w.(http.Hijacker)
			u, ok := w.(interface{ Unwrap() http.ResponseWriter })
			into.unwraps = ok && u.Unwrap() == *under
			into.same = w == *under
			rc := http.NewResponseController(w)
			into.deadline = rc.SetWriteDeadline(time.Now().Add(time.Minute))
			into.fullDuplex = rc.EnableFullDuplex()
		})
	}
	outcome := httplimit.WithRefundOn(succeeded)

	// A recorder flushes and does nothing else.
	var got seen
	var under http.ResponseWriter
	h := httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(uniquePrefix(t)), byAccount, outcome)(look(&got, &under))
	rec := httptest.NewRecorder()
	under = rec
	h.ServeHTTP(rec, loginRequest(context.Background(), "alice", "x"))
	if !got.flusher || got.hijacker || !got.unwraps || got.same ||
		!errors.Is(got.deadline, http.ErrNotSupported) || !errors.Is(got.fullDuplex, http.ErrNotSupported) {
		t.Fatalf("over a recorder: %+v; want a Flusher, no Hijacker, Unwrap to the recorder", got)
	}

	// A real server's writer does all of it; ResponseController reaches what the wrapper
	// lacks (write deadlines, full duplex) through Unwrap.
	got = seen{}
	addr, client := serveLoopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		under = w
		h.ServeHTTP(w, r)
	}))
	if code, err := postTo(client, addr, "alice", "x"); err != nil || code != http.StatusOK {
		t.Fatalf("real server: %d, %v", code, err)
	}
	if !got.flusher || !got.hijacker || !got.unwraps || got.same || got.deadline != nil || got.fullDuplex != nil {
		t.Fatalf("over a real server's writer: %+v; want a Flusher, a Hijacker, Unwrap, deadlines and full duplex", got)
	}

	// No outcome option: the handler gets the writer as it is.
	got = seen{}
	plain := httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(uniquePrefix(t)), byAccount)(look(&got, &under))
	rec = httptest.NewRecorder()
	under = rec
	plain.ServeHTTP(rec, loginRequest(context.Background(), "alice", "x"))
	if !got.same {
		t.Fatal("without an outcome option the writer is wrapped")
	}
}

// unwrapOnly is a middleware's writer of the kind Go 1.20 recommends: it implements no
// optional interface, only Unwrap, for http.ResponseController to find them.
type unwrapOnly struct{ w http.ResponseWriter }

func (u unwrapOnly) Header() http.Header         { return u.w.Header() }
func (u unwrapOnly) Write(b []byte) (int, error) { return u.w.Write(b) }
func (u unwrapOnly) WriteHeader(code int)        { u.w.WriteHeader(code) }
func (u unwrapOnly) Unwrap() http.ResponseWriter { return u.w }

// A request whose handler hijacked the connection has no status, and is never refunded:
// hijacked through the interface, through http.ResponseController, or through a writer that
// only unwraps to the server's.
func TestHijackedIsNeverRefunded(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	for _, tc := range []struct {
		name   string
		hijack func(http.ResponseWriter) (io.WriteCloser, error)
		outer  func(http.ResponseWriter) http.ResponseWriter
	}{
		{"Hijacker", func(w http.ResponseWriter) (io.WriteCloser, error) {
			conn, _, err := w.(http.Hijacker).Hijack()
			return conn, err
		}, nil},
		{"ResponseController", func(w http.ResponseWriter) (io.WriteCloser, error) {
			conn, _, err := http.NewResponseController(w).Hijack()
			return conn, err
		}, nil},
		{"ResponseController behind an Unwrap-only writer", func(w http.ResponseWriter) (io.WriteCloser, error) {
			conn, _, err := http.NewResponseController(w).Hijack()
			return conn, err
		}, func(w http.ResponseWriter) http.ResponseWriter { return unwrapOnly{w} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := uniquePrefix(t)
			var asked atomic.Int64
			done := make(chan struct{}, 1)
			hijacking := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				conn, err := tc.hijack(w)
				if err != nil {
					t.Errorf("hijack: %v", err)
					return
				}
				io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
				conn.Close()
			})
			h := httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(prefix), byAccount,
				httplimit.WithRefundOn(func(s int) bool { asked.Add(1); return succeeded(s) }))(hijacking)
			addr, client := serveLoopback(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if tc.outer != nil {
					w = tc.outer(w)
				}
				h.ServeHTTP(w, r)
				done <- struct{}{}
			}))
			if code, err := postTo(client, addr, "alice", "right"); err != nil || code != http.StatusOK {
				t.Fatalf("hijacked login: %d, %v", code, err)
			}
			<-done // the middleware has returned
			if asked.Load() != 0 {
				t.Fatalf("the refund was asked about a hijacked request")
			}
			wantRemaining(t, e, prefix, "alice", 4)
		})
	}
}

// Never refunded: a panicking handler (the panic goes on), a request shadow mode admitted
// over the limit, one a fail-open engine admitted without deciding, a denied one.
func TestOutcomeNeverForUncountedRequests(t *testing.T) {
	t.Run("panic", func(t *testing.T) {
		e := enginetest.New(t, server.Client(t))
		prefix := uniquePrefix(t)
		var asked atomic.Int64
		h := httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(prefix), byAccount,
			httplimit.WithRefundOn(func(int) bool { asked.Add(1); return true }),
			httplimit.WithResetOn(func(int) bool { asked.Add(1); return true }),
		)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusOK)
			panic(http.ErrAbortHandler)
		}))
		func() {
			defer func() {
				if p := recover(); p != http.ErrAbortHandler {
					t.Fatalf("recovered %v, want the handler's panic", p)
				}
			}()
			post(h, "alice", "right")
		}()
		if asked.Load() != 0 {
			t.Fatal("outcome asked about a panicking handler")
		}
		wantRemaining(t, e, prefix, "alice", 4)
	})

	t.Run("shadow", func(t *testing.T) {
		e := enginetest.New(t, server.Client(t), engine.WithShadow(true))
		prefix := uniquePrefix(t)
		var statuses []int
		var hooked error
		one := engine.Limit{Max: 1, Window: loginLimit.Window}
		h := httplimit.Limit(e, one, httplimit.WithKeyPrefix(prefix), byAccount,
			httplimit.WithRefundOn(func(s int) bool { statuses = append(statuses, s); return succeeded(s) }),
			httplimit.WithOutcomeErrorHook(func(_ *http.Request, err error) { hooked = err }))(&login{})
		wantStatus(t, "a failure fills the limit", post(h, "alice", "wrong"), http.StatusUnauthorized)
		wantStatus(t, "shadow admission", post(h, "alice", "right"), http.StatusOK)
		if len(statuses) != 1 || statuses[0] != http.StatusUnauthorized || hooked != nil {
			t.Fatalf("refund asked about %v, hook %v: want the recorded failure only", statuses, hooked)
		}
		key := clientkey.Prefix(prefix, engine.Policy{one}) + "alice"
		if r := enginetest.MustPeek(t, e, key, one); r.Remaining != 0 {
			t.Fatalf("after a shadow admission: %+v, want the failure still counted", r)
		}
	})

	t.Run("fail-open", func(t *testing.T) {
		own := valkeytest.New(t, valkeytest.OwnServer())
		e := enginetest.New(t, own.Client(t), engine.WithFailOpen(true))
		var asked atomic.Int64
		var hooked error
		h := httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(uniquePrefix(t)), byAccount,
			httplimit.WithRefundOn(func(int) bool { asked.Add(1); return true }),
			httplimit.WithOutcomeErrorHook(func(_ *http.Request, err error) { hooked = err }))(&login{})
		if err := own.Stop(); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, loginRequest(ctx, "alice", "right"))
		wantStatus(t, "fail-open", rec, http.StatusOK)
		if asked.Load() != 0 || hooked != nil {
			t.Fatalf("fail-open admission: refund asked %d times, hook %v; want neither", asked.Load(), hooked)
		}
	})

	t.Run("denied", func(t *testing.T) {
		e := enginetest.New(t, server.Client(t))
		prefix := uniquePrefix(t)
		var asked atomic.Int64
		h := httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(prefix), byAccount,
			httplimit.WithResetOn(func(s int) bool { asked.Add(1); return s == http.StatusTooManyRequests }))(&login{})
		for range 5 {
			post(h, "alice", "wrong")
		}
		wantStatus(t, "denied", post(h, "alice", "wrong"), http.StatusTooManyRequests)
		if asked.Load() != 5 {
			t.Fatalf("reset asked %d times, want the 5 admitted requests only", asked.Load())
		}
		wantRemaining(t, e, prefix, "alice", 0)
	})
}

// A client that hung up while its handler ran still gets its refund: it runs on the request's
// context without its cancellation.
func TestRefundAfterTheClientHungUp(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	prefix := uniquePrefix(t)
	ctx, hangUp := context.WithCancel(context.Background())
	defer hangUp()
	var hooked error
	h := httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(prefix), byAccount, httplimit.WithRefundOn(succeeded),
		httplimit.WithOutcomeErrorHook(func(_ *http.Request, err error) { hooked = err }),
	)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hangUp()
		<-r.Context().Done()
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, loginRequest(ctx, "alice", "right"))
	if hooked != nil {
		t.Fatalf("hook: %v", hooked)
	}
	wantRemaining(t, e, prefix, "alice", 5)
}

// A refund or a reset that fails goes to the hook, with an error that wraps ErrRefund or
// ErrReset and the engine's; the response is the handler's. Without a hook it is logged.
func TestOutcomeFailure(t *testing.T) {
	t.Run("refund", func(t *testing.T) {
		c := server.Client(t)
		e := enginetest.New(t, c)
		prefix := uniquePrefix(t)
		var hooked []error
		// The handler overwrites the key's log with a string, which Refund refuses to read.
		h := httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(prefix), byAccount, httplimit.WithRefundOn(succeeded),
			httplimit.WithOutcomeErrorHook(func(_ *http.Request, err error) { hooked = append(hooked, err) }),
		)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			full := enginetest.Prefix + clientkey.Prefix(prefix, engine.Policy{loginLimit}) + "alice"
			if err := c.Do(r.Context(), c.B().Set().Key(full).Value("not a log").Build()).Error(); err != nil {
				t.Error(err)
			}
			w.Header().Set("X-Login", "ok")
			io.WriteString(w, "welcome\n")
		}))
		rec := post(h, "alice", "right")
		wantStatus(t, "refund failed", rec, http.StatusOK)
		if rec.Body.String() != "welcome\n" || rec.Header().Get("X-Login") != "ok" {
			t.Fatalf("response %q %v, want the handler's", rec.Body.String(), rec.Header())
		}
		if len(hooked) != 1 || !errors.Is(hooked[0], httplimit.ErrRefund) || errors.Is(hooked[0], httplimit.ErrReset) ||
			!errors.Is(hooked[0], engine.ErrUnknownLayout) {
			t.Fatalf("hook got %v, want one error wrapping ErrRefund and engine.ErrUnknownLayout", hooked)
		}
	})

	t.Run("reset", func(t *testing.T) {
		c, err := valkey.NewClient(valkey.ClientOption{InitAddress: []string{server.Addr}})
		if err != nil {
			t.Fatal(err)
		}
		e := enginetest.New(t, c)
		var hooked []error
		// The handler closes the engine's client: the reset cannot be sent.
		h := httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(uniquePrefix(t)), byAccount,
			httplimit.WithResetOn(func(s int) bool { return s == http.StatusOK }),
			httplimit.WithOutcomeErrorHook(func(_ *http.Request, err error) { hooked = append(hooked, err) }),
		)(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			c.Close()
			io.WriteString(w, "welcome\n")
		}))
		rec := post(h, "alice", "right")
		wantStatus(t, "reset failed", rec, http.StatusOK)
		if rec.Body.String() != "welcome\n" {
			t.Fatalf("body %q, want the handler's", rec.Body.String())
		}
		if len(hooked) != 1 || !errors.Is(hooked[0], httplimit.ErrReset) || errors.Is(hooked[0], httplimit.ErrRefund) ||
			!errors.Is(hooked[0], valkey.ErrClosing) {
			t.Fatalf("hook got %v, want one error wrapping ErrReset and the client's", hooked)
		}
	})

	t.Run("logged by default", func(t *testing.T) {
		var logged syncBuffer
		old := slog.Default()
		slog.SetDefault(slog.New(slog.NewTextHandler(&logged, nil)))
		t.Cleanup(func() { slog.SetDefault(old) })
		c := server.Client(t)
		e := enginetest.New(t, c)
		prefix := uniquePrefix(t)
		h := httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(prefix), byAccount, httplimit.WithRefundOn(succeeded))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			full := enginetest.Prefix + clientkey.Prefix(prefix, engine.Policy{loginLimit}) + "alice"
			c.Do(r.Context(), c.B().Set().Key(full).Value("not a log").Build())
		}))
		wantStatus(t, "refund failed", post(h, "alice", "right"), http.StatusOK)
		if s := logged.String(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, httplimit.ErrRefund.Error()) ||
			!strings.Contains(s, "path=/login") {
			t.Fatalf("logged %q, want a warning with ErrRefund and the path", s)
		}
	})
}

// onlyReader hides a reader's WriteTo, so that io.Copy calls the writer's ReadFrom.
type onlyReader struct{ io.Reader }

// syncBuffer is a bytes.Buffer safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// On a real server io.Copy goes through the server's ReadFrom (sendfile for a file): its
// status is 200 once it wrote, and nothing when it wrote nothing.
func TestOutcomeReadFromOnARealServer(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	body := bytes.Repeat([]byte("0123456789abcdef"), 1<<12) // 64 KiB, past net/http's sniffing
	var statuses []int
	var mu sync.Mutex
	h := httplimit.Limit(e, loginLimit, httplimit.WithKeyPrefix(uniquePrefix(t)), byAccount,
		httplimit.WithRefundOn(func(s int) bool { mu.Lock(); statuses = append(statuses, s); mu.Unlock(); return false }),
	)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := w.(io.ReaderFrom); !ok {
			t.Error("the writer lost io.ReaderFrom")
		}
		if r.PostFormValue("password") == "right" {
			io.Copy(w, onlyReader{bytes.NewReader(body)})
			return
		}
		io.Copy(w, onlyReader{strings.NewReader("")})
		w.WriteHeader(http.StatusUnauthorized)
	}))
	addr, client := serveLoopback(t, h)
	resp, err := client.PostForm(addr, url.Values{"account": {"alice"}, "password": {"right"}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK || !bytes.Equal(got, body) {
		t.Fatalf("copied body: %d, %d bytes, %v", resp.StatusCode, len(got), err)
	}
	wantPosts(t, client, addr, "alice", "wrong", 1, http.StatusUnauthorized)
	mu.Lock()
	defer mu.Unlock()
	if len(statuses) != 2 || statuses[0] != http.StatusOK || statuses[1] != http.StatusUnauthorized {
		t.Fatalf("refund asked about %v, want [200 401]", statuses)
	}
}
