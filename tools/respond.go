package tools

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
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
	NextAction   NextAction       `json:"next_action"`
	Attempts     int              `json:"attempts,omitempty"`
	FirstSeenAt  *time.Time       `json:"first_seen_at,omitempty"`
	CompletedAt  *time.Time       `json:"completed_at,omitempty"`
	IsError      bool             `json:"-"`
	// encoded caches the JSON of the finished response (Encoded).
	encoded []byte
	// marshaled is a ledger record's result (fromRecord): JSON that
	// json.Marshal wrote, which Encoded copies as it is while Result
	// holds these very bytes.
	marshaled json.RawMessage
}

// Encoded is the response's JSON — the text the server sends and the
// bytes the audit's response_sha256 digests — encoded once per response
// and kept. It is for a finished response: Service.Call's answer, not to
// be changed afterwards.
func (r *Response) Encoded() ([]byte, error) {
	if r.encoded == nil {
		b, err := r.encode()
		if err != nil {
			return nil, err
		}
		r.encoded = b
	}
	return r.encoded, nil
}

// encode is json.Marshal(r). A result that json.Marshal wrote (a ledger
// record's: the record's encoding compacts and escapes it) is what
// json.Marshal would write of it again, so it is put in as it is instead
// of being validated and compacted a second time — a replay's saved
// result, the bulk of its answer.
func (r *Response) encode() ([]byte, error) {
	res := r.Result
	if len(res) == 0 || len(r.marshaled) != len(res) || &r.marshaled[0] != &res[0] {
		return json.Marshal(r)
	}
	c := *r
	c.Result = json.RawMessage(`0`)
	b, err := json.Marshal(&c)
	if err != nil {
		return nil, err
	}
	// The field after replayed: no string holds this text unescaped.
	const mark = `,"result":0`
	i := bytes.Index(b, []byte(mark))
	if i < 0 {
		return json.Marshal(r)
	}
	out := make([]byte, 0, len(b)+len(res))
	out = append(out, b[:i+len(mark)-1]...)
	out = append(out, res...)
	return append(out, b[i+len(mark):]...), nil
}

// errorCodes are the documented error codes as strings (Codes); a test
// keeps them equal to the error.code enum of schemas/result.json.
func errorCodes() []string {
	out := make([]string, 0, len(Codes()))
	for _, c := range Codes() {
		out = append(out, string(c))
	}
	return out
}

// documentedCode reports whether code is one of errorCodes.
func documentedCode(code string) bool { return slices.Contains(errorCodes(), code) }

// checked enforces the one rule every answer obeys: IsError holds exactly
// when Error is present, with a documented Code and a Message. An answer
// that breaks it is mended rather than sent: a missing error becomes the
// error its status implies, an undocumented code is replaced by that
// error's code (the original kept in the message), an empty message gets
// that error's message, and an error on a non-error answer is dropped. It
// reports whether anything had to be mended, so a caller that expected a
// well-formed answer can log the bug.
func checked(r *Response) (*Response, bool) {
	if r == nil {
		return internalError(""), true
	}
	switch {
	case r.IsError && r.Error == nil:
		r.Error = defaultError(r.Status)
		return r, true
	case r.IsError && !documentedCode(r.Error.Code):
		e := *r.Error
		e.Message = defaultError(r.Status).Message + " (" + e.Code + ": " + e.Message + ")"
		e.Code = defaultError(r.Status).Code
		r.Error = &e
		return r, true
	case r.IsError && r.Error.Message == "": // a tombstone keeps only the code
		e := *r.Error
		e.Message = defaultError(r.Status).Message
		r.Error = &e
		return r, true
	case !r.IsError && r.Error != nil:
		r.Error = nil
		return r, true
	}
	return r, false
}

// defaultError is the error an isError answer in status carries when
// nothing more specific is known.
func defaultError(status ledger.State) *ledger.OpError {
	switch status {
	case ledger.StateInProgress:
		return opError(CodeInProgress, msgInProgress)
	case ledger.StateUnknown:
		return opError(CodeOutcomeUnknown, msgUnknown)
	case ledger.StateAwaitingApproval:
		return opError(CodeApprovalRequired, "This operation is waiting for a human approver; nothing has run yet. Do not resend it under a new key: poll get_operation_status with this key.")
	case ledger.StateRetryable:
		return opError(CodeDownstreamError, msgRetryable)
	case ledger.StateFailed:
		return opError(CodeDownstreamError, "The operation failed and nothing was changed. Do not retry it; look at get_operation_status for details.")
	case ledger.StateRejected:
		return opError(CodeForbidden, "The operation was refused and nothing was executed. Do not retry it under any key.")
	}
	return opError(CodeInternal, "idemgate hit an internal error; it has been logged. Do not mint a new key: call get_operation_status with this operation_key to see whether anything ran, or call again later with the same key and arguments.")
}

// Messages shared by several answers.
const (
	msgInProgress = "Another call with this operation_key is still running. Do not mint a new key and do not resend with different arguments: call get_operation_status with this key in a few seconds, or repeat this exact call."
	msgUnknown    = "The outcome of this operation is unknown: it may or may not have taken effect. It will not be re-sent automatically. Do NOT retry under a new key — that is how duplicate orders happen. Check with get_operation_status or get_order/list_orders, or ask an operator to reconcile it."
	msgRetryable  = "The earlier attempt stopped before it could take effect (nothing happened); call again with the same key and arguments to run it."
)

func errorResponse(key string, status ledger.State, code Code, msg string, next NextAction) *Response {
	return &Response{OperationKey: key, Status: status, Error: opError(code, msg), NextAction: next, IsError: true}
}

func internalError(key string) *Response {
	return Internal(key, defaultError("").Message)
}

// Internal is the answer of a call under key that failed inside idemgate
// with msg, a message for the model: its outcome is not known here.
func Internal(key, msg string) *Response {
	return errorResponse(key, ledger.StateUnknown, CodeInternal, msg, NextWaitPoll)
}

// fromRecord fills the envelope fields every answer about rec shares. The
// answer is an error unless rec succeeded, and an error answer always
// carries an error: the record's own, or the one its state implies.
func fromRecord(rec *ledger.Record) *Response {
	r := &Response{OperationKey: rec.Key, Status: rec.State, Result: rec.Result, Error: rec.Error, Approval: answerApproval(rec.Approval), Attempts: rec.Attempts}
	// A record's result is JSON that json.Marshal wrote: the ledger
	// encodes a result it records (and every record) with it, and a
	// record read back holds those bytes.
	r.marshaled = rec.Result
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
	r, _ = checked(r)
	return r
}

// answerApproval is a record's approval as answers carry it: without
// Resource, the whole order a change or a cancel is for (its ship_to and
// note included). That is for approvers — the approvals API's ApprovalView
// shows it — not for every agent's answer, replay and status poll, and not
// in the published output schema's approval object. a is not changed.
func answerApproval(a *ledger.Approval) *ledger.Approval {
	if a == nil || a.Resource == nil {
		return a
	}
	c := *a
	c.Resource = nil
	return &c
}

// nextActionFor is the advice for a record in its state.
func nextActionFor(rec *ledger.Record) NextAction {
	switch rec.State {
	case ledger.StateSucceeded:
		return NextNone
	case ledger.StateFailed, ledger.StateRejected:
		return NextDoNotRetry
	case ledger.StateInProgress:
		return NextWaitPoll
	case ledger.StateAwaitingApproval:
		return NextAwait
	case ledger.StateUnknown:
		return NextReconcile
	case ledger.StateRetryable:
		return NextRetry
	}
	return NextWaitPoll
}

// respond turns a ledger decision into the answer of a side-effecting call.
// It is total: every decision about a record in any state gets an answer,
// and every error answer carries an error with a documented code.
func (s *Service) respond(d ledger.Decision) *Response {
	r := s.respondTo(d)
	if r, mended := checked(r); mended {
		s.log.Error("answer mended: isError without a documented error", "decision", d.Kind, "status", r.Status, "code", r.Error)
		return r
	}
	return r
}

func (s *Service) respondTo(d ledger.Decision) *Response {
	rec := d.Record
	if rec == nil {
		return internalError("")
	}
	switch d.Kind {
	case ledger.DecisionBusy, ledger.DecisionHeld, ledger.DecisionApprovalRequested, ledger.DecisionSuspectedDuplicate:
		// Nothing ran for this call and the record answers: a final one
		// is replayed whatever the decision said (it was read later), and
		// a busy record no longer in progress is held.
		switch {
		case rec.State.Final() && !rec.Tombstone:
			d.Kind = ledger.DecisionReplay
		case rec.State.Final():
			d.Kind = ledger.DecisionExpired
		case d.Kind == ledger.DecisionBusy && rec.State != ledger.StateInProgress:
			d.Kind = ledger.DecisionHeld
		}
	}
	switch d.Kind {
	case ledger.DecisionExecuted:
		return fromRecord(rec)
	case ledger.DecisionReplay:
		r := fromRecord(rec)
		r.Replayed = true
		return r
	case ledger.DecisionMismatch:
		r := errorResponse(rec.Key, ledger.StateRejected, CodeKeyReused,
			fmt.Sprintf("This operation_key already belongs to a different request (tool %s, state %s, first seen %s); nothing was executed. "+
				"If you meant to retry that earlier request, send exactly its arguments again. If this is a new intent, get a new key from new_operation_key.",
				rec.Tool, rec.State, rec.FirstSeenAt.UTC().Format(time.RFC3339)),
			NextNewKey)
		r.Error.Details = mustJSON(map[string]any{"existing_tool": rec.Tool, "existing_state": rec.State})
		return r
	case ledger.DecisionBusy:
		r := fromRecord(rec)
		r.Error = opError(CodeInProgress, msgInProgress)
		r.NextAction = NextWaitPoll
		r.IsError = true
		return r
	case ledger.DecisionHeld:
		r := fromRecord(rec)
		switch rec.State {
		case ledger.StateAwaitingApproval:
			r.Error = opError(CodeApprovalRequired, "This operation is waiting for a human approver (approval "+approvalID(rec)+"); nothing has run yet. Do not resend it under a new key: poll get_operation_status with this key.")
		case ledger.StateUnknown:
			r.Error = opError(CodeOutcomeUnknown, msgUnknown)
		case ledger.StateRetryable:
			if !CodeDownstreamError.Is(rec.Error) { // keep the attempt's own error (and its retry_after_seconds)
				r.Error = opError(CodeDownstreamError, msgRetryable)
			}
		case ledger.StateInProgress:
			r.Error = opError(CodeInProgress, msgInProgress)
		}
		r.IsError = true
		return r
	case ledger.DecisionApprovalRequested:
		r := fromRecord(rec)
		reason := "policy"
		if rec.Approval != nil {
			reason = rec.Approval.Reason
		}
		r.Error = opError(CodeApprovalRequired, "Held for a human approver: "+reason+
			". Nothing has run yet. An approver sees exactly this request (approval "+approvalID(rec)+") and approves or rejects it. "+
			"Do not resend it under a new key: repeat this exact call, or poll get_operation_status with this operation_key, to learn the outcome.")
		r.IsError = true
		return r
	case ledger.DecisionSuspectedDuplicate:
		r := fromRecord(rec)
		earlier := d.Earlier
		if earlier == nil {
			earlier = &ledger.Record{Key: "(unknown)"}
		}
		r.Error = opError(CodeApprovalRequired, fmt.Sprintf(
			"Nothing was executed: this request is identical to operation %s (state %s, %s) made moments ago under a different operation_key. "+
				"If this call is a retry of that same intent, call again with operation_key %s to get its result — never mint a new key for a retry. "+
				"If a second identical %s is really intended, a human approver must approve approval %s.",
			earlier.Key, earlier.State, earlier.FirstSeenAt.UTC().Format(time.RFC3339), earlier.Key, s.human(rec.Tool), approvalID(rec)))
		r.Error.Details = mustJSON(map[string]any{"earlier_operation_key": earlier.Key, "earlier_status": earlier.State, "earlier_result": earlier.Result})
		r.IsError = true
		return r
	case ledger.DecisionExpired:
		r := fromRecord(rec)
		r.Replayed = true
		r.Result = nil
		r.Error = opError(CodeKeyExpired, fmt.Sprintf(
			"This operation finished long ago (state %s, %s, completed %s) and its full result is no longer kept. It was NOT executed again. Do not retry; look the outcome up with get_order or list_orders.",
			rec.State, rec.Summary, rec.CompletedAt.UTC().Format(time.RFC3339)))
		r.Error.Details = mustJSON(map[string]any{"final_state": rec.State, "summary": rec.Summary})
		r.NextAction = NextDoNotRetry
		r.IsError = true
		return r
	}
	return internalError(rec.Key)
}

// approvalID is the id of rec's approval, or a placeholder when it has none.
func approvalID(rec *ledger.Record) string {
	if rec.Approval == nil {
		return "(none)"
	}
	return rec.Approval.ID
}
