// Package httplimit is net/http middleware that rate-limits requests with a strictrate engine
// and tells clients where they stand through the IETF RateLimit header fields.
//
// Each request costs one event of its key (by default the client's IP address) against an
// engine.Policy: one or more limits that must all hold, decided in one atomic call. Admitted
// requests go to the next handler; denied ones get 429 Too Many Requests and Retry-After.
//
// # Header fields
//
// The fields follow draft-ietf-httpapi-ratelimit-headers-10 (September 2025; its -08 and -09
// have the same syntax): two Structured Field Lists (RFC 9651).
//
//	RateLimit-Policy: "1s";q=5;w=1, "1h";q=100;w=3600
//	RateLimit: "1s";r=0;t=1
//
// RateLimit-Policy names every limit of the policy (the name is its window: "500ms", "1s",
// "90m", "1h") with its quota q and its window w in seconds. The draft's w is an integer, so a
// window that is not a whole number of seconds is rounded up: a client pacing itself by q per
// w never sends faster than the limit allows.
//
// RateLimit gives, for one limit, the remaining quota r and t, a delta in seconds, rounded up
// so that it is never early. The limit named is the tightest one of this decision, the one
// with the least room left (engine.Result.Window; the shortest window among equals), and r is
// that room. On a denial t is the wait until the request would be admitted (Retry-After,
// rounded up); otherwise t is the wait until the named limit has its whole quota back.
//
// Denied responses also carry Retry-After, in seconds, rounded up: never earlier than the
// engine's RetryAfter. WithLegacyHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
// X-RateLimit-Reset (a delta in seconds) with the same values as RateLimit.
//
// # Backend failures
//
// When the engine cannot decide, the middleware follows the engine's policy
// (engine.WithFailOpen). Fail-closed, the default: the engine returns an error and the
// middleware answers 503 Service Unavailable (replace it with WithErrorHandler). Fail-open:
// the engine admits the request and sets Result.BackendErr; the middleware passes the request
// on with RateLimit-Policy but without RateLimit (there is no count to report), and calls the
// WithFailOpenHook function, if any, so the failure is logged or counted.
//
// # In-flight limits
//
// NewConcurrent limits how many requests of one key run at once instead of how often they
// arrive: each request holds an engine lease while its handler runs. It keys requests, answers
// denials and fails open as New does, with the quota unit "concurrent-requests" in
// RateLimit-Policy. Both kinds can wrap one handler: a rate limit and an in-flight limit.
package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/strictrate/strictrate/engine"
)

// ErrKey is wrapped by the error the middleware passes to its error handler when it cannot
// tell the request's key: an unparsable RemoteAddr, a missing key header, a key function's
// error, an empty or too long key. The default error handler answers 400 Bad Request.
var ErrKey = errors.New("httplimit: no rate-limit key for the request")

// MaxKeyLength is the longest key, in bytes, the middleware sends to the engine (without the
// prefix). A longer key (a huge header value, say) is refused with ErrKey, so a client cannot
// make the server store arbitrarily large keys.
const MaxKeyLength = 512

// DeniedHandler writes the response to a denied request. The RateLimit, RateLimit-Policy and
// Retry-After header fields are already set on w; res is the engine's decision.
type DeniedHandler func(w http.ResponseWriter, r *http.Request, res engine.Result)

// ErrorHandler writes the response when the middleware could not decide: err wraps ErrKey
// when the request has no key, else it is the engine's error (wrapping
// engine.ErrUnavailable when the server was not reached).
type ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)

// ForwardedHeader selects which header a trusted proxy reports the client's address in.
type ForwardedHeader int

const (
	// XForwardedFor is the de facto X-Forwarded-For: a comma-separated list of addresses,
	// each proxy appending the address it received the request from. The default.
	XForwardedFor ForwardedHeader = iota
	// Forwarded is RFC 7239's Forwarded header; its for= parameters are read.
	Forwarded
)

// Option configures New, Limit and NewConcurrent.
type Option func(*config)

type config struct {
	keyFunc     func(*http.Request) (string, error) // nil: the client's IP address
	keyPrefix   string
	trusted     []netip.Prefix
	proxyHeader ForwardedHeader
	denied      DeniedHandler
	onError     ErrorHandler
	onFailOpen  func(*http.Request, error)
	legacy      bool
}

// WithKeyFunc keys requests by what f returns, such as an API key or a user id from the
// request's context. An error from f, or an empty key, goes to the error handler wrapped
// in ErrKey: by default a 400 answer. It replaces the IP address and WithKeyHeader.
func WithKeyFunc(f func(*http.Request) (string, error)) Option {
	return func(c *config) { c.keyFunc = f }
}

// WithKeyHeader keys requests by the value of the named request header, such as an API key
// header. A request without it is refused through the error handler (by default 400). It
// replaces the IP address and WithKeyFunc.
func WithKeyHeader(name string) Option {
	canonical := http.CanonicalHeaderKey(name)
	return WithKeyFunc(func(r *http.Request) (string, error) {
		v := r.Header.Get(canonical)
		if v == "" {
			return "", fmt.Errorf("no %s header", canonical)
		}
		return v, nil
	})
}

// WithKeyPrefix sets the text put before every key, after the engine's own prefix; the
// default is "http:". Middlewares that share an engine but not their counts (one per route,
// say) need different prefixes; middlewares with the same prefix share the clients' counts.
func WithKeyPrefix(prefix string) Option { return func(c *config) { c.keyPrefix = prefix } }

// WithTrustedProxies names the proxies (load balancers, CDNs) in front of the server. Only
// when the request comes from one of them is the forwarding header read: walking it right
// to left, every address inside prefixes is skipped and the first one outside is the
// client's. Without trusted proxies the header is ignored, as any client can write it.
func WithTrustedProxies(prefixes ...netip.Prefix) Option {
	return func(c *config) {
		c.trusted = make([]netip.Prefix, len(prefixes))
		for i, p := range prefixes {
			c.trusted[i] = p.Masked()
		}
	}
}

// WithForwardedHeader selects the header the trusted proxies write: XForwardedFor (the
// default) or Forwarded. Only that one is read, since a client can send the other itself.
func WithForwardedHeader(h ForwardedHeader) Option { return func(c *config) { c.proxyHeader = h } }

// WithDeniedHandler replaces the default answer to a denied request (429 with a short
// plain-text body).
func WithDeniedHandler(h DeniedHandler) Option { return func(c *config) { c.denied = h } }

// WithErrorHandler replaces the default answer when no decision could be taken: 400 for a
// request without a key (ErrKey), 503 for the engine's errors.
func WithErrorHandler(h ErrorHandler) Option { return func(c *config) { c.onError = h } }

// WithFailOpenHook sets a function called for each request an engine built with
// engine.WithFailOpen(true) admitted without deciding, with the backend's error: for logs and
// metrics, as the request itself goes through.
func WithFailOpenHook(f func(r *http.Request, err error)) Option {
	return func(c *config) { c.onFailOpen = f }
}

// WithLegacyHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset (a
// delta in seconds) for clients that predate the RateLimit fields.
func WithLegacyHeaders(on bool) Option { return func(c *config) { c.legacy = on } }

// limiter is one configured middleware.
type limiter struct {
	cfg    config
	engine *engine.Engine
	policy engine.Policy

	policyField string // RateLimit-Policy, the same on every response
	// named holds, per window of the policy, what RateLimit says of that limit; fallback
	// names the limit with the smallest quota, for a Result that names none.
	named    map[time.Duration]namedLimit
	fallback namedLimit
}

// namedLimit is one limit as the RateLimit field names it, prepared once.
type namedLimit struct {
	item       string // `"<name>";r=`
	limitField string // X-RateLimit-Limit
	// shorter is how much sooner than the log this limit empties: longest - its window.
	shorter time.Duration
}

// New returns middleware that admits each request only if p admits one more event for the
// request's key, and sets the RateLimit header fields on every response. It panics if e is
// nil or p is invalid (see engine.Policy.Validate): like a route pattern, a policy is fixed
// when the program starts, and a wrong one is a bug to fail on at once.
func New(e *engine.Engine, p engine.Policy, opts ...Option) func(http.Handler) http.Handler {
	if e == nil {
		panic("httplimit: New with a nil engine")
	}
	if err := p.Validate(); err != nil {
		panic(fmt.Sprintf("httplimit: New: %v", err))
	}
	l := &limiter{cfg: newConfig(opts), engine: e, policy: append(engine.Policy(nil), p...), named: map[time.Duration]namedLimit{}}
	items := make([]string, len(p))
	smallest := 0
	for i, lim := range p {
		items[i] = fmt.Sprintf("%q;q=%d;w=%d", windowName(lim.Window), lim.Max, ceilSeconds(lim.Window))
		l.named[lim.Window] = namedLimit{
			item:       strconv.Quote(windowName(lim.Window)) + ";r=",
			limitField: strconv.Itoa(lim.Max),
			shorter:    p.Longest().Window - lim.Window,
		}
		if lim.Max < p[smallest].Max || lim.Max == p[smallest].Max && lim.Window < p[smallest].Window {
			smallest = i
		}
	}
	l.policyField = strings.Join(items, ", ")
	l.fallback = l.named[p[smallest].Window]
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { l.serve(w, r, next) })
	}
}

// Limit returns middleware for a single limit: New with engine.Policy{l}.
func Limit(e *engine.Engine, l engine.Limit, opts ...Option) func(http.Handler) http.Handler {
	return New(e, engine.Policy{l}, opts...)
}

func (l *limiter) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	key, err := l.cfg.key(r)
	if err != nil {
		l.cfg.onError(w, r, err)
		return
	}
	res, err := l.engine.AllowPolicy(r.Context(), l.cfg.keyPrefix+key, l.policy, 1)
	if err != nil {
		l.cfg.onError(w, r, err)
		return
	}
	h := w.Header()
	// Fresh slices: a handler may change the values it finds in its header map.
	h["Ratelimit-Policy"] = []string{l.policyField}
	if res.BackendErr != nil {
		l.cfg.failedOpen(w, r, next, res.BackendErr)
		return
	}
	named, ok := l.named[res.Window]
	if !ok {
		named = l.fallback
	}
	var reset int64
	if res.Allowed {
		reset = ceilSeconds(res.ResetAfter - named.shorter)
	} else {
		reset = ceilSeconds(res.RetryAfter)
	}
	l.cfg.setRateLimit(h, named.item, named.limitField, res.Remaining, reset)
	if !res.Allowed {
		l.cfg.deny(w, r, res)
		return
	}
	next.ServeHTTP(w, r)
}

// newConfig is the configuration opts make, from the defaults.
func newConfig(opts []Option) config {
	cfg := config{keyPrefix: "http:", denied: defaultDenied, onError: defaultError}
	for _, opt := range opts {
		opt(&cfg)
	}
	return cfg
}

// setRateLimit sets the RateLimit field for one limit, item being `"<name>";r=`, and the
// legacy fields when asked for: remaining is r, reset is t (left out when negative).
func (c *config) setRateLimit(h http.Header, item, limitField string, remaining int, reset int64) {
	var buf [64]byte
	b := append(buf[:0], item...)
	b = strconv.AppendInt(b, int64(remaining), 10)
	if reset >= 0 {
		b = append(b, ";t="...)
		b = strconv.AppendInt(b, reset, 10)
	}
	h["Ratelimit"] = []string{string(b)}
	if c.legacy {
		h["X-Ratelimit-Limit"] = []string{limitField}
		h["X-Ratelimit-Remaining"] = []string{strconv.Itoa(remaining)}
		if reset >= 0 {
			h["X-Ratelimit-Reset"] = []string{strconv.FormatInt(reset, 10)}
		}
	}
}

// deny answers a denied request: Retry-After, rounded up, then the denied handler.
func (c *config) deny(w http.ResponseWriter, r *http.Request, res engine.Result) {
	w.Header()["Retry-After"] = []string{strconv.FormatInt(ceilSeconds(res.RetryAfter), 10)}
	c.denied(w, r, res)
}

// failedOpen passes on a request a fail-open engine admitted without deciding, after the hook.
func (c *config) failedOpen(w http.ResponseWriter, r *http.Request, next http.Handler, err error) {
	if c.onFailOpen != nil {
		c.onFailOpen(r, err)
	}
	next.ServeHTTP(w, r)
}

// key returns the request's key, without the prefix.
func (c *config) key(r *http.Request) (string, error) {
	var key string
	if c.keyFunc != nil {
		k, err := c.keyFunc(r)
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrKey, err)
		}
		key = k
	} else {
		k, err := clientIP(r, c.trusted, c.proxyHeader)
		if err != nil {
			return "", fmt.Errorf("%w: %w", ErrKey, err)
		}
		key = k
	}
	switch {
	case key == "":
		return "", fmt.Errorf("%w: empty key", ErrKey)
	case len(key) > MaxKeyLength:
		return "", fmt.Errorf("%w: key of %d bytes, more than %d", ErrKey, len(key), MaxKeyLength)
	}
	return key, nil
}

func defaultDenied(w http.ResponseWriter, _ *http.Request, _ engine.Result) {
	http.Error(w, "429 too many requests: rate limit exceeded, see Retry-After", http.StatusTooManyRequests)
}

func defaultError(w http.ResponseWriter, _ *http.Request, err error) {
	if errors.Is(err, ErrKey) {
		http.Error(w, "400 bad request: no rate-limit key for this request", http.StatusBadRequest)
		return
	}
	http.Error(w, "503 service unavailable: rate limiter unavailable", http.StatusServiceUnavailable)
}

// ceilSeconds is d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// windowName is a window's name in the header fields: the largest unit that divides it
// exactly, "1h", "90m", "1s", "500ms", else microseconds ("1500us"), rounded up as the engine
// rounds windows.
func windowName(d time.Duration) string {
	for _, u := range []struct {
		unit time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}} {
		if d%u.unit == 0 {
			return strconv.FormatInt(int64(d/u.unit), 10) + u.name
		}
	}
	return strconv.FormatInt(int64((d+time.Microsecond-1)/time.Microsecond), 10) + "us"
}
