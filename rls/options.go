package rls

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Headers chooses which rate limit header fields a response asks Envoy to add
// (response_headers_to_add), for the descriptor closest to its limit.
type Headers int

const (
	// HeadersOff adds none: the reference's default (LIMIT_RESPONSE_HEADERS_ENABLED false).
	HeadersOff Headers = iota
	// HeadersFields adds the IETF RateLimit-Policy and RateLimit fields
	// (draft-ietf-httpapi-ratelimit-headers, written by package fields).
	HeadersFields
	// HeadersLegacy adds the reference's trio: the limit, the remaining and the seconds to the
	// reset, under the names WithLegacyHeaderNames sets.
	HeadersLegacy
)

// Default values of the options, the reference's where it has them.
const (
	DefaultNearLimitRatio = 0.8
	DefaultRequestTimeout = time.Second
	// DefaultSlotsPerWindow is how many slots a rule's window is cut into when its
	// requests_per_unit is larger (WithSlotsPerWindow).
	DefaultSlotsPerWindow = 3600
	// The reference's default names of its legacy header trio.
	DefaultLimitHeader     = "RateLimit-Limit"
	DefaultRemainingHeader = "RateLimit-Remaining"
	DefaultResetHeader     = "RateLimit-Reset"
)

// Option configures a Service.
type Option func(*options)

type options struct {
	keyPrefix         string
	nearLimitRatio    float64
	shadow            bool
	quota             bool
	headers           Headers
	limitHeader       string
	remainingHeader   string
	resetHeader       string
	calendar          *time.Location
	slots             int
	requestTimeout    time.Duration
	registerer        prometheus.Registerer
	logger            *slog.Logger
	ping              func(context.Context) error
	healthyWithConfig bool
	tracer            trace.Tracer
	dynamicMetadata   bool
	record            recordNames
}

func defaultOptions() options {
	return options{
		nearLimitRatio:  DefaultNearLimitRatio,
		limitHeader:     DefaultLimitHeader,
		remainingHeader: DefaultRemainingHeader,
		resetHeader:     DefaultResetHeader,
		slots:           DefaultSlotsPerWindow,
		requestTimeout:  DefaultRequestTimeout,
		logger:          slog.New(slog.DiscardHandler),
		tracer:          noop.NewTracerProvider().Tracer(""),
	}
}

// WithKeyPrefix puts prefix before every counter's key (the reference's CACHE_KEY_PREFIX), so
// that several services can share one Valkey. The engine's own prefix comes before it.
func WithKeyPrefix(prefix string) Option { return func(o *options) { o.keyPrefix = prefix } }

// WithNearLimitRatio sets the share of a limit above which admitted hits count as near_limit
// in the metrics (the reference's NEAR_LIMIT_RATIO); the default is 0.8.
func WithNearLimitRatio(r float64) Option { return func(o *options) { o.nearLimitRatio = r } }

// WithShadowMode makes every answer OK while still deciding every request (the reference's global
// SHADOW_MODE): each descriptor's status says whether it was over its limit, and a request some
// descriptor would have denied is counted in the global_shadow_mode metric. As the reference
// records the other descriptors' hits of such a request, each limited descriptor is recorded when
// its limit admits its hits, whatever the others decide; one over its limit records nothing, so
// each counter holds only hits its limit admits, and turning shadow mode off denies exactly what
// the limits deny. Rules have their own shadow_mode in the configuration.
func WithShadowMode(on bool) Option { return func(o *options) { o.shadow = on } }

// WithQuotaMode puts every rule in quota mode (the reference's global QUOTA_MODE), as a rule's
// quota_mode does for it: a descriptor over its limit does not deny the request, and its
// status is OK, with its limit, limit_remaining 0 and no duration_until_reset. Each limited
// descriptor is recorded when its limit admits its hits, whatever the others decide.
func WithQuotaMode(on bool) Option { return func(o *options) { o.quota = on } }

// WithDynamicMetadata makes every response carry dynamic_metadata (the reference's
// RESPONSE_DYNAMIC_METADATA), a google.protobuf.Struct that Envoy's rate limit filter puts in
// the request's dynamic metadata (under envoy.filters.http.ratelimit), as the reference
// writes it:
//
//   - "domain": the request's domain;
//   - "descriptors": one struct per descriptor of the request, in order: "entries", a list of
//     "key=value" strings; "limit", the descriptor's own limit (an override) as its proto
//     text, when it has one; "hitsAddend", the descriptor's own hits_addend, when set;
//   - "hitsAddend": the request's hits_addend, when not 0;
//   - "quotaModeViolations": the indices of the descriptors over their limit in quota mode
//     (the rule's quota_mode, or WithQuotaMode), whose status is OK; absent when none is;
//   - "quotaModeEnabled": whether a limited descriptor's rule has quota_mode: true (the
//     rule's own key; WithQuotaMode alone does not set it, as in the reference);
//   - "metadata": the metadata of the rules (their metadata key) of the limited descriptors
//     whose status is OK and that are not over their limit, merged in the request's order:
//     a key already there keeps its first value, two maps under one key are merged alike;
//     absent when none has any.
//
// The first five are the pinned reference's; "metadata" is its later versions', which read
// the rules' metadata as this service does. Off, the default, responses carry none.
func WithDynamicMetadata(on bool) Option { return func(o *options) { o.dynamicMetadata = on } }

// WithRecordOverLimit makes the rules named record usage reported after the fact, as
// record_over_limit: true does for a rule of a file (the command's
// STRICTRATE_RECORD_OVER_LIMIT): for configurations served over xDS, such as Envoy Gateway
// generates, whose rules cannot carry the key. A descriptor of such a rule with hits is a
// charge: its hits are recorded whatever remains of its limit, before the request's other
// descriptors are decided, and answered OVER_LIMIT when they did not fit; every later request
// on its key is then over the limit until enough of the window's hits have left it. A
// descriptor of 0 hits checks as any other: OVER_LIMIT while its key holds more than its limit.
//
// Each name is a rule's stats name: its full key, as /rlconfig lists it and as its metrics are
// named without the request's values that detailed_metric or value_to_metric add
// ("domain.key_value.key"). A name ending in '*' is a prefix of such names
// ("default/eg/http.*"), any other is exact; a request's limit override is named by its
// entries alike, and is also a charge when the rule configured for its entries is. Several
// calls add up; none by default. docs/rls.md, "After-the-fact reports", has the patterns.
func WithRecordOverLimit(names ...string) Option {
	return func(o *options) { o.record.add(names) }
}

// WithResponseHeaders chooses the header fields the responses carry (the reference's
// LIMIT_RESPONSE_HEADERS_ENABLED turns them on); HeadersOff by default.
func WithResponseHeaders(h Headers) Option { return func(o *options) { o.headers = h } }

// WithLegacyHeaderNames sets the names of HeadersLegacy's trio (the reference's
// HEADER_RATELIMIT_LIMIT, HEADER_RATELIMIT_REMAINING and HEADER_RATELIMIT_RESET). An empty
// name keeps its default.
func WithLegacyHeaderNames(limit, remaining, reset string) Option {
	return func(o *options) {
		if limit != "" {
			o.limitHeader = limit
		}
		if remaining != "" {
			o.remainingHeader = remaining
		}
		if reset != "" {
			o.resetHeader = reset
		}
	}
}

// WithCalendar makes the units day, week, month and year calendar periods in loc (a day from
// midnight, a week from Monday, a month from the 1st, a year from January 1st), each counting
// the events since the start of the current period, instead of sliding windows of the
// reference's lengths (a day of 86400 s, a month of 30 days, a year of 365). nil keeps
// sliding windows, the default. A calendar period is counted one at a time: a rule of several
// (a unit_multiplier above 1 on day, week, month or year) stays a sliding window of that many
// units' length. The command refuses such a rule instead, at load (config.WithCalendar).
func WithCalendar(loc *time.Location) Option { return func(o *options) { o.calendar = loc } }

// WithSlotsPerWindow bounds a sliding rule's memory: a rule whose requests_per_unit is larger
// than n keeps its log in n slots of its window (engine.Limit.Resolution of unit/n), so its
// key holds at most about n entries however many requests it admits. It still never admits
// more than the limit in any trailing window; a denial may come up to unit/n early (with the
// default 3600: 1 s for an hour, 24 s for a day, 12 minutes for a month). 0 keeps every rule's
// log exact: one entry per admitted request.
func WithSlotsPerWindow(n int) Option { return func(o *options) { o.slots = n } }

// WithRequestTimeout bounds how long a decision waits for Valkey when the request carries no
// deadline of its own (1 s by default); with a deadline, the answer comes a little before it.
// The request timeout is the service's bound on Valkey's answer: under the engine's fail-open
// (engine.WithFailOpen) its expiry admits. A request's own deadline is the client's: a
// decision it cuts short is answered UNAVAILABLE (or DEADLINE_EXCEEDED) under either policy,
// so that a client cannot buy an OK past a used-up limit with a short deadline.
func WithRequestTimeout(d time.Duration) Option { return func(o *options) { o.requestTimeout = d } }

// WithMetrics registers the service's Prometheus metrics, named as the reference's Prometheus
// exporter names them, with r. Without it the metrics are kept but not exposed.
func WithMetrics(r prometheus.Registerer) Option { return func(o *options) { o.registerer = r } }

// WithLogger sets the logger for configuration loads and errors; none by default.
func WithLogger(l *slog.Logger) Option {
	return func(o *options) {
		if l != nil {
			o.logger = l
		}
	}
}

// WithPing sets the check /healthcheck runs against the storage (a Valkey PING, say): the
// service is healthy only while it passes.
func WithPing(ping func(context.Context) error) Option { return func(o *options) { o.ping = ping } }

// WithHealthyWithAtLeastOneConfigLoaded makes the service unhealthy until a configuration with
// at least one domain is loaded (the reference's HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
func WithHealthyWithAtLeastOneConfigLoaded(on bool) Option {
	return func(o *options) { o.healthyWithConfig = on }
}

// WithTracerProvider traces every ShouldRateLimit call as a span of tp's (OpenTelemetry), as
// the reference does when TRACING_ENABLED; none by default.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) {
		if tp != nil {
			o.tracer = tp.Tracer("github.com/strictrate/strictrate/rls")
		}
	}
}
