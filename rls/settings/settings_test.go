package settings

import (
	"crypto/tls"
	"errors"
	"log/slog"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// env is a lookup over name, value pairs.
func env(kv ...string) func(string) (string, bool) {
	m := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(name string) (string, bool) {
		v, ok := m[name]
		return v, ok
	}
}

func TestDefaults(t *testing.T) {
	s, warnings, err := FromEnv(env())
	if err != nil || len(warnings) != 0 {
		t.Fatalf("FromEnv of an empty environment: %v, warnings %q", err, warnings)
	}
	want := Settings{
		Host: "0.0.0.0", Port: 8080, GRPCHost: "0.0.0.0", GRPCPort: 8081, DebugHost: "0.0.0.0", DebugPort: 6070,
		GRPCMaxConnectionAge: 24 * time.Hour, GRPCMaxConnectionAgeGrace: time.Hour,
		LogLevel: "warn", LogFormat: "text",
		ConfigType: ConfigFile, RuntimeRoot: "/srv/runtime_data/current", RuntimeAppDirectory: "config", RuntimeWatchRoot: true,
		ConfigGRPCXDSNodeID: "default", ConfigGRPCXDSNodeMetadata: map[string]string{}, ConfigGRPCXDSServerURL: "localhost:18000",
		ConfigGRPCXDSClientAdditionalHeaders: map[string]string{},
		XDSClientBackoffInitialInterval:      10 * time.Second, XDSClientBackoffMaxInterval: time.Minute,
		PrometheusAddr: ":9090", PrometheusPath: "/metrics",
		BackendType: "redis", NearLimitRatio: 0.8,
		HeaderRateLimitLimit: "RateLimit-Limit", HeaderRateLimitRemaining: "RateLimit-Remaining", HeaderRateLimitReset: "RateLimit-Reset",
		RedisSocketType: "unix", RedisType: RedisSingle, RedisURL: "/var/run/nutcracker/ratelimit.sock", RedisTimeout: 10 * time.Second,
		RedisStartupInitialInterval: time.Second, RedisStartupMaxInterval: 30 * time.Second, RedisStartupMaxElapsedTime: 30 * time.Second,
		TracingServiceName: "RateLimit", TracingSamplingRate: 1, TracingExporterProtocol: "http",
		Batching: true, SlotsPerWindow: 3600, RequestTimeout: time.Second, DrainTimeout: 10 * time.Second,
	}
	if !reflect.DeepEqual(s, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", s, want)
	}
	if got := s.ConfigDir(); got != "/srv/runtime_data/current/config" {
		t.Errorf("ConfigDir() = %q", got)
	}
	if s.HTTPAddr() != "0.0.0.0:8080" || s.GRPCAddr() != "0.0.0.0:8081" || s.DebugAddr() != "0.0.0.0:6070" {
		t.Errorf("addresses %s %s %s", s.HTTPAddr(), s.GRPCAddr(), s.DebugAddr())
	}
	if s.SlogLevel() != slog.LevelWarn {
		t.Errorf("SlogLevel() = %v, want WARN", s.SlogLevel())
	}
}

// envoyGateway is the environment Envoy Gateway gives the rate limit deployment
// (internal/infrastructure/kubernetes/ratelimit/resource.go), with Redis over TLS, Prometheus
// and tracing turned on, the certificate paths replaced by files of the test's own.
func envoyGateway(c serverCerts, redisCert, redisKey string, prometheus bool) []string {
	kv := []string{
		"RUNTIME_ROOT", "/data",
		"RUNTIME_SUBDIRECTORY", "ratelimit",
		"RUNTIME_IGNOREDOTFILES", "true",
		"RUNTIME_WATCH_ROOT", "false",
		"LOG_LEVEL", "info",
		"USE_STATSD", "false",
		"CONFIG_TYPE", "GRPC_XDS_SOTW",
		"CONFIG_GRPC_XDS_SERVER_URL", "envoy-gateway:18001",
		"CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit",
		"GRPC_SERVER_USE_TLS", "true",
		"GRPC_SERVER_TLS_CERT", c.serverCert,
		"GRPC_SERVER_TLS_KEY", c.serverKey,
		"GRPC_SERVER_TLS_CA_CERT", c.ca.file,
		"CONFIG_GRPC_XDS_SERVER_USE_TLS", "true",
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT", c.serverCert,
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY", c.serverKey,
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", c.ca.file,
		"FORCE_START_WITHOUT_INITIAL_CONFIG", "true",
		"REDIS_SOCKET_TYPE", "tcp",
		"REDIS_URL", "redis.redis-system.svc.cluster.local:6379",
		"REDIS_TLS", "true",
		"REDIS_TLS_CLIENT_CERT", redisCert,
		"REDIS_TLS_CLIENT_KEY", redisKey,
		"TRACING_ENABLED", "true",
		"TRACING_SERVICE_NAME", "envoy-ratelimit",
		"TRACING_SERVICE_NAMESPACE", "envoy-gateway-system",
		"TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-5d8f7c9b4-x2x7q",
		"TRACING_SAMPLING_RATE", "0.5",
		"OTEL_EXPORTER_OTLP_ENDPOINT", "http://otel-collector.monitoring.svc.cluster.local:4318",
	}
	if prometheus {
		kv = append(kv, "USE_PROMETHEUS", "true", "PROMETHEUS_ADDR", ":19001",
			"PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml")
	}
	return kv
}

func TestEnvoyGatewayDeployment(t *testing.T) {
	// Envoy Gateway's certgen issues every certificate from one CA, without extended key
	// Usages: the same files serve the gRPC server, the xDS client and Envoy's client side.
	ca := newTestCA(t, "envoy-gateway")
	serverCert, serverKey := ca.issue(t, leaf{CN: "*", DNS: []string{"*.envoy-gateway-system", "localhost"}})
	envoyCert, envoyKey := ca.issue(t, leaf{CN: "*", DNS: []string{"*.envoy-gateway-system"}})
	redisCert, redisKey := ca.issue(t, leaf{CN: "redis-client"})
	c := serverCerts{ca: ca, serverCert: serverCert, serverKey: serverKey}

	s, warnings, err := FromEnv(env(envoyGateway(c, redisCert, redisKey, false)...))
	if err != nil {
		t.Fatalf("Envoy Gateway's environment: %v", err)
	}
	if len(warnings) != 0 {
		t.Errorf("Envoy Gateway's environment drew warnings: %q", warnings)
	}
	if s.ConfigType != ConfigXDS || s.ConfigGRPCXDSNodeID != "envoy-ratelimit" || s.ConfigGRPCXDSServerURL != "envoy-gateway:18001" ||
		!s.ForceStartWithoutInitialConfig || s.GRPCServerTLSCACert != ca.file || s.RedisSocketType != "tcp" ||
		!s.RedisUseTLS || s.SlogLevel() != slog.LevelInfo || s.ConfigDir() != "/data/ratelimit/config" ||
		!s.TracingEnabled || s.TracingSamplingRate != 0.5 || s.TracingServiceInstanceID == "" || s.OTLPEndpoint == "" {
		t.Errorf("Envoy Gateway's environment read as %+v", s)
	}

	// Envoy presents its own certificate of the same CA to the gRPC server.
	serverCfg, err := s.ServerTLS()
	if err != nil {
		t.Fatal(err)
	}
	envoy := &tls.Config{RootCAs: ca.pool(), ServerName: "envoy-ratelimit.envoy-gateway-system",
		Certificates: []tls.Certificate{keyPairOf(t, envoyCert, envoyKey)}}
	if res := handshake(t, serverCfg, envoy); res.serverErr != nil || res.clientErr != nil {
		t.Errorf("Envoy to the rate limit service: server %v, client %v", res.serverErr, res.clientErr)
	}

	// The xDS client presents the rate limit's certificate to Envoy Gateway's xDS server,
	// which requires one of the CA.
	xdsCfg, err := s.XDSClientTLS()
	if err != nil {
		t.Fatal(err)
	}
	xdsCfg = xdsCfg.Clone()
	xdsCfg.ServerName = "envoy-gateway.envoy-gateway-system" // gRPC takes the address's host
	gateway := &tls.Config{Certificates: []tls.Certificate{keyPairOf(t, serverCert, serverKey)},
		ClientCAs: ca.pool(), ClientAuth: tls.RequireAndVerifyClientCert}
	if res := handshake(t, gateway, xdsCfg); res.serverErr != nil || res.clientErr != nil {
		t.Errorf("the xDS client to Envoy Gateway: server %v, client %v", res.serverErr, res.clientErr)
	}

	opt, err := s.ValkeyOption()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(opt.InitAddress, []string{"redis.redis-system.svc.cluster.local:6379"}) || opt.TLSConfig == nil || !opt.ForceSingleClient {
		t.Errorf("Valkey option %+v", opt)
	}

	// With Prometheus on, Envoy Gateway also sets PROMETHEUS_MAPPER_YAML, a statsd-exporter
	// mapping this service has no use for: the one warning of its deployment.
	s, warnings, err = FromEnv(env(envoyGateway(c, redisCert, redisKey, true)...))
	if err != nil {
		t.Fatal(err)
	}
	if !s.UsePrometheus || s.PrometheusAddr != ":19001" || s.PrometheusPath != "/metrics" {
		t.Errorf("Prometheus read as %v %q %q", s.UsePrometheus, s.PrometheusAddr, s.PrometheusPath)
	}
	if len(warnings) != 1 || !strings.HasPrefix(warnings[0], "PROMETHEUS_MAPPER_YAML=/etc/statsd-exporter/conf.yaml is ignored") {
		t.Errorf("warnings %q, want PROMETHEUS_MAPPER_YAML's alone", warnings)
	}
}

func TestRefused(t *testing.T) {
	for _, tc := range []struct{ name, value string }{
		{"REDIS_PERSECOND", "true"},
		{"BACKEND_TYPE", "memcache"},
	} {
		_, _, err := FromEnv(env(tc.name, tc.value))
		if !errors.Is(err, ErrRefused) {
			t.Errorf("%s=%s: error %v, want ErrRefused", tc.name, tc.value, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.name) {
			t.Errorf("%s=%s: %q does not name the variable", tc.name, tc.value, err)
		}
	}
	// Off, they are what the service does anyway.
	if _, warnings, err := FromEnv(env("REDIS_PERSECOND", "false", "BACKEND_TYPE", "redis")); err != nil || len(warnings) != 0 {
		t.Errorf("the refused settings turned off: %v, %q", err, warnings)
	}
}

// QUOTA_MODE, refused before quota mode was implemented, now turns it on.
func TestQuotaMode(t *testing.T) {
	for value, want := range map[string]bool{"true": true, "false": false, "": false} {
		s, _, err := FromEnv(env("QUOTA_MODE", value))
		if err != nil || s.QuotaMode != want {
			t.Errorf("QUOTA_MODE=%q: %v, %v; want %v", value, s.QuotaMode, err, want)
		}
	}
}

// RESPONSE_DYNAMIC_METADATA, ignored with a warning before dynamic metadata was implemented,
// now turns it on, without a warning.
func TestResponseDynamicMetadata(t *testing.T) {
	for value, want := range map[string]bool{"true": true, "1": true, "false": false, "": false} {
		s, warnings, err := FromEnv(env("RESPONSE_DYNAMIC_METADATA", value))
		if err != nil || s.ResponseDynamicMetadata != want || len(warnings) != 0 {
			t.Errorf("RESPONSE_DYNAMIC_METADATA=%q: %v, %v, %q; want %v and no warning", value, s.ResponseDynamicMetadata, err, warnings, want)
		}
	}
	if _, _, err := FromEnv(env("RESPONSE_DYNAMIC_METADATA", "sometimes")); !errors.Is(err, ErrInvalid) {
		t.Errorf("RESPONSE_DYNAMIC_METADATA=sometimes: %v, want an error wrapping ErrInvalid", err)
	}
}

// The start's retries of an unreachable Valkey: the reference's newer settings, with a
// bounded total by default.
func TestRedisStartup(t *testing.T) {
	s := mustSettings(t)
	if s.RedisStartupInitialInterval != time.Second || s.RedisStartupMaxInterval != 30*time.Second || s.RedisStartupMaxElapsedTime != 30*time.Second {
		t.Errorf("defaults %v %v %v, want 1s 30s 30s", s.RedisStartupInitialInterval, s.RedisStartupMaxInterval, s.RedisStartupMaxElapsedTime)
	}
	if s := mustSettings(t, "REDIS_STARTUP_MAX_ELAPSED_TIME", "0"); s.RedisStartupMaxElapsedTime != 0 {
		t.Errorf("REDIS_STARTUP_MAX_ELAPSED_TIME=0 read as %v", s.RedisStartupMaxElapsedTime)
	}
	for _, kv := range [][]string{
		{"REDIS_STARTUP_INITIAL_INTERVAL", "0s"},
		{"REDIS_STARTUP_INITIAL_INTERVAL", "1m"}, // above the longest wait
		{"REDIS_STARTUP_MAX_ELAPSED_TIME", "-1s"},
	} {
		if _, _, err := FromEnv(env(kv...)); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), kv[0]) {
			t.Errorf("%s=%s: %v, want ErrInvalid naming it", kv[0], kv[1], err)
		}
	}
}

func TestInvalid(t *testing.T) {
	for _, kv := range [][]string{
		{"PORT", "http"},
		{"GRPC_PORT", "70000"},
		{"DEBUG_PORT", "-1"},
		{"GRPC_SERVER_USE_TLS", "yes please"},
		{"GRPC_SERVER_USE_TLS", "true"}, // without its certificate
		{"GRPC_CLIENT_TLS_CACERT", "/a/ca.crt", "GRPC_SERVER_TLS_CA_CERT", "/b/ca.crt"},
		{"GRPC_MAX_CONNECTION_AGE", "a day"},
		{"LOG_LEVEL", "loud"},
		{"CONFIG_TYPE", "REST"},
		{"CONFIG_TYPE", "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_SERVER_URL", ""},
		{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-tenant"},
		{"CONFIG_GRPC_XDS_SERVER_USE_TLS", "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "/certs/tls.crt"},
		{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "-4"},
		{"PROMETHEUS_PATH", "metrics", "USE_PROMETHEUS", "true"},
		{"BACKEND_TYPE", "dynamodb"},
		{"LOCAL_CACHE_SIZE_IN_BYTES", "-1"},
		{"NEAR_LIMIT_RATIO", "1.5"},
		{"NEAR_LIMIT_RATIO", "NaN"},
		{"REDIS_SOCKET_TYPE", "udp"},
		{"REDIS_TYPE", "RING"},
		{"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", ""},
		{"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "valkey-0:6379,valkey-1:6379"},
		{"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "valkey"},
		{"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "rediss://valkey:6379"},
		{"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "redis://valkey:6379/zero"},
		{"REDIS_SOCKET_TYPE", "tcp", "REDIS_TYPE", "CLUSTER", "REDIS_URL", "a:1,,b:2"},
		{"REDIS_SOCKET_TYPE", "tcp", "REDIS_TYPE", "CLUSTER", "REDIS_URL", "redis://u:p@a:1,redis://u:q@b:2"},
		{"REDIS_TYPE", "SENTINEL", "REDIS_URL", "sentinel-0:26379"},
		{"REDIS_URL", "redis://valkey:6379"}, // a URL for a unix socket
		{"REDIS_TLS", "true", "REDIS_TLS_CLIENT_KEY", "/k"},
		{"REDIS_TIMEOUT", "-1s"},
		{"TRACING_EXPORTER_PROTOCOL", "zipkin"},
		{"TRACING_SAMPLING_RATE", "half"},
		{"STRICTRATE_CALENDAR", "true", "STRICTRATE_CALENDAR_ZONE", "Mars/Olympus_Mons"},
		{"STRICTRATE_DURABLE_ACK_LOCAL", "2"},
		{"STRICTRATE_DURABLE_ACK_REPLICAS", "-1"},
		{"STRICTRATE_REPLICA_ACK_TIMEOUT", "soon"},
		{"STRICTRATE_REQUEST_TIMEOUT", "0s"},
		{"STRICTRATE_SLOTS_PER_WINDOW", "-5"},
	} {
		_, _, err := FromEnv(env(kv...))
		if !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: error %v, want ErrInvalid", kv, err)
			continue
		}
		if !strings.Contains(err.Error(), kv[0]) && !strings.Contains(err.Error(), kv[len(kv)-2]) {
			t.Errorf("%q: %q names neither variable", kv, err)
		}
	}
}

// TestWriteLayoutIsNoLongerASetting: STRICTRATE_WRITE_LAYOUT chose the layout an earlier
// release wrote; this one writes one, so the variable set to anything (an earlier default, a
// layout that was never written, the empty string) stops the start, saying to unset it.
func TestWriteLayoutIsNoLongerASetting(t *testing.T) {
	const want = "STRICTRATE_WRITE_LAYOUT is no longer a setting: this release writes one layout; unset it"
	for _, value := range []string{"5", "3", "2", "4", "v5", ""} {
		_, _, err := FromEnv(env("STRICTRATE_WRITE_LAYOUT", value))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), want) {
			t.Errorf("STRICTRATE_WRITE_LAYOUT=%q: error %v, want ErrInvalid saying %q", value, err, want)
		}
	}
	if _, _, err := FromEnv(env()); err != nil {
		t.Errorf("STRICTRATE_WRITE_LAYOUT unset: %v", err)
	}
}

func TestErrorsAreJoinedAndSecretsKept(t *testing.T) {
	_, _, err := FromEnv(env("PORT", "x", "GRPC_PORT", "y", "REDIS_PERSECOND", "true",
		"REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "redis://admin:hunter2@valkey"))
	for _, want := range []error{ErrInvalid, ErrRefused} {
		if !errors.Is(err, want) {
			t.Errorf("%v does not wrap %v", err, want)
		}
	}
	for _, want := range []string{"PORT=", "GRPC_PORT=", "REDIS_PERSECOND", "REDIS_URL"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%v does not name %s", err, want)
		}
	}
	if err != nil && strings.Contains(err.Error(), "hunter2") {
		t.Errorf("the error shows REDIS_URL's password: %v", err)
	}
}

func TestWarnings(t *testing.T) {
	for _, tc := range []struct {
		kv   []string
		name string // the variable the one warning must name
	}{
		{[]string{"USE_STATSD", "true"}, "USE_STATSD"},
		{[]string{"USE_DOG_STATSD", "true"}, "USE_DOG_STATSD"},
		{[]string{"STATSD_HOST", "statsd.monitoring"}, "STATSD_HOST"},
		{[]string{"STATSD_PORT", "9125"}, "STATSD_PORT"},
		{[]string{"EXTRA_TAGS", "team:edge"}, "EXTRA_TAGS"},
		{[]string{"STATS_FLUSH_INTERVAL", "1s"}, "STATS_FLUSH_INTERVAL"},
		{[]string{"PROMETHEUS_MAPPER_YAML", "/etc/mapper.yaml"}, "PROMETHEUS_MAPPER_YAML"},
		{[]string{"REDIS_POOL_SIZE", "64"}, "REDIS_POOL_SIZE"},
		{[]string{"REDIS_PIPELINE_LIMIT", "8"}, "REDIS_PIPELINE_LIMIT"},
		{[]string{"REDIS_POOL_ON_EMPTY_BEHAVIOR", "ERROR"}, "REDIS_POOL_ON_EMPTY_BEHAVIOR"},
		{[]string{"REDIS_PERSECOND_URL", "valkey-ps:6379"}, "REDIS_PERSECOND_URL"},
		{[]string{"EXPIRATION_JITTER_MAX_SECONDS", "60"}, "EXPIRATION_JITTER_MAX_SECONDS"},
		{[]string{"MEMCACHE_HOST_PORT", "memcached:11211"}, "MEMCACHE_HOST_PORT"},
		{[]string{"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "1s"}, "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL"},
		{[]string{"XDS_CLIENT_BACKOFF_JITTER", "false"}, "XDS_CLIENT_BACKOFF_JITTER"},
		{[]string{"CONFIG_GRPC_XDS_NODE_METADATA", "cluster=edge,zone:eu"}, "CONFIG_GRPC_XDS_NODE_METADATA"},
		{[]string{"LOG_FORMAT", "logfmt"}, "LOG_FORMAT"},
		{[]string{"LIMIT_RESPONSE_HEADERS_ENABLED", "true", "LIMIT_LIMIT_HEADER", "X-RateLimit-Limit"}, "LIMIT_LIMIT_HEADER"},
		{[]string{"REDIS_TYPE", "CLUSTER", "REDIS_SOCKET_TYPE", "unix", "REDIS_URL", "a:1,b:2"}, "REDIS_SOCKET_TYPE"},
		{[]string{"STRICTRATE_CALENDAR_ZONE", "Europe/Paris"}, "STRICTRATE_CALENDAR_ZONE"},
	} {
		_, warnings, err := FromEnv(env(tc.kv...))
		if err != nil {
			t.Errorf("%q: %v", tc.kv, err)
			continue
		}
		if len(warnings) != 1 || !strings.HasPrefix(warnings[0], tc.name) {
			t.Errorf("%q: warnings %q, want one naming %s", tc.kv, warnings, tc.name)
		}
	}

	// Values that ask for nothing draw no warning: the reference's defaults, statsd off.
	quiet := []string{"USE_STATSD", "false", "USE_DOG_STATSD", "false", "STATSD_PORT", "8125", "STATS_FLUSH_INTERVAL", "10s",
		"REDIS_POOL_SIZE", "10", "REDIS_POOL_ON_EMPTY_BEHAVIOR", "wait", "EXPIRATION_JITTER_MAX_SECONDS", "300",
		"XDS_CLIENT_BACKOFF_JITTER", "true", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "0.50", "REDIS_PERSECOND_TIMEOUT", "10s",
		"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "true", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true",
		"LIMIT_LIMIT_HEADER", "X-RateLimit-Limit", // headers off: no header to name
		"PROMETHEUS_MAPPER_YAML", ""}
	if _, warnings, err := FromEnv(env(quiet...)); err != nil || len(warnings) != 0 {
		t.Errorf("values that ask for nothing: %v, warnings %q", err, warnings)
	}

	// A secret's value is never repeated.
	_, warnings, _ := FromEnv(env("REDIS_PERSECOND_AUTH", "hunter2"))
	if len(warnings) != 1 || strings.Contains(warnings[0], "hunter2") {
		t.Errorf("warnings %q", warnings)
	}
}

func TestReadsValues(t *testing.T) {
	s := mustSettings(t,
		"PORT", "9080", "GRPC_UDS", "/run/rls.sock", "GRPC_MAX_CONNECTION_AGE", "10m",
		"LOG_LEVEL", "DEBUG", "LOG_FORMAT", "JSON",
		"RUNTIME_ROOT", "/etc/rls", "RUNTIME_SUBDIRECTORY", "ratelimit", "RUNTIME_APPDIRECTORY", "rules",
		"CONFIG_GRPC_XDS_NODE_METADATA", "cluster=edge,expr=a=b",
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-tenant:edge,authorization:Bearer a:b",
		"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "0x1000000",
		"LOCAL_CACHE_SIZE_IN_BYTES", "1048576", "NEAR_LIMIT_RATIO", "0.9", "SHADOW_MODE", "t",
		"LIMIT_RESPONSE_HEADERS_ENABLED", "true", "STRICTRATE_LEGACY_HEADERS", "true", "LIMIT_RESET_HEADER", "X-RateLimit-Reset",
		"STRICTRATE_FAIL_OPEN", "true", "STRICTRATE_BATCHING", "false",
		"STRICTRATE_REPLICA_ACK", "1", "STRICTRATE_REPLICA_ACK_TIMEOUT", "50ms",
		"STRICTRATE_DURABLE_ACK_LOCAL", "1", "STRICTRATE_DURABLE_ACK_REPLICAS", "1", "STRICTRATE_DURABLE_ACK_TIMEOUT", "100ms",
		"STRICTRATE_CALENDAR", "true", "STRICTRATE_CALENDAR_ZONE", "Europe/Paris",
		"STRICTRATE_SLOTS_PER_WINDOW", "0", "STRICTRATE_REQUEST_TIMEOUT", "250ms", "STRICTRATE_DRAIN_TIMEOUT", "30s",
	)
	if s.Port != 9080 || s.GRPCUDS != "/run/rls.sock" || s.GRPCMaxConnectionAge != 10*time.Minute ||
		s.LogLevel != "debug" || s.SlogLevel() != slog.LevelDebug || s.LogFormat != "json" {
		t.Errorf("listeners and logs: %+v", s)
	}
	if s.ConfigDir() != "/etc/rls/ratelimit/rules" {
		t.Errorf("ConfigDir() = %q", s.ConfigDir())
	}
	if !reflect.DeepEqual(s.ConfigGRPCXDSNodeMetadata, map[string]string{"cluster": "edge", "expr": "a=b"}) ||
		!reflect.DeepEqual(s.ConfigGRPCXDSClientAdditionalHeaders, map[string]string{"x-tenant": "edge", "authorization": "Bearer a:b"}) ||
		s.XDSClientMaxMsgSizeInBytes != 1<<24 {
		t.Errorf("xDS: %v %v %d", s.ConfigGRPCXDSNodeMetadata, s.ConfigGRPCXDSClientAdditionalHeaders, s.XDSClientMaxMsgSizeInBytes)
	}
	if s.LocalCacheSizeInBytes != 1<<20 || s.NearLimitRatio != 0.9 || !s.ShadowMode || !s.LimitResponseHeadersEnabled ||
		!s.LegacyHeaders || s.HeaderRateLimitReset != "X-RateLimit-Reset" || s.HeaderRateLimitLimit != "RateLimit-Limit" {
		t.Errorf("limits: %+v", s)
	}
	if !s.FailOpen || s.Batching || s.ReplicaAck != 1 || s.ReplicaAckTimeout != 50*time.Millisecond ||
		!s.DurableAckLocal || s.DurableAckReplicas != 1 || s.DurableAckTimeout != 100*time.Millisecond ||
		s.Calendar == nil || s.Calendar.String() != "Europe/Paris" || s.SlotsPerWindow != 0 ||
		s.RequestTimeout != 250*time.Millisecond || s.DrainTimeout != 30*time.Second {
		t.Errorf("strictrate's own: %+v", s)
	}
}

// referenceVariables is every variable the reference server reads at the version the
// service follows (src/settings/settings.go, and its statsd library's), and the two of
// Envoy Gateway's deployment it does not.
var referenceVariables = []string{
	"HOST", "PORT", "DEBUG_HOST", "DEBUG_PORT", "GRPC_UDS", "GRPC_HOST", "GRPC_PORT",
	"GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE", "GRPC_SERVER_USE_TLS",
	"GRPC_SERVER_TLS_CERT", "GRPC_SERVER_TLS_KEY", "GRPC_CLIENT_TLS_CACERT", "GRPC_CLIENT_TLS_SAN",
	"LOG_LEVEL", "LOG_FORMAT", "CONFIG_TYPE", "FORCE_START_WITHOUT_INITIAL_CONFIG",
	"CONFIG_GRPC_XDS_NODE_ID", "CONFIG_GRPC_XDS_NODE_METADATA", "CONFIG_GRPC_XDS_SERVER_URL",
	"CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "CONFIG_GRPC_XDS_SERVER_TLS_SAN",
	"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "XDS_CLIENT_BACKOFF_MAX_INTERVAL", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR",
	"XDS_CLIENT_BACKOFF_JITTER", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES",
	"USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS", "USE_STATSD", "STATSD_HOST", "STATSD_PORT", "EXTRA_TAGS",
	"STATS_FLUSH_INTERVAL", "DISABLE_STATS", "USE_PROMETHEUS", "PROMETHEUS_ADDR", "PROMETHEUS_PATH", "PROMETHEUS_MAPPER_YAML",
	"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_IGNOREDOTFILES", "RUNTIME_WATCH_ROOT",
	"EXPIRATION_JITTER_MAX_SECONDS", "LOCAL_CACHE_SIZE_IN_BYTES", "NEAR_LIMIT_RATIO", "CACHE_KEY_PREFIX", "BACKEND_TYPE",
	"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "LIMIT_RESPONSE_HEADERS_ENABLED", "LIMIT_LIMIT_HEADER",
	"LIMIT_REMAINING_HEADER", "LIMIT_RESET_HEADER", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
	"REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_POOL_SIZE", "REDIS_AUTH", "REDIS_TLS",
	"REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
	"REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT", "REDIS_PERSECOND", "REDIS_PERSECOND_SOCKET_TYPE",
	"REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL", "REDIS_PERSECOND_POOL_SIZE", "REDIS_PERSECOND_AUTH",
	"REDIS_PERSECOND_TLS", "REDIS_SENTINEL_AUTH", "REDIS_PERSECOND_SENTINEL_AUTH", "REDIS_PERSECOND_PIPELINE_WINDOW",
	"REDIS_PERSECOND_PIPELINE_LIMIT", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "REDIS_TIMEOUT", "REDIS_PERSECOND_TIMEOUT",
	"REDIS_POOL_ON_EMPTY_BEHAVIOR", "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
	"REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL", "REDIS_STARTUP_MAX_ELAPSED_TIME", // newer
	"MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS",
	"MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
	"SHADOW_MODE", "QUOTA_MODE", "RESPONSE_DYNAMIC_METADATA", "MERGE_DOMAIN_CONFIG",
	"TRACING_ENABLED", "TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID",
	"TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE",
	"STATSD_PROTOCOL", "GOSTATS_FLUSH_INTERVAL_SECONDS", // the reference's statsd library
	"GRPC_SERVER_TLS_CA_CERT", "OTEL_EXPORTER_OTLP_ENDPOINT", // Envoy Gateway's
}

// lookedUp runs FromEnv over lookup and returns every variable it asked for.
func lookedUp(kv ...string) map[string]bool {
	asked := map[string]bool{}
	inner := env(kv...)
	FromEnv(func(name string) (string, bool) {
		asked[name] = true
		return inner(name)
	})
	return asked
}

// TestEveryReferenceVariableIsRead checks that no variable of the reference goes unread, so
// that none is ignored without a word.
func TestEveryReferenceVariableIsRead(t *testing.T) {
	asked := lookedUp("REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "valkey:6379", "STRICTRATE_CALENDAR", "true")
	for _, name := range referenceVariables {
		if !asked[name] {
			t.Errorf("FromEnv never reads %s", name)
		}
	}
}

// TestDocumentedVariables checks that docs/rls-settings.md has a row for every variable
// FromEnv reads, and that its column says what FromEnv does with it.
func TestDocumentedVariables(t *testing.T) {
	doc, err := os.ReadFile("../../docs/rls-settings.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, m := range regexp.MustCompile("(?m)^\\| `([A-Z0-9_]+)` \\|(.*)$").FindAllStringSubmatch(string(doc), -1) {
		if _, dup := rows[m[1]]; dup {
			t.Errorf("%s has two rows", m[1])
		}
		rows[m[1]] = m[2]
	}
	asked := lookedUp("REDIS_SOCKET_TYPE", "tcp", "REDIS_URL", "valkey:6379", "STRICTRATE_CALENDAR", "true")
	for name := range asked {
		if _, ok := rows[name]; !ok {
			t.Errorf("docs/rls-settings.md has no row for %s", name)
		}
	}
	for name := range rows {
		if !asked[name] {
			t.Errorf("docs/rls-settings.md documents %s, which FromEnv never reads", name)
		}
	}
	for _, v := range ignoredVariables {
		if row := rows[v.name]; !strings.Contains(row, "| ignored, warns |") {
			t.Errorf("%s's row does not say it is ignored with a warning: %s", v.name, row)
		}
	}
	for _, name := range []string{"REDIS_PERSECOND"} {
		if row := rows[name]; !strings.Contains(row, "| refused |") {
			t.Errorf("%s's row does not say it is refused: %s", name, row)
		}
	}
}

// STRICTRATE_RECORD_OVER_LIMIT is a comma-separated list of rules' stats names, each trimmed,
// an empty item left out; unset or empty, none.
func TestRecordOverLimitNames(t *testing.T) {
	for _, tc := range []struct {
		value string
		want  []string
	}{
		{"", nil},
		{" , ", nil},
		{"ai.tokens", []string{"ai.tokens"}},
		{"ai.tokens, default/eg/http.httproute/default/llm/*,", []string{"ai.tokens", "default/eg/http.httproute/default/llm/*"}},
	} {
		s := mustSettings(t, "STRICTRATE_RECORD_OVER_LIMIT", tc.value)
		if !reflect.DeepEqual(s.RecordOverLimit, tc.want) {
			t.Errorf("STRICTRATE_RECORD_OVER_LIMIT=%q: %q, want %q", tc.value, s.RecordOverLimit, tc.want)
		}
	}
}
