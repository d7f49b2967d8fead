package server

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.41.0"
	"go.opentelemetry.io/otel/semconv/v1.41.0/mcpconv"
	"go.opentelemetry.io/otel/trace"

	"idemgate/ledger"
	"idemgate/telemetry"
)

// What OpenTelemetry sees of the MCP requests the server answers: one
// server span per request, named and described by the MCP semantic
// conventions (GenAI conventions: mcp.method.name, gen_ai.tool.name,
// jsonrpc.request.id, mcp.session.id, mcp.protocol.version,
// network.transport, error.type, rpc.response.status_code), under the
// caller's trace, and the mcp.server.operation.duration histogram. The
// tools put their own attributes and child spans under it (package
// tools). Nothing here runs when telemetry is off: the hooks are not
// registered and no request carries a slot.

// MetaTracestate is the _meta key of the W3C tracestate beside
// MetaTraceparent.
const MetaTracestate = "tracestate"

// MetaTraceID and MetaSpanID are the _meta keys of a tool result that
// name the trace and the server span that answered it, when tracing is on.
const (
	MetaTraceID = "idemgate/trace_id"
	MetaSpanID  = "idemgate/span_id"
)

// requestTelemetry traces one server's requests.
type requestTelemetry struct {
	tracer   trace.Tracer // nil: metrics only
	prop     propagation.TextMapPropagator
	duration mcpconv.ServerOperationDuration
}

// requestSlot is where the span of one MCP request is kept from the hook
// that starts it to the one that ends it (mcp-go's hooks share nothing
// but the request's context): the transport puts a slot on the context
// of each message it hands mcp-go (withRequestSlot).
//
// Over stdio the slot is part of the message's requestStream; over HTTP
// the transport's context function puts one on every request, with the
// request's headers.
type requestSlot struct {
	header  http.Header // the HTTP request's headers; nil on stdio
	mu      sync.Mutex
	open    bool       // started and not yet ended
	span    trace.Span // nil unless traced
	started time.Time
	attrs   []attribute.KeyValue // the metric's attributes
}

type requestSlotKey struct{}

// withHTTPSlot returns ctx with a slot for the span of the HTTP request
// whose headers are header.
func withHTTPSlot(ctx context.Context, header http.Header) context.Context {
	return context.WithValue(ctx, requestSlotKey{}, &requestSlot{header: header})
}

// slotOf is the slot of the request served under ctx; nil for none (an
// in-process client's).
func slotOf(ctx context.Context) *requestSlot {
	if s, ok := ctx.Value(requestSlotKey{}).(*requestSlot); ok {
		return s
	}
	if st := requestStreamOf(ctx); st != nil {
		return &st.slot
	}
	return nil
}

// requestSpan is ctx with the span of its MCP request as the current
// span, so that what runs under it (the tool) becomes its child; ctx
// itself when there is none.
func requestSpan(ctx context.Context) context.Context {
	s := slotOf(ctx)
	if s == nil {
		return ctx
	}
	s.mu.Lock()
	span := s.span
	if !s.open {
		span = nil
	}
	s.mu.Unlock()
	if span == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, span)
}

// newRequestTelemetry is the request tracing of p; nil when p is nil.
func newRequestTelemetry(p *telemetry.Provider) *requestTelemetry {
	if p == nil {
		return nil
	}
	d, _ := mcpconv.NewServerOperationDuration(p.Meter()) // a no-op instrument on error
	return &requestTelemetry{tracer: p.Tracer(), prop: p.Propagator(), duration: d}
}

// addHooks makes s trace every request through tel.
func (tel *requestTelemetry) addHooks(s *mcpserver.MCPServer) {
	h := s.GetHooks()
	if h == nil {
		h = &mcpserver.Hooks{}
		mcpserver.WithHooks(h)(s)
	}
	h.AddBeforeAny(tel.start)
	h.AddOnSuccess(func(ctx context.Context, _ any, method mcp.MCPMethod, _ any, result any) {
		var failed []attribute.KeyValue
		if r, ok := result.(*mcp.CallToolResult); ok && r.IsError {
			failed = []attribute.KeyValue{semconv.ErrorTypeKey.String("tool_error")}
		}
		tel.end(ctx, failed, "")
	})
	h.AddOnError(func(ctx context.Context, _ any, _ mcp.MCPMethod, _ any, err error) {
		code := strconv.Itoa(mcp.INTERNAL_ERROR)
		if e, ok := err.(interface{ ToJSONRPCError() mcp.JSONRPCError }); ok {
			code = strconv.Itoa(e.ToJSONRPCError().Error.Code)
		}
		tel.end(ctx, []attribute.KeyValue{semconv.ErrorTypeKey.String(code), semconv.RPCResponseStatusCode(code)}, err.Error())
	})
}

// start begins the span of a request, under the trace context its
// _meta carries (traceparent, tracestate), else its HTTP headers'.
func (tel *requestTelemetry) start(ctx context.Context, id any, method mcp.MCPMethod, message any) {
	s := slotOf(ctx)
	if s == nil {
		return
	}
	name := string(method)
	attrs := make([]attribute.KeyValue, 0, 8)
	transport := semconv.NetworkTransportPipe
	if s.header != nil {
		transport = semconv.NetworkTransportTCP
	}
	attrs = append(attrs, semconv.McpMethodNameKey.String(name), transport)
	var meta *mcp.Meta
	if call, ok := message.(*mcp.CallToolRequest); ok {
		name += " " + call.Params.Name
		attrs = append(attrs, semconv.GenAIToolName(call.Params.Name), semconv.GenAIOperationNameExecuteTool)
		meta = call.Params.Meta
	}
	parent := ctx
	if carrier := metaCarrier(meta); carrier != nil {
		parent = tel.prop.Extract(ctx, carrier)
	} else if s.header != nil {
		parent = tel.prop.Extract(ctx, propagation.HeaderCarrier(s.header))
	}
	if v := mcpserver.RequestProtocolVersion(ctx); v != "" {
		attrs = append(attrs, semconv.McpProtocolVersion(v))
	}
	metricAttrs := attrs
	spanAttrs := append(attrs[:len(attrs):len(attrs)], semconv.JSONRPCRequestID(formatRequestID(id)))
	if sid := sessionID(ctx); sid != "" {
		spanAttrs = append(spanAttrs, semconv.McpSessionID(sid))
	}
	var span trace.Span
	if tel.tracer != nil {
		_, span = tel.tracer.Start(parent, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(spanAttrs...))
	}
	s.mu.Lock()
	s.open, s.span, s.started, s.attrs = true, span, time.Now(), metricAttrs
	s.mu.Unlock()
}

// end ends the span of the request of ctx, if it is still open, with
// the attributes of a failure (none: it succeeded), and records its
// duration.
func (tel *requestTelemetry) end(ctx context.Context, failed []attribute.KeyValue, msg string) {
	s := slotOf(ctx)
	if s == nil {
		return
	}
	s.mu.Lock()
	open, span, started, attrs := s.open, s.span, s.started, s.attrs
	s.open, s.span = false, nil
	s.mu.Unlock()
	if !open {
		return
	}
	if len(failed) > 0 {
		attrs = append(attrs[:len(attrs):len(attrs)], failed...)
	}
	if span != nil {
		if len(failed) > 0 {
			span.SetAttributes(failed...)
			span.SetStatus(codes.Error, msg)
		}
		span.End()
	}
	tel.duration.Inst().Record(ctx, time.Since(started).Seconds(), metric.WithAttributes(attrs...))
}

// metaCarrier is the W3C trace context of a request's _meta, nil when it
// carries no well-formed traceparent.
func metaCarrier(meta *mcp.Meta) propagation.MapCarrier {
	if meta == nil {
		return nil
	}
	tp, _ := meta.AdditionalFields[MetaTraceparent].(string)
	if _, ok := Traceparent(tp); !ok {
		return nil
	}
	c := propagation.MapCarrier{"traceparent": tp}
	if ts, ok := meta.AdditionalFields[MetaTracestate].(string); ok {
		c["tracestate"] = ts
	}
	if b, ok := meta.AdditionalFields["baggage"].(string); ok {
		c["baggage"] = b
	}
	return c
}

// traceOf puts the trace and span of ctx's current span on actor, for
// the audit entries of its call, and returns them ("" when there is no
// valid span: telemetry off).
func traceOf(ctx context.Context, actor *ledger.Actor) (traceID, spanID string) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return "", ""
	}
	traceID, spanID = sc.TraceID().String(), sc.SpanID().String()
	actor.TraceID, actor.SpanID = traceID, spanID
	return traceID, spanID
}
