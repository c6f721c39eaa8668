// Package telemetry sets up Hopper's traces (OpenTelemetry, OTLP) and
// metrics (Prometheus). The proxy records at its decision point through the
// small Observer interface it declares; this package implements it.
package telemetry

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/hopper-sidecar/hopper/internal/redact"
	"github.com/hopper-sidecar/hopper/telemetry/otlp"
)

// Tracing is the tracer provider and what is needed to stop it.
type Tracing struct {
	Provider trace.TracerProvider
	// Enabled is false when no OTLP endpoint is configured.
	Enabled bool
	// Dropped counts spans that were not exported: the export failed
	// (collector unreachable) or the queue in front of the exporter was
	// full. Tracing never blocks delivery.
	Dropped atomic.Int64
	// Exporter names the exporter in use, for the startup log.
	Exporter string
	shutdown func(context.Context) error
}

// TracingFromEnv configures tracing from the standard OTEL_* variables:
// OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) turns
// it on; OTEL_EXPORTER_OTLP_PROTOCOL picks grpc or http/protobuf (default);
// OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES name the resource;
// OTEL_TRACES_SAMPLER (and _ARG) pick the sampler; OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none turn it off. getenv is os.Getenv in production;
// version, the running binary's, is the resource's service.version.
func TracingFromEnv(ctx context.Context, getenv func(string) string, version string) (*Tracing, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	t := &Tracing{Provider: noop.NewTracerProvider(), shutdown: func(context.Context) error { return nil }}
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || strings.EqualFold(getenv("OTEL_TRACES_EXPORTER"), "none") {
		return t, nil
	}
	cfg, ok, err := otlp.FromEnv(getenv)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	if !ok {
		return t, nil
	}
	cfg.UserAgent = otlp.UserAgent(version)
	exp := otlp.New(cfg)
	exp.Rejected = func(n int64) { t.Dropped.Add(n) }
	t.Exporter = "otlp " + cfg.Protocol + " " + redact.URL(cfg.URL)
	if cfg.Proxy != nil {
		t.Exporter += " through proxy " + cfg.Proxy.Redacted()
	}
	res, err := resource.Merge(
		resource.NewSchemaless(semconv.ServiceName("hopper"), semconv.ServiceVersion(version)),
		resource.Environment(), // OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME win
	)
	if err != nil {
		return nil, fmt.Errorf("tracing resource: %w", err)
	}
	// Ending a span never blocks a delivery: spans go through a bounded
	// queue that counts what it cannot take, in front of a batcher that
	// waits for the exporter instead of dropping silently.
	batcher := sdktrace.NewBatchSpanProcessor(&countingExporter{SpanExporter: exp, dropped: &t.Dropped},
		sdktrace.WithBatchTimeout(time.Second),
		sdktrace.WithExportTimeout(5*time.Second),
		sdktrace.WithBlocking())
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithSpanProcessor(newSpanQueue(batcher, spanQueueSize, &t.Dropped)),
		sdktrace.WithResource(res),
	)
	t.Provider, t.Enabled, t.shutdown = tp, true, tp.Shutdown
	return t, nil
}

// spanQueueSize is how many ended spans may wait for the batcher, the
// SDK's default batch queue size.
const spanQueueSize = 2048

// Shutdown flushes pending spans (bounded by ctx).
func (t *Tracing) Shutdown(ctx context.Context) error {
	if err := t.shutdown(ctx); err != nil {
		return fmt.Errorf("flush traces: %w", err)
	}
	return nil
}

// countingExporter counts the spans an export failed to deliver.
type countingExporter struct {
	sdktrace.SpanExporter
	dropped *atomic.Int64
}

func (c *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	err := c.SpanExporter.ExportSpans(ctx, spans)
	if err != nil {
		c.dropped.Add(int64(len(spans)))
	}
	return err
}
