package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.26.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/strictrate/strictrate/rls/settings"
)

// setupTracing starts OpenTelemetry tracing when TRACING_ENABLED: spans go to the OTLP
// endpoint (OTEL_EXPORTER_OTLP_ENDPOINT and the exporter's other OTEL_EXPORTER_OTLP_*
// variables) over TRACING_EXPORTER_PROTOCOL, sampled at TRACING_SAMPLING_RATE, under
// TRACING_SERVICE_NAME, as the reference exports them. The returned function flushes and
// stops the exporter.
func setupTracing(ctx context.Context, s settings.Settings, logger *slog.Logger) (trace.TracerProvider, func(), error) {
	if !s.TracingEnabled {
		return noop.NewTracerProvider(), func() {}, nil
	}
	var client otlptrace.Client
	if s.TracingExporterProtocol == "grpc" {
		client = otlptracegrpc.NewClient()
	} else {
		client = otlptracehttp.NewClient()
	}
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, nil, fmt.Errorf("tracing exporter: %w", err)
	}
	id := s.TracingServiceInstanceID
	if id == "" {
		id = uuid.NewString()
	}
	res := resource.NewWithAttributes(semconv.SchemaURL, semconv.ServiceName(s.TracingServiceName),
		semconv.ServiceInstanceID(id), semconv.ServiceNamespace(s.TracingServiceNamespace))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(s.TracingSamplingRate))))
	logger.Info("tracing", "protocol", s.TracingExporterProtocol, "endpoint", s.OTLPEndpoint, "sampling_rate", s.TracingSamplingRate)
	return tp, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tp.Shutdown(ctx)
	}, nil
}
