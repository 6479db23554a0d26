// Package settings reads the rate limit service's settings from the environment, under the
// names and with the defaults of the reference server (envoyproxy/ratelimit), so that a
// deployment of the reference, Envoy Gateway's included, runs unchanged with the image
// swapped.
//
// FromEnv is the one entry point: it returns the Settings, a warning for every variable of
// the reference that is set and not honoured, and an error wrapping ErrInvalid (a value that
// does not parse) or ErrRefused (a setting whose absence would change what is limited). The
// methods then build what the service needs: ServerTLS, XDSClientTLS and RedisTLS the TLS
// configurations, ValkeyOption the Valkey client's options, ConfigDir the configuration's
// directory. Variables of this service's own start with STRICTRATE_.
// docs/rls-settings.md lists every variable.
package settings

import (
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

var (
	// ErrInvalid is wrapped by FromEnv's error when a value does not parse or cannot work: a
	// PORT that is not a number, an unknown REDIS_TYPE, TLS without a certificate.
	ErrInvalid = errors.New("settings: invalid value")
	// ErrRefused is wrapped by FromEnv's error when a setting of the reference asks for what
	// this service does not do and ignoring it would change what is limited (a separate Redis
	// for per-second limits, memcached).
	ErrRefused = errors.New("settings: refused")
)

// Configuration sources (CONFIG_TYPE).
const (
	ConfigFile = "FILE"          // YAML files under ConfigDir
	ConfigXDS  = "GRPC_XDS_SOTW" // an xDS management server, state of the world
)

// Valkey deployments (REDIS_TYPE).
const (
	RedisSingle   = "SINGLE"
	RedisCluster  = "CLUSTER"
	RedisSentinel = "SENTINEL"
)

// Settings is every setting of the service, typed. The comment of each field names its
// variable; the reference's default is the default unless it says otherwise.
type Settings struct {
	// Listeners.
	Host      string // HOST: the HTTP listener (/healthcheck, /json); 0.0.0.0
	Port      int    // PORT: 8080
	GRPCHost  string // GRPC_HOST: 0.0.0.0
	GRPCPort  int    // GRPC_PORT: 8081
	GRPCUDS   string // GRPC_UDS: a unix socket path the gRPC server listens on instead of GRPCHost:GRPCPort
	DebugHost string // DEBUG_HOST: the debug listener (/rlconfig); 0.0.0.0
	DebugPort int    // DEBUG_PORT: 6070
	// GRPCMaxConnectionAge (GRPC_MAX_CONNECTION_AGE, 24h) and GRPCMaxConnectionAgeGrace
	// (GRPC_MAX_CONNECTION_AGE_GRACE, 1h) are the gRPC server's keepalive MaxConnectionAge
	// and MaxConnectionAgeGrace, so that Envoy's connections are spread again over replicas.
	GRPCMaxConnectionAge      time.Duration
	GRPCMaxConnectionAgeGrace time.Duration

	// TLS of the gRPC server (ServerTLS).
	GRPCServerUseTLS  bool   // GRPC_SERVER_USE_TLS
	GRPCServerTLSCert string // GRPC_SERVER_TLS_CERT: the server's certificate chain, PEM
	GRPCServerTLSKey  string // GRPC_SERVER_TLS_KEY: its private key, PEM
	// GRPCServerTLSCACert is the CA that client certificates must chain to; when set, a client
	// without such a certificate is refused. The reference reads GRPC_CLIENT_TLS_CACERT;
	// Envoy Gateway sets GRPC_SERVER_TLS_CA_CERT, which the reference never reads. Either
	// name is read here (both set must agree).
	GRPCServerTLSCACert string
	GRPCClientTLSSAN    string // GRPC_CLIENT_TLS_SAN: the name a client certificate must hold

	// Logging.
	LogLevel  string // LOG_LEVEL: trace, debug, info, warn, error, fatal or panic, lower case; warn
	LogFormat string // LOG_FORMAT: text or json; text

	// Where the rate limit configuration comes from.
	ConfigType                     string // CONFIG_TYPE: ConfigFile or ConfigXDS
	ForceStartWithoutInitialConfig bool   // FORCE_START_WITHOUT_INITIAL_CONFIG
	RuntimeRoot                    string // RUNTIME_ROOT: /srv/runtime_data/current
	RuntimeSubdirectory            string // RUNTIME_SUBDIRECTORY
	RuntimeAppDirectory            string // RUNTIME_APPDIRECTORY: config
	RuntimeWatchRoot               bool   // RUNTIME_WATCH_ROOT: watch RuntimeRoot (true) or ConfigDir only
	RuntimeIgnoreDotFiles          bool   // RUNTIME_IGNOREDOTFILES

	// The xDS client (CONFIG_TYPE=GRPC_XDS_SOTW).
	ConfigGRPCXDSNodeID       string            // CONFIG_GRPC_XDS_NODE_ID: default
	ConfigGRPCXDSNodeMetadata map[string]string // CONFIG_GRPC_XDS_NODE_METADATA: key=value,key=value
	ConfigGRPCXDSServerURL    string            // CONFIG_GRPC_XDS_SERVER_URL: localhost:18000
	// ConfigGRPCXDSClientAdditionalHeaders is sent as gRPC metadata on the xDS stream
	// (CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: key:value,key:value).
	ConfigGRPCXDSClientAdditionalHeaders map[string]string
	ConfigGRPCXDSServerUseTLS            bool          // CONFIG_GRPC_XDS_SERVER_USE_TLS
	ConfigGRPCXDSClientTLSCert           string        // CONFIG_GRPC_XDS_CLIENT_TLS_CERT: presented to the xDS server
	ConfigGRPCXDSClientTLSKey            string        // CONFIG_GRPC_XDS_CLIENT_TLS_KEY
	ConfigGRPCXDSServerTLSCACert         string        // CONFIG_GRPC_XDS_SERVER_TLS_CACERT: verifies the xDS server
	ConfigGRPCXDSServerTLSSAN            string        // CONFIG_GRPC_XDS_SERVER_TLS_SAN: the name verified instead of the URL's host
	XDSClientBackoffInitialInterval      time.Duration // XDS_CLIENT_BACKOFF_INITIAL_INTERVAL: 10s
	XDSClientBackoffMaxInterval          time.Duration // XDS_CLIENT_BACKOFF_MAX_INTERVAL: 60s
	XDSClientMaxMsgSizeInBytes           int           // XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES: 0, gRPC's 4 MiB

	// Metrics.
	UsePrometheus  bool   // USE_PROMETHEUS
	PrometheusAddr string // PROMETHEUS_ADDR: :9090
	PrometheusPath string // PROMETHEUS_PATH: /metrics
	DisableStats   bool   // DISABLE_STATS: serve no metrics at all
	// UseStatsd is USE_STATSD as set (false when unset, where the reference's default is
	// true): statsd is not supported, and FromEnv warns when it is asked for.
	UseStatsd bool

	// Limits.
	BackendType                       string  // BACKEND_TYPE: redis (the only one supported)
	CacheKeyPrefix                    string  // CACHE_KEY_PREFIX: put before every key in Valkey
	LocalCacheSizeInBytes             int     // LOCAL_CACHE_SIZE_IN_BYTES: the deny cache's size; 0 turns it off
	NearLimitRatio                    float64 // NEAR_LIMIT_RATIO: 0.8
	ShadowMode                        bool    // SHADOW_MODE: decide and count, always answer OK
	QuotaMode                         bool    // QUOTA_MODE: every rule in quota mode (rls.WithQuotaMode)
	ResponseDynamicMetadata           bool    // RESPONSE_DYNAMIC_METADATA: responses carry dynamic_metadata (rls.WithDynamicMetadata)
	MergeDomainConfig                 bool    // MERGE_DOMAIN_CONFIG: files naming one domain are merged (config.WithMergeDomains)
	HealthyWithAtLeastOneConfigLoaded bool    // HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED
	LimitResponseHeadersEnabled       bool    // LIMIT_RESPONSE_HEADERS_ENABLED
	// The names of the legacy header trio (LegacyHeaders): LIMIT_LIMIT_HEADER,
	// LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER, by default RateLimit-Limit,
	// RateLimit-Remaining and RateLimit-Reset.
	HeaderRateLimitLimit     string
	HeaderRateLimitRemaining string
	HeaderRateLimitReset     string

	// Valkey (the reference's Redis settings). ValkeyOption turns them into a client's options.
	RedisSocketType string // REDIS_SOCKET_TYPE: tcp or unix; unix
	RedisType       string // REDIS_TYPE: RedisSingle, RedisCluster or RedisSentinel
	// RedisURL is REDIS_URL: host:port or redis://[user[:password]@]host:port[/db] (SINGLE),
	// a comma-separated list of them (CLUSTER, any nodes), the master set's name and then
	// the sentinels' addresses (SENTINEL: name,host:port,...), or a socket path (unix).
	// /var/run/nutcracker/ratelimit.sock by default.
	RedisURL          string
	RedisAuth         string // REDIS_AUTH: password, or user:password
	RedisSentinelAuth string // REDIS_SENTINEL_AUTH: the sentinels' own, password or user:password
	// RedisUseTLS is REDIS_TLS (named so beside the RedisTLS method).
	RedisUseTLS                      bool
	RedisTLSClientCert               string        // REDIS_TLS_CLIENT_CERT
	RedisTLSClientKey                string        // REDIS_TLS_CLIENT_KEY
	RedisTLSCACert                   string        // REDIS_TLS_CACERT: verifies the servers, with the system's roots
	RedisTLSSkipHostnameVerification bool          // REDIS_TLS_SKIP_HOSTNAME_VERIFICATION: verify the chain, not the name
	RedisPipelineWindow              time.Duration // REDIS_PIPELINE_WINDOW: the client's MaxFlushDelay; 0
	RedisTimeout                     time.Duration // REDIS_TIMEOUT: dial and write timeout; 10s
	// At start, a Valkey that cannot be reached is tried again, the wait doubling from
	// RedisStartupInitialInterval (REDIS_STARTUP_INITIAL_INTERVAL, 1s) up to
	// RedisStartupMaxInterval (REDIS_STARTUP_MAX_INTERVAL, 30s), for at most
	// RedisStartupMaxElapsedTime (REDIS_STARTUP_MAX_ELAPSED_TIME), after which the start
	// fails; 0 tries until it answers. The reference's newer names; its default for the last
	// is 0, this service's 30s, so that a wrong address stops the start, naming it.
	RedisStartupInitialInterval time.Duration
	RedisStartupMaxInterval     time.Duration
	RedisStartupMaxElapsedTime  time.Duration

	// Tracing (OpenTelemetry). The exporter reads its own OTEL_EXPORTER_OTLP_* variables.
	TracingEnabled           bool    // TRACING_ENABLED
	TracingServiceName       string  // TRACING_SERVICE_NAME: RateLimit
	TracingServiceNamespace  string  // TRACING_SERVICE_NAMESPACE
	TracingServiceInstanceID string  // TRACING_SERVICE_INSTANCE_ID: a random UUID when empty
	TracingSamplingRate      float64 // TRACING_SAMPLING_RATE: 1 samples all, 0 none
	TracingExporterProtocol  string  // TRACING_EXPORTER_PROTOCOL: http or grpc; http
	OTLPEndpoint             string  // OTEL_EXPORTER_OTLP_ENDPOINT, as set (for logs; the exporter reads it)

	// This service's own (STRICTRATE_*).

	// FailOpen (STRICTRATE_FAIL_OPEN, false): when Valkey cannot answer (unreachable, an error
	// reply, or no answer within RequestTimeout for a request without a deadline), false
	// answers UNAVAILABLE so that Envoy's failure_mode_deny decides; true admits with OK. A
	// decision cut short by the request's own deadline is never admitted.
	FailOpen bool
	// Batching (STRICTRATE_BATCHING, true): concurrent decisions share one call to Valkey
	// (engine.WithBatching).
	Batching bool
	// ReplicaAck and ReplicaAckTimeout (STRICTRATE_REPLICA_ACK, 0, and
	// STRICTRATE_REPLICA_ACK_TIMEOUT, 0: until the request's deadline): each decision waits
	// until that many replicas hold it (engine.WithReplicaAck).
	ReplicaAck        int
	ReplicaAckTimeout time.Duration
	// DurableAckLocal, DurableAckReplicas and DurableAckTimeout (STRICTRATE_DURABLE_ACK_LOCAL,
	// false; STRICTRATE_DURABLE_ACK_REPLICAS, 0; STRICTRATE_DURABLE_ACK_TIMEOUT, 0: until the
	// request's deadline): each admission waits until it is fsynced by the primary and by that
	// many replicas (engine.WithDurableAck).
	DurableAckLocal    bool
	DurableAckReplicas int
	DurableAckTimeout  time.Duration
	// Calendar (STRICTRATE_CALENDAR, false, in STRICTRATE_CALENDAR_ZONE, UTC) makes the units
	// day, week, month and year calendar periods in this zone; nil keeps sliding windows of
	// the reference's lengths.
	Calendar *time.Location
	// LegacyHeaders (STRICTRATE_LEGACY_HEADERS, false): with LimitResponseHeadersEnabled, the
	// response headers are the reference's trio (HeaderRateLimit*) instead of the IETF
	// RateLimit and RateLimit-Policy fields.
	LegacyHeaders bool
	// SlotsPerWindow (STRICTRATE_SLOTS_PER_WINDOW, 3600) bounds a large rule's memory by
	// keeping its log in that many slots of its window; 0 keeps one entry per request.
	SlotsPerWindow int
	// RequestTimeout (STRICTRATE_REQUEST_TIMEOUT, 1s) is the longest a decision waits for
	// Valkey when the request carries no deadline; its expiry is Valkey's failure, which
	// FailOpen admits on.
	RequestTimeout time.Duration
	// DrainTimeout (STRICTRATE_DRAIN_TIMEOUT, 10s) is how long shutdown lets requests in
	// flight finish.
	DrainTimeout time.Duration
	// RecordOverLimit (STRICTRATE_RECORD_OVER_LIMIT, none) names the rules that record usage
	// reported after the fact, as record_over_limit: true does in a file: a comma-separated
	// list of rules' stats names ("domain.key_value.key", as /rlconfig lists them), each
	// exact or, ending in '*', a prefix (rls.WithRecordOverLimit). For configurations served
	// over xDS, whose rules cannot carry the key.
	RecordOverLimit []string
}

// FromEnv reads the settings through lookup (os.LookupEnv, in the command). It returns a
// warning for every variable of the reference that is set and not honoured (each names its
// variable and says why), and an error, joining one per problem, that wraps ErrInvalid or
// ErrRefused. The Settings are not to be used when the error is not nil; the warnings are
// returned either way.
func FromEnv(lookup func(string) (string, bool)) (Settings, []string, error) {
	r := &reader{lookup: lookup}
	var s Settings
	s.readListeners(r)
	s.readConfigSource(r)
	s.readMetrics(r)
	s.readLimits(r)
	s.readRedis(r)
	s.readTracing(r)
	s.readOwn(r)
	r.refuseUnsupported()
	r.warnIgnored()
	return s, r.warnings, errors.Join(r.errs...)
}

func (s *Settings) readListeners(r *reader) {
	s.Host = r.str("HOST", "0.0.0.0")
	s.Port = r.port("PORT", 8080)
	s.GRPCHost = r.str("GRPC_HOST", "0.0.0.0")
	s.GRPCPort = r.port("GRPC_PORT", 8081)
	s.GRPCUDS = r.str("GRPC_UDS", "")
	s.DebugHost = r.str("DEBUG_HOST", "0.0.0.0")
	s.DebugPort = r.port("DEBUG_PORT", 6070)
	s.GRPCMaxConnectionAge = r.duration("GRPC_MAX_CONNECTION_AGE", 24*time.Hour)
	s.GRPCMaxConnectionAgeGrace = r.duration("GRPC_MAX_CONNECTION_AGE_GRACE", time.Hour)

	s.GRPCServerUseTLS = r.boolean("GRPC_SERVER_USE_TLS", false)
	s.GRPCServerTLSCert = r.str("GRPC_SERVER_TLS_CERT", "")
	s.GRPCServerTLSKey = r.str("GRPC_SERVER_TLS_KEY", "")
	referenceCA, gatewayCA := r.str("GRPC_CLIENT_TLS_CACERT", ""), r.str("GRPC_SERVER_TLS_CA_CERT", "")
	s.GRPCServerTLSCACert = referenceCA
	switch {
	case referenceCA == "":
		s.GRPCServerTLSCACert = gatewayCA
	case gatewayCA != "" && gatewayCA != referenceCA:
		r.invalid("GRPC_CLIENT_TLS_CACERT=%q and GRPC_SERVER_TLS_CA_CERT=%q name two client CAs: set one", referenceCA, gatewayCA)
	}
	s.GRPCClientTLSSAN = r.str("GRPC_CLIENT_TLS_SAN", "")
	if s.GRPCServerUseTLS && (s.GRPCServerTLSCert == "" || s.GRPCServerTLSKey == "") {
		r.invalid("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY")
	}

	s.LogLevel = strings.ToLower(r.str("LOG_LEVEL", "WARN"))
	if _, ok := logLevels[s.LogLevel]; !ok {
		r.invalid("LOG_LEVEL=%q is not one of trace, debug, info, warn, error, fatal, panic", s.LogLevel)
		s.LogLevel = "warn"
	}
	s.LogFormat = strings.ToLower(r.str("LOG_FORMAT", "text"))
	if s.LogFormat != "text" && s.LogFormat != "json" {
		r.warn("LOG_FORMAT=%s is read as text: the formats are text and json", s.LogFormat)
		s.LogFormat = "text"
	}
}

func (s *Settings) readConfigSource(r *reader) {
	s.ConfigType = r.word("CONFIG_TYPE", ConfigFile, ConfigFile, ConfigXDS)
	s.ForceStartWithoutInitialConfig = r.boolean("FORCE_START_WITHOUT_INITIAL_CONFIG", false)
	s.RuntimeRoot = r.str("RUNTIME_ROOT", "/srv/runtime_data/current")
	s.RuntimeSubdirectory = r.str("RUNTIME_SUBDIRECTORY", "")
	s.RuntimeAppDirectory = r.str("RUNTIME_APPDIRECTORY", "config")
	s.RuntimeWatchRoot = r.boolean("RUNTIME_WATCH_ROOT", true)
	s.RuntimeIgnoreDotFiles = r.boolean("RUNTIME_IGNOREDOTFILES", false)

	s.ConfigGRPCXDSNodeID = r.str("CONFIG_GRPC_XDS_NODE_ID", "default")
	s.ConfigGRPCXDSNodeMetadata = nodeMetadata(r)
	s.ConfigGRPCXDSServerURL = r.str("CONFIG_GRPC_XDS_SERVER_URL", "localhost:18000")
	s.ConfigGRPCXDSClientAdditionalHeaders = r.stringMap("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS")
	s.ConfigGRPCXDSServerUseTLS = r.boolean("CONFIG_GRPC_XDS_SERVER_USE_TLS", false)
	s.ConfigGRPCXDSClientTLSCert = r.str("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "")
	s.ConfigGRPCXDSClientTLSKey = r.str("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "")
	s.ConfigGRPCXDSServerTLSCACert = r.str("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "")
	s.ConfigGRPCXDSServerTLSSAN = r.str("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "")
	s.XDSClientBackoffInitialInterval = r.duration("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", 10*time.Second)
	s.XDSClientBackoffMaxInterval = r.duration("XDS_CLIENT_BACKOFF_MAX_INTERVAL", 60*time.Second)
	s.XDSClientMaxMsgSizeInBytes = r.atLeast("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", 0, 0)

	if s.ConfigType == ConfigXDS {
		if s.ConfigGRPCXDSServerURL == "" {
			r.invalid("CONFIG_TYPE=%s needs CONFIG_GRPC_XDS_SERVER_URL", ConfigXDS)
		}
		if s.ConfigGRPCXDSNodeID == "" {
			r.invalid("CONFIG_TYPE=%s needs CONFIG_GRPC_XDS_NODE_ID: the management server keys its configuration by it", ConfigXDS)
		}
	}
	if s.ConfigGRPCXDSServerUseTLS && (s.ConfigGRPCXDSClientTLSCert == "") != (s.ConfigGRPCXDSClientTLSKey == "") {
		r.invalid("CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together: set both or neither")
	}
}

// nodeMetadata reads CONFIG_GRPC_XDS_NODE_METADATA as the reference does: key=value entries
// separated by commas, the value free to hold '='. An entry without '=' is skipped there
// without a word; here it is named in a warning.
func nodeMetadata(r *reader) map[string]string {
	const name = "CONFIG_GRPC_XDS_NODE_METADATA"
	m := map[string]string{}
	v, ok := r.typed(name)
	if !ok {
		return m
	}
	for _, entry := range strings.Split(v, ",") {
		key, value, found := strings.Cut(entry, "=")
		if !found {
			r.warn("%s: the entry %q is ignored: entries are key=value", name, entry)
			continue
		}
		m[key] = value
	}
	return m
}

func (s *Settings) readMetrics(r *reader) {
	s.UsePrometheus = r.boolean("USE_PROMETHEUS", false)
	s.PrometheusAddr = r.str("PROMETHEUS_ADDR", ":9090")
	s.PrometheusPath = r.str("PROMETHEUS_PATH", "/metrics")
	s.DisableStats = r.boolean("DISABLE_STATS", false)
	s.UseStatsd = r.boolean("USE_STATSD", false)
	if s.UsePrometheus && !strings.HasPrefix(s.PrometheusPath, "/") {
		r.invalid("PROMETHEUS_PATH=%q does not start with /", s.PrometheusPath)
	}
}

func (s *Settings) readLimits(r *reader) {
	s.BackendType = strings.ToLower(r.str("BACKEND_TYPE", "redis"))
	switch s.BackendType {
	case "redis", "":
		s.BackendType = "redis"
	case "memcache":
		r.refuse("BACKEND_TYPE=memcache: memcached is not supported; limits are kept in Valkey (BACKEND_TYPE=redis, REDIS_*)")
	default:
		r.invalid("BACKEND_TYPE=%q is not redis", s.BackendType)
	}
	s.CacheKeyPrefix = r.str("CACHE_KEY_PREFIX", "")
	s.LocalCacheSizeInBytes = r.atLeast("LOCAL_CACHE_SIZE_IN_BYTES", 0, 0)
	s.NearLimitRatio = r.float("NEAR_LIMIT_RATIO", 0.8)
	if s.NearLimitRatio < 0 || s.NearLimitRatio > 1 {
		r.invalid("NEAR_LIMIT_RATIO=%g is not between 0 and 1", s.NearLimitRatio)
	}
	s.ShadowMode = r.boolean("SHADOW_MODE", false)
	s.QuotaMode = r.boolean("QUOTA_MODE", false)
	s.ResponseDynamicMetadata = r.boolean("RESPONSE_DYNAMIC_METADATA", false)
	s.MergeDomainConfig = r.boolean("MERGE_DOMAIN_CONFIG", false)
	s.HealthyWithAtLeastOneConfigLoaded = r.boolean("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", false)
	// Both are what this service always does: a denied request is never counted, and
	// /healthcheck always asks Valkey. They are read to check that they parse.
	r.boolean("STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", false)
	r.boolean("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", false)

	s.LimitResponseHeadersEnabled = r.boolean("LIMIT_RESPONSE_HEADERS_ENABLED", false)
	s.LegacyHeaders = r.boolean("STRICTRATE_LEGACY_HEADERS", false)
	s.HeaderRateLimitLimit = r.str("LIMIT_LIMIT_HEADER", "RateLimit-Limit")
	s.HeaderRateLimitRemaining = r.str("LIMIT_REMAINING_HEADER", "RateLimit-Remaining")
	s.HeaderRateLimitReset = r.str("LIMIT_RESET_HEADER", "RateLimit-Reset")
	for _, name := range []string{"LIMIT_LIMIT_HEADER", "LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER"} {
		if v, ok := r.typed(name); ok && s.LimitResponseHeadersEnabled && !s.LegacyHeaders {
			r.warn("%s=%s is ignored: the responses carry the IETF RateLimit and RateLimit-Policy fields; "+
				"STRICTRATE_LEGACY_HEADERS=true sends the reference's trio under these names", name, v)
		}
	}
}

func (s *Settings) readRedis(r *reader) {
	errs := len(r.errs)
	s.RedisSocketType = strings.ToLower(r.str("REDIS_SOCKET_TYPE", "unix"))
	switch s.RedisSocketType {
	case "tcp", "tcp4", "tcp6", "unix":
	default:
		r.invalid("REDIS_SOCKET_TYPE=%q is not tcp or unix", s.RedisSocketType)
	}
	s.RedisType = r.word("REDIS_TYPE", RedisSingle, RedisSingle, RedisCluster, RedisSentinel)
	s.RedisURL = r.str("REDIS_URL", "/var/run/nutcracker/ratelimit.sock")
	s.RedisAuth = r.str("REDIS_AUTH", "")
	s.RedisSentinelAuth = r.str("REDIS_SENTINEL_AUTH", "")
	s.RedisUseTLS = r.boolean("REDIS_TLS", false)
	s.RedisTLSClientCert = r.str("REDIS_TLS_CLIENT_CERT", "")
	s.RedisTLSClientKey = r.str("REDIS_TLS_CLIENT_KEY", "")
	s.RedisTLSCACert = r.str("REDIS_TLS_CACERT", "")
	s.RedisTLSSkipHostnameVerification = r.boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", false)
	s.RedisPipelineWindow = r.duration("REDIS_PIPELINE_WINDOW", 0)
	s.RedisTimeout = r.duration("REDIS_TIMEOUT", 10*time.Second)
	s.RedisStartupInitialInterval = r.duration("REDIS_STARTUP_INITIAL_INTERVAL", time.Second)
	s.RedisStartupMaxInterval = r.duration("REDIS_STARTUP_MAX_INTERVAL", 30*time.Second)
	s.RedisStartupMaxElapsedTime = r.duration("REDIS_STARTUP_MAX_ELAPSED_TIME", 30*time.Second)
	if s.RedisStartupInitialInterval <= 0 || s.RedisStartupMaxInterval < s.RedisStartupInitialInterval {
		r.invalid("REDIS_STARTUP_INITIAL_INTERVAL=%s and REDIS_STARTUP_MAX_INTERVAL=%s: the first wait must be above 0 and the longest at least as long",
			s.RedisStartupInitialInterval, s.RedisStartupMaxInterval)
	}
	if s.RedisStartupMaxElapsedTime < 0 {
		r.invalid("REDIS_STARTUP_MAX_ELAPSED_TIME=%s is negative (0 tries until Valkey answers)", s.RedisStartupMaxElapsedTime)
	}

	if s.RedisUseTLS && (s.RedisTLSClientCert == "") != (s.RedisTLSClientKey == "") {
		r.invalid("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together: set both or neither")
	}
	if len(r.errs) > errs {
		return // the target depends on the values above
	}
	_, warnings, err := s.redisTarget(r.isSet("REDIS_SOCKET_TYPE"))
	r.warnings = append(r.warnings, warnings...)
	if err != nil {
		r.errs = append(r.errs, err)
	}
}

func (s *Settings) readTracing(r *reader) {
	s.TracingEnabled = r.boolean("TRACING_ENABLED", false)
	s.TracingServiceName = r.str("TRACING_SERVICE_NAME", "RateLimit")
	s.TracingServiceNamespace = r.str("TRACING_SERVICE_NAMESPACE", "")
	s.TracingServiceInstanceID = r.str("TRACING_SERVICE_INSTANCE_ID", "")
	s.TracingSamplingRate = r.float("TRACING_SAMPLING_RATE", 1)
	s.TracingExporterProtocol = strings.ToLower(r.str("TRACING_EXPORTER_PROTOCOL", "http"))
	switch s.TracingExporterProtocol {
	case "http", "grpc":
	case "":
		s.TracingExporterProtocol = "http"
	default:
		r.invalid("TRACING_EXPORTER_PROTOCOL=%q is not http or grpc", s.TracingExporterProtocol)
	}
	s.OTLPEndpoint = r.str("OTEL_EXPORTER_OTLP_ENDPOINT", "")
}

func (s *Settings) readOwn(r *reader) {
	s.FailOpen = r.boolean("STRICTRATE_FAIL_OPEN", false)
	s.Batching = r.boolean("STRICTRATE_BATCHING", true)
	// STRICTRATE_WRITE_LAYOUT chose the layout of the logs an earlier release wrote. This one
	// writes one layout; a deployment that still sets the variable (to anything, even the empty
	// string) expects a choice it no longer has, and is told so before Valkey is dialled.
	if _, ok := r.get("STRICTRATE_WRITE_LAYOUT"); ok {
		r.invalid("STRICTRATE_WRITE_LAYOUT is no longer a setting: this release writes one layout; unset it")
	}
	s.ReplicaAck = r.atLeast("STRICTRATE_REPLICA_ACK", 0, 0)
	s.ReplicaAckTimeout = r.duration("STRICTRATE_REPLICA_ACK_TIMEOUT", 0)
	s.DurableAckLocal = r.boolean("STRICTRATE_DURABLE_ACK_LOCAL", false)
	s.DurableAckReplicas = r.atLeast("STRICTRATE_DURABLE_ACK_REPLICAS", 0, 0)
	s.DurableAckTimeout = r.duration("STRICTRATE_DURABLE_ACK_TIMEOUT", 0)
	if r.boolean("STRICTRATE_CALENDAR", false) {
		s.Calendar = r.location("STRICTRATE_CALENDAR_ZONE", "UTC")
	} else if v, ok := r.typed("STRICTRATE_CALENDAR_ZONE"); ok {
		r.warn("STRICTRATE_CALENDAR_ZONE=%s is ignored without STRICTRATE_CALENDAR=true", v)
	}
	s.SlotsPerWindow = r.atLeast("STRICTRATE_SLOTS_PER_WINDOW", 3600, 0)
	s.RequestTimeout = r.duration("STRICTRATE_REQUEST_TIMEOUT", time.Second)
	if s.RequestTimeout == 0 {
		r.invalid("STRICTRATE_REQUEST_TIMEOUT=0: a decision must have a deadline")
	}
	s.DrainTimeout = r.duration("STRICTRATE_DRAIN_TIMEOUT", 10*time.Second)
	s.RecordOverLimit = r.list("STRICTRATE_RECORD_OVER_LIMIT")
}

// ConfigDir is the directory of the configuration files:
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY.
func (s Settings) ConfigDir() string {
	return filepath.Join(s.RuntimeRoot, s.RuntimeSubdirectory, s.RuntimeAppDirectory)
}

// HTTPAddr is the HTTP listener's address, HOST:PORT.
func (s Settings) HTTPAddr() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// GRPCAddr is the gRPC listener's address, GRPC_HOST:GRPC_PORT (unless GRPCUDS is set).
func (s Settings) GRPCAddr() string { return net.JoinHostPort(s.GRPCHost, strconv.Itoa(s.GRPCPort)) }

// DebugAddr is the debug listener's address, DEBUG_HOST:DEBUG_PORT.
func (s Settings) DebugAddr() string { return net.JoinHostPort(s.DebugHost, strconv.Itoa(s.DebugPort)) }

// logLevels maps the reference's levels (logrus's names) to slog's.
var logLevels = map[string]slog.Level{
	"trace":   slog.LevelDebug - 4,
	"debug":   slog.LevelDebug,
	"info":    slog.LevelInfo,
	"warn":    slog.LevelWarn,
	"warning": slog.LevelWarn,
	"error":   slog.LevelError,
	"fatal":   slog.LevelError,
	"panic":   slog.LevelError,
}

// SlogLevel is LOG_LEVEL as a log/slog level: trace is below debug, fatal and panic are
// error.
func (s Settings) SlogLevel() slog.Level { return logLevels[s.LogLevel] }
