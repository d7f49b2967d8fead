package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"sync"
	"time"

	"idemgate/ledger"
	"idemgate/orders"
	"idemgate/outbox"
)

// What the audit log learns from the tools: the policy check of a call,
// what its side effect did at the downstream, and what the client was sent.

// refusal is a call refused before the ledger was asked (invalid
// arguments, policy deny): its audit entry is written once the answer is
// known, with the answer's digest.
type refusal struct {
	code   Code
	detail string
	key    string // the operation_key as sent, even when it was the thing refused
}

// audit writes the entry that ends a tool call: a refusal's "call" entry,
// or the "answer" entry of a side-effecting tool (read-only tools are not
// audited) — unless the entry of the call's decision already carries
// resp (answered), so the call leaves one entry. It never fails the call:
// an answer that cannot be encoded is audited without a digest.
func (s *Service) audit(c *call, tool string, readOnly bool, resp *Response) {
	if readOnly && c.refused == nil {
		return
	}
	if c.early != nil && c.early.audited != nil && c.early.audited == resp {
		return
	}
	key := resp.OperationKey
	if key == "" && c.req != nil {
		key = c.req.OperationKey
	}
	e := ledger.AnswerEntry(c.actor, tool, key, c.answerOf(resp))
	if r := c.refused; r != nil {
		e.Event, e.Decision, e.ErrorCode, e.Detail = ledger.EventCall, ledger.AuditRefused, string(r.code), clipDetail(r.detail)
		e.Key, e.StateAfter, e.Attempt = r.key, "", 0
	}
	s.ledger.Audit(e)
}

// answerOf is what the audit records of resp, c's answer.
func (c *call) answerOf(resp *Response) ledger.Answer {
	a := ledger.Answer{State: resp.Status, Attempt: resp.Attempts, Replayed: resp.Replayed, DurationMS: ms(time.Since(c.started))}
	if c.policy.Action != "" {
		a.PolicyRule, a.PolicyAction = c.policy.Rule, c.policy.Action
	}
	if resp.Error != nil {
		a.ErrorCode = resp.Error.Code
	}
	if ap := resp.Approval; ap != nil {
		a.ApprovalID, a.ApprovalStatus, a.Approver = ap.ID, ap.Status, ap.DecidedBy
	}
	if b, err := resp.Encoded(); err == nil {
		sum := sha256.Sum256(b) // the bytes the server sends as the result's text
		a.ResponseSHA256 = hex.EncodeToString(sum[:])
	}
	return a
}

// early is the answer a call gave the ledger (ledger.Claim.Answer) for
// the audit entry of its decision to carry.
type early struct {
	kind ledger.DecisionKind
	rec  *ledger.Record
	resp *Response // nil: the last decision asked about was not final
	// audited is the answer the ledger's entry carried (answered): audit
	// writes no entry for it.
	audited *Response
}

// answerFor is the Claim.Answer of call c: for a decision that final
// says the call answers with respond(d) as it is, that answer (kept in
// c.early, to be sent as it was digested); nil for any other.
func (s *Service) answerFor(c *call, final func(ledger.Decision) bool) ledger.AnswerFunc {
	c.early = &early{}
	e := c.early
	return func(d ledger.Decision) *ledger.Answer {
		e.resp = nil
		if !final(d) {
			return nil
		}
		resp := s.respond(d)
		e.kind, e.rec, e.resp = d.Kind, d.Record, resp
		a := c.answerOf(resp)
		return &a
	}
}

// answered is the answer the ledger's audit entry of d carries
// (d.Answered, for the decision answerFor was last asked about), which
// the call must send as it is; nil when there is none.
func (c *call) answered(d ledger.Decision) *Response {
	e := c.early
	if e == nil || !d.Answered || e.resp == nil || e.kind != d.Kind || e.rec != d.Record {
		return nil
	}
	e.audited = e.resp
	return e.resp
}

func clipDetail(s string) string {
	if len(s) > 500 {
		return s[:500] + "…"
	}
	return s
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// recordingTx is a ledger.Tx that notes what an embedded side effect wrote:
// the order (id, version) and the outbox messages.
type recordingTx struct {
	ledger.Tx
	call *ledger.DownstreamCall
}

func (t *recordingTx) Put(collection, key string, value []byte) error {
	if err := t.Tx.Put(collection, key, value); err != nil {
		return err
	}
	switch collection {
	case orders.Collection:
		var o struct {
			OrderID string `json:"order_id"`
			Version int    `json:"version"`
		}
		if json.Unmarshal(value, &o) == nil {
			t.call.OrderID, t.call.Version = o.OrderID, o.Version
		}
	case outbox.Collection:
		if !slices.Contains(t.call.MessageIDs, key) {
			t.call.MessageIDs = append(t.call.MessageIDs, key)
		}
	}
	return nil
}

// audited wraps an embedded side effect so that its outcome carries what
// it wrote (Outcome.Call): system is "embedded" or "outbox".
func audited(system string, apply ledger.ApplyFunc) ledger.ApplyFunc {
	if apply == nil {
		return nil
	}
	return func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		started := time.Now()
		call := &ledger.DownstreamCall{System: system, Attempt: rec.Attempts}
		out, err := apply(&recordingTx{Tx: tx, call: call}, rec)
		call.DurationMS = ms(time.Since(started))
		if out.Call == nil {
			out.Call = call
		}
		return out, err
	}
}

// auditedAlso wraps an outcome's Also step so the messages it queues are
// added to the outcome's Call.
func auditedAlso(out *ledger.Outcome) {
	also := out.Also
	if also == nil || out.Call == nil {
		return
	}
	call := out.Call
	base := len(call.MessageIDs)
	out.Also = func(tx ledger.Tx) error {
		call.MessageIDs = call.MessageIDs[:base] // a re-run of the transaction starts over
		return also(&recordingTx{Tx: tx, call: call})
	}
}

// httpTrace collects the order API request of one downstream call, for
// the audit; the order API client reports to it when the context carries
// one (withHTTPTrace).
type httpTrace struct {
	mu       sync.Mutex
	method   string
	path     string
	status   int
	failure  string
	duration time.Duration
}

func withHTTPTrace(ctx context.Context, t *httpTrace) context.Context {
	return orders.WithObserver(ctx, t.note)
}

// note records one request's method, path, answer and duration; the last
// request of a call wins.
func (t *httpTrace) note(r orders.HTTPCall) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.method, t.path, t.status, t.failure, t.duration = r.Method, r.Path, r.Status, r.Failure, r.Duration
}

// downstreamCall is the trace as an audit record of attempt.
func (t *httpTrace) downstreamCall(system string, attempt int) *ledger.DownstreamCall {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.method == "" {
		return nil
	}
	return &ledger.DownstreamCall{System: system, Method: t.method, Path: t.path, Status: t.status,
		Attempt: attempt, DurationMS: ms(t.duration), Failure: t.failure}
}

// noteOrder copies the order id and version of an order API answer
// ({"order": {...}}) onto c.
func noteOrder(c *ledger.DownstreamCall, result json.RawMessage) {
	if c == nil || result == nil {
		return
	}
	var r struct {
		Order struct {
			OrderID string `json:"order_id"`
			Version int    `json:"version"`
		} `json:"order"`
	}
	if json.Unmarshal(result, &r) == nil {
		c.OrderID, c.Version = r.Order.OrderID, r.Order.Version
	}
}
