// Package grpclimit is gRPC server middleware that rate-limits calls with a strictrate engine:
// a unary and a stream server interceptor over one engine.Policy.
//
// Each call (a unary call, or a stream when it opens) costs one event of its key against the
// policy, decided in one atomic call to Valkey. The key is the client's address by default, by
// httplimit's rules (package clientaddr: trusted proxies, an IPv6 client's /64; on a Unix
// socket, WithTrustedUnixSocket), or a metadata value (WithKeyMetadata), or what a function
// returns (WithKeyFunc).
//
//   - Admitted: the call goes on to the handler.
//   - Denied: codes.ResourceExhausted, with two details a client reads with status.FromError:
//     google.rpc.RetryInfo, whose retry_delay is the engine's RetryAfter to the microsecond,
//     and google.rpc.QuotaFailure, whose violation names the limit that denied it (quota_id as
//     the fields name it, "1m" or "month"; quota_value its Max).
//   - No key: codes.InvalidArgument, with ErrKey's message and the reason.
//   - The engine cannot decide: codes.Unavailable when it fails closed (the default); failing
//     open (engine.WithFailOpen), the call goes through and the WithFailOpenHook function sees
//     the error. A caller's cancelled or expired context is codes.Canceled or
//     codes.DeadlineExceeded under either policy: fail-open is for a server that could not
//     decide, so a client that sets a short deadline never reaches the handler on it.
//   - WithRefundOn and WithResetOn act on the code an admitted call's handler ended it with:
//     give its event back, or clear its key's log (count only failed logins). The call is
//     counted when admitted, so parallel ones never pass the limit.
//   - Every decided call, and every call a fail-open engine let through, gets the header
//     metadata "ratelimit-policy" and, after a decision, "ratelimit": the values httplimit
//     sends, written by package fields (WithFieldsVersion chooses the draft revision). A client
//     reads them with grpc.Header or ClientStream.Header, denied calls included.
//
// grpclimit is a module of its own, so that the core module requires no gRPC; docs/http-grpc.md
// has the options and a client's reading of a denial.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/strictrate/strictrate/clientaddr"
	"github.com/strictrate/strictrate/clientkey"
	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/fields"
)

// ErrKey is the error of a call whose key cannot be told: no peer address, or one that is
// not an IP address (a Unix socket's, without WithTrustedUnixSocket); a trusted proxy's
// forwarding metadata that breaks its syntax where it is read; no value for the
// WithKeyMetadata name; a key function's error; an empty or too long key. The interceptors end
// such a call with codes.InvalidArgument, whose message is ErrKey's followed by the reason: a
// status error, which does not wrap ErrKey for errors.Is.
//
// It is not the same error as httplimit.ErrKey, though the same checks refuse a key in both
// packages (and MaxKeyLength is the same): each message names its package and what it
// limits, a call or a request, in the logs and answers that quote it, and errors.Is(err,
// httplimit.ErrKey) is true of httplimit's errors only.
var ErrKey = errors.New("grpclimit: no rate-limit key for the call")

// MaxKeyLength is the longest key, in bytes, sent to the engine (without the prefix), 512:
// httplimit uses the same. A longer one is refused (ErrKey), so a client cannot
// make the server store arbitrarily large keys.
const MaxKeyLength = clientkey.MaxLength

// Option configures New.
type Option func(*config)

type config struct {
	keyFunc    func(ctx context.Context, method string) (string, error) // nil: the client's address
	keySource  string                                                   // QuotaFailure's subject for keyFunc's keys
	keyPrefix  string
	addr       []clientaddr.Option
	version    fields.Version
	onFailOpen func(ctx context.Context, method string, err error)

	// Outcomes (outcome.go): nil functions give nothing back.
	refundOn       func(codes.Code) bool
	resetOn        func(codes.Code) bool
	onOutcomeError func(ctx context.Context, method string, err error) // nil: logged through slog.Default
}

// WithKeyFunc keys calls by what f returns for the call's context (which carries its incoming
// metadata, peer and auth info) and its full method name ("/pkg.Service/Method"). An error from
// f, or an empty key, refuses the call with codes.InvalidArgument. It replaces the client's
// address and WithKeyMetadata.
func WithKeyFunc(f func(ctx context.Context, method string) (string, error)) Option {
	return func(c *config) { c.keyFunc, c.keySource = f, "key" }
}

// WithKeyMetadata keys calls by the first value of the named incoming metadata (an API key,
// a tenant id). A call without it is refused with codes.InvalidArgument. It replaces the
// client's address and WithKeyFunc.
func WithKeyMetadata(name string) Option {
	name = strings.ToLower(name)
	return func(c *config) {
		c.keyFunc = func(ctx context.Context, _ string) (string, error) {
			md, _ := metadata.FromIncomingContext(ctx)
			if v := md.Get(name); len(v) > 0 && v[0] != "" {
				return v[0], nil
			}
			return "", fmt.Errorf("no %s metadata", name)
		}
		c.keySource = "metadata:" + name
	}
}

// WithKeyPrefix sets the text put before every key, after the engine's own prefix; the
// default is "grpc:". A key is the prefix, the policy's engine.Policy.Tag and the client, so
// interceptors of different policies never share counts. Interceptors of one policy that
// share an engine but not their counts need different prefixes; give an httplimit middleware
// and a grpclimit interceptor of the same policy the same prefix and a client's HTTP requests
// and gRPC calls share one count.
func WithKeyPrefix(prefix string) Option { return func(c *config) { c.keyPrefix = prefix } }

// WithTrustedProxies names the proxies in front of the server. Only when the peer is one of
// them is the forwarding metadata ("x-forwarded-for", or "forwarded" with WithForwardedHeader)
// read: walking it right to left, every address inside prefixes is skipped and the first one
// outside is the client's. Nothing the client wrote on the left of that hop is read, and a
// "forwarded" element the walk has to read that breaks RFC 7239's syntax refuses the call
// (ErrKey wrapping clientaddr.ErrMalformedHeader), rather than keying it by the proxy's shared
// address. Without trusted proxies it is ignored, as any client can send it.
func WithTrustedProxies(prefixes ...netip.Prefix) Option {
	return func(c *config) { c.addr = append(c.addr, clientaddr.WithTrustedProxies(prefixes...)) }
}

// WithTrustedUnixSocket is for a server listening on a Unix socket behind a reverse proxy:
// its peer address is "@" (or "" or a path), which is no IP address, so without it each call
// is refused with ErrKey (codes.InvalidArgument). With it the peer on the socket is a trusted
// proxy: its forwarding metadata is read right to left as for WithTrustedProxies, whose
// prefixes still name the proxies further out, and a call without it is keyed
// clientaddr.UnixSocketKey. Give it only when every process that can connect to the socket is
// a proxy that writes the metadata. See clientaddr.WithTrustedUnixSocket.
func WithTrustedUnixSocket() Option {
	return func(c *config) { c.addr = append(c.addr, clientaddr.WithTrustedUnixSocket()) }
}

// WithForwardedHeader selects the metadata the trusted proxies write: clientaddr.XForwardedFor
// ("x-forwarded-for", the default) or clientaddr.Forwarded (RFC 7239's "forwarded").
func WithForwardedHeader(h clientaddr.Header) Option {
	return func(c *config) { c.addr = append(c.addr, clientaddr.WithHeader(h)) }
}

// WithIPv6Prefix keys IPv6 clients by their /bits network prefix, as httplimit.WithIPv6Prefix
// does; the default is clientaddr.DefaultIPv6Prefix (64), and 128 keys each address by itself.
// New panics for bits outside 1 to 128.
func WithIPv6Prefix(bits int) Option {
	return func(c *config) { c.addr = append(c.addr, clientaddr.WithIPv6Prefix(bits)) }
}

// WithFieldsVersion selects the revision of draft-ietf-httpapi-ratelimit-headers whose syntax
// the ratelimit-policy and ratelimit metadata follow; the default is fields.DefaultVersion
// (-10). New panics for a revision package fields does not write.
func WithFieldsVersion(v fields.Version) Option { return func(c *config) { c.version = v } }

// WithFailOpenHook sets a function called for each call an engine built with
// engine.WithFailOpen(true) admitted without deciding, with the backend's error: for logs and
// metrics, as the call itself goes through.
func WithFailOpenHook(f func(ctx context.Context, method string, err error)) Option {
	return func(c *config) { c.onFailOpen = f }
}

// Limiter decides calls against one policy; its two interceptors share its configuration and
// its keys. Make one with New; it is safe for concurrent use.
type Limiter struct {
	cfg    config
	engine *engine.Engine
	policy engine.Policy
	// keyPrefix is the configured prefix and the policy's tag: what goes before a client.
	keyPrefix string
	addr      *clientaddr.Resolver
	fields    *fields.Dated
	// meta holds every field name as metadata keys are written: in lower case.
	meta         map[string]string
	forwardedKey string // the forwarding metadata's key
}

// New returns a Limiter that admits each call only if p admits one more event for the call's
// key. It panics if e is nil, p is invalid (see engine.Policy.Validate) or an option's value is
// out of range: a policy is fixed when the program starts, and a wrong one is a bug to fail on
// at once.
func New(e *engine.Engine, p engine.Policy, opts ...Option) *Limiter {
	if e == nil {
		panic("grpclimit: New with a nil engine")
	}
	cfg := config{keyPrefix: "grpc:", version: fields.DefaultVersion}
	for _, opt := range opts {
		opt(&cfg)
	}
	f, err := fields.NewDated(p, cfg.version)
	if err != nil {
		panic(fmt.Sprintf("grpclimit: New: %v", err))
	}
	addr, err := clientaddr.New(cfg.addr...)
	if err != nil {
		panic(fmt.Sprintf("grpclimit: New: %v", err))
	}
	l := &Limiter{cfg: cfg, engine: e, policy: append(engine.Policy(nil), p...), keyPrefix: clientkey.Prefix(cfg.keyPrefix, p), addr: addr, fields: f,
		meta: map[string]string{}, forwardedKey: strings.ToLower(addr.Header().Name())}
	for _, name := range f.Names() {
		l.meta[name] = strings.ToLower(name)
	}
	return l
}

// UnaryServerInterceptor returns the interceptor for unary calls: pass it to
// grpc.ChainUnaryInterceptor (or grpc.UnaryInterceptor).
func (l *Limiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		d, err := l.decide(ctx, info.FullMethod)
		if d.md != nil {
			// Before the handler nothing was sent, so this cannot fail; the handler may add more.
			_ = grpc.SetHeader(ctx, d.md)
		}
		if err != nil {
			return nil, err
		}
		if !l.cfg.settles(d.res) {
			return handler(ctx, req)
		}
		resp, err := handler(ctx, req)
		l.applyOutcome(ctx, info.FullMethod, d, err)
		return resp, err
	}
}

// StreamServerInterceptor returns the interceptor for streams, decided once when a stream
// opens: pass it to grpc.ChainStreamInterceptor (or grpc.StreamInterceptor).
func (l *Limiter) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		d, err := l.decide(ss.Context(), info.FullMethod)
		if d.md != nil {
			_ = ss.SetHeader(d.md)
		}
		if err != nil {
			return err
		}
		if !l.cfg.settles(d.res) {
			return handler(srv, ss)
		}
		err = handler(srv, ss)
		l.applyOutcome(ss.Context(), info.FullMethod, d, err)
		return err
	}
}

// decision is a call's decision, as the interceptors act on it.
type decision struct {
	md  metadata.MD   // the header metadata to send; nil when there was no decision
	key string        // the engine key decided on, the prefix included
	res engine.Result // the engine's decision
}

// decide takes the call's decision, and returns with it the status error to end the call with
// (nil to let it through).
func (l *Limiter) decide(ctx context.Context, method string) (decision, error) {
	key, subject, err := l.key(ctx, method)
	if err != nil {
		return decision{}, status.Error(codes.InvalidArgument, err.Error())
	}
	d := decision{key: l.keyPrefix + key}
	d.res, err = l.engine.AllowPolicy(ctx, d.key, l.policy, 1)
	if err != nil {
		return decision{}, status.Error(failureCode(err), fmt.Sprintf("grpclimit: %s: %v", method, err))
	}
	d.md = make(metadata.MD, 2)
	for _, f := range l.fields.Policy(d.res.At) {
		d.md[l.meta[f.Name]] = []string{f.Value}
	}
	if d.res.BackendErr != nil {
		if l.cfg.onFailOpen != nil {
			l.cfg.onFailOpen(ctx, method, d.res.BackendErr)
		}
		return d, nil
	}
	var buf [2]fields.Field
	for _, f := range l.fields.AppendDecision(buf[:0], d.res) {
		d.md[l.meta[f.Name]] = []string{f.Value}
	}
	if !d.res.Allowed {
		return d, l.denied(subject, d.res)
	}
	return d, nil
}

// failureCode is the status of a call the engine could not decide: the caller's own end, or
// Unavailable.
func failureCode(err error) codes.Code {
	switch {
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	}
	return codes.Unavailable
}

// denied is the status of a denied call: ResourceExhausted, with RetryInfo and QuotaFailure.
func (l *Limiter) denied(subject string, res engine.Result) error {
	lim, name := l.fields.Named(res)
	st := status.New(codes.ResourceExhausted, fmt.Sprintf("rate limit exceeded: %d per %s, retry after %s", lim.Max, name, res.RetryAfter))
	detailed, err := st.WithDetails(
		&errdetails.RetryInfo{RetryDelay: durationpb.New(res.RetryAfter)},
		&errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
			Subject:     subject,
			Description: fmt.Sprintf("%d requests per %s", lim.Max, name),
			QuotaId:     name,
			QuotaValue:  int64(lim.Max),
		}}},
	)
	if err != nil { // not reached: both details marshal
		return st.Err()
	}
	return detailed.Err()
}

// key returns the call's key, without the prefix, and the subject QuotaFailure names: the
// client's address ("clientip:2001:db8::/64"), or where a key came from ("metadata:x-api-key",
// "key"), never a metadata or function key's value, which may be a credential.
func (l *Limiter) key(ctx context.Context, method string) (key, subject string, err error) {
	if l.cfg.keyFunc != nil {
		key, err = l.cfg.keyFunc(ctx, method)
		if key, err = clientkey.Checked(ErrKey, key, err); err != nil {
			return "", "", err
		}
		return key, l.cfg.keySource, nil
	}
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "", "", fmt.Errorf("%w: no peer address", ErrKey)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	key, err = clientkey.FromAddr(ErrKey, l.addr, p.Addr.String(), md.Get(l.forwardedKey),
		"key calls with WithKeyMetadata or WithKeyFunc")
	if err != nil {
		return "", "", err
	}
	return key, "clientip:" + key, nil
}
