package tools

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"idemgate/approvals"
	"idemgate/ledger"
)

// The approvals API: one typed entry per thing an approver or operator
// does, used by the MCP tools (list_pending_approvals, decide_approval,
// resolve_operation, reconcile_operation are thin wrappers over it), the
// command line and any other front end. Every method checks the actor's
// role itself, so no caller can skip the check.

// Error is a request the service refused or could not serve. Answer is
// exactly what the equivalent tool call answers; Code is its error code.
// Methods returning an error return an *Error (see errors.As).
type Error struct{ answer *Response }

func (e *Error) Error() string { return e.answer.Error.Code + ": " + e.answer.Error.Message }

// Code is the error's documented code.
func (e *Error) Code() Code { return Code(e.answer.Error.Code) }

// Answer is the error as a tool call answers it.
func (e *Error) Answer() *Response { return e.answer }

// answerOf is the answer to a failed API call (err is an *Error, or a bug).
func answerOf(err error) *Response {
	var e *Error
	if errors.As(err, &e) {
		return e.answer
	}
	return internalError("")
}

// ApprovalView is what an approver sees of one held operation. Its JSON
// is the approval object of list_pending_approvals (fields in name order).
type ApprovalView struct {
	ApprovalID          string          `json:"approval_id"`
	Comment             *string         `json:"comment,omitempty"` // set once decided
	CreatedAt           time.Time       `json:"created_at"`
	DecidedAt           *time.Time      `json:"decided_at,omitempty"` // set once decided
	DecidedBy           string          `json:"decided_by,omitempty"`
	Diff                json.RawMessage `json:"diff"`
	DiffText            string          `json:"diff_text"`
	EarlierOperationKey string          `json:"earlier_operation_key,omitempty"`
	ExpiresAt           time.Time       `json:"expires_at"`
	OperationKey        string          `json:"operation_key"`
	Reason              string          `json:"reason"`
	RequestedBy         string          `json:"requested_by"`
	// Resource is what the operation acts on as it was when asked: the
	// order a change or a cancel is for (ledger.Approval.Resource).
	Resource        json.RawMessage `json:"resource,omitempty"`
	ResourceVersion int             `json:"resource_version,omitempty"`
	Rule            string          `json:"rule"`
	Status          string          `json:"status"`
	Tool            string          `json:"tool"`
	// Total is the order's total once the operation is done: a create's,
	// a change's new total, the total of the order a cancel is for. Nil
	// when the operation has no order total, or when it is not known (a
	// change or a cancel recorded before Resource was kept).
	Total *approvals.Total `json:"total,omitempty"`
}

// approvalView is what an approver sees of rec (which holds an approval).
func approvalView(rec *ledger.Record) ApprovalView {
	a := rec.Approval
	v := ApprovalView{
		ApprovalID: a.ID, Status: a.Status, OperationKey: rec.Key, Tool: rec.Tool,
		RequestedBy: a.RequestedBy, Reason: a.Reason, Rule: a.Rule,
		CreatedAt: a.CreatedAt, ExpiresAt: a.ExpiresAt,
		Diff: a.Diff, DiffText: a.DiffText,
		ResourceVersion: a.ResourceVersion, EarlierOperationKey: a.EarlierKey,
		Resource: a.Resource, Total: approvalTotal(a),
	}
	if a.DecidedBy != "" {
		at, comment := a.DecidedAt, a.Comment
		v.DecidedBy, v.DecidedAt, v.Comment = a.DecidedBy, &at, &comment
	}
	return v
}

// approvalTotal is the order total a decides on, read from its structured
// diff and resource: the diff's new total_minor and currency (a create, a
// change of the items), else the resource's (a cancel, a change that
// keeps the total). Nil when neither says both.
func approvalTotal(a *ledger.Approval) *approvals.Total {
	var (
		amount   *int64
		currency string
	)
	var res struct {
		TotalMinor *int64 `json:"total_minor"`
		Currency   string `json:"currency"`
	}
	if len(a.Resource) > 0 && json.Unmarshal(a.Resource, &res) == nil {
		amount, currency = res.TotalMinor, res.Currency
	}
	var changes []struct {
		Path  string          `json:"path"`
		After json.RawMessage `json:"after"`
	}
	if len(a.Diff) > 0 && json.Unmarshal(a.Diff, &changes) == nil {
		for _, c := range changes {
			switch c.Path {
			case "total_minor":
				var n int64
				if json.Unmarshal(c.After, &n) == nil && string(c.After) != "null" {
					amount = &n
				}
			case "currency":
				var cur string
				if json.Unmarshal(c.After, &cur) == nil && cur != "" {
					currency = cur
				}
			}
		}
	}
	if amount == nil || currency == "" {
		return nil
	}
	return &approvals.Total{AmountMinor: *amount, Currency: currency}
}

// ListApprovalsRequest asks for one page of the pending approvals.
type ListApprovalsRequest struct {
	// Limit is the page size, 1 to 100 (20 when 0).
	Limit int `json:"limit"`
	// Cursor is the NextCursor of the previous page, "" for the first.
	Cursor string `json:"cursor"`
}

// ApprovalList is one page of pending approvals, oldest first.
type ApprovalList struct {
	Approvals []ApprovalView `json:"approvals"`
	Count     int            `json:"count"`
	// NextCursor, when not "", asks for the next page.
	NextCursor string `json:"next_cursor,omitempty"`
}

// maxApprovalsPage bounds ListApprovalsRequest.Limit (the schema's maximum).
const maxApprovalsPage = 100

// ListApprovals returns a page of the pending approvals of actor's tenant,
// oldest first. Errors (*Error): forbidden without the approver role,
// invalid_arguments for a cursor not made by this listing, internal.
func (s *Service) ListApprovals(ctx context.Context, actor ledger.Actor, req ListApprovalsRequest) (*ApprovalList, error) {
	if err := s.requireApprover(actor); err != nil {
		return nil, err
	}
	limit := req.Limit
	if limit < 1 {
		limit = 20
	}
	limit = min(limit, maxApprovalsPage)
	query := []string{"list_pending_approvals", actor.Tenant}
	var after string
	if req.Cursor != "" {
		pos, err := DecodeCursor(req.Cursor, query)
		if err != nil {
			return nil, &Error{errorResponse("", ledger.StateRejected, CodeInvalidArguments, "cursor: "+err.Error()+".", NextFixRetry)}
		}
		after = string(pos)
	}
	recs, err := s.ledger.PendingApprovals(ctx, actor.Tenant, after, limit+1)
	if err != nil {
		return nil, &Error{s.failed(specListPendingApprovals.Name, "", err)}
	}
	out := &ApprovalList{Approvals: make([]ApprovalView, 0, min(len(recs), limit))}
	if len(recs) > limit {
		recs = recs[:limit]
		out.NextCursor = EncodeCursor(query, []byte(ledger.ApprovalPosition(recs[limit-1])))
	}
	for _, rec := range recs {
		out.Approvals = append(out.Approvals, approvalView(rec))
	}
	out.Count = len(out.Approvals)
	return out, nil
}

// ShowApproval returns one approval of actor's tenant, pending or decided.
// Errors (*Error): forbidden without the approver role, not_found,
// internal.
func (s *Service) ShowApproval(ctx context.Context, actor ledger.Actor, id string) (*ApprovalView, error) {
	if !isApprover(actor) {
		return nil, &Error{errorResponse("", ledger.StateRejected, CodeForbidden, "Only principals with the approver role may see approvals.", NextDoNotRetry)}
	}
	rec, err := s.ledger.ApprovalRecord(ctx, actor.Tenant, id)
	if errors.Is(err, ledger.ErrNotFound) {
		return nil, &Error{notFoundApproval(id)}
	}
	if err != nil {
		s.log.Error("ledger", "approval", id, "err", err)
		return nil, &Error{internalError("")}
	}
	v := approvalView(rec)
	return &v, nil
}

// Decision is an approver's answer to an approval.
type Decision string

// The decisions.
const (
	Approve Decision = "approve"
	Reject  Decision = "reject"
)

// DecideRequest decides one pending approval.
type DecideRequest struct {
	ApprovalID string   `json:"approval_id"`
	Decision   Decision `json:"decision"`
	// Comment is recorded in the audit log (at most 1000 characters).
	Comment string `json:"comment,omitempty"`
}

// Decide approves or rejects one pending approval of actor's tenant, as
// the decide_approval tool does (the request is validated by its schema
// and the call audited): approving runs the operation once and answers
// its outcome; rejecting records the comment and runs nothing.
func (s *Service) Decide(ctx context.Context, actor ledger.Actor, req DecideRequest) *Response {
	return s.Call(ctx, actor, specDecideApproval.Name, argsOf(req), nil)
}

// ResolveRequest settles an unknown operation by hand.
type ResolveRequest struct {
	OperationKey string `json:"operation_key"`
	// Outcome is "succeeded" or "not_executed".
	Outcome string `json:"outcome"`
	// Evidence is what the approver checked (kept in the audit log).
	Evidence string `json:"evidence"`
	// DownstreamRef is the order system's id of what was done, if any.
	DownstreamRef string `json:"downstream_ref,omitempty"`
}

// Resolve settles an unknown operation of actor's tenant by hand, as the
// resolve_operation tool does (validated by its schema, audited).
func (s *Service) Resolve(ctx context.Context, actor ledger.Actor, req ResolveRequest) *Response {
	return s.Call(ctx, actor, specResolveOperation.Name, argsOf(req), nil)
}

// ReconcileRequest asks what became of one operation.
type ReconcileRequest struct {
	OperationKey string `json:"operation_key"`
}

// Reconcile asks the order system what became of an unknown operation of
// actor's tenant and settles it, as the reconcile_operation tool does.
func (s *Service) Reconcile(ctx context.Context, actor ledger.Actor, req ReconcileRequest) *Response {
	return s.Call(ctx, actor, specReconcileOperation.Name, argsOf(req), nil)
}

// argsOf is a typed request as the arguments of a tool call: the map an
// MCP client's JSON decodes to, so that Call validates it exactly as it
// validates a client's call.
func argsOf(req any) map[string]any {
	var m map[string]any
	if err := json.Unmarshal(mustJSON(req), &m); err != nil {
		panic(err) // a struct marshals to an object
	}
	return m
}
