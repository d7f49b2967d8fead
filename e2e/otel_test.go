package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	collmetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	colltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP/HTTP receiver (protobuf, as the OpenTelemetry
// exporters send it by default): it keeps every span and the names and
// attributes of every metric data point it is sent.
type otlpReceiver struct {
	srv *httptest.Server

	mu      sync.Mutex
	spans   []*tracepb.Span
	metrics []otlpPoint
}

// otlpPoint is one histogram data point received: its metric's name and
// its attributes.
type otlpPoint struct {
	Name  string
	Attrs map[string]string
	Count uint64
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", func(w http.ResponseWriter, req *http.Request) {
		var in colltrace.ExportTraceServiceRequest
		if !r.decode(w, req, &in) {
			return
		}
		r.mu.Lock()
		for _, rs := range in.ResourceSpans {
			for _, ss := range rs.ScopeSpans {
				r.spans = append(r.spans, ss.Spans...)
			}
		}
		r.mu.Unlock()
		r.answer(w, &colltrace.ExportTraceServiceResponse{})
	})
	mux.HandleFunc("POST /v1/metrics", func(w http.ResponseWriter, req *http.Request) {
		var in collmetrics.ExportMetricsServiceRequest
		if !r.decode(w, req, &in) {
			return
		}
		r.mu.Lock()
		for _, rm := range in.ResourceMetrics {
			for _, sm := range rm.ScopeMetrics {
				for _, m := range sm.Metrics {
					if h := m.GetHistogram(); h != nil {
						for _, dp := range h.DataPoints {
							r.metrics = append(r.metrics, otlpPoint{Name: m.Name, Attrs: attrMap(dp.Attributes), Count: dp.Count})
						}
					}
				}
			}
		}
		r.mu.Unlock()
		r.answer(w, &collmetrics.ExportMetricsServiceResponse{})
	})
	r.srv = httptest.NewServer(mux)
	t.Cleanup(r.srv.Close)
	return r
}

func (r *otlpReceiver) decode(w http.ResponseWriter, req *http.Request, m proto.Message) bool {
	var body io.Reader = req.Body
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return false
		}
		body = zr
	}
	b, err := io.ReadAll(body)
	if err == nil {
		err = proto.Unmarshal(b, m)
	}
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return false
	}
	return true
}

func (r *otlpReceiver) answer(w http.ResponseWriter, m proto.Message) {
	b, _ := proto.Marshal(m)
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(b)
}

// trace is the spans of traceID received so far.
func (r *otlpReceiver) trace(traceID string) []*tracepb.Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range r.spans {
		if hex.EncodeToString(s.TraceId) == traceID {
			out = append(out, s)
		}
	}
	return out
}

// points is the data points of the metric name received so far.
func (r *otlpReceiver) points(name string) []otlpPoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []otlpPoint
	for _, p := range r.metrics {
		if p.Name == name {
			out = append(out, p)
		}
	}
	return out
}

func attrMap(kvs []*commonpb.KeyValue) map[string]string {
	m := map[string]string{}
	for _, kv := range kvs {
		v := kv.Value
		switch {
		case v.GetStringValue() != "":
			m[kv.Key] = v.GetStringValue()
		case v.GetIntValue() != 0:
			m[kv.Key] = fmt.Sprint(v.GetIntValue())
		default:
			if _, ok := v.Value.(*commonpb.AnyValue_BoolValue); ok {
				m[kv.Key] = fmt.Sprint(v.GetBoolValue())
			}
		}
	}
	return m
}

// setOTLPEnv points the servers the test starts (and their ledger's
// owner, which they start with their environment) at rcv, exporting at
// once.
func setOTLPEnv(t *testing.T, rcv *otlpReceiver) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rcv.srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "50")
	t.Setenv("OTEL_METRIC_EXPORT_INTERVAL", "200")
	t.Setenv("OTEL_SERVICE_NAME", "idemgate-e2e")
}

// callTraced calls tool with args and a traceparent in _meta, and returns
// the envelope's status and replayed flag, and the result's _meta.
func callTraced(t *testing.T, s *session, tool string, args map[string]any, traceparent string) (envelope, map[string]any) {
	t.Helper()
	req := mcp.CallToolRequest{}
	req.Params.Name = tool
	req.Params.Arguments = args
	req.Params.Meta = &mcp.Meta{AdditionalFields: map[string]any{"traceparent": traceparent, "tracestate": "vendor=e2e"}}
	res, err := s.mc.CallTool(testContext(t), req)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	r := &rawResult{Structured: res.RawStructuredContent, IsError: res.IsError}
	for _, c := range res.Content {
		if tc, ok := c.(mcp.TextContent); ok {
			r.Texts = append(r.Texts, tc.Text)
		}
	}
	env, err := decodeEnvelope(tool, r)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	var meta map[string]any
	if res.Meta != nil {
		meta = res.Meta.AdditionalFields
	}
	return env, meta
}

// spanNamed is the first span of spans named name, nil when none is.
func spanNamed(spans []*tracepb.Span, name string) *tracepb.Span {
	for _, s := range spans {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// waitTrace waits until the receiver holds the spans of traceID named
// names, and returns the trace.
func waitTrace(t *testing.T, rcv *otlpReceiver, traceID string, names ...string) []*tracepb.Span {
	t.Helper()
	var spans []*tracepb.Span
	ok := eventually(20*time.Second, func() bool {
		spans = rcv.trace(traceID)
		for _, n := range names {
			if spanNamed(spans, n) == nil {
				return false
			}
		}
		return true
	})
	if !ok {
		var got []string
		for _, s := range spans {
			got = append(got, s.Name)
		}
		t.Fatalf("trace %s: spans %q, want %q among them", traceID, got, names)
	}
	return spans
}

// TestTracesToOTLP: a server configured by OTEL_* exports, to a real OTLP
// receiver, for a create_order whose _meta carries a traceparent: the
// MCP server span under the caller's span, with the MCP semantic
// conventions' attributes and idemgate's (key, tenant, states, decision),
// the ledger's spans and the order API's HTTP span under it, and the
// order API receives the same trace; the answer's _meta and the call's
// audit entries name the trace. A replay and a refusal carry their
// decisions, and mcp.server.operation.duration arrives with its
// attributes.
func TestTracesToOTLP(t *testing.T) {
	rcv := newOTLPReceiver(t)
	setOTLPEnv(t, rcv)
	api := newFakeAPI(t)
	s := startServer(t, mcpGoModern, serverConfig{Tenant: "t-otel", Principal: "agent-otel", Args: []string{"--orders-api", api.URL()}})

	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	const parent = "00f067aa0ba902b7"
	key := newKey()
	args := orderArgs(key, "cust-otel", []item{{"sku-1", 2, 500}}, nil)
	env, meta := callTraced(t, s, "create_order", args, "00-"+traceID+"-"+parent+"-01")
	if env.Status != "succeeded" || env.Replayed {
		t.Fatalf("create_order: %s", env)
	}
	if meta["idemgate/trace_id"] != traceID {
		t.Errorf("the answer's _meta %v: want idemgate/trace_id %s", meta, traceID)
	}

	spans := waitTrace(t, rcv, traceID, "tools/call create_order", "ledger claim", "ledger complete", "POST")
	call := spanNamed(spans, "tools/call create_order")
	if got := hex.EncodeToString(call.ParentSpanId); got != parent {
		t.Errorf("server span's parent %s, want the caller's %s", got, parent)
	}
	if call.Kind != tracepb.Span_SPAN_KIND_SERVER {
		t.Errorf("server span kind %v", call.Kind)
	}
	attrs := attrMap(call.Attributes)
	want := map[string]string{
		"mcp.method.name": "tools/call", "gen_ai.tool.name": "create_order", "gen_ai.operation.name": "execute_tool",
		"network.transport": "pipe", "mcp.protocol.version": mcpGoModern.Version,
		"idemgate.operation_key": key, "idemgate.tenant": "t-otel", "idemgate.state_after": "succeeded",
		"idemgate.replayed": "false", "idemgate.decision": "executed",
	}
	for k, v := range want {
		if attrs[k] != v {
			t.Errorf("server span %s = %q, want %q", k, attrs[k], v)
		}
	}
	if attrs["jsonrpc.request.id"] == "" || !strings.HasPrefix(attrs["mcp.session.id"], "stdio-") {
		t.Errorf("server span jsonrpc.request.id %q, mcp.session.id %q: want both", attrs["jsonrpc.request.id"], attrs["mcp.session.id"])
	}
	if _, ok := attrs["error.type"]; ok {
		t.Errorf("a succeeded call's span has error.type %q", attrs["error.type"])
	}
	serverSpan := hex.EncodeToString(call.SpanId)
	for _, name := range []string{"ledger claim", "ledger complete", "POST"} {
		if got := hex.EncodeToString(spanNamed(spans, name).ParentSpanId); got != serverSpan {
			t.Errorf("span %q's parent %s, want the server span %s", name, got, serverSpan)
		}
	}
	if post := spanNamed(spans, "POST"); post.Kind != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("order API span kind %v, want client", post.Kind)
	}
	if meta["idemgate/span_id"] != serverSpan {
		t.Errorf("the answer's _meta %v: want idemgate/span_id %s", meta, serverSpan)
	}
	// The order API's own logs join the trace: it got the trace's context.
	var sent []string
	for _, tp := range api.Traceparents() {
		if strings.Contains(tp, traceID) {
			sent = append(sent, tp)
		}
	}
	if len(sent) == 0 {
		t.Errorf("the order API received traceparents %q: none of trace %s", api.Traceparents(), traceID)
	}

	// A replay, in another trace, says so.
	const replayTrace = "5bf92f3577b34da6a3ce929d0e0e4737"
	env, _ = callTraced(t, s, "create_order", args, "00-"+replayTrace+"-"+parent+"-01")
	if !env.Replayed {
		t.Fatalf("replay: %s", env)
	}
	replay := attrMap(spanNamed(waitTrace(t, rcv, replayTrace, "tools/call create_order"), "tools/call create_order").Attributes)
	if replay["idemgate.decision"] != "replayed" || replay["idemgate.replayed"] != "true" || replay["idemgate.state_before"] != "succeeded" {
		t.Errorf("replay span: decision %q, replayed %q, state_before %q", replay["idemgate.decision"], replay["idemgate.replayed"], replay["idemgate.state_before"])
	}

	// The same key with another request is refused, as a tool error.
	const refusedTrace = "6bf92f3577b34da6a3ce929d0e0e4738"
	changed := orderArgs(key, "cust-otel", []item{{"sku-1", 3, 500}}, nil)
	env, _ = callTraced(t, s, "create_order", changed, "00-"+refusedTrace+"-"+parent+"-01")
	if env.code() != "key_reused_with_different_request" {
		t.Fatalf("changed request: %s", env)
	}
	refused := attrMap(spanNamed(waitTrace(t, rcv, refusedTrace, "tools/call create_order"), "tools/call create_order").Attributes)
	if refused["idemgate.decision"] != "refused" || refused["idemgate.error_code"] != "key_reused_with_different_request" || refused["error.type"] != "tool_error" {
		t.Errorf("refusal span: decision %q, error_code %q, error.type %q", refused["idemgate.decision"], refused["idemgate.error_code"], refused["error.type"])
	}

	// The duration histogram, by the conventions.
	if !eventually(10*time.Second, func() bool {
		for _, p := range rcv.points("mcp.server.operation.duration") {
			if p.Attrs["mcp.method.name"] == "tools/call" && p.Attrs["gen_ai.tool.name"] == "create_order" && p.Attrs["error.type"] == "tool_error" {
				return true
			}
		}
		return false
	}) {
		t.Errorf("mcp.server.operation.duration points %+v: want tools/call create_order with a tool_error one", rcv.points("mcp.server.operation.duration"))
	}

	// The audit entries of the first call name its trace and span.
	s.Close()
	var named []string
	for _, l := range exportAuditTraces(t, s.cfg.DB) {
		if l.Key == key && l.Actor.TraceID == traceID {
			named = append(named, l.Event)
			if l.Actor.SpanID != serverSpan {
				t.Errorf("audit entry %d (%s): span_id %q, want %s", l.Seq, l.Event, l.Actor.SpanID, serverSpan)
			}
		}
	}
	if !slices.Contains(named, "transition") {
		t.Errorf("audit entries of trace %s: %q, want the call's transitions", traceID, named)
	}
}

// auditTraceLine is what TestTracesToOTLP reads of an audit entry.
type auditTraceLine struct {
	Seq   uint64 `json:"seq"`
	Event string `json:"event"`
	Key   string `json:"key"`
	Actor struct {
		TraceID string `json:"trace_id"`
		SpanID  string `json:"span_id"`
	} `json:"actor"`
}

func exportAuditTraces(t *testing.T, db string) []auditTraceLine {
	t.Helper()
	r := runCLI(t, 20*time.Second, "audit", "export", "--db", db)
	if r.Code != 0 {
		t.Fatalf("audit export: exit %d: %s", r.Code, r.Stderr)
	}
	var out []auditTraceLine
	for line := range bytes.Lines([]byte(r.Stdout)) {
		var l auditTraceLine
		if err := json.Unmarshal(line, &l); err != nil {
			t.Fatalf("audit export line: %v", err)
		}
		out = append(out, l)
	}
	return out
}

// TestTracesOverHTTP: over Streamable HTTP a request without a
// traceparent in _meta is traced under its traceparent header — the
// handshake and the tools/call alike —, and an embedded create_order's
// transaction is its ledger execute span.
func TestTracesOverHTTP(t *testing.T) {
	rcv := newOTLPReceiver(t)
	setOTLPEnv(t, rcv)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	token := addToken(t, tokens, "agent-http", "t-http", "agent")
	base := httpServer(t, filepath.Join(dir, "ledger.db"), tokens)

	const traceID = "7bf92f3577b34da6a3ce929d0e0e4739"
	tr, err := transport.NewStreamableHTTP(base+"/mcp", transport.WithHTTPHeaders(map[string]string{
		"Authorization": "Bearer " + token, "Traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}))
	if err != nil {
		t.Fatal(err)
	}
	c := client.NewClient(tr)
	t.Cleanup(func() { c.Close() })
	ctx := testContext(t)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Initialize(ctx, mcp.InitializeRequest{}); err != nil {
		t.Fatal(err)
	}
	s := &session{t: t, flavor: mcpGoModern, mc: c}
	s.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-http", []item{{"sku-1", 1, 100}}, nil))

	spans := waitTrace(t, rcv, traceID, "tools/call create_order", "ledger execute")
	call := spanNamed(spans, "tools/call create_order")
	var handshake []string // initialize, or server/discover in the 2026-07-28 era
	for _, sp := range spans {
		if m := attrMap(sp.Attributes)["mcp.method.name"]; m != "" && m != "tools/call" {
			handshake = append(handshake, sp.Name)
		}
	}
	if len(handshake) == 0 {
		t.Errorf("no span of the client's handshake in trace %s", traceID)
	}
	// (No mcp.session.id: the 2026-07-28 era has no sessions.)
	if a := attrMap(call.Attributes); a["network.transport"] != "tcp" || a["idemgate.decision"] != "executed" {
		t.Errorf("server span over HTTP: network.transport %q, decision %q", a["network.transport"], a["idemgate.decision"])
	}
	if got, want := hex.EncodeToString(spanNamed(spans, "ledger execute").ParentSpanId), hex.EncodeToString(call.SpanId); got != want {
		t.Errorf("ledger execute's parent %s, want the server span %s", got, want)
	}
}
