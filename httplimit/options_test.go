package httplimit_test

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/fields"
	"github.com/strictrate/strictrate/httplimit"
	"github.com/strictrate/strictrate/internal/enginetest"
)

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
