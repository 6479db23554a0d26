package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valkey-io/valkey-go"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"

	"github.com/strictrate/strictrate/engine"
	"github.com/strictrate/strictrate/rls"
	"github.com/strictrate/strictrate/rls/config"
	"github.com/strictrate/strictrate/rls/settings"
	"github.com/strictrate/strictrate/rls/xds"
)

// denyCacheEntryBytes is what one entry of the engine's deny cache is counted as when
// LOCAL_CACHE_SIZE_IN_BYTES is turned into a number of entries.
const denyCacheEntryBytes = 256

// lifecycle is the level of the few lines that say what the process as a whole does: where
// it serves, with which configuration and Valkey; a configuration loaded later; the drain
// that SIGTERM starts; the exit. They must be seen without asking, and LOG_LEVEL's default is
// warn, as the reference's is (and stays so: a deployment of the reference that sets nothing
// must log as it did), so they are logged at warn rather than info, where they would be
// hidden by default. The reference logs its own "Listening for ... on" lines at warn for the
// same reason. There are a handful per process, none per request; LOG_LEVEL=error still
// silences them.
const lifecycle = slog.LevelWarn

// healthInterval is how often the gRPC health service's status is brought up to date.
const healthInterval = time.Second

// run is the command: it reads the settings from lookup, serves until ctx ends, then drains.
// Its log goes to logw.
func run(ctx context.Context, lookup func(string) (string, bool), logw io.Writer) error {
	s, warnings, err := settings.FromEnv(lookup)
	logger := newLogger(s.SlogLevel(), s.LogFormat, logw)
	for _, w := range warnings {
		logger.Warn(w)
	}
	if err != nil {
		return err // it starts with "settings:" and names every variable at fault
	}

	client, valkeyAddrs, err := connect(ctx, s, logger)
	if err != nil {
		return err
	}
	defer client.Close()

	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// The engine's metrics go to the Prometheus registry; under DISABLE_STATS, which serves
	// none, they are not recorded at all.
	var meters metric.MeterProvider = noop.NewMeterProvider()
	if !s.DisableStats {
		exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
		if err != nil {
			return fmt.Errorf("metrics exporter: %w", err)
		}
		sdk := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
		defer sdk.Shutdown(context.Background())
		meters = sdk
	}

	tracer, shutdownTracing, err := setupTracing(ctx, s, logger)
	if err != nil {
		return err
	}
	defer shutdownTracing()

	e, err := engine.New(client, engineOptions(s, logger, meters)...)
	if err != nil {
		return fmt.Errorf("rate limit engine: %w", err)
	}
	svc := rls.New(e, append(serviceOptions(s, logger, registry, client), rls.WithTracerProvider(tracer))...)

	if err := loadConfig(ctx, s, svc, logger); err != nil {
		return err
	}
	return serve(ctx, s, svc, registry, logger, valkeyAddrs)
}

// connect makes the Valkey client. Credentials the server refuses are a configuration error:
// the start stops at once, naming them. A server that cannot be reached is tried again (a
// service started before its storage waits for it), the wait doubling from
// REDIS_STARTUP_INITIAL_INTERVAL up to REDIS_STARTUP_MAX_INTERVAL, for at most
// REDIS_STARTUP_MAX_ELAPSED_TIME (0: until it answers), after which the start stops, naming
// the address; no port is open meanwhile. It returns the client and the addresses it was
// given, joined by commas, for the log.
func connect(ctx context.Context, s settings.Settings, logger *slog.Logger) (valkey.Client, string, error) {
	opt, err := s.ValkeyOption()
	if err != nil {
		return nil, "", fmt.Errorf("valkey: %w", err)
	}
	addrs := strings.Join(opt.InitAddress, ",")
	tries := ctx
	if s.RedisStartupMaxElapsedTime > 0 {
		var cancel context.CancelFunc
		tries, cancel = context.WithTimeout(ctx, s.RedisStartupMaxElapsedTime)
		defer cancel()
	}
	var lastErr error // the last answer of the server, or of the network, for the message
	for wait := s.RedisStartupInitialInterval; ; wait = min(2*wait, s.RedisStartupMaxInterval) {
		client, err := dialValkey(tries, opt)
		switch {
		case err == nil:
			return client, addrs, nil
		case ctx.Err() != nil:
			return nil, "", ctx.Err()
		case credentialsRefused(err):
			return nil, "", fmt.Errorf("valkey at %s refuses the credentials (REDIS_AUTH, or REDIS_URL's user and password): %w", addrs, err)
		case tries.Err() == nil || lastErr == nil: // not the deadline's own error after a real one
			lastErr = err
		}
		if tries.Err() == nil {
			logger.Warn("valkey unreachable; retrying", "addr", addrs, "err", err, "retry_in", wait)
			select {
			case <-tries.Done():
			case <-time.After(wait):
				continue
			}
		}
		if ctx.Err() != nil {
			return nil, "", ctx.Err()
		}
		return nil, "", fmt.Errorf("valkey at %s (REDIS_URL) unreachable for %s (REDIS_STARTUP_MAX_ELAPSED_TIME): %w", addrs, s.RedisStartupMaxElapsedTime, lastErr)
	}
}

// dialValkey is valkey.NewClient, given up on when ctx ends first, its error then ctx's
// (a client that comes later is closed).
func dialValkey(ctx context.Context, opt valkey.ClientOption) (valkey.Client, error) {
	type dialed struct {
		client valkey.Client
		err    error
	}
	done := make(chan dialed, 1)
	go func() {
		client, err := valkey.NewClient(opt)
		if err != nil && client != nil {
			client.Close()
			client = nil
		}
		done <- dialed{client, err}
	}()
	select {
	case d := <-done:
		return d.client, d.err
	case <-ctx.Done():
		go func() {
			if d := <-done; d.client != nil {
				d.client.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

// credentialsRefused reports whether err is the server refusing the connection's credentials
// (AUTH, or HELLO's): none given where some are needed (NOAUTH), wrong ones (WRONGPASS), or a
// user not allowed to connect as it asked (NOPERM). Trying again cannot help.
func credentialsRefused(err error) bool {
	var verr *valkey.ValkeyError
	if !errors.As(err, &verr) {
		return false
	}
	for _, prefix := range []string{"NOAUTH", "WRONGPASS", "NOPERM"} {
		if strings.HasPrefix(verr.Error(), prefix) {
			return true
		}
	}
	return false
}

// engineOptions are the engine's options from the settings.
func engineOptions(s settings.Settings, logger *slog.Logger, meters metric.MeterProvider) []engine.Option {
	opts := []engine.Option{
		engine.WithBatching(s.Batching),
		engine.WithFailOpen(s.FailOpen),
		engine.WithLogger(logger),
		engine.WithMeterProvider(meters),
	}
	if s.LocalCacheSizeInBytes > 0 {
		opts = append(opts, engine.WithDenyCache(max(1, s.LocalCacheSizeInBytes/denyCacheEntryBytes)))
	}
	if s.ReplicaAck > 0 {
		opts = append(opts, engine.WithReplicaAck(s.ReplicaAck, s.ReplicaAckTimeout))
	}
	if s.DurableAckLocal || s.DurableAckReplicas > 0 {
		local := 0
		if s.DurableAckLocal {
			local = 1
		}
		opts = append(opts, engine.WithDurableAck(local, s.DurableAckReplicas, s.DurableAckTimeout))
	}
	return opts
}

// serviceOptions are the service's options from the settings.
func serviceOptions(s settings.Settings, logger *slog.Logger, registry prometheus.Registerer, client valkey.Client) []rls.Option {
	opts := []rls.Option{
		rls.WithKeyPrefix(s.CacheKeyPrefix),
		rls.WithNearLimitRatio(s.NearLimitRatio),
		rls.WithShadowMode(s.ShadowMode),
		rls.WithQuotaMode(s.QuotaMode),
		rls.WithDynamicMetadata(s.ResponseDynamicMetadata),
		rls.WithRecordOverLimit(s.RecordOverLimit...),
		rls.WithCalendar(s.Calendar),
		rls.WithSlotsPerWindow(s.SlotsPerWindow),
		rls.WithRequestTimeout(s.RequestTimeout),
		rls.WithLogger(logger),
		rls.WithHealthyWithAtLeastOneConfigLoaded(s.HealthyWithAtLeastOneConfigLoaded),
		rls.WithLegacyHeaderNames(s.HeaderRateLimitLimit, s.HeaderRateLimitRemaining, s.HeaderRateLimitReset),
		rls.WithPing(func(ctx context.Context) error { return client.Do(ctx, client.B().Ping().Build()).Error() }),
	}
	if !s.DisableStats {
		opts = append(opts, rls.WithMetrics(registry))
	}
	switch {
	case !s.LimitResponseHeadersEnabled:
	case s.LegacyHeaders:
		opts = append(opts, rls.WithResponseHeaders(rls.HeadersLegacy))
	default:
		opts = append(opts, rls.WithResponseHeaders(rls.HeadersFields))
	}
	return opts
}

// loadConfig loads the first configuration and keeps it current: from the files, watched for
// changes, or from the xDS server. Without FORCE_START_WITHOUT_INITIAL_CONFIG, a first
// configuration that cannot be had stops the command (files) or is waited for (xDS).
func loadConfig(ctx context.Context, s settings.Settings, svc *rls.Service, logger *slog.Logger) error {
	if s.ConfigType == settings.ConfigXDS {
		return watchXDS(ctx, s, svc, logger)
	}
	return watchFiles(ctx, s, svc, logger)
}

// watchFiles loads the files and reloads them as they change. The watch's own first load is the
// one that decides whether the command starts, so that no change between the two is missed and
// nothing is loaded or refused twice: a refused (or unreadable) configuration stops the command
// unless FORCE_START_WITHOUT_INITIAL_CONFIG, with which it is counted and the command serves
// without one. Each later load replaces the configuration, or is refused and counted while the
// last good one stays.
func watchFiles(ctx context.Context, s settings.Settings, svc *rls.Service, logger *slog.Logger) error {
	w := config.WatchOptions{Root: s.RuntimeRoot, Subdirectory: s.RuntimeSubdirectory, AppDirectory: s.RuntimeAppDirectory,
		WatchRoot: s.RuntimeWatchRoot, IgnoreDotFiles: s.RuntimeIgnoreDotFiles, MergeDomains: s.MergeDomainConfig,
		Calendar: s.Calendar != nil}
	first := make(chan error, 1)
	firstDone := false // set by Watch's goroutine alone: its callbacks are called one at a time
	onLoad := func(c *config.Config) {
		svc.SetConfig(c)
		if !firstDone {
			firstDone = true
			first <- nil
			return // the first is in serve's start-up line
		}
		logger.Log(context.Background(), lifecycle, "rate limit configuration reloaded", configAttrs(s, c)...)
	}
	onError := func(err error) {
		if !firstDone {
			firstDone = true
			first <- err
			return
		}
		svc.ConfigError(err)
	}
	wctx, cancel := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- config.Watch(wctx, w, onLoad, onError) }()

	var err error
	select {
	case err = <-first:
		go func() {
			if err := <-stopped; err != nil && wctx.Err() == nil {
				logger.Error("watching the rate limit configuration stopped; changes to it are not loaded", "dir", w.Dir(), "err", err)
			}
			cancel()
		}()
	case werr := <-stopped:
		// The files cannot be watched (the directory that holds them is missing, say): they are
		// loaded once, and served without reloads.
		cancel()
		logger.Error("the rate limit configuration cannot be watched; changes to it are not loaded", "dir", w.Dir(), "err", werr)
		var c *config.Config
		if c, err = config.LoadDir(w.Dir(), w.IgnoreDotFiles, config.WithMergeDomains(w.MergeDomains), config.WithCalendar(w.Calendar)); err == nil {
			svc.SetConfig(c)
		}
	case <-ctx.Done():
		cancel()
		return ctx.Err()
	}
	switch {
	case err == nil:
		return nil
	case s.ForceStartWithoutInitialConfig:
		svc.ConfigError(err)
		return nil
	}
	cancel()
	return fmt.Errorf("rate limit configuration in %s: %w", w.Dir(), err)
}

// watchXDS takes the configuration from the xDS server, waiting for the first one unless
// FORCE_START_WITHOUT_INITIAL_CONFIG.
func watchXDS(ctx context.Context, s settings.Settings, svc *rls.Service, logger *slog.Logger) error {
	o := xds.Options{
		ServerURL: s.ConfigGRPCXDSServerURL, NodeID: s.ConfigGRPCXDSNodeID, NodeMetadata: s.ConfigGRPCXDSNodeMetadata,
		Headers: s.ConfigGRPCXDSClientAdditionalHeaders, MaxRecvMsgSize: s.XDSClientMaxMsgSizeInBytes,
		BackoffInitial: s.XDSClientBackoffInitialInterval, BackoffMax: s.XDSClientBackoffMaxInterval, Logger: logger,
	}
	if s.ConfigGRPCXDSServerUseTLS {
		t, err := s.XDSClientTLS()
		if err != nil {
			return fmt.Errorf("xds client tls: %w", err)
		}
		o.TLS = t
	}
	// Watch retries everything but options that can never work, which it returns at once:
	// refused here, before the watch starts, they stop the start whether or not it waits.
	if err := o.Validate(); err != nil {
		return fmt.Errorf("xds configuration (CONFIG_GRPC_XDS_*): %w", err)
	}
	first := make(chan struct{})
	var once sync.Once
	go func() {
		err := xds.Watch(ctx, o, func(cfgs []*rlsconfv3.RateLimitConfig) error {
			cfg, err := config.FromProto(cfgs, config.WithMergeDomains(s.MergeDomainConfig), config.WithCalendar(s.Calendar != nil))
			if err != nil {
				svc.ConfigError(err)
				return err
			}
			svc.SetConfig(cfg)
			waitedFor := false // the one the start waited for, which serve's start-up line shows
			once.Do(func() { close(first); waitedFor = !s.ForceStartWithoutInitialConfig })
			if !waitedFor {
				logger.Log(context.Background(), lifecycle, "rate limit configuration received from the xds server", configAttrs(s, cfg)...)
			}
			return nil
		})
		if err != nil && ctx.Err() == nil {
			logger.Error("xds watch stopped", "err", err)
		}
	}()
	if s.ForceStartWithoutInitialConfig {
		return nil
	}
	logger.Log(ctx, lifecycle, "waiting for the first rate limit configuration from the xds server", "server", o.ServerURL)
	select {
	case <-first:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// configAttrs are what the log says of a configuration: where it comes from (the files'
// directory, or the xDS server), its domains and how many rules they hold. c is nil before
// any configuration (FORCE_START_WITHOUT_INITIAL_CONFIG): no domains, no rules.
func configAttrs(s settings.Settings, c *config.Config) []any {
	from := "files:" + s.ConfigDir()
	if s.ConfigType == settings.ConfigXDS {
		from = "xds:" + s.ConfigGRPCXDSServerURL
	}
	return []any{"config", from, "domains", strings.Join(c.Domains(), ","), "rules", c.Rules()}
}

// serve runs the gRPC, HTTP, debug and metrics servers until ctx ends, then stops taking
// requests (health fails at once), drains for at most DrainTimeout, and returns. It logs, at
// the lifecycle level, the start (the addresses it listens on, the configuration in use and
// valkeyAddrs), the drain and the end.
func serve(ctx context.Context, s settings.Settings, svc *rls.Service, registry *prometheus.Registry, logger *slog.Logger, valkeyAddrs string) error {
	grpcOpts := []grpc.ServerOption{grpc.KeepaliveParams(keepalive.ServerParameters{
		MaxConnectionAge: s.GRPCMaxConnectionAge, MaxConnectionAgeGrace: s.GRPCMaxConnectionAgeGrace,
	})}
	if s.GRPCServerUseTLS {
		t, err := s.ServerTLS()
		if err != nil {
			return fmt.Errorf("grpc server tls: %w", err)
		}
		grpcOpts = append(grpcOpts, grpc.Creds(credentials.NewTLS(t)))
	}
	g := grpc.NewServer(grpcOpts...)
	pb.RegisterRateLimitServiceServer(g, svc)
	healthSrv := health.NewServer()
	healthpb.RegisterHealthServer(g, healthSrv)
	// Server reflection, so that grpcurl and other tools can call the service without
	// Envoy's proto files (docs/rls.md's quick start calls it so). It tells the services'
	// schemas alone, all of them public: Envoy's rate limit API, gRPC health and reflection
	// itself. It is the command's: rls.Service, the library, registers nothing of its own.
	reflection.Register(g)

	grpcLn, err := listenGRPC(s)
	if err != nil {
		return err
	}
	servers := []*http.Server{{Addr: s.HTTPAddr(), Handler: svc.HTTPHandler(), ReadHeaderTimeout: 10 * time.Second}}
	debug := http.NewServeMux()
	debug.Handle("/", svc.DebugHandler())
	if !s.DisableStats {
		debug.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	}
	servers = append(servers, &http.Server{Addr: s.DebugAddr(), Handler: debug, ReadHeaderTimeout: 10 * time.Second})
	if s.UsePrometheus && !s.DisableStats {
		mux := http.NewServeMux()
		mux.Handle(s.PrometheusPath, promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
		servers = append(servers, &http.Server{Addr: s.PrometheusAddr, Handler: mux, ReadHeaderTimeout: 10 * time.Second})
	}
	var listeners []net.Listener
	for _, srv := range servers {
		ln, err := net.Listen("tcp", srv.Addr)
		if err != nil {
			grpcLn.Close()
			for _, l := range listeners {
				l.Close()
			}
			return fmt.Errorf("listen on %s: %w", srv.Addr, err)
		}
		listeners = append(listeners, ln)
	}

	attrs := []any{"grpc", grpcLn.Addr().String(), "http", listeners[0].Addr().String(), "debug", listeners[1].Addr().String()}
	if len(listeners) > 2 {
		attrs = append(attrs, "prometheus", listeners[2].Addr().String()+s.PrometheusPath)
	}
	attrs = append(attrs, "valkey", valkeyAddrs)
	if s.RedisType != settings.RedisSingle {
		attrs = append(attrs, "redis_type", s.RedisType)
	}
	attrs = append(attrs, configAttrs(s, svc.Config())...)
	// Logged once every listener is open and before any is served, so that nothing is
	// answered before the line is written.
	logger.Log(ctx, lifecycle, "serving", attrs...)

	errc := make(chan error, len(servers)+1)
	go func() { errc <- g.Serve(grpcLn) }()
	for i, srv := range servers {
		go func() {
			if err := srv.Serve(listeners[i]); !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
	}
	go keepHealth(ctx, svc, healthSrv)

	var serveErr, cause error // cause: why it stops, the signal or a server's failure
	select {
	case <-ctx.Done():
		cause = context.Cause(ctx)
	case serveErr = <-errc:
		cause = serveErr
	}
	svc.Stop()
	healthSrv.Shutdown()
	stopping := time.Now()
	logger.Log(context.Background(), lifecycle, "shutting down: draining requests in flight", "cause", cause, "timeout", s.DrainTimeout)
	drained := make(chan struct{})
	go func() { g.GracefulStop(); close(drained) }()
	dctx, cancel := context.WithTimeout(context.Background(), s.DrainTimeout)
	defer cancel()
	complete := true // every request in flight was answered within the drain timeout
	for _, srv := range servers {
		if srv.Shutdown(dctx) != nil {
			complete = false
		}
	}
	select {
	case <-drained:
	case <-dctx.Done():
		g.Stop()
		complete = false
	}
	end := []any{"drained", complete, "took", time.Since(stopping).Round(time.Millisecond)}
	if serveErr != nil {
		end = append(end, "err", serveErr)
	}
	logger.Log(context.Background(), lifecycle, "stopped", end...)
	return serveErr
}

// listenGRPC listens where the gRPC server is asked to: GRPC_UDS, else GRPC_HOST:GRPC_PORT.
func listenGRPC(s settings.Settings) (net.Listener, error) {
	network, addr := "tcp", s.GRPCAddr()
	if s.GRPCUDS != "" {
		network, addr = "unix", s.GRPCUDS
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", addr, err)
	}
	return ln, nil
}

// healthServices are the names the gRPC health service answers for, each with the service's
// health: the server as a whole (""), "ratelimit", the name the reference registers and that
// probes and meshes configured for it ask for, and the rate limit service's own name.
var healthServices = []string{"", "ratelimit", pb.RateLimitService_ServiceDesc.ServiceName}

// keepHealth keeps the gRPC health service's status in step with the service's health.
func keepHealth(ctx context.Context, svc *rls.Service, h *health.Server) {
	t := time.NewTicker(healthInterval)
	defer t.Stop()
	for {
		st := healthpb.HealthCheckResponse_SERVING
		if svc.Healthy(ctx) != nil {
			st = healthpb.HealthCheckResponse_NOT_SERVING
		}
		for _, name := range healthServices {
			h.SetServingStatus(name, st)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
