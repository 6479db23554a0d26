// Package httplimit is net/http middleware that rate-limits requests with a strictrate engine
// and tells clients where they stand through the IETF RateLimit header fields.
//
//   - Each request costs one event of its key (WithCost: a cost of its own) against an
//     engine.Policy, decided in one atomic call. Admitted requests go to the next handler;
//     denied ones get 429 Too Many Requests and Retry-After, in seconds rounded up, never
//     earlier than the engine's RetryAfter.
//   - The key is the client's address by package clientaddr's rules: RemoteAddr, or behind
//     trusted proxies (WithTrustedProxies) the first untrusted hop of their forwarding header,
//     read from its right end; an IPv6 client's /64. A Forwarded element that must be read and
//     breaks RFC 7239, or a Unix socket's peer without WithTrustedUnixSocket, is a 400 (ErrKey).
//     WithKeyHeader and WithKeyFunc key requests otherwise.
//   - Every response carries the fields as package fields writes them, in the syntax of
//     draft-ietf-httpapi-ratelimit-headers-10 (WithFieldsVersion chooses the revision):
//     RateLimit-Policy, every limit with its quota and window ("1s";q=5;w=1, "1h";q=100;w=3600),
//     and, after a decision, RateLimit, the tightest limit's remaining r and wait t
//     ("1s";r=0;t=1). WithLegacyHeaders adds the X-RateLimit-* trio.
//   - When the engine cannot decide: fail-closed (the default) answers 503 (WithErrorHandler
//     replaces it); fail-open (engine.WithFailOpen) passes the request on with RateLimit-Policy
//     but no RateLimit, and calls the WithFailOpenHook function. A request whose context ended
//     (the client went away, or a deadline the server set passed) is the error handler's under
//     either policy: fail-open never passes it on.
//   - Under engine.WithShadow(true) it never answers 429: a request the limit denies reaches the
//     handler with the real decision's fields (r=0) and no Retry-After.
//   - WithRefundOn and WithResetOn act on the status an admitted request's handler answered
//     with: give its event back, or clear its key's log (count only failed logins). The request
//     is counted when admitted, so parallel ones never pass the limit.
//   - NewConcurrent bounds requests in flight instead of how often they arrive; both kinds can
//     wrap one handler.
//
// docs/http-grpc.md has the options, calendar limits' fields and an example server.
package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"

	"github.com/strictrate/strictrate/clientaddr"
	"github.com/strictrate/strictrate/clientkey"
	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/fields"
)

// ErrKey is wrapped by the error the middleware passes to its error handler when it cannot
// tell the request's key: an unparsable RemoteAddr (a Unix socket's, without
// WithTrustedUnixSocket: clientaddr.ErrUnixSocket), a trusted proxy's forwarding header that
// breaks its syntax where it is read (clientaddr.ErrMalformedHeader), a missing key header, a
// key function's error, an empty or too long key. The default error handler answers 400 Bad
// Request.
//
// It is not the same error as grpclimit.ErrKey, though the same checks refuse a key in both
// packages (and clientkey.MaxLength bounds both): each message names its package and what it
// limits, a request or a call, in the logs and answers that quote it, and errors.Is(err,
// ErrKey) is true of this package's errors only.
var ErrKey = errors.New("httplimit: no rate-limit key for the request")

// ErrCost is wrapped by the error the middleware passes to its error handler when the
// WithCost function fails or gives a cost outside 1 to the policy's smallest Max (a request
// that could never be admitted). Nothing is recorded. The default error handler answers 400
// Bad Request.
var ErrCost = errors.New("httplimit: no valid cost for the request")

// DeniedHandler writes the response to a denied request. The RateLimit, RateLimit-Policy and
// Retry-After header fields are already set on w; res is the engine's decision.
type DeniedHandler func(w http.ResponseWriter, r *http.Request, res engine.Result)

// ErrorHandler writes the response when the middleware could not decide: err wraps ErrKey
// when the request has no key, ErrCost when it has no valid cost, else it is the engine's
// error (wrapping engine.ErrUnavailable when the server was not reached).
type ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)

// Option configures New, Limit and NewConcurrent.
type Option func(*config)

type config struct {
	keyFunc    func(*http.Request) (string, error) // nil: the client's IP address
	keyPrefix  string
	addr       []clientaddr.Option
	cost       func(*http.Request) (int, error) // nil: every request costs 1
	version    fields.Version
	denied     DeniedHandler
	onError    ErrorHandler
	onFailOpen func(*http.Request, error)
	legacy     bool
	resolver   *clientaddr.Resolver // made from addr by newConfig

	// Outcomes (outcome.go): nil functions give nothing back.
	refundOn       func(status int) bool
	resetOn        func(status int) bool
	onOutcomeError func(*http.Request, error) // nil: logged through slog.Default
}

// newConfig is the configuration opts make, from the defaults, with its address resolver.
func newConfig(opts []Option) (config, error) {
	cfg := config{keyPrefix: "http:", version: fields.DefaultVersion, denied: defaultDenied, onError: defaultError}
	for _, opt := range opts {
		opt(&cfg)
	}
	var err error
	cfg.resolver, err = clientaddr.New(cfg.addr...)
	return cfg, err
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
// default is "http:". A key is the prefix, the policy's engine.Policy.Tag and the client:
// middlewares of different policies never share counts; middlewares of the same policy and
// prefix (one per route, say, or an httplimit middleware and a grpclimit interceptor) share
// the clients' counts, and need different prefixes to count apart.
func WithKeyPrefix(prefix string) Option { return func(c *config) { c.keyPrefix = prefix } }

// WithTrustedProxies names the proxies (load balancers, CDNs) in front of the server. Only
// when the request comes from one of them is the forwarding header read: walking it right
// to left, every address inside prefixes is skipped and the first one outside is the
// client's. Nothing the client wrote on the left of that hop is read, and a Forwarded element
// the walk has to read that breaks RFC 7239's syntax is a 400 (ErrKey wrapping
// clientaddr.ErrMalformedHeader), not the proxy's shared key. Without trusted proxies the
// header is ignored, as any client can write it.
func WithTrustedProxies(prefixes ...netip.Prefix) Option {
	return func(c *config) { c.addr = append(c.addr, clientaddr.WithTrustedProxies(prefixes...)) }
}

// WithTrustedUnixSocket is for a server listening on a Unix socket behind a reverse proxy:
// every request has the RemoteAddr "@" (or "" or a path), which is no IP address, so without
// it each one is refused with ErrKey (400). With it the peer on the socket is a trusted proxy:
// its forwarding header (WithForwardedHeader) is read right to left as for WithTrustedProxies,
// whose prefixes still name the proxies further out, and a request without the header is
// keyed clientaddr.UnixSocketKey. Give it only when every process that can connect to the
// socket is a proxy that writes the header. See clientaddr.WithTrustedUnixSocket.
func WithTrustedUnixSocket() Option {
	return func(c *config) { c.addr = append(c.addr, clientaddr.WithTrustedUnixSocket()) }
}

// WithForwardedHeader selects the header the trusted proxies write: clientaddr.XForwardedFor (the
// default) or clientaddr.Forwarded. Only that one is read, since a client can send the other
// itself.
func WithForwardedHeader(h clientaddr.Header) Option {
	return func(c *config) { c.addr = append(c.addr, clientaddr.WithHeader(h)) }
}

// WithIPv6Prefix keys IPv6 clients by their /bits network prefix (written "2001:db8::/64") in
// place of their address: every address a subscriber rotates through inside its prefix counts
// as one client. The default is clientaddr.DefaultIPv6Prefix, 64: every IPv6 link is a /64, so no two
// subscribers share one, and a /64 holds 2^64 addresses one client can switch between at will.
// 56 or 48 also close the /56 and /48 that many providers delegate to one subscriber, but count
// together the customers of providers that give each a /64 of a shared /56 or /48. 128 keys
// each address by itself. IPv4 clients, IPv4-mapped IPv6 addresses ("::ffff:192.0.2.1")
// included, are keyed by their address. New panics for bits outside 1 to 128. It applies to
// the key from the client's address, not to WithKeyHeader or WithKeyFunc.
func WithIPv6Prefix(bits int) Option {
	return func(c *config) { c.addr = append(c.addr, clientaddr.WithIPv6Prefix(bits)) }
}

// WithCost gives each request the cost f returns, in events, in place of 1: bytes uploaded,
// tokens asked for, the weight of an endpoint. An error from f, or a cost below 1 or above the
// policy's smallest Max (it could never be admitted), goes to the error handler wrapped in
// ErrCost, by default a 400 answer, and nothing is recorded. The cost is all or nothing, as
// for [engine.Engine.AllowPolicy].
func WithCost(f func(*http.Request) (int, error)) Option {
	return func(c *config) { c.cost = f }
}

// WithFieldsVersion selects the revision of draft-ietf-httpapi-ratelimit-headers whose syntax
// RateLimit-Policy and RateLimit follow. The default is fields.Draft10; New panics for a
// revision package fields does not write.
func WithFieldsVersion(v fields.Version) Option { return func(c *config) { c.version = v } }

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
// delta in seconds), with the same values as RateLimit, for clients that predate the RateLimit
// fields.
func WithLegacyHeaders(on bool) Option { return func(c *config) { c.legacy = on } }

// limiter is one configured middleware.
type limiter struct {
	cfg    config
	engine *engine.Engine
	policy engine.Policy
	// keyPrefix is the configured prefix and the policy's tag: what goes before a client.
	keyPrefix string
	smallest  int // the policy's smallest Max: the largest cost a request may have
	fields    *fields.Dated
	// header holds the canonical form of every field name fields writes.
	header map[string]string
}

// New returns middleware that admits each request only if p admits one more event (or its
// WithCost cost) for the request's key, and sets the RateLimit header fields on every
// response. It panics if e is nil, p is invalid (see engine.Policy.Validate) or an option's
// value is out of range: like a route pattern, a policy is fixed when the program starts, and
// a wrong one is a bug to fail on at once.
func New(e *engine.Engine, p engine.Policy, opts ...Option) func(http.Handler) http.Handler {
	if e == nil {
		panic("httplimit: New with a nil engine")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		panic(fmt.Sprintf("httplimit: New: %v", err))
	}
	f, err := fields.NewDated(p, cfg.version)
	if err != nil {
		panic(fmt.Sprintf("httplimit: New: %v", err))
	}
	l := &limiter{cfg: cfg, engine: e, policy: append(engine.Policy(nil), p...), keyPrefix: clientkey.Prefix(cfg.keyPrefix, p), smallest: p[0].Max,
		fields: f, header: map[string]string{}}
	for _, lim := range p {
		l.smallest = min(l.smallest, lim.Max)
	}
	for _, name := range f.Names() {
		l.header[name] = http.CanonicalHeaderKey(name)
	}
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
	cost, err := l.cost(r)
	if err != nil {
		l.cfg.onError(w, r, err)
		return
	}
	res, err := l.engine.AllowPolicy(r.Context(), l.keyPrefix+key, l.policy, cost)
	if err != nil {
		l.cfg.onError(w, r, err)
		return
	}
	h := w.Header()
	// Fresh slices: a handler may change the values it finds in its header map.
	for _, f := range l.fields.Policy(res.At) {
		h[l.header[f.Name]] = []string{f.Value}
	}
	if res.BackendErr != nil {
		l.cfg.failedOpen(w, r, next, res.BackendErr)
		return
	}
	var buf [2]fields.Field
	for _, f := range l.fields.AppendDecision(buf[:0], res) {
		h[l.header[f.Name]] = []string{f.Value}
	}
	if l.cfg.legacy {
		named, _ := l.fields.Named(res)
		h["X-Ratelimit-Limit"] = []string{strconv.Itoa(named.Max)}
		h["X-Ratelimit-Remaining"] = []string{strconv.Itoa(res.Remaining)}
		h["X-Ratelimit-Reset"] = []string{strconv.FormatInt(fields.Reset(res), 10)}
	}
	if !res.Allowed {
		l.cfg.deny(w, r, res)
		return
	}
	if l.cfg.settles(res) {
		l.serveCounted(w, r, next, l.keyPrefix+key, res)
		return
	}
	next.ServeHTTP(w, r)
}

// setRateLimit sets the RateLimit field for one limit that is not a policy's (NewConcurrent's),
// item being `"<name>";r=`, and the legacy fields when asked for: remaining is r, reset is t
// (left out when negative).
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
	w.Header()["Retry-After"] = []string{strconv.FormatInt(fields.Seconds(res.RetryAfter), 10)}
	c.denied(w, r, res)
}

// failedOpen passes on a request a fail-open engine admitted without deciding, after the hook.
func (c *config) failedOpen(w http.ResponseWriter, r *http.Request, next http.Handler, err error) {
	if c.onFailOpen != nil {
		c.onFailOpen(r, err)
	}
	next.ServeHTTP(w, r)
}

// cost returns the request's cost: 1, or what the WithCost function says, checked.
func (l *limiter) cost(r *http.Request) (int, error) {
	if l.cfg.cost == nil {
		return 1, nil
	}
	n, err := l.cfg.cost(r)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%w: %w", ErrCost, err)
	case n < 1 || n > l.smallest:
		return 0, fmt.Errorf("%w: cost %d is outside 1 to %d, the policy's smallest Max", ErrCost, n, l.smallest)
	}
	return n, nil
}

// key returns the request's key, without the prefix.
func (c *config) key(r *http.Request) (string, error) {
	if c.keyFunc != nil {
		k, err := c.keyFunc(r)
		return clientkey.Checked(ErrKey, k, err)
	}
	return clientkey.FromAddr(ErrKey, c.resolver, r.RemoteAddr, r.Header.Values(c.resolver.Header().Name()),
		"key requests with WithKeyFunc or WithKeyHeader")
}

func defaultDenied(w http.ResponseWriter, _ *http.Request, _ engine.Result) {
	http.Error(w, "429 too many requests: rate limit exceeded, see Retry-After", http.StatusTooManyRequests)
}

func defaultError(w http.ResponseWriter, _ *http.Request, err error) {
	if errors.Is(err, ErrKey) {
		http.Error(w, "400 bad request: no rate-limit key for this request", http.StatusBadRequest)
		return
	}
	if errors.Is(err, ErrCost) {
		http.Error(w, "400 bad request: no valid rate-limit cost for this request", http.StatusBadRequest)
		return
	}
	http.Error(w, "503 service unavailable: rate limiter unavailable", http.StatusServiceUnavailable)
}
