package tools

import (
	"context"
	"errors"

	"idemgate/ledger"
)

var specDecideApproval = Spec{
	Name:         "decide_approval",
	ApproverOnly: true,
	Title:        "Approve or reject a pending operation",
	Description: "For approvers: approve or reject one pending approval of your tenant. approve runs the operation exactly as its diff showed, once, and returns the operation's outcome; reject records your comment and nothing runs. " +
		"An approval is single use and bound to that exact request; if the order changed since the diff was computed, the operation fails with precondition_failed and nothing is applied. You cannot approve your own requests.",
	Idempotent: true, Destructive: true, OpenWorld: false,
}

// decideApprovalTool is Decide as a tool.
func decideApprovalTool() descriptor {
	return define(specDecideApproval, (*Service).decideApproval, nil)
}

func (s *Service) decideApproval(ctx context.Context, c *call, a DecideRequest) *Response {
	if err := s.requireApprover(c.actor); err != nil {
		return answerOf(err)
	}
	id, approve, comment := a.ApprovalID, a.Decision == Approve, a.Comment
	rec, err := s.ledger.ApprovalRecord(ctx, c.actor.Tenant, id)
	if errors.Is(err, ledger.ErrNotFound) {
		return notFoundApproval(id)
	}
	if err != nil {
		return s.ledgerError(c, err)
	}
	var apply ledger.ApplyFunc
	run, external, err := s.external(rec.Tool, rec.Tenant, rec.Args)
	if err != nil {
		return s.ledgerError(c, err)
	}
	if approve && rec.State == ledger.StateAwaitingApproval && !external {
		eff := s.effectOf(rec.Tool)
		if eff == nil {
			s.log.Error("no applier for held tool", "tool", rec.Tool, "key", rec.Key)
			return internalError(rec.Key)
		}
		if apply, err = eff.applier(s, rec.Tenant, rec.Args, nil); err != nil {
			return s.ledgerError(c, err)
		}
		apply = audited(s.downstream(rec.Tool), apply)
	}
	if external && approve && rec.State == ledger.StateAwaitingApproval && rec.Approval != nil && rec.Approval.Rule == "rerun_after_unknown" {
		// Look once more before re-sending: a late commit of the lost
		// attempt must not be duplicated by the approved re-run.
		trace := &httpTrace{}
		if out, what, lerr := s.lookupOutcome(withHTTPTrace(ctx, trace), rec); lerr == nil {
			out.Call = trace.downstreamCall(s.systemOf(rec.Tool), rec.Attempts)
			noteOrder(out.Call, out.Result)
			auditedAlso(&out)
			settled, serr := s.ledger.Settle(ctx, ledger.SettleRequest{Actor: c.actor, Key: rec.Key, From: []ledger.State{ledger.StateAwaitingApproval}, Outcome: out,
				Why: "reconciled at approval: the downstream has " + what + " for this key; nothing re-sent"})
			if serr == nil {
				s.outbox.Kick()
				return fromRecord(settled)
			}
		}
	}
	d, err := s.ledger.Decide(ctx, ledger.DecideRequest{Approver: c.actor, ApprovalID: id, Approve: approve, Comment: comment, Downstream: s.downstream(rec.Tool)}, apply)
	if err == nil && d.Kind == ledger.DecisionClaimed {
		// An external downstream: the approval claimed it; call out now.
		d = s.runClaimed(ctx, c.actor, d.Record, run, nil)
	}
	switch {
	case err == nil:
		if d.Record.State == ledger.StateSucceeded {
			s.outbox.Kick()
		}
		return fromRecord(d.Record)
	case errors.Is(err, ledger.ErrNotFound):
		return notFoundApproval(id)
	case errors.Is(err, ledger.ErrDownstreamMismatch):
		c.req.OperationKey = rec.Key
		return s.ledgerError(c, err)
	case errors.Is(err, ledger.ErrSelfApproval):
		return errorResponse(rec.Key, ledger.StateAwaitingApproval, CodeForbidden,
			"You requested this operation yourself; another approver must decide it.", NextDoNotRetry)
	case errors.Is(err, ledger.ErrApprovalExpired):
		r := fromRecord(d.Record)
		r.Error = opError(CodeApprovalRequired, "This approval expired before your decision; the operation was rejected (approval_expired) and nothing ran. The requester must ask again under a new operation_key if it is still wanted.")
		r.IsError = true
		return r
	case errors.Is(err, ledger.ErrAlreadyDecided):
		// Another approver was first: answer with what was recorded.
		r := fromRecord(d.Record)
		r.Replayed = true
		return r
	}
	return s.ledgerError(c, err)
}

func notFoundApproval(id string) *Response {
	return errorResponse("", ledger.StateRejected, CodeNotFound,
		"There is no approval "+id+" in your tenant. list_pending_approvals shows the pending ones.", NextFixRetry)
}
