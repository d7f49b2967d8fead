package tools

import (
	"encoding/json"
	"fmt"
	"time"

	"idemgate/ledger"
)

// Response is the result envelope every tool answers with (DESIGN §4). The
// server publishes it as structuredContent and as JSON text; IsError marks
// results the model must act on.
type Response struct {
	OperationKey string           `json:"operation_key,omitempty"`
	Status       ledger.State     `json:"status"`
	Replayed     bool             `json:"replayed"`
	Result       json.RawMessage  `json:"result,omitempty"`
	Error        *ledger.OpError  `json:"error,omitempty"`
	Approval     *ledger.Approval `json:"approval,omitempty"`
	NextAction   string           `json:"next_action"`
	Attempts     int              `json:"attempts,omitempty"`
	FirstSeenAt  *time.Time       `json:"first_seen_at,omitempty"`
	CompletedAt  *time.Time       `json:"completed_at,omitempty"`
	IsError      bool             `json:"-"`
}

// The next actions a response can advise.
const (
	nextNone       = "none"
	nextWaitPoll   = "wait_and_poll_status"
	nextAwait      = "await_approval"
	nextReconcile  = "reconcile"
	nextFixRetry   = "fix_arguments_and_retry_same_key"
	nextNewKey     = "use_new_key_for_new_intent"
	nextDoNotRetry = "do_not_retry"
)

func errorResponse(key string, status ledger.State, code, msg, next string) *Response {
	return &Response{OperationKey: key, Status: status, Error: &ledger.OpError{Code: code, Message: msg}, NextAction: next, IsError: true}
}

func internalError(key string) *Response {
	return errorResponse(key, ledger.StateUnknown, "internal",
		"idemgate hit an internal error; it has been logged. Do not mint a new key: call get_operation_status with this operation_key to see whether anything ran, or call again later with the same key and arguments.",
		nextWaitPoll)
}

// fromRecord fills the envelope fields every answer about rec shares.
func fromRecord(rec *ledger.Record) *Response {
	r := &Response{OperationKey: rec.Key, Status: rec.State, Result: rec.Result, Error: rec.Error, Approval: rec.Approval, Attempts: rec.Attempts}
	if !rec.FirstSeenAt.IsZero() {
		t := rec.FirstSeenAt
		r.FirstSeenAt = &t
	}
	if !rec.CompletedAt.IsZero() {
		t := rec.CompletedAt
		r.CompletedAt = &t
	}
	r.NextAction = nextActionFor(rec)
	r.IsError = rec.State != ledger.StateSucceeded
	return r
}

// nextActionFor is the advice for a record in its state.
func nextActionFor(rec *ledger.Record) string {
	switch rec.State {
	case ledger.StateSucceeded:
		return nextNone
	case ledger.StateFailed, ledger.StateRejected:
		return nextDoNotRetry
	case ledger.StateInProgress:
		return nextWaitPoll
	case ledger.StateAwaitingApproval:
		return nextAwait
	case ledger.StateUnknown:
		return nextReconcile
	case ledger.StateRetryable:
		return nextFixRetry
	}
	return nextWaitPoll
}

// respond turns a ledger decision into the answer of a side-effecting call.
func (s *Service) respond(d ledger.Decision) *Response {
	rec := d.Record
	switch d.Kind {
	case ledger.DecisionExecuted:
		return fromRecord(rec)
	case ledger.DecisionReplay:
		r := fromRecord(rec)
		r.Replayed = true
		return r
	case ledger.DecisionMismatch:
		r := errorResponse(rec.Key, ledger.StateRejected, "key_reused_with_different_request",
			fmt.Sprintf("This operation_key already belongs to a different request (tool %s, state %s, first seen %s); nothing was executed. "+
				"If you meant to retry that earlier request, send exactly its arguments again. If this is a new intent, get a new key from new_operation_key.",
				rec.Tool, rec.State, rec.FirstSeenAt.UTC().Format(time.RFC3339)),
			nextNewKey)
		r.Error.Details = mustJSON(map[string]any{"existing_tool": rec.Tool, "existing_state": rec.State})
		return r
	case ledger.DecisionBusy:
		r := fromRecord(rec)
		r.Error = &ledger.OpError{Code: "operation_in_progress", Message: "Another call with this operation_key is still running. Do not mint a new key and do not resend with different arguments: call get_operation_status with this key in a few seconds, or repeat this exact call."}
		r.IsError = true
		return r
	case ledger.DecisionHeld:
		r := fromRecord(rec)
		switch rec.State {
		case ledger.StateAwaitingApproval:
			r.Error = &ledger.OpError{Code: "approval_required", Message: "This operation is waiting for a human approver (approval " + rec.Approval.ID + "); nothing has run yet. Do not resend it under a new key: poll get_operation_status with this key."}
		case ledger.StateUnknown:
			r.Error = &ledger.OpError{Code: "outcome_unknown", Message: "The outcome of this operation is unknown: it may or may not have taken effect. It will not be re-sent automatically. Do NOT retry under a new key — that is how duplicate orders happen. Check with get_operation_status or get_order/list_orders, or ask an operator to reconcile it."}
		case ledger.StateRetryable:
			r.Error = &ledger.OpError{Code: "downstream_error", Message: "The earlier attempt stopped before it could take effect (nothing happened); call again with the same key and arguments to run it."}
		}
		r.IsError = true
		return r
	case ledger.DecisionApprovalRequested:
		r := fromRecord(rec)
		r.Error = &ledger.OpError{Code: "approval_required", Message: "Held for a human approver: " + rec.Approval.Reason +
			". Nothing has run yet. An approver sees exactly this request (approval " + rec.Approval.ID + ") and approves or rejects it. " +
			"Do not resend it under a new key: repeat this exact call, or poll get_operation_status with this operation_key, to learn the outcome."}
		r.IsError = true
		return r
	case ledger.DecisionSuspectedDuplicate:
		r := fromRecord(rec)
		earlier := d.Earlier
		r.Error = &ledger.OpError{Code: "approval_required", Message: fmt.Sprintf(
			"Nothing was executed: this request is identical to operation %s (state %s, %s) made moments ago under a different operation_key. "+
				"If this call is a retry of that same intent, call again with operation_key %s to get its result — never mint a new key for a retry. "+
				"If a second identical %s is really intended, a human approver must approve approval %s.",
			earlier.Key, earlier.State, earlier.FirstSeenAt.UTC().Format(time.RFC3339), earlier.Key, humanTool(rec.Tool), rec.Approval.ID)}
		r.Error.Details = mustJSON(map[string]any{"earlier_operation_key": earlier.Key, "earlier_status": earlier.State, "earlier_result": earlier.Result})
		r.IsError = true
		return r
	case ledger.DecisionExpired:
		r := fromRecord(rec)
		r.Replayed = true
		r.Result = nil
		r.Error = &ledger.OpError{Code: "key_expired", Message: fmt.Sprintf(
			"This operation finished long ago (state %s, %s, completed %s) and its full result is no longer kept. It was NOT executed again. Do not retry; look the outcome up with get_order or list_orders.",
			rec.State, rec.Summary, rec.CompletedAt.UTC().Format(time.RFC3339))}
		r.Error.Details = mustJSON(map[string]any{"final_state": rec.State, "summary": rec.Summary})
		r.NextAction = nextDoNotRetry
		r.IsError = true
		return r
	}
	return internalError(rec.Key)
}

func humanTool(name string) string {
	switch name {
	case "create_order":
		return "order"
	case "send_notification":
		return "notification"
	}
	return name
}
