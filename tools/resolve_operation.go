package tools

import (
	"context"
	"errors"

	"idemgate/ledger"
	"idemgate/orders"
)

var specResolveOperation = Spec{
	Name:         "resolve_operation",
	ApproverOnly: true,
	Title:        "Settle an unknown operation by hand",
	Description: "For approvers: settle an operation whose outcome is unknown, with evidence (what you checked, e.g. the order system's admin screen or a carrier's record). " +
		"outcome succeeded records it as done (give downstream_ref, e.g. the order id you found); not_executed records that it provably did not happen and makes it retryable under the same key. The evidence is kept in the audit log. You cannot settle your own requests.",
	Idempotent: true, Destructive: true, OpenWorld: false,
}

// resolveOperationTool is Resolve as a tool.
func resolveOperationTool() descriptor {
	return define(specResolveOperation, (*Service).resolveOperation, nil)
}

func (s *Service) resolveOperation(ctx context.Context, c *call, a ResolveRequest) *Response {
	if err := s.requireApprover(c.actor); err != nil {
		return answerOf(err)
	}
	key := c.req.OperationKey
	rec, err := s.ledger.Get(ctx, c.actor.Tenant, key)
	if errors.Is(err, ledger.ErrNotFound) {
		return errorResponse(key, ledger.StateRejected, CodeNotFound, "No operation with this operation_key exists in your tenant.", NextFixRetry)
	}
	if err != nil {
		return s.ledgerError(c, err)
	}
	if ledger.SamePrincipal(rec.Principal, c.actor.Principal) {
		return errorResponse(key, rec.State, CodeForbidden,
			"You requested this operation yourself; another approver must settle it.", NextDoNotRetry)
	}
	outcome, evidence, ref := a.Outcome, a.Evidence, a.DownstreamRef
	req := ledger.SettleRequest{
		Actor: c.actor, Key: key, From: []ledger.State{ledger.StateUnknown}, How: ledger.SettledResolvedByHand,
		Why: "resolved by " + c.actor.Principal + ": " + outcome + "; evidence: " + evidence,
	}
	if outcome == "succeeded" {
		req.Outcome = s.resolvedOutcome(ctx, c, rec, ref, evidence)
	} else {
		req.Outcome = ledger.Outcome{State: ledger.StateRetryable}
	}
	rec, err = s.ledger.Settle(ctx, req)
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		return errorResponse(key, ledger.StateRejected, CodeNotFound, "No operation with this operation_key exists in your tenant.", NextFixRetry)
	case errors.Is(err, ledger.ErrWrongState):
		cur, gerr := s.ledger.Get(ctx, c.actor.Tenant, key)
		if gerr != nil {
			return s.ledgerError(c, gerr)
		}
		r := fromRecord(cur)
		r.Error = opError(CodePreconditionFailed, "Only an operation whose outcome is unknown can be resolved by hand; this one is "+string(cur.State)+".")
		r.IsError = true
		return r
	case err != nil:
		return s.ledgerError(c, err)
	}
	r := fromRecord(rec)
	r.IsError = false
	r.Error = nil
	return r
}

// resolvedOutcome is the saved result of an operation settled by hand as
// succeeded. For order tools it keeps the shape every replay of them has
// ({"order": …}), read from the order system when it can be, and a
// create_order still gets its confirmation step.
func (s *Service) resolvedOutcome(ctx context.Context, c *call, rec *ledger.Record, ref, evidence string) ledger.Outcome {
	resolution := map[string]any{"resolved_by": c.actor.Principal, "evidence": evidence, "downstream_ref": ref}
	out := ledger.Outcome{State: ledger.StateSucceeded, DownstreamRef: ref, Summary: "resolved by hand", Result: mustJSON(resolution)}
	if op := s.remoteOpOf(rec.Tool); op != nil {
		// A declared tool's result keeps the shape its other outcomes
		// have ({noun: resource}) when its API's lookup finds the
		// resource; the resolution is saved beside it either way.
		result := map[string]any{"resolution": resolution}
		if r, err := op.Lookup(ctx, rec.Tenant, opRef(rec), rec.Args); err == nil {
			result[op.Noun()] = r.Resource
			if ref == "" {
				out.DownstreamRef = r.ID
			}
		}
		out.Result = mustJSON(result)
		return out
	}
	eff := s.effectOf(rec.Tool)
	if ref == "" || eff == nil || !eff.onOrders() {
		return out
	}
	o, err := s.readOrder(ctx, c.actor.Tenant, ref)
	if err != nil || o == nil {
		o = &orders.Order{OrderID: ref}
	}
	out.Result = mustJSON(map[string]any{"order": o, "resolution": resolution})
	return s.withFollowUps(out, rec.Tenant, rec, rec.Args, o, map[string]any{"order": o, "resolution": resolution})
}
