package settings

import (
	"strconv"
	"strings"
	"time"
)

// kind says how an ignored variable's value is compared with the value that asks for nothing.
type kind int

const (
	text   kind = iota // compared as it is
	word               // compared ignoring case
	flag               // a boolean
	number             // an integer or a float
	span               // a duration
)

// ignored is a variable of the reference server that this service reads but does not honour:
// set to anything but noop, it is named in a warning. noop is the value with which the
// reference does nothing this service does not do: its default, except for USE_STATSD, whose
// default (on) this service cannot honour.
type ignored struct {
	name   string
	kind   kind
	noop   string
	secret bool // never repeat its value in a warning
	why    string
}

const (
	whyStatsd      = "statsd is not supported; metrics are served to Prometheus (USE_PROMETHEUS=true)"
	whyDogStatsd   = "DogStatsD is not supported; metrics are served to Prometheus (USE_PROMETHEUS=true)"
	whyMemcache    = "memcached is not supported: limits are kept in Valkey (BACKEND_TYPE=redis)"
	whyPerSecond   = "a separate Redis for per-second limits is not supported (REDIS_PERSECOND): every limit is kept in the one of REDIS_URL"
	whyPipelined   = "decisions are pipelined over a few shared connections to each server; there is no pool to size or wait for"
	whyXDSBackoff  = "the xDS client doubles its wait from XDS_CLIENT_BACKOFF_INITIAL_INTERVAL up to XDS_CLIENT_BACKOFF_MAX_INTERVAL, each wait drawn between half and all of it"
	whyStatsdNames = "metrics keep the names and labels of the reference's default mapping (ratelimit_service_rate_limit_total_hits{domain,key1,key2} and the like); a custom mapping file is not applied"
)

// ignoredVariables lists, in the order of the reference's settings, every variable read and
// not honoured.
var ignoredVariables = []ignored{
	{name: "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", kind: span, noop: "3s", why: whyXDSBackoff},
	{name: "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", kind: number, noop: "0.5", why: whyXDSBackoff},
	{name: "XDS_CLIENT_BACKOFF_JITTER", kind: flag, noop: "true", why: whyXDSBackoff},

	{name: "USE_DOG_STATSD", kind: flag, noop: "false", why: whyDogStatsd},
	{name: "USE_DOG_STATSD_MOGRIFIERS", kind: text, noop: "", why: whyDogStatsd},
	{name: "USE_STATSD", kind: flag, noop: "false", why: whyStatsd},
	{name: "STATSD_HOST", kind: text, noop: "localhost", why: whyStatsd},
	{name: "STATSD_PORT", kind: number, noop: "8125", why: whyStatsd},
	{name: "STATSD_PROTOCOL", kind: word, noop: "tcp", why: whyStatsd},
	{name: "GOSTATS_FLUSH_INTERVAL_SECONDS", kind: number, noop: "5", why: whyStatsd},
	{name: "EXTRA_TAGS", kind: text, noop: "", why: "the Prometheus metrics carry no extra labels"},
	{name: "STATS_FLUSH_INTERVAL", kind: span, noop: "10s", why: "Prometheus reads the metrics when it scrapes them; nothing is flushed"},
	{name: "PROMETHEUS_MAPPER_YAML", kind: text, noop: "", why: whyStatsdNames},

	{name: "EXPIRATION_JITTER_MAX_SECONDS", kind: number, noop: "300", why: "each key expires once its window has passed; there are no fixed windows whose keys expire together"},

	{name: "REDIS_POOL_SIZE", kind: number, noop: "10", why: whyPipelined},
	{name: "REDIS_PIPELINE_LIMIT", kind: number, noop: "0", why: "it has no effect in the reference either"},
	{name: "REDIS_PERSECOND_SOCKET_TYPE", kind: word, noop: "unix", why: whyPerSecond},
	{name: "REDIS_PERSECOND_TYPE", kind: word, noop: "SINGLE", why: whyPerSecond},
	{name: "REDIS_PERSECOND_URL", kind: text, noop: "/var/run/nutcracker/ratelimitpersecond.sock", secret: true, why: whyPerSecond},
	{name: "REDIS_PERSECOND_POOL_SIZE", kind: number, noop: "10", why: whyPerSecond},
	{name: "REDIS_PERSECOND_AUTH", kind: text, noop: "", secret: true, why: whyPerSecond},
	{name: "REDIS_PERSECOND_TLS", kind: flag, noop: "false", why: whyPerSecond},
	{name: "REDIS_PERSECOND_SENTINEL_AUTH", kind: text, noop: "", secret: true, why: whyPerSecond},
	{name: "REDIS_PERSECOND_PIPELINE_WINDOW", kind: span, noop: "0s", why: whyPerSecond},
	{name: "REDIS_PERSECOND_PIPELINE_LIMIT", kind: number, noop: "0", why: whyPerSecond},
	{name: "REDIS_PERSECOND_TIMEOUT", kind: span, noop: "10s", why: whyPerSecond},
	{name: "REDIS_POOL_ON_EMPTY_BEHAVIOR", kind: word, noop: "WAIT", why: whyPipelined},
	{name: "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR", kind: word, noop: "WAIT", why: whyPerSecond},

	{name: "MEMCACHE_HOST_PORT", kind: text, noop: "", why: whyMemcache},
	{name: "MEMCACHE_MAX_IDLE_CONNS", kind: number, noop: "2", why: whyMemcache},
	{name: "MEMCACHE_SRV", kind: text, noop: "", why: whyMemcache},
	{name: "MEMCACHE_SRV_REFRESH", kind: span, noop: "0s", why: whyMemcache},
	{name: "MEMCACHE_TLS", kind: flag, noop: "false", why: whyMemcache},
	{name: "MEMCACHE_TLS_CLIENT_CERT", kind: text, noop: "", why: whyMemcache},
	{name: "MEMCACHE_TLS_CLIENT_KEY", kind: text, noop: "", why: whyMemcache},
	{name: "MEMCACHE_TLS_CACERT", kind: text, noop: "", why: whyMemcache},
	{name: "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION", kind: flag, noop: "false", why: whyMemcache},
}

// warnIgnored names in a warning every ignored variable set to something other than its noop.
func (r *reader) warnIgnored() {
	for _, v := range ignoredVariables {
		got, ok := r.typed(v.name)
		if !ok || sameValue(v.kind, got, v.noop) {
			continue
		}
		if v.secret {
			r.warn("%s is set and ignored: %s", v.name, v.why)
		} else {
			r.warn("%s=%s is ignored: %s", v.name, got, v.why)
		}
	}
}

// sameValue reports whether a and b mean the same value of kind k; a value that does not
// parse differs from every other.
func sameValue(k kind, a, b string) bool {
	switch k {
	case word:
		return strings.EqualFold(a, b)
	case flag:
		x, errA := strconv.ParseBool(a)
		y, errB := strconv.ParseBool(b)
		return errA == nil && errB == nil && x == y
	case number:
		x, errA := strconv.ParseFloat(a, 64)
		y, errB := strconv.ParseFloat(b, 64)
		return errA == nil && errB == nil && x == y
	case span:
		x, errA := time.ParseDuration(a)
		y, errB := time.ParseDuration(b)
		return errA == nil && errB == nil && x == y
	}
	return a == b
}

// refuseUnsupported fails on the reference's settings that change what is limited and that
// this service cannot honour: ignoring them would admit or deny other requests than the
// operator configured.
func (r *reader) refuseUnsupported() {
	if r.boolean("REDIS_PERSECOND", false) {
		r.refuse("REDIS_PERSECOND=true: a separate Redis for per-second limits is not supported; " +
			"remove it to keep per-second limits in the Valkey of REDIS_URL with every other limit")
	}
}
