package tools

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"idemgate/ledger"
	"idemgate/telemetry"
)

// What a traced call adds to its trace (Options.Telemetry): idemgate's
// attributes on the call's span (the MCP request's, which the server
// starts), and child spans for the ledger's transactions, the wait of a
// duplicate and — through the order API client's transport — every
// downstream HTTP request. Untraced, none of this runs: c.span is nil and
// startSpan returns a no-op span without touching the context.

// The attributes of a call's span, beside the MCP conventions' own.
const (
	AttrOperationKey = attribute.Key("idemgate.operation_key")
	AttrTenant       = attribute.Key("idemgate.tenant")
	AttrStateBefore  = attribute.Key("idemgate.state_before")
	AttrStateAfter   = attribute.Key("idemgate.state_after")
	AttrReplayed     = attribute.Key("idemgate.replayed")
	AttrDecision     = attribute.Key("idemgate.decision")
	AttrErrorCode    = attribute.Key("idemgate.error_code")
	// AttrLedgerDecision is on a ledger span: what the ledger decided
	// (ledger.DecisionKind).
	AttrLedgerDecision = attribute.Key("idemgate.ledger.decision")
)

// The decisions a call's span names (AttrDecision).
const (
	DecisionExecuted = "executed" // it ran (or was recorded running) now, for this call
	DecisionReplayed = "replayed" // answered from the record of an earlier call
	DecisionRefused  = "refused"  // refused: arguments, policy, key reused with another request
	DecisionHeld     = "held"     // waiting for a human's approval
	DecisionUnknown  = "unknown"  // its outcome is not known yet (unknown, or still in progress)
)

// Telemetry is the telemetry the service was built with (nil: off).
func (s *Service) Telemetry() *telemetry.Provider { return s.opts.Telemetry }

// startSpan starts the child span name of ctx's span when the service
// traces, and returns ctx with it; ctx and a no-op span otherwise.
func (s *Service) startSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	if s.tracer == nil {
		return ctx, noop.Span{}
	}
	return s.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindInternal))
}

// endLedgerSpan ends the span of a ledger call that decided d or failed
// with err.
func endLedgerSpan(span trace.Span, d ledger.Decision, err error) {
	if span.IsRecording() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else if d.Kind != "" {
			span.SetAttributes(AttrLedgerDecision.String(string(d.Kind)))
		}
	}
	span.End()
}

// endRecordSpan ends the span of a ledger call that left rec or failed
// with err.
func endRecordSpan(span trace.Span, rec *ledger.Record, err error) {
	if span.IsRecording() && err == nil && rec != nil {
		span.SetAttributes(AttrStateAfter.String(string(rec.State)))
	}
	endLedgerSpan(span, ledger.Decision{}, err)
}

// traced is what a traced call notes for its span.
type traced struct {
	span trace.Span // the call's (its MCP request's)
	// before is the state the call found its operation in, once the
	// ledger's first decision noted it (noted).
	before ledger.State
	noted  bool
}

// noteBefore records, from the first decision a call got from the
// ledger, the state the call found its operation in: none for a new
// operation, retryable for a re-run (a claim of an operation attempted
// before), the record's state for any other decision.
func (c *call) noteBefore(d ledger.Decision) {
	t := c.traced
	if t == nil || t.noted || d.Record == nil {
		return
	}
	t.noted = true
	switch d.Kind {
	case ledger.DecisionExecuted, ledger.DecisionClaimed, ledger.DecisionApprovalRequested, ledger.DecisionSuspectedDuplicate:
		if d.Record.Attempts > 1 {
			t.before = ledger.StateRetryable
		}
	default:
		t.before = d.Record.State
	}
}

// annotate puts what the call decided on its span (traced calls only).
func (c *call) annotate(sideEffect bool, resp *Response) {
	t := c.traced
	if t == nil || !t.span.IsRecording() || resp == nil {
		return
	}
	key := resp.OperationKey
	if key == "" && c.req != nil {
		key = c.req.OperationKey
	}
	if key == "" && c.refused != nil {
		key = c.refused.key
	}
	attrs := make([]attribute.KeyValue, 0, 7)
	attrs = append(attrs, AttrTenant.String(c.actor.Tenant), AttrStateAfter.String(string(resp.Status)), AttrReplayed.Bool(resp.Replayed))
	if key != "" {
		attrs = append(attrs, AttrOperationKey.String(key))
	}
	if t.before != "" {
		attrs = append(attrs, AttrStateBefore.String(string(t.before)))
	}
	if resp.Error != nil {
		attrs = append(attrs, AttrErrorCode.String(resp.Error.Code))
	}
	if d := c.decision(sideEffect, resp); d != "" {
		attrs = append(attrs, AttrDecision.String(d))
	}
	t.span.SetAttributes(attrs...)
}

// decision is what the call decided, for its span: one of the Decision
// constants; "" for a read-only tool's call that was not refused.
func (c *call) decision(sideEffect bool, resp *Response) string {
	code := ""
	if resp.Error != nil {
		code = resp.Error.Code
	}
	switch {
	case c.refused != nil, code == string(CodeInvalidArguments), code == string(CodeForbidden), code == string(CodeKeyReused):
		return DecisionRefused
	case !sideEffect:
		return ""
	case resp.Replayed:
		return DecisionReplayed
	case resp.Status == ledger.StateAwaitingApproval:
		return DecisionHeld
	case resp.Status == ledger.StateUnknown, resp.Status == ledger.StateInProgress:
		return DecisionUnknown
	}
	return DecisionExecuted
}
