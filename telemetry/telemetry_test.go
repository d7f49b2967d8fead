package telemetry

import (
	"context"
	"net/http"
	"strings"
	"testing"
)

func TestFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name            string
		env             map[string]string
		traces, metrics bool
		err             string
	}{
		{name: "nothing set is off"},
		{name: "an endpoint turns both on", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}, traces: true, metrics: true},
		{name: "a traces endpoint turns traces on", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:1/v1/traces"}, traces: true},
		{name: "none wins over an endpoint", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_METRICS_EXPORTER": "none"}, traces: true},
		{name: "otlp over grpc", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, traces: true},
		{name: "disabled", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1", "OTEL_SDK_DISABLED": "true"}},
		{name: "another exporter is refused", env: map[string]string{"OTEL_TRACES_EXPORTER": "console"}, err: "OTEL_TRACES_EXPORTER"},
		{name: "http/json is refused", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, err: "OTEL_EXPORTER_OTLP_PROTOCOL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := FromEnv(context.Background(), func(k string) string { return tc.env[k] }, "test")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Shutdown(context.Background())
			if !tc.traces && !tc.metrics {
				if p != nil {
					t.Fatalf("got a provider, want none (off)")
				}
				return
			}
			if p == nil {
				t.Fatal("got none, want a provider")
			}
			if got := p.tp != nil; got != tc.traces {
				t.Errorf("traces on %v, want %v", got, tc.traces)
			}
			if got := p.mp != nil; got != tc.metrics {
				t.Errorf("metrics on %v, want %v", got, tc.metrics)
			}
			if got := p.Tracer() != nil; got != tc.traces {
				t.Errorf("a tracer %v, want %v", got, tc.traces)
			}
			if rt := http.DefaultTransport; (p.Transport(rt) != rt) != tc.traces {
				t.Errorf("the transport wrapped: %v, want %v", p.Transport(rt) != rt, tc.traces)
			}
		})
	}
}

// TestOffIsNil: a nil Provider (off) does nothing and leaves a transport
// as it is.
func TestOffIsNil(t *testing.T) {
	var p *Provider
	if p.Tracer() != nil || p.Meter() != nil || p.Propagator() != nil || p.Shutdown(context.Background()) != nil {
		t.Error("a nil Provider is not inert")
	}
	if rt := http.DefaultTransport; p.Transport(rt) != rt {
		t.Error("a nil Provider wrapped a transport")
	}
}
