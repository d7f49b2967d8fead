// Package telemetry sets up OpenTelemetry for one idemgate process from
// the standard OTEL_* environment variables: a tracer provider and a meter
// provider exporting over OTLP (HTTP or gRPC), the W3C trace-context
// propagator, and the HTTP client transport that traces downstream calls
// and carries the trace to them. It imports nothing of idemgate.
//
// Telemetry is off unless configured: FromEnv returns a nil *Provider, and
// every method of a nil *Provider does nothing (so callers test for nil
// once, where a span would start, and pay nothing else when it is off).
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/trace"
)

// Scope is the instrumentation scope of idemgate's spans and metrics.
const Scope = "idemgate"

// Provider is one process's telemetry: a tracer and a meter, each
// exporting (or a no-op when only the other signal is configured). Safe
// for concurrent use; a nil *Provider is telemetry switched off.
type Provider struct {
	tp     *sdktrace.TracerProvider // nil: traces off
	mp     *sdkmetric.MeterProvider // nil: metrics off
	tracer trace.Tracer             // nil: traces off
	meter  metric.Meter
	prop   propagation.TextMapPropagator
}

// FromEnv builds the process's telemetry from the OTEL_* variables that
// getenv reads (os.Getenv), naming the service version version. Traces
// are exported when OTEL_TRACES_EXPORTER is "otlp", or when it is unset
// and OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT
// is; metrics likewise (OTEL_METRICS_EXPORTER,
// OTEL_EXPORTER_OTLP_METRICS_ENDPOINT). OTEL_SDK_DISABLED=true, or
// "none", turns a signal off. The protocol is
// OTEL_EXPORTER_OTLP_{TRACES_,METRICS_,}PROTOCOL: http/protobuf (the
// default) or grpc. Everything else (endpoint, headers, timeout,
// compression, certificates, service name and resource attributes,
// sampler, batch sizes, export interval) the OpenTelemetry SDK and its
// exporters read from their own variables.
//
// It returns nil, nil when no signal is configured; an error names a
// variable whose value it cannot use.
func FromEnv(ctx context.Context, getenv func(string) string, version string) (*Provider, error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return nil, nil
	}
	traces, err := enabled(getenv, "OTEL_TRACES_EXPORTER", "TRACES")
	if err != nil {
		return nil, err
	}
	metrics, err := enabled(getenv, "OTEL_METRICS_EXPORTER", "METRICS")
	if err != nil {
		return nil, err
	}
	if !traces && !metrics {
		return nil, nil
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(
		semconv.ServiceName("idemgate"), semconv.ServiceVersion(version)))
	if err != nil {
		return nil, err
	}
	// The environment's service name and attributes win over the defaults.
	if env, err := resource.New(ctx, resource.WithFromEnv()); err == nil {
		if merged, err := resource.Merge(res, env); err == nil {
			res = merged
		}
	} else {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES / OTEL_SERVICE_NAME: %w", err)
	}
	p := &Provider{prop: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})}
	if traces {
		exp, err := traceExporter(ctx, protocol(getenv, "TRACES"))
		if err != nil {
			return nil, err
		}
		// The sampler (OTEL_TRACES_SAMPLER, default parent-based
		// always-on) and the batch processor's limits (OTEL_BSP_*) are
		// read by the SDK.
		p.tp = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		p.tracer = p.tp.Tracer(Scope, trace.WithInstrumentationVersion(version))
	}
	if metrics {
		exp, err := metricExporter(ctx, protocol(getenv, "METRICS"))
		if err != nil {
			p.Shutdown(ctx)
			return nil, err
		}
		// The export interval is OTEL_METRIC_EXPORT_INTERVAL (default 60 s).
		p.mp = sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(exp)), sdkmetric.WithResource(res))
		p.meter = p.mp.Meter(Scope, metric.WithInstrumentationVersion(version))
	} else {
		p.meter = metricnoop.NewMeterProvider().Meter(Scope)
	}
	return p, nil
}

// enabled reports whether a signal is exported: its exporter variable
// (otlp or none), else whether an OTLP endpoint is set for it.
func enabled(getenv func(string) string, exporterVar, signal string) (bool, error) {
	switch v := strings.ToLower(strings.TrimSpace(getenv(exporterVar))); v {
	case "otlp":
		return true, nil
	case "none":
		return false, nil
	case "":
		return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_"+signal+"_ENDPOINT") != "", nil
	default:
		return false, fmt.Errorf("%s=%s: idemgate exports over OTLP only: set otlp or none", exporterVar, v)
	}
}

// protocol is the OTLP protocol of a signal: its own variable, else the
// common one.
func protocol(getenv func(string) string, signal string) string {
	if v := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_" + signal + "_PROTOCOL")); v != "" {
		return v
	}
	return strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
}

var errProtocol = errors.New("OTEL_EXPORTER_OTLP_PROTOCOL: want http/protobuf or grpc")

func traceExporter(ctx context.Context, proto string) (sdktrace.SpanExporter, error) {
	switch proto {
	case "", "http/protobuf":
		return otlptracehttp.New(ctx)
	case "grpc":
		return otlptracegrpc.New(ctx)
	}
	return nil, fmt.Errorf("%w, got %q", errProtocol, proto)
}

func metricExporter(ctx context.Context, proto string) (sdkmetric.Exporter, error) {
	switch proto {
	case "", "http/protobuf":
		return otlpmetrichttp.New(ctx)
	case "grpc":
		return otlpmetricgrpc.New(ctx)
	}
	return nil, fmt.Errorf("%w, got %q", errProtocol, proto)
}

// Tracer is the tracer of idemgate's spans; nil when p is nil or traces
// are off (only metrics are exported).
func (p *Provider) Tracer() trace.Tracer {
	if p == nil {
		return nil
	}
	return p.tracer
}

// Meter is the meter of idemgate's metrics; nil when p is nil.
func (p *Provider) Meter() metric.Meter {
	if p == nil {
		return nil
	}
	return p.meter
}

// Propagator reads and writes the W3C traceparent, tracestate and
// baggage; nil when p is nil.
func (p *Provider) Propagator() propagation.TextMapPropagator {
	if p == nil {
		return nil
	}
	return p.prop
}

// Transport wraps rt, an HTTP client's transport to a downstream, so that
// each request is a client span and carries the trace to the downstream
// (traceparent, tracestate); rt itself when p is nil or traces are off.
func (p *Provider) Transport(rt http.RoundTripper) http.RoundTripper {
	if p == nil || p.tp == nil {
		return rt
	}
	return otelhttp.NewTransport(rt, otelhttp.WithTracerProvider(p.tp), otelhttp.WithPropagators(p.prop),
		otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
		// The HTTP conventions' span name without a URL template: the method.
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string { return r.Method }))
}

// Shutdown exports what is buffered and stops the exporters, within ctx;
// nothing when p is nil.
func (p *Provider) Shutdown(ctx context.Context) error {
	if p == nil {
		return nil
	}
	var errs []error
	if p.tp != nil {
		errs = append(errs, p.tp.Shutdown(ctx))
	}
	if p.mp != nil {
		errs = append(errs, p.mp.Shutdown(ctx))
	}
	return errors.Join(errs...)
}
