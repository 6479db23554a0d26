package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valkey-io/valkey-go"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/httplimit"
	"github.com/strictrate/strictrate/internal/enginetest"
	"github.com/strictrate/strictrate/internal/valkeytest"
)

// blocking is a handler that holds every request until freed, and says when one starts.
type blocking struct {
	started chan struct{}
	release chan struct{}
	once    sync.Once
}

func newBlocking(t *testing.T) *blocking {
	b := &blocking{started: make(chan struct{}, 100), release: make(chan struct{})}
	t.Cleanup(b.free) // a failed test must not leave handlers blocked
	return b
}

// free lets every held request, and every later one, finish.
func (b *blocking) free() { b.once.Do(func() { close(b.release) }) }

func (b *blocking) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.started <- struct{}{}
	<-b.release
	io.WriteString(w, "done\n")
}

// inFlight sends a request through h in a goroutine and returns its response once it is
// answered; it waits until the handler started.
func inFlight(t *testing.T, h http.Handler, b *blocking, remote string) <-chan *httptest.ResponseRecorder {
	t.Helper()
	out := make(chan *httptest.ResponseRecorder, 1)
	go func() { out <- do(h, remote, nil) }()
	select {
	case <-b.started:
	case rec := <-out:
		t.Fatalf("request from %s answered %d without reaching the handler", remote, rec.Code)
	case <-time.After(10 * time.Second):
		t.Fatalf("request from %s never reached the handler", remote)
	}
	return out
}

// refused sends a request through h that must be answered without reaching the handler.
func refused(t *testing.T, h http.Handler, b *blocking, remote string) *httptest.ResponseRecorder {
	t.Helper()
	out := make(chan *httptest.ResponseRecorder, 1)
	go func() { out <- do(h, remote, nil) }()
	select {
	case rec := <-out:
		return rec
	case <-b.started:
		b.free()
		t.Fatalf("request from %s reached the handler: %d", remote, (<-out).Code)
	}
	return nil
}

// leaseMembers returns the leases the middleware key k holds: member and expiry score.
func leaseMembers(t *testing.T, c valkey.Client, k string) []valkey.ZScore {
	t.Helper()
	return valkeytest.Must(t, "ZRANGE", c.Do(context.Background(),
		c.B().Zrange().Key("strictrate:"+engine.LeaseNamespace+k).Min("0").Max("-1").Withscores().Build()), valkey.ValkeyResult.AsZScores)
}

// Max requests of one client run at once; the next is answered 429 with Retry-After and the
// RateLimit fields (exact on a caller's clock); another client has its own slots; a finished
// request gives its slot back.
func TestConcurrentLimit(t *testing.T) {
	c := server.Client(t)
	e, _ := enginetest.Clocked(t, c)
	prefix := uniquePrefix(t)
	b := newBlocking(t)
	h := httplimit.NewConcurrent(e, 2, 10*time.Second, httplimit.WithKeyPrefix(prefix), httplimit.WithLegacyHeaders(true))(b)
	const client = "192.0.2.1:1"

	first := inFlight(t, h, b, client)
	second := inFlight(t, h, b, client)
	rec := refused(t, h, b, client)
	wantStatus(t, "third at once", rec, http.StatusTooManyRequests)
	for field, want := range map[string]string{
		"RateLimit-Policy": concurrentPolicy, "RateLimit": `"concurrency";r=0;t=10`, "Retry-After": "10",
		"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "10",
	} {
		if got := rec.Header().Get(field); got != want {
			t.Fatalf("denied %s: %q, want %q", field, got, want)
		}
	}
	if items, err := parseSFList(rec.Header().Get("RateLimit-Policy")); err != nil || items[0].strs["qu"] != "concurrent-requests" {
		t.Fatalf("RateLimit-Policy: %+v, %v", items, err)
	}
	if n := len(leaseMembers(t, c, prefix+"192.0.2.1")); n != 2 {
		t.Fatalf("%d leases for the client's key, want 2", n)
	}
	other := inFlight(t, h, b, "192.0.2.2:1")

	b.free() // the handlers return
	for i, tc := range []struct {
		ch <-chan *httptest.ResponseRecorder
		r  string
	}{{first, "1"}, {second, "0"}, {other, "1"}} {
		rec := <-tc.ch
		wantStatus(t, fmt.Sprintf("held request %d", i+1), rec, http.StatusOK)
		checkPolicyFieldConcurrent(t, rec.Header())
		if got := rec.Header().Get("X-RateLimit-Remaining"); got != tc.r || rec.Header().Get("X-RateLimit-Reset") != "" {
			t.Fatalf("held request %d: X-RateLimit-Remaining %q, want %s and no reset", i+1, got, tc.r)
		}
	}
	// Every slot given back: the client may run two again, and the key is gone with its leases.
	waitLeases(t, c, prefix+"192.0.2.1", 0)
	// The handler no longer blocks, so the request is sent directly: inFlight's select could
	// see the answer before the start signal.
	wantStatus(t, "after the releases", do(h, client, nil), http.StatusOK)
	select {
	case <-b.started:
	default:
		t.Fatal("the request after the releases was answered without reaching the handler")
	}
}

// checkPolicyFieldConcurrent checks an admitted response's fields: the policy, and r alone.
func checkPolicyFieldConcurrent(t *testing.T, h http.Header) {
	t.Helper()
	if got := h.Get("RateLimit-Policy"); got != concurrentPolicy {
		t.Fatalf("RateLimit-Policy %q, want %q", got, concurrentPolicy)
	}
	items, err := parseSFList(h.Get("RateLimit"))
	if err != nil || len(items) != 1 || items[0].name != "concurrency" || fmt.Sprint(items[0].keys) != "[r]" {
		t.Fatalf("RateLimit %q: %v; want one item with r only", h.Get("RateLimit"), err)
	}
}

// waitLeases waits until the middleware key k holds n leases: the releases run after the
// response is written.
func waitLeases(t *testing.T, c valkey.Client, k string, n int) {
	t.Helper()
	if err := valkeytest.WaitFor(context.Background(), 10*time.Second, "the releases", func() (bool, error) {
		return len(leaseMembers(t, c, k)) == n, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// A handler that panics gives its slot back, and the panic goes on to the server.
func TestConcurrentReleasesOnPanic(t *testing.T) {
	c := server.Client(t)
	e := enginetest.New(t, c)
	prefix := uniquePrefix(t)
	boom := errors.New("boom")
	h := httplimit.NewConcurrent(e, 1, time.Minute, httplimit.WithKeyPrefix(prefix))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic(boom)
	}))
	for i := 0; i < 2; i++ { // max 1: the second would be refused if the first kept its slot
		func() {
			defer func() {
				if got := recover(); got != boom {
					t.Fatalf("request %d: recovered %v, want the handler's panic", i+1, got)
				}
			}()
			do(h, "192.0.2.1:1", nil)
		}()
		if n := len(leaseMembers(t, c, prefix+"192.0.2.1")); n != 0 {
			t.Fatalf("after a panic: %d leases held, want 0", n)
		}
	}
}

// A handler that runs past its lease's ttl keeps the slot: the lease is extended every half
// ttl, on the server's clock, until the handler returns.
func TestConcurrentExtendsLongHandlers(t *testing.T) {
	c := server.Client(t)
	e := enginetest.New(t, c)
	prefix := uniquePrefix(t)
	const ttl = time.Second
	b := newBlocking(t)
	h := httplimit.NewConcurrent(e, 1, ttl, httplimit.WithKeyPrefix(prefix))(b)
	k := prefix + "192.0.2.1"
	long := inFlight(t, h, b, "192.0.2.1:1")
	leases := leaseMembers(t, c, k)
	if len(leases) != 1 {
		t.Fatalf("%d leases while one request runs", len(leases))
	}
	firstExpiry := int64(leases[0].Score)

	ctx := context.Background()
	if err := valkeytest.WaitFor(ctx, 10*time.Second, "the server's clock to pass the first ttl", func() (bool, error) {
		tm, err := c.Do(ctx, c.B().Time().Build()).AsIntSlice()
		return err == nil && tm[0]*1_000_000+tm[1] > firstExpiry+int64(100*time.Millisecond/time.Microsecond), err
	}); err != nil {
		t.Fatal(err)
	}
	rec := refused(t, h, b, "192.0.2.1:2")
	wantStatus(t, "past the first ttl, the long request still runs", rec, http.StatusTooManyRequests)
	if leases = leaseMembers(t, c, k); len(leases) != 1 || int64(leases[0].Score) <= firstExpiry {
		t.Fatalf("leases %v: want the one lease, extended past %d", leases, firstExpiry)
	}
	if secs, err := strconv.Atoi(rec.Header().Get("Retry-After")); err != nil || secs != 1 {
		t.Fatalf("Retry-After %q, want 1 (the extended lease's expiry, rounded up)", rec.Header().Get("Retry-After"))
	}
	b.free()
	wantStatus(t, "the long request", <-long, http.StatusOK)
	waitLeases(t, c, k, 0)
	wantStatus(t, "after the long request", do(h, "192.0.2.1:3", nil), http.StatusOK)
}

// An extension that finds the lease gone (here: deleted behind the middleware's back, as a
// failover may lose it) cancels the handler's context with cause engine.ErrLeaseExpired.
func TestConcurrentLostLeaseCancelsHandler(t *testing.T) {
	c := server.Client(t)
	e := enginetest.New(t, c)
	prefix := uniquePrefix(t)
	started := make(chan struct{})
	cause := make(chan error, 1)
	h := httplimit.NewConcurrent(e, 1, 100*time.Millisecond, httplimit.WithKeyPrefix(prefix))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		select {
		case <-r.Context().Done():
			cause <- context.Cause(r.Context())
		case <-time.After(30 * time.Second):
			cause <- errors.New("the handler's context was never cancelled")
		}
	}))
	done := make(chan struct{})
	go func() { do(h, "192.0.2.1:1", nil); close(done) }()
	<-started
	if err := c.Do(context.Background(), c.B().Del().Key("strictrate:"+engine.LeaseNamespace+prefix+"192.0.2.1").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := <-cause; !errors.Is(err, engine.ErrLeaseExpired) {
		t.Fatalf("handler's context cause %v, want engine.ErrLeaseExpired", err)
	}
	<-done
}

// Through a real http.Server and http.Client, 16 connections at once, one client address: no
// more than max handlers ever run at once, the others are told 429 with Retry-After, and
// every slot is given back.
func TestConcurrentRealServer(t *testing.T) {
	c := server.Client(t)
	e := enginetest.New(t, c)
	prefix := uniquePrefix(t)
	const max = 3
	var running, peak atomic.Int64
	h := httplimit.NewConcurrent(e, max, time.Minute, httplimit.WithKeyPrefix(prefix))(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		time.Sleep(5 * time.Millisecond)
		running.Add(-1)
		io.WriteString(w, "ok\n")
	}))
	url, client := serveLoopback(t, h)

	var ok, denied atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 10 {
				resp, err := client.Get(url)
				if err != nil {
					errs <- err
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					ok.Add(1)
				case http.StatusTooManyRequests:
					if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || secs < 1 {
						errs <- fmt.Errorf("429 with Retry-After %q", resp.Header.Get("Retry-After"))
						return
					}
					denied.Add(1)
				default:
					errs <- fmt.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("%d admitted, %d denied, at most %d handlers at once (max %d)", ok.Load(), denied.Load(), peak.Load(), max)
	if peak.Load() > max {
		t.Fatalf("%d handlers ran at once, above max %d", peak.Load(), max)
	}
	if ok.Load()+denied.Load() != 160 || ok.Load() < max || denied.Load() == 0 {
		t.Fatalf("%d admitted and %d denied of 160: want both, and at least %d admitted", ok.Load(), denied.Load(), max)
	}
	waitLeases(t, c, prefix+"127.0.0.1", 0)
}

// NewConcurrent refuses a nil engine, max below 1 and a ttl below a millisecond at once.
func TestNewConcurrentPanicsOnInvalidArguments(t *testing.T) {
	e := enginetest.New(t, server.Client(t))
	for name, f := range map[string]func(){
		"nil engine": func() { httplimit.NewConcurrent(nil, 1, time.Second) },
		"max 0":      func() { httplimit.NewConcurrent(e, 0, time.Second) },
		"ttl 999µs":  func() { httplimit.NewConcurrent(e, 1, 999*time.Microsecond) },
	} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s: NewConcurrent did not panic", name)
				}
			}()
			f()
		}()
	}
}

// 300 clients hang up while their requests wait for a server that does not answer (paused):
// no handler runs, and once the server answers again, every slot is back long before the
// leases' ttl (an hour): max requests run at once again, and one more is refused.
func TestConcurrentClientsThatHangUpHoldNoSlot(t *testing.T) {
	own := valkeytest.New(t, valkeytest.OwnServer())
	t.Cleanup(func() { _ = own.Resume() })
	c := own.Client(t)
	e := enginetest.New(t, own.Client(t))
	prefix := uniquePrefix(t)
	const max, clients = 10, 300
	var arrived, gaveUp, otherErrors atomic.Int64
	b := newBlocking(t)
	h := httplimit.NewConcurrent(e, max, time.Hour, httplimit.WithKeyPrefix(prefix),
		// Every request has the one key, and counts as arrived just before its Acquire.
		httplimit.WithKeyFunc(func(*http.Request) (string, error) { arrived.Add(1); return "export", nil }),
		httplimit.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, context.Canceled) {
				gaveUp.Add(1)
			} else {
				otherErrors.Add(1)
				t.Errorf("request failed: %v", err)
			}
			http.Error(w, "503 service unavailable", http.StatusServiceUnavailable)
		}))(b)
	k := prefix + "export"
	// The engine's connection is up before the pause: a dial would wait for the server, and
	// nothing would be sent.
	ctx := context.Background()
	l, err := e.Acquire(ctx, k, max, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	url, client := serveLoopback(t, h)

	if err := own.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	clientCtx, hangUp := context.WithCancel(ctx)
	defer hangUp()
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			req, err := http.NewRequestWithContext(clientCtx, http.MethodGet, url, nil)
			if err != nil {
				t.Error(err)
				return
			}
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
				t.Errorf("answered %d while the server was paused", resp.StatusCode)
			}
		})
	}
	if err := valkeytest.WaitFor(ctx, 30*time.Second, "every request to reach the middleware", func() (bool, error) {
		return arrived.Load() == clients, nil
	}); err != nil {
		t.Fatal(err)
	}
	hangUp()
	hungUp := time.Now()
	wg.Wait()
	if err := valkeytest.WaitFor(ctx, 30*time.Second, "the middleware to notice every client hang up", func() (bool, error) {
		return gaveUp.Load()+otherErrors.Load() == clients, nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := own.Resume(); err != nil {
		t.Fatal(err)
	}
	// It must stay well under the 5 s an Acquire's call outlives its caller by: past that, a
	// release may reach the server before its acquire.
	t.Logf("server paused %s, %s of it after the clients hung up", time.Since(paused).Round(time.Millisecond), time.Since(hungUp).Round(time.Millisecond))

	if err := valkeytest.WaitFor(ctx, 30*time.Second, "every slot to come back", func() (bool, error) {
		return len(leaseMembers(t, c, k)) == 0, nil
	}); err != nil {
		t.Fatalf("%v: %d of %d slots held by clients that hung up", err, len(leaseMembers(t, c, k)), max)
	}
	// Full capacity: the engine's calls queue behind those of the clients that hung up, so
	// these see whatever those left behind.
	var held []<-chan *httptest.ResponseRecorder
	for range max {
		held = append(held, inFlight(t, h, b, "192.0.2.1:1"))
	}
	wantStatus(t, "one more than max at once", refused(t, h, b, "192.0.2.1:1"), http.StatusTooManyRequests)
	b.free()
	for i, ch := range held {
		wantStatus(t, fmt.Sprintf("held request %d", i+1), <-ch, http.StatusOK)
	}
	waitLeases(t, c, k, 0)
}
