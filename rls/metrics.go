package rls

import (
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/strictrate/strictrate/rls/config"
)

// metrics are the reference's Prometheus metrics, with its names and labels: per rule, the
// hits counted against it in every state (the rule's stats key split into domain, key1 and
// key2), and the service's own.
type metrics struct {
	totalHits, overLimit, nearLimit, withinLimit, shadowMode *prometheus.CounterVec
	overLimitLocalCache                                      *prometheus.CounterVec
	configLoadSuccess, configLoadError, globalShadow         prometheus.Counter
	callErrors                                               *prometheus.CounterVec
	totalRequests                                            *prometheus.CounterVec
	responseTime                                             *prometheus.HistogramVec
	// shouldRateLimitCalls and shouldRateLimitTime are totalRequests and responseTime of the
	// one method counted there, found once, not by its label on every call.
	shouldRateLimitCalls prometheus.Counter
	shouldRateLimitTime  prometheus.Observer

	// rules holds each rule's counters by its stats key (*ruleCounters), found once: a
	// counter vector's lookup hashes and validates its labels on every call, which for a
	// request of three descriptors cost more than its whole decision's arithmetic.
	rules sync.Map
	// perValue counts the stats keys in rules that name a request's values (an override's, a
	// detailed_metric or value_to_metric rule's): at most maxPerValueSeries, so that clients
	// sending ever new values cannot grow the series, nor the memory that holds them, without
	// bound.
	perValue atomic.Int64
}

// maxPerValueSeries is the most stats keys named by requests' values the service keeps series
// for (six counters each); past it, such a match counts under its config.Match.BoundedStatKey.
const maxPerValueSeries = 1000

// ruleCounters are one rule's counters, its labels resolved.
type ruleCounters struct {
	totalHits, overLimit, nearLimit, withinLimit, shadowMode, overLimitLocalCache prometheus.Counter
}

// ruleOf returns the counters of a descriptor's matched rule: by its stats key, or, for a
// match named by the request's values once maxPerValueSeries of those are kept, by its
// bounded stats key.
func (m *metrics) ruleOf(match config.Match) *ruleCounters {
	if !match.PerValue {
		return m.rule(match.StatKey)
	}
	if c, ok := m.rules.Load(match.StatKey); ok {
		return c.(*ruleCounters)
	}
	if m.perValue.Add(1) > maxPerValueSeries {
		m.perValue.Add(-1)
		return m.rule(match.BoundedStatKey)
	}
	c, made := m.made(match.StatKey)
	if !made {
		m.perValue.Add(-1) // another request made it first
	}
	return c
}

// rule returns the counters of the rule whose stats key is statKey.
func (m *metrics) rule(statKey string) *ruleCounters {
	c, _ := m.made(statKey)
	return c
}

// made returns the counters of statKey, made if need be; made says this call made them.
func (m *metrics) made(statKey string) (*ruleCounters, bool) {
	if c, ok := m.rules.Load(statKey); ok {
		return c.(*ruleCounters), false
	}
	l := statLabels(statKey)
	c := &ruleCounters{
		totalHits: m.totalHits.With(l), overLimit: m.overLimit.With(l), nearLimit: m.nearLimit.With(l),
		withinLimit: m.withinLimit.With(l), shadowMode: m.shadowMode.With(l), overLimitLocalCache: m.overLimitLocalCache.With(l),
	}
	actual, loaded := m.rules.LoadOrStore(statKey, c)
	return actual.(*ruleCounters), !loaded
}

func newMetrics(r prometheus.Registerer) *metrics {
	rule := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_rate_limit_" + name, Help: help},
			[]string{"domain", "key1", "key2"})
	}
	m := &metrics{
		totalHits:           rule("total_hits", "Hits asked of the rule, admitted or not."),
		overLimit:           rule("over_limit", "Hits over the rule's limit."),
		nearLimit:           rule("near_limit", "Hits admitted above the near-limit ratio, or denied below the limit."),
		withinLimit:         rule("within_limit", "Hits admitted within the rule's limit."),
		shadowMode:          rule("shadow_mode", "Hits over a shadow rule's limit, answered OK."),
		overLimitLocalCache: rule("over_limit_with_local_cache", "Hits denied by the deny cache without asking Valkey."),
		configLoadSuccess: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_success",
			Help: "Configurations loaded."}),
		configLoadError: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_config_load_error",
			Help: "Configurations rejected; the last good one is kept."}),
		globalShadow: prometheus.NewCounter(prometheus.CounterOpts{Name: "ratelimit_service_global_shadow_mode",
			Help: "Requests over a limit answered OK by the global shadow mode."}),
		callErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_should_rate_limit_error",
			Help: "ShouldRateLimit calls answered with an error: redis_error (storage), service_error (the request or the configuration)."},
			[]string{"err_type"}),
		totalRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_total_requests",
			Help: "gRPC calls served."}, []string{"grpc_method"}),
		responseTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "ratelimit_service_response_time_seconds",
			Help: "Time to answer a gRPC call.", Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16)}, []string{"grpc_method"}),
	}
	m.shouldRateLimitCalls = m.totalRequests.WithLabelValues(shouldRateLimitMethod)
	m.shouldRateLimitTime = m.responseTime.WithLabelValues(shouldRateLimitMethod)
	if r != nil {
		for _, c := range []prometheus.Collector{m.totalHits, m.overLimit, m.nearLimit, m.withinLimit, m.shadowMode,
			m.overLimitLocalCache, m.configLoadSuccess, m.configLoadError, m.globalShadow, m.callErrors,
			m.totalRequests, m.responseTime} {
			r.MustRegister(c)
		}
	}
	return m
}

// statLabels splits a rule's stats key ("domain.key1_value.key2") into the labels the
// reference's exporter gives it; ':' and '|' become '_', as the reference sanitizes them.
func statLabels(key string) prometheus.Labels {
	key = strings.NewReplacer(":", "_", "|", "_").Replace(key)
	parts := strings.SplitN(key, ".", 4)
	for len(parts) < 3 {
		parts = append(parts, "")
	}
	return prometheus.Labels{"domain": parts[0], "key1": parts[1], "key2": parts[2]}
}

// ruleHits are one descriptor's counts for the metrics: its hits, the count of its window
// before the request and after it, and its limit.
type ruleHits struct {
	counters      *ruleCounters // metrics.rule of the descriptor's rule
	hits          uint64
	before, after uint64
	limit         uint64
	admitted      bool // the request's hits were recorded
	shadow        bool // a shadow rule (or the global shadow mode) answered OK over the limit
	fromCache     bool
}

// count adds one descriptor's hits to the per-rule counters, split as the reference splits
// them: hits that take the count over the limit are over_limit, those between the near-limit
// threshold and the limit near_limit, the admitted ones within_limit.
func (m *metrics) count(h ruleHits, nearRatio float64) {
	c := h.counters
	c.totalHits.Add(float64(h.hits))
	if h.hits == 0 {
		return
	}
	near := uint64(math.Floor(float64(h.limit) * nearRatio))
	switch {
	case h.after > h.limit:
		over := h.hits
		if h.before < h.limit {
			over = h.after - h.limit
			c.nearLimit.Add(float64(h.limit - max(near, h.before)))
		}
		c.overLimit.Add(float64(over))
		if h.fromCache {
			c.overLimitLocalCache.Add(float64(h.hits))
		}
		if h.shadow {
			c.shadowMode.Add(float64(over))
		}
	case h.admitted:
		c.withinLimit.Add(float64(h.hits))
		if h.after > near {
			c.nearLimit.Add(float64(h.after - max(near, h.before)))
		}
	}
}
