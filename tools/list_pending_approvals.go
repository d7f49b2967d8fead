package tools

import (
	"context"

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

// listPendingApprovalsTool is ListApprovals as a tool.
func listPendingApprovalsTool() descriptor {
	return define(specListPendingApprovals, (*Service).listPendingApprovals, nil)
}

func (s *Service) listPendingApprovals(ctx context.Context, c *call, a ListApprovalsRequest) *Response {
	list, err := s.ListApprovals(ctx, c.actor, a)
	if err != nil {
		return answerOf(err)
	}
	return readResponse(list)
}

// isApprover reports whether a holds the approver role.
func isApprover(a ledger.Actor) bool { return approvals.CheckApprover(a) == nil }

// requireApprover refuses callers without the approver role (an *Error).
// Hidden tools are also refused by the server's tool filter; this check
// keeps the command line and any other caller honest.
func (s *Service) requireApprover(a ledger.Actor) error {
	if !isApprover(a) {
		return &Error{errorResponse("", ledger.StateRejected, CodeForbidden, "Only principals with the approver role may see or decide approvals.", NextDoNotRetry)}
	}
	return nil
}
