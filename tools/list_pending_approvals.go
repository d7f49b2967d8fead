package tools

import (
	"context"
	"errors"

	"idemgate/approvals"
	"idemgate/ledger"
)

var specListPendingApprovals = Spec{
	Name:         "list_pending_approvals",
	ApproverOnly: true,
	Title:        "List pending approvals",
	Description: "For approvers: the operations of your tenant waiting for a human decision, oldest first (at most limit, default 20; when more follow, the answer has next_cursor: pass it as cursor for the next page), each with what it would do — a structured diff (path, before, after) and the same as readable text — who requested it, why it needs approval, and when the request expires. " +
		"Decide with decide_approval. You cannot approve your own requests.",
	ReadOnly: true, Idempotent: true,
}

func (s *Service) listPendingApprovals(ctx context.Context, c *call) *Response {
	if r := s.requireApprover(c); r != nil {
		return r
	}
	limit := asInt(c.req.Args["limit"], 20)
	if limit < 1 {
		limit = 20
	}
	query := []string{"list_pending_approvals", c.actor.Tenant}
	var after string
	if cur, _ := c.req.Args["cursor"].(string); cur != "" {
		pos, err := DecodeCursor(cur, query)
		if err != nil {
			return errorResponse("", ledger.StateRejected, CodeInvalidArguments, "cursor: "+err.Error()+".", NextFixRetry)
		}
		after = string(pos)
	}
	recs, err := s.ledger.PendingApprovals(ctx, c.actor.Tenant, after, limit+1)
	if err != nil {
		return s.ledgerError(c, err)
	}
	var next string
	if len(recs) > limit {
		recs = recs[:limit]
		next = EncodeCursor(query, []byte(ledger.ApprovalPosition(recs[limit-1])))
	}
	list := make([]map[string]any, 0, len(recs))
	for _, rec := range recs {
		list = append(list, approvalView(rec))
	}
	out := map[string]any{"approvals": list, "count": len(list)}
	if next != "" {
		out["next_cursor"] = next
	}
	return readResponse(out)
}

// approvalView is what an approver sees of one held operation.
func approvalView(rec *ledger.Record) map[string]any {
	a := rec.Approval
	v := map[string]any{
		"approval_id": a.ID, "status": a.Status, "operation_key": rec.Key, "tool": rec.Tool,
		"requested_by": a.RequestedBy, "reason": a.Reason, "rule": a.Rule,
		"created_at": a.CreatedAt, "expires_at": a.ExpiresAt,
		"diff": a.Diff, "diff_text": a.DiffText,
	}
	if a.ResourceVersion != 0 {
		v["resource_version"] = a.ResourceVersion
	}
	if a.EarlierKey != "" {
		v["earlier_operation_key"] = a.EarlierKey
	}
	if a.DecidedBy != "" {
		v["decided_by"], v["decided_at"], v["comment"] = a.DecidedBy, a.DecidedAt, a.Comment
	}
	return v
}

// requireApprover refuses callers without the approver role. Hidden tools
// are also refused by the server's tool filter; this check keeps the
// command line and any other caller honest.
func (s *Service) requireApprover(c *call) *Response {
	if err := approvals.CheckApprover(c.actor); err != nil {
		return errorResponse("", ledger.StateRejected, CodeForbidden, "Only principals with the approver role may see or decide approvals.", NextDoNotRetry)
	}
	return nil
}

// ShowApproval returns one approval of the actor's tenant, pending or
// decided, for approvers.
func (s *Service) ShowApproval(ctx context.Context, actor ledger.Actor, id string) *Response {
	if err := approvals.CheckApprover(actor); err != nil {
		return errorResponse("", ledger.StateRejected, CodeForbidden, "Only principals with the approver role may see approvals.", NextDoNotRetry)
	}
	rec, err := s.ledger.ApprovalRecord(ctx, actor.Tenant, id)
	if errors.Is(err, ledger.ErrNotFound) {
		return notFoundApproval(id)
	}
	if err != nil {
		s.log.Error("ledger", "approval", id, "err", err)
		return internalError("")
	}
	return readResponse(map[string]any{"approval": approvalView(rec)})
}
