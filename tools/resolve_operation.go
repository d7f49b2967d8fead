package tools

import (
	"context"
	"encoding/json"
	"errors"

	"idemgate/ledger"
)

var specResolveOperation = Spec{
	Name:         "resolve_operation",
	ApproverOnly: true,
	Title:        "Settle an unknown operation by hand",
	Description: "For approvers: settle an operation whose outcome is unknown, with evidence (what you checked, e.g. the order system's admin screen or a carrier's record). " +
		"outcome succeeded records it as done (give downstream_ref, e.g. the order id you found); not_executed records that it provably did not happen and makes it retryable under the same key. The evidence is kept in the audit log. You cannot settle your own requests.",
	Idempotent: true, Destructive: true, OpenWorld: false,
}

func (s *Service) resolveOperation(ctx context.Context, c *call) *Response {
	if r := s.requireApprover(c); r != nil {
		return r
	}
	key := c.req.OperationKey
	rec, err := s.ledger.Get(ctx, c.actor.Tenant, key)
	if errors.Is(err, ledger.ErrNotFound) {
		return errorResponse(key, ledger.StateRejected, "not_found", "No operation with this operation_key exists in your tenant.", nextFixRetry)
	}
	if err != nil {
		return s.ledgerError(c, err)
	}
	if ledger.SamePrincipal(rec.Principal, c.actor.Principal) {
		return errorResponse(key, rec.State, "forbidden",
			"You requested this operation yourself; another approver must settle it.", nextDoNotRetry)
	}
	outcome, _ := c.req.Args["outcome"].(string)
	evidence, _ := c.req.Args["evidence"].(string)
	ref, _ := c.req.Args["downstream_ref"].(string)
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
		return errorResponse(key, ledger.StateRejected, "not_found", "No operation with this operation_key exists in your tenant.", nextFixRetry)
	case errors.Is(err, ledger.ErrWrongState):
		cur, gerr := s.ledger.Get(ctx, c.actor.Tenant, key)
		if gerr != nil {
			return s.ledgerError(c, gerr)
		}
		r := fromRecord(cur)
		r.Error = &ledger.OpError{Code: "precondition_failed", Message: "Only an operation whose outcome is unknown can be resolved by hand; this one is " + string(cur.State) + "."}
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
	if ref == "" || (rec.Tool != "create_order" && rec.Tool != "update_order" && rec.Tool != "cancel_order") {
		return out
	}
	o, err := s.readOrder(ctx, c.actor.Tenant, ref)
	if err != nil || o == nil {
		o = &Order{OrderID: ref}
	}
	out.Result = mustJSON(map[string]any{"order": o, "resolution": resolution})
	if rec.Tool == "create_order" {
		var a createOrderArgs
		if json.Unmarshal(rec.Args, &a) == nil && a.NotifyCustomer {
			view, queue := confirmation(rec.Tenant, rec, a, o)
			out.Result = mustJSON(map[string]any{"order": o, "confirmation": view, "resolution": resolution})
			out.Also = queue
		}
	}
	return out
}
