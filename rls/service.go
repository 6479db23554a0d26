package rls

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.opentelemetry.io/otel/attribute"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/fields"
	"github.com/strictrate/strictrate/rls/config"
)

// Service is Envoy's rate limit service (envoy.service.ratelimit.v3.RateLimitService) on a
// strictrate engine. Most programs run the command strictrate-rls; a program that embeds the
// service needs four calls:
//
//	svc := rls.New(e, rls.WithMetrics(prometheus.DefaultRegisterer))
//	svc.SetConfig(cfg)            // from config.LoadDir, config.Watch or xds.Watch
//	pb.RegisterRateLimitServiceServer(grpcServer, svc)
//	http.Handle("/", svc.HTTPHandler()) // /json and /healthcheck
//
// A request's descriptors are matched against the configuration as the reference server
// matches them (package config); each limited descriptor counts on a key in Valkey (its
// entries', shared by a rule and a request's override of its unit), whose rule's unit is a
// sliding window of that length. The descriptors of one request, however many, are decided
// all or nothing ([engine.Engine.AllowAll]): admitted only when every one's limit admits its
// hits, and then recorded in every one; a denied request consumes nothing of any descriptor. A
// descriptor that never denies (a shadow or quota rule, or any under WithShadowMode) is
// recorded when its limit admits its hits, whatever the others decide. A descriptor of a rule
// that records over its limit (record_over_limit, WithRecordOverLimit) with hits is a charge,
// usage already spent: recorded first, whatever remains and whatever the others decide
// ([engine.Engine.ChargePolicy]), and when it does not fit, the request is over the limit and
// the others record nothing.
type Service struct {
	pb.UnimplementedRateLimitServiceServer

	engine  *engine.Engine
	opts    options
	metrics *metrics

	config   atomic.Pointer[config.Config]
	stopping atomic.Bool
	// fields holds the header fields of the configured rules' limits (engine.Limit ->
	// *fields.Dated), made on first use and dropped with their configuration (SetConfig); a
	// request's own limit (an override), which a client may vary at will, is never kept.
	fields sync.Map
}

// New returns a service deciding with e. It answers every request with an error until a
// configuration is set (SetConfig).
func New(e *engine.Engine, opts ...Option) *Service {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	return &Service{engine: e, opts: o, metrics: newMetrics(o.registerer)}
}

// SetConfig makes c the configuration every later request is matched against, and counts a
// successful load. Requests already being decided finish with the configuration they began
// with.
func (s *Service) SetConfig(c *config.Config) {
	s.config.Store(c)
	// A request that began under the last configuration may still add one of its limits.
	s.fields.Clear()
	s.metrics.configLoadSuccess.Inc()
	s.opts.logger.Info("rate limit configuration loaded", "domains", len(c.Domains()))
}

// ConfigError reports a configuration that was rejected: it is logged and counted
// (config_load_error), and the configuration in use stays as it was.
func (s *Service) ConfigError(err error) {
	s.metrics.configLoadError.Inc()
	s.opts.logger.Error("rate limit configuration rejected; keeping the last good one", "err", err)
}

// Config returns the configuration in use, or nil before the first.
func (s *Service) Config() *config.Config { return s.config.Load() }

// Stop makes /healthcheck fail from now on, so that load balancers stop sending requests
// while the servers drain (on SIGTERM).
func (s *Service) Stop() { s.stopping.Store(true) }

// errNoConfig is the error of a request that comes before any configuration.
var errNoConfig = errors.New("no rate limit configuration loaded")

// descriptorPlan is what one descriptor of a request asks: its rule and its counter.
type descriptorPlan struct {
	match    config.Match
	override bool         // match is the request's own limit (descriptor.limit), not a configured rule
	limit    engine.Limit // the rule's limit in the engine: Max is its requests_per_unit, at most engine.MaxEvents
	hits     uint64
	key      string
	keyHits  uint64        // the hits of every descriptor of this request on the key, its own included
	req      int           // index in the engine requests (one per key); -1 when not sent
	over     bool          // denied without a call: the key's hits in this request are above its limit
	metrics  *ruleCounters // the rule's counters
	shadow   bool          // the rule's shadow_mode: over its limit, it answers OK
	quota    bool          // quota mode (the rule's quota_mode, or WithQuotaMode): over its limit, it answers OK without a reset
	record   bool          // the rule records hits over its limit (record_over_limit, WithRecordOverLimit)
	// charge says the descriptor's key is charged: a descriptor of a record rule with hits
	// counts on it, and the hits of every descriptor on the key are recorded whatever its
	// limits say (engine.ChargePolicy), before the request's other keys are decided.
	charge bool
	// advisory descriptors never deny the request (a shadow or quota rule, or any rule under
	// WithShadowMode): each is recorded when its limit admits its hits, whatever the others decide.
	advisory bool
	present  bool // the descriptor is limited (a rule that is neither nil nor unlimited)
}

// ShouldRateLimit decides a request of Envoy's (RateLimitService/ShouldRateLimit). The call
// is counted and timed in total_requests and response_time_seconds, as the reference's gRPC
// server counts its calls; a request to /json is decided the same way but not counted there.
func (s *Service) ShouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	began := time.Now()
	resp, err := s.decide(ctx, req)
	s.metrics.shouldRateLimitCalls.Inc()
	s.metrics.shouldRateLimitTime.Observe(time.Since(began).Seconds())
	return resp, err
}

// shouldRateLimitMethod is the gRPC method's name in the metrics' grpc_method label.
const shouldRateLimitMethod = "ShouldRateLimit"

// spanName names a decision's span as the reference names it, for the traces' queries.
const spanName = "ShouldRateLimit Execution"

// decide decides a request, traced, and counts an error by its kind.
func (s *Service) decide(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	ctx, span := s.opts.tracer.Start(ctx, spanName, trace.WithAttributes(
		attribute.String("domain", req.GetDomain()), attribute.Int("descriptors", len(req.GetDescriptors()))))
	defer span.End()
	resp, err := s.shouldRateLimit(ctx, req)
	if err != nil {
		span.SetStatus(otelcodes.Error, err.Error())
	} else {
		span.SetAttributes(attribute.String("overall_code", resp.OverallCode.String()))
	}
	if err != nil {
		kind := "service_error"
		if status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded {
			kind = "redis_error"
		}
		s.metrics.callErrors.WithLabelValues(kind).Inc()
	}
	return resp, err
}

// shouldRateLimit is a decision's path, top-down: plan matches each descriptor with its rule
// and makes one engine request per key; decideKeys records the charges, then decides the
// other keys all or nothing; status answers each descriptor and counts its hits; the headers
// and the dynamic metadata speak for the answers.
func (s *Service) shouldRateLimit(ctx context.Context, req *pb.RateLimitRequest) (*pb.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	cfg := s.config.Load()
	if cfg == nil {
		return nil, status.Error(codes.FailedPrecondition, errNoConfig.Error())
	}
	plans, reqs, charges := s.plan(cfg, req)

	resp := &pb.RateLimitResponse{Statuses: make([]*pb.RateLimitResponse_DescriptorStatus, len(plans))}
	var results []engine.Result
	allowed := true
	for _, p := range plans {
		if p.over && !p.advisory {
			allowed = false
		}
	}
	if len(reqs) > 0 {
		var err error
		if results, allowed, err = s.decideKeys(ctx, req.Domain, reqs, charges, allowed); err != nil {
			return nil, err
		}
	}

	code := pb.RateLimitResponse_OK
	tightest := -1
	var tightestRemaining uint64 = math.MaxUint64
	var quotaOver []int // the descriptors over their limit in quota mode, answered OK
	for i, p := range plans {
		st, hits, overQuota := s.status(p, reqs, results, allowed)
		resp.Statuses[i] = st
		if overQuota {
			quotaOver = append(quotaOver, i)
		}
		if p.present {
			s.metrics.count(hits, s.opts.nearLimitRatio)
		}
		if st.Code == pb.RateLimitResponse_OVER_LIMIT {
			code = pb.RateLimitResponse_OVER_LIMIT
		}
		// The headers speak for the descriptor closest to its limit: an over-limit one first.
		if p.present {
			rem := uint64(st.LimitRemaining)
			if st.Code == pb.RateLimitResponse_OVER_LIMIT {
				rem = 0
			}
			if rem < tightestRemaining || (rem == tightestRemaining && st.Code == pb.RateLimitResponse_OVER_LIMIT) {
				tightest, tightestRemaining = i, rem
			}
		}
	}
	if tightest >= 0 && s.opts.headers != HeadersOff {
		resp.ResponseHeadersToAdd = s.headers(plans[tightest], resp.Statuses[tightest], results)
	}
	if code == pb.RateLimitResponse_OVER_LIMIT && s.opts.shadow {
		code = pb.RateLimitResponse_OK
		s.metrics.globalShadow.Inc()
	}
	if s.opts.dynamicMetadata {
		resp.DynamicMetadata = dynamicMetadata(req, plans, resp.Statuses, quotaOver)
	}
	resp.OverallCode = code
	return resp, nil
}

// plan matches each descriptor with its rule, applies replaces, and makes the engine requests
// of the limited ones: one per key, for the hits of every descriptor on it. charges[i] says
// reqs[i] is a charge (nil when none is): a descriptor of a rule that records over its limit,
// with hits, counts on its key, and the key's hits are recorded whatever its limits say.
//
// Several descriptors of a request may count on one key (the same entries twice, or a rule and
// a request's override of the same unit: see counterOf). Every limit on a key holds on every
// event of the key, so each is judged against its own limit with the hits of all of them: a
// descriptor is over when the key's hits in this request are above its limit, and the engine
// decides the key under the smallest limit of those that can deny (an advisory one's only when
// every one is advisory), which admits the hits exactly when every one of them does. The order the
// descriptors come in changes nothing. A charged key is charged under that limit too: when the
// charge does not fit it, every descriptor on the key is over, a looser limit's included (the
// engine says whether the charge fit the limit it was decided under, not how far over it went).
func (s *Service) plan(cfg *config.Config, req *pb.RateLimitRequest) ([]descriptorPlan, []engine.Request, []bool) {
	plans := make([]descriptorPlan, len(req.Descriptors))
	replaced := map[string]bool{}
	for i, d := range req.Descriptors {
		entries := make([]config.Entry, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			entries[j] = config.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		m, override := match(cfg, req.Domain, entries, d.GetLimit())
		plans[i] = descriptorPlan{match: m, override: override, hits: hitsOf(req, i), req: -1}
		if m.Limit != nil {
			for _, r := range m.Limit.Replaces {
				replaced[r] = true
			}
		}
	}
	byKey := make(map[string]int, len(plans))
	var keys [][]int // the descriptors of each key, in the order keys were first named
	for i := range plans {
		p := &plans[i]
		r := p.match.Limit
		if r == nil || r.Unlimited || (r.Name != "" && replaced[r.Name]) {
			continue
		}
		p.present = true
		p.shadow = r.ShadowMode
		p.quota = r.QuotaMode || s.opts.quota
		p.advisory = p.shadow || p.quota || s.opts.shadow
		p.metrics = s.metrics.ruleOf(p.match)
		p.limit = s.limitOf(r)
		var configured config.Match // an override's: the rule configured for its entries
		if p.override {
			configured = cfg.Match(req.Domain, p.match.Counter)
		}
		p.key = s.counterOf(req.Domain, p, configured)
		p.record = s.records(r) || configured.Limit != nil && s.records(configured.Limit)
		k, ok := byKey[p.key]
		if !ok {
			k = len(keys)
			byKey[p.key] = k
			keys = append(keys, nil)
		}
		keys[k] = append(keys[k], i)
	}
	reqs := make([]engine.Request, 0, len(keys))
	var charges []bool
	for _, members := range keys {
		var total uint64
		lead := -1 // the descriptor whose limit the engine decides the key under
		charge := false
		for _, i := range members {
			p := &plans[i]
			total = addHits(total, p.hits)
			charge = charge || p.record && p.hits > 0
			if p.limit.Max > 0 && (lead < 0 || tighter(p, &plans[lead])) {
				lead = i
			}
		}
		for _, i := range members {
			// Hits the limit can never admit (a limit of 0, or a request above
			// engine.MaxEvents, which limits at that): over without asking, or, charged, over
			// whatever the charge answers.
			plans[i].keyHits = total
			plans[i].over = total > uint64(plans[i].limit.Max)
			plans[i].charge = charge
		}
		if lead < 0 { // every limit on the key is 0: nothing to ask, nor to record
			continue
		}
		l := &plans[lead]
		n := 0
		switch {
		case charge:
			n = int(min(total, engine.MaxEvents)) // the most one entry holds; more is over any limit
		case !l.over:
			n = int(total) // at most l.limit.Max
		}
		for _, i := range members {
			plans[i].req = len(reqs)
		}
		if charge && charges == nil {
			charges = make([]bool, len(keys))
		}
		if charge {
			charges[len(reqs)] = true
		}
		reqs = append(reqs, engine.Request{Key: l.key, Policy: engine.Policy{l.limit}, N: n, Advisory: l.advisory})
	}
	if charges != nil {
		charges = charges[:len(reqs)]
	}
	return plans, reqs, charges
}

// records reports whether rule r records hits over its limit: its record_over_limit, or its
// stats name among WithRecordOverLimit's.
func (s *Service) records(r *config.RateLimit) bool {
	return r.RecordOverLimit || s.opts.record.match(r.FullKey)
}

// decideKeys asks the engine for reqs, the engine requests of a request's limited keys (plan):
// the charges first (charges[i]), each on its own, since what they record is usage already
// spent, whatever the others decide; then the others together, all or nothing (AllowAll),
// only looked at, never recorded, when allowed is already false or a charge that can deny did
// not fit. It returns their results, in reqs' order, and whether the request is admitted.
//
// A charge recorded before a later call fails stays recorded: the usage was spent, and the
// request is answered with the failure all the same.
func (s *Service) decideKeys(ctx context.Context, domain string, reqs []engine.Request, charges []bool, allowed bool) ([]engine.Result, bool, error) {
	dctx, cancel := s.decisionContext(ctx)
	defer cancel()
	var results []engine.Result
	rest := reqs // the requests decided all or nothing
	if charges != nil {
		results = make([]engine.Result, len(reqs))
		rest = make([]engine.Request, 0, len(reqs))
		for i, q := range reqs {
			if !charges[i] {
				rest = append(rest, q)
				continue
			}
			res, err := s.engine.ChargePolicy(dctx, q.Key, q.Policy, q.N)
			if err != nil {
				return nil, false, s.engineError(ctx, err)
			}
			results[i] = res
			if !res.Allowed && !q.Advisory {
				allowed = false
			}
		}
		if len(rest) == 0 {
			return results, allowed, nil
		}
	}
	if !allowed { // a descriptor can never admit this request: only look at the others
		for i := range rest {
			rest[i].N = 0
		}
	}
	ok, rs, err := s.engine.AllowAll(dctx, rest)
	switch {
	case err != nil && rs == nil:
		return nil, false, s.engineError(ctx, err)
	case err != nil:
		// A denial whose refunds failed (keys on several cluster primaries): it is still
		// a denial, and answering it with an error would let Envoy admit the request. The
		// events that could not be given back stay counted until they leave their windows.
		s.opts.logger.Warn("rate limit denial could not give back what it held", "domain", domain, "err", err)
	}
	if charges == nil {
		return rs, allowed && ok, nil
	}
	j := 0
	for i := range reqs {
		if !charges[i] {
			results[i] = rs[j]
			j++
		}
	}
	return results, allowed && ok, nil
}

// tighter reports whether p's limit, rather than lead's, is the one its key is decided under:
// a limit that can deny before an advisory one's, then the smaller.
func tighter(p, lead *descriptorPlan) bool {
	if p.advisory != lead.advisory {
		return !p.advisory
	}
	return p.limit.Max < lead.limit.Max
}

// addHits adds hits without wrapping around: a sum past the largest uint64 is over any limit
// anyway.
func addHits(a, b uint64) uint64 {
	if a > math.MaxUint64-b {
		return math.MaxUint64
	}
	return a + b
}

// match is the rule a descriptor is limited by, and whether it is the request's own limit
// (descriptor.limit, an override). An override whose unit the service does not know (Envoy's
// UNKNOWN, or a number that names no unit) is ignored, and the configured rule applies: the
// reference has no answer for it (it panics), and the descriptor stays limited at least as
// the operator configured it, without making the request an error. The override's
// unit_multiplier (Envoy's newer API; 0 or none is 1) makes its window that many units long;
// one that makes it longer than the engine's longest window (engine.MaxWindow) is ignored
// alike.
func match(cfg *config.Config, domain string, entries []config.Entry, o *rlv3.RateLimitDescriptor_RateLimitOverride) (config.Match, bool) {
	if o != nil {
		u, n := overrideUnit(o.GetUnit()), o.GetUnitMultiplier().GetValue()
		if u != config.UnitUnknown && time.Duration(n) <= engine.MaxWindow/u.Duration() {
			m := cfg.Override(domain, entries, o.GetRequestsPerUnit(), u)
			if m.Limit != nil && n > 1 {
				m.Limit.UnitMultiplier = n // the override's own Limit, shared with nothing
			}
			return m, true
		}
	}
	return cfg.Match(domain, entries), false
}

// counterOf is the key of a limited descriptor's counter. A configured rule counts under its
// counter's entries (counterKey). So does a request's override of the same window (unit and
// unit_multiplier) as the limited rule configured for the same entries: the two count the
// same events, each against its own limit, as the reference's share its key (the entries and
// the unit's window). An override of another window, or of entries no limited rule counts
// under, has a counter of its own: the entries' key followed by the unit's name, preceded by
// the multiplier when above 1 ("hour", "30second"; a key of entries ends in '_', never in
// either), so that it never splits a rule's counter, nor puts two windows on one key. rule is,
// for an override, the configured rule's match for its entries.
func (s *Service) counterOf(domain string, p *descriptorPlan, rule config.Match) string {
	key := counterKey(s.opts.keyPrefix, domain, p.match.Counter)
	if !p.override {
		return key
	}
	o := p.match.Limit
	if r := rule.Limit; r != nil && !r.Unlimited && r.Unit == o.Unit && r.Units() == o.Units() && slices.Equal(rule.Counter, p.match.Counter) {
		return key
	}
	if o.Units() > 1 {
		return key + strconv.FormatUint(uint64(o.Units()), 10) + o.Unit.String()
	}
	return key + o.Unit.String()
}

// hitsOf is descriptor i's hits: its own hits_addend when set (0 checks without counting),
// else the request's, else 1.
func hitsOf(req *pb.RateLimitRequest, i int) uint64 {
	d := req.Descriptors[i]
	if d.GetIsNegativeHits() {
		return 0 // giving quota back is not supported: the descriptor is only checked
	}
	if h := d.GetHitsAddend(); h != nil {
		return h.GetValue()
	}
	return max(1, uint64(req.GetHitsAddend()))
}

// limitOf is a rule's limit in the engine: a sliding window of its units' length (its
// unit's, times its unit_multiplier; slotted when the rule is larger than the slots asked),
// or, for a rule of one day, week, month or year, a calendar period under WithCalendar. A
// configured rule is at most engine.MaxEvents (config.MaxRequestsPerUnit); a request's
// override may ask more, and is decided against engine.MaxEvents: it can deny early, after
// that many hits in one unit, never admit more than it asks.
func (s *Service) limitOf(r *config.RateLimit) engine.Limit {
	max := int(min(uint64(r.RequestsPerUnit), engine.MaxEvents))
	if s.opts.calendar != nil && r.Units() == 1 {
		if p := r.Unit.CalendarPeriod(); p != 0 {
			return engine.Calendar(max, p, s.opts.calendar)
		}
	}
	l := engine.Limit{Max: max, Window: r.Window()}
	if s.opts.slots > 0 && max > s.opts.slots {
		l.Resolution = (l.Window / time.Duration(s.opts.slots)).Truncate(time.Microsecond)
		if l.Resolution <= 0 {
			l.Resolution = 0
		}
	}
	return l
}

// overrideUnit is the unit of a request's limit override, read by its number as the
// reference reads it (config.Unit has Envoy's numbers: 7 is a week, which newer protos name),
// UnitUnknown for 0 and any number that names no unit.
func overrideUnit(u typev3.RateLimitUnit) config.Unit {
	if n := config.Unit(u); n.Duration() != 0 {
		return n
	}
	return config.UnitUnknown
}

// protoUnit is u in the response's enum, which has config.Unit's numbers; UNKNOWN for
// UnitUnknown and any number that names no unit.
func protoUnit(u config.Unit) pb.RateLimitResponse_RateLimit_Unit {
	if u.Duration() == 0 {
		return pb.RateLimitResponse_RateLimit_UNKNOWN
	}
	return pb.RateLimitResponse_RateLimit_Unit(u)
}

// status makes a descriptor's status from the decision of its key, and its counts for the
// metrics; overQuota says it is over its limit in quota mode, and answered OK.
func (s *Service) status(p descriptorPlan, reqs []engine.Request, results []engine.Result, allowed bool) (st *pb.RateLimitResponse_DescriptorStatus, h ruleHits, overQuota bool) {
	r := p.match.Limit
	switch {
	case r == nil:
		return &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}, ruleHits{}, false
	case r.Unlimited:
		return &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK, LimitRemaining: math.MaxUint32}, ruleHits{}, false
	case !p.present: // replaced by another descriptor's rule
		return &pb.RateLimitResponse_DescriptorStatus{Code: pb.RateLimitResponse_OK}, ruleHits{}, false
	}
	st = &pb.RateLimitResponse_DescriptorStatus{
		Code:         pb.RateLimitResponse_OK,
		CurrentLimit: protoLimit(r),
	}
	// The limit the descriptor is decided against: its requests_per_unit, at most
	// engine.MaxEvents.
	limit := uint64(p.limit.Max)
	h = ruleHits{counters: p.metrics, hits: p.hits, limit: limit, shadow: p.shadow}
	var res engine.Result
	// A key not asked (every limit on it is 0) admits only a check.
	room, hasRoom, keyRecorded := uint64(0), !p.over, false
	if p.req >= 0 {
		res = results[p.req]
		q := reqs[p.req]
		// The key's events as its decision counted them (this request's, when recorded),
		// under the limit it was decided by: every limit on the key counts the same events.
		// For that limit the engine's answer speaks (a key may hold more than it, which
		// Remaining, never below 0, does not tell); a looser one has its own room.
		decided := q.Policy[0].Max
		used := uint64(decided - min(max(res.Remaining, 0), decided))
		room = limit - min(used, limit)
		if p.charge { // recorded whatever the limits said: it fit, or every limit on the key is over
			keyRecorded, hasRoom = true, res.Allowed && !p.over
		} else {
			keyRecorded = allowed && res.Allowed && q.N > 0
			hasRoom = !p.over && (keyRecorded || p.keyHits <= room && (res.Allowed || p.limit.Max > decided))
		}
	}
	recorded := keyRecorded && hasRoom && p.hits > 0
	switch {
	case res.BackendErr != nil && !p.over: // fail-open answered without a count
		h.admitted, h.before, h.after = (allowed || p.charge) && p.hits > 0, 0, p.hits
		st.LimitRemaining = uint32(min(limit, math.MaxUint32))
	case p.charge && !hasRoom:
		// Recorded over the limit. The engine does not say how many of the hits fit before
		// it, so every one counts as over it, as the reference counts hits added to a count
		// already over its limit.
		h.before, h.after = limit, addHits(limit, p.hits)
		st.Code, st.LimitRemaining = pb.RateLimitResponse_OVER_LIMIT, 0
	case recorded:
		h.admitted = true
		h.after = limit - min(room, limit)
		h.before = h.after - min(p.hits, h.after)
		st.LimitRemaining = uint32(min(room, math.MaxUint32))
	default:
		h.before = limit - min(room, limit)
		h.after = h.before + p.hits
		h.fromCache = res.FromCache
		st.LimitRemaining = uint32(min(room, math.MaxUint32))
		if !hasRoom {
			st.Code = pb.RateLimitResponse_OVER_LIMIT
			st.LimitRemaining = 0
		}
	}
	st.DurationUntilReset = durationpb.New(untilReset(p.limit, res))
	switch {
	case st.Code != pb.RateLimitResponse_OVER_LIMIT:
	case p.shadow:
		st.Code = pb.RateLimitResponse_OK
	case p.quota:
		// The reference's quota mode answers an exceeded quota with its limit and no time
		// to reset; a shadow rule in quota mode answers as a shadow rule, as there.
		st.Code, st.DurationUntilReset = pb.RateLimitResponse_OK, nil
		overQuota = true
	}
	return st, h, overQuota
}

// protoLimit is a rule's current_limit as the reference answers it: its requests_per_unit,
// unit and name, and, for a rule of several units, unit_multiplier (the field of Envoy's
// newer API, which the reference never sets; left out for one unit, as there).
func protoLimit(r *config.RateLimit) *pb.RateLimitResponse_RateLimit {
	l := &pb.RateLimitResponse_RateLimit{Name: r.Name, RequestsPerUnit: r.RequestsPerUnit, Unit: protoUnit(r.Unit)}
	if n := r.Units(); n > 1 {
		l.UnitMultiplier = wrapperspb.UInt32(n)
	}
	return l
}

// untilReset is when a descriptor's limit next gets quota back: when the oldest event in its
// window leaves it, or, for an empty window, a whole window away (for a calendar limit, the
// end of the current period).
func untilReset(l engine.Limit, r engine.Result) time.Duration {
	if r.QuotaAfter > 0 {
		return r.QuotaAfter
	}
	if r.RetryAfter > 0 {
		return r.RetryAfter
	}
	if l.IsCalendar() { // the rest of the period the decision was taken in, on its clock
		at := r.At
		if at.IsZero() {
			at = time.Now()
		}
		_, end := l.PeriodAt(at)
		return end.Sub(at)
	}
	return l.Window
}

// headers are the header fields for the descriptor closest to its limit.
func (s *Service) headers(p descriptorPlan, st *pb.RateLimitResponse_DescriptorStatus, results []engine.Result) []*corev3.HeaderValue {
	if s.opts.headers == HeadersLegacy {
		return []*corev3.HeaderValue{
			{Key: s.opts.limitHeader, Value: fmt.Sprint(st.CurrentLimit.GetRequestsPerUnit())},
			{Key: s.opts.remainingHeader, Value: fmt.Sprint(st.LimitRemaining)},
			{Key: s.opts.resetHeader, Value: fmt.Sprint(fields.Seconds(st.DurationUntilReset.AsDuration()))},
		}
	}
	f, err := s.fieldsOf(p.limit, !p.override)
	if err != nil {
		return nil
	}
	var res engine.Result
	if p.req >= 0 {
		res = results[p.req]
	}
	res.Remaining = int(st.LimitRemaining)
	if st.Code == pb.RateLimitResponse_OVER_LIMIT && res.RetryAfter == 0 {
		res.RetryAfter = st.DurationUntilReset.AsDuration()
	}
	if res.At.IsZero() {
		res.At = time.Now()
	}
	res.Allowed = st.Code == pb.RateLimitResponse_OK
	res.Window = p.limit.Window
	// The policy's fields are shared: the decision's are appended to a copy.
	fs := append(make([]fields.Field, 0, 2), f.Policy(res.At)...)
	var out []*corev3.HeaderValue
	for _, fl := range f.AppendDecision(fs, res) {
		out = append(out, &corev3.HeaderValue{Key: fl.Name, Value: fl.Value})
	}
	return out
}

// fieldsOf returns the fields writer of a limit: made once per limit of a configured rule
// (keep), for every request of an override's, so that what is kept is bounded by the
// configuration and not by what clients send.
func (s *Service) fieldsOf(l engine.Limit, keep bool) (*fields.Dated, error) {
	if f, ok := s.fields.Load(l); ok {
		return f.(*fields.Dated), nil
	}
	f, err := fields.NewDated(engine.Policy{l}, fields.DefaultVersion)
	if err != nil {
		return nil, err
	}
	if keep {
		s.fields.Store(l, f)
	}
	return f, nil
}

// decisionContext bounds a decision: a little before the request's deadline, so that the
// answer reaches Envoy in time, or the request timeout when it has none. The first is the
// client's own end, which no engine admits on (a client that sets a short deadline is not let
// past a used-up limit); the second is the service's bound on Valkey's answer, whose expiry is
// Valkey's failure (errRequestTimeout), which a fail-open engine admits on.
func (s *Service) decisionContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok {
		margin := max(time.Until(dl)/10, 2*time.Millisecond)
		return context.WithDeadline(ctx, dl.Add(-margin))
	}
	return context.WithTimeoutCause(ctx, s.opts.requestTimeout, errRequestTimeout)
}

// errRequestTimeout ends a decision of a request without a deadline that Valkey did not answer
// within the request timeout: the server's failure (engine.ErrUnavailable), not the client's.
var errRequestTimeout = fmt.Errorf("%w: no answer within the request timeout", engine.ErrUnavailable)

// engineError is the gRPC status of a decision the engine could not take: UNAVAILABLE, so
// that Envoy's failure_mode_deny decides, or the caller's own cancellation.
func (s *Service) engineError(ctx context.Context, err error) error {
	switch {
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	case errors.Is(err, engine.ErrInvalidArgument):
		return status.Error(codes.InvalidArgument, err.Error())
	}
	return status.Error(codes.Unavailable, err.Error())
}
