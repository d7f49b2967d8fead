package tools

import (
	"context"
	"errors"

	"idemgate/ledger"
)

var specReconcileOperation = Spec{
	Name:  "reconcile_operation",
	Title: "Find out what happened to an operation",
	Description: "For an operation whose outcome is unknown (the order system may or may not have done it — a timeout after sending, a crash mid-call): asks the order system's lookup by operation_key and settles the record. " +
		"If the order exists, the operation becomes succeeded with that order. If it provably does not, the operation becomes retryable (when the order system guarantees safe same-key retries) or waits for an approver to allow a re-run. " +
		"Nothing is ever re-sent blindly, and never under a new key. For any other state it just reports the record.",
	Idempotent: true, Destructive: false, OpenWorld: true,
}

// reconcileOperationTool asks the order system about an unknown outcome.
func reconcileOperationTool() descriptor {
	return define(specReconcileOperation, (*Service).reconcileOperation, nil)
}

func (s *Service) reconcileOperation(ctx context.Context, c *call, _ noArgs) *Response {
	key := c.req.OperationKey
	rec, err := s.ledger.Get(ctx, c.actor.Tenant, key)
	if errors.Is(err, ledger.ErrNotFound) {
		return errorResponse(key, ledger.StateRejected, CodeNotFound, "No operation with this operation_key exists in your tenant.", NextFixRetry)
	}
	if err != nil {
		return s.ledgerError(c, err)
	}
	if rec.State == ledger.StateInProgress {
		// If its executor is gone, the lease expiry makes it unknown first.
		if _, err := s.ledger.ExpireLeases(ctx); err != nil {
			return s.ledgerError(c, err)
		}
		if rec, err = s.ledger.Get(ctx, c.actor.Tenant, key); err != nil {
			return s.ledgerError(c, err)
		}
	}
	d := ledger.Decision{Kind: ledger.DecisionHeld, Record: rec}
	if rec.State == ledger.StateUnknown {
		if d, err = s.reconcile(ctx, c.actor, rec); err != nil {
			return s.ledgerError(c, err)
		}
	}
	r := fromRecord(d.Record)
	r.IsError = d.Record.State == ledger.StateUnknown
	if r.IsError {
		r.Error = opError(CodeOutcomeUnknown, "The order system could not say yet whether this operation took effect. It stays unknown and will not be re-sent; the background reconciler keeps asking. An approver can settle it with resolve_operation given evidence.")
	} else {
		r.Error = nil
	}
	return r
}
