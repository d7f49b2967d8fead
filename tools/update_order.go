package tools

import (
	"context"
	"errors"
	"fmt"

	"idemgate/approvals"
	"idemgate/ledger"
)

var specUpdateOrder = Spec{
	Name:  "update_order",
	Title: "Change an order (needs approval)",
	Description: "Changes an existing order: its items, shipping address, requested delivery date or note. Pass the order's version as you read it (expected_version); if the order changed since, the call fails with precondition_failed and the current version. " +
		"Every change waits for a human approver, who sees exactly the fields that change; the answer is awaiting_approval with an approval id. " +
		"Make ONE operation_key per intended change (new_operation_key) and reuse it on every retry and while waiting: repeating the call returns the approval's state and, once approved, the outcome. Never mint a new key to retry.",
	Idempotent: true, Destructive: true, OpenWorld: false,
}

// updateOrderTool changes an order at the version the caller read.
func updateOrderTool() descriptor {
	return define(specUpdateOrder, (*Service).updateOrder, &sideEffect[updateOrderArgs]{
		apply: applyUpdateOrder,
		remote: func(api *OrderAPI, tenant string, a updateOrderArgs) runner {
			return func(ctx context.Context, rec *ledger.Record) ledger.Outcome {
				o, err := api.Update(ctx, tenant, opRef(rec), a.OrderID, a.ExpectedVersion, a.Changes)
				return outcomeOf(o, err, "changed order")
			}
		},
	})
}

type orderChanges struct {
	Items                 []Item   `json:"items,omitempty"`
	ShipTo                *Address `json:"ship_to,omitempty"`
	RequestedDeliveryDate *string  `json:"requested_delivery_date,omitempty"`
	Note                  *string  `json:"note,omitempty"`
}

type updateOrderArgs struct {
	OrderID         string       `json:"order_id"`
	ExpectedVersion int          `json:"expected_version"`
	Changes         orderChanges `json:"changes"`
}

// changedOrder returns a copy of o with ch applied (version and times not
// touched).
func changedOrder(o *Order, ch orderChanges) (*Order, error) {
	n := *o
	if ch.Items != nil {
		sum, err := total(ch.Items)
		if err != nil {
			return nil, err
		}
		n.Items, n.TotalMinor = ch.Items, sum
	}
	if ch.ShipTo != nil {
		n.ShipTo = ch.ShipTo
	}
	if ch.RequestedDeliveryDate != nil {
		n.RequestedDeliveryDate = *ch.RequestedDeliveryDate
	}
	if ch.Note != nil {
		n.Note = *ch.Note
	}
	return &n, nil
}

// diffFields are the fields of an order a change can touch, as shown to
// approvers.
func diffFields(o *Order) map[string]any {
	m := approvals.ToMap(o)
	out := map[string]any{}
	for _, k := range []string{"items", "total_minor", "ship_to", "requested_delivery_date", "note"} {
		out[k] = m[k]
	}
	return out
}

func (s *Service) updateOrder(ctx context.Context, c *call, a updateOrderArgs) *Response {
	cur, resp := s.currentOrder(ctx, c, a.OrderID, a.ExpectedVersion)
	if resp != nil {
		return resp
	}
	if cur == nil { // the ledger already knows this key: it answers
		return s.execute(ctx, c, proposal{})
	}
	next, err := changedOrder(cur, a.Changes)
	if err != nil {
		return errorResponse(c.req.OperationKey, ledger.StateRejected, CodeInvalidArguments, "The new order total does not fit in 64-bit minor units. Nothing was recorded.", NextFixRetry)
	}
	diff := approvals.UpdateDiff("order", cur.OrderID, cur.Version, diffFields(cur), diffFields(next))
	return s.execute(ctx, c, proposal{diff: diff, resourceVersion: cur.Version})
}

// currentOrder checks a change's preconditions before anything is
// recorded: the order exists in the caller's tenant, is not cancelled, and
// is still at expected. It returns (nil, nil) when the ledger already has
// a record for the key — the record decides then (replay, pending
// approval, mismatch), whatever the order looks like now.
func (s *Service) currentOrder(ctx context.Context, c *call, id string, expected int) (*Order, *Response) {
	key := c.req.OperationKey
	if _, err := s.ledger.Get(ctx, c.actor.Tenant, key); err == nil {
		return nil, nil
	} else if !errors.Is(err, ledger.ErrNotFound) {
		return nil, s.ledgerError(c, err)
	}
	o, err := s.readOrder(ctx, c.actor.Tenant, id)
	if err != nil {
		return nil, s.downstreamError(c, err)
	}
	if o == nil {
		return nil, errorResponse(key, ledger.StateRejected, CodeNotFound,
			"There is no order "+id+" in your tenant. Nothing was recorded; check the id with list_orders and call again with the same operation_key.", NextFixRetry)
	}
	if r := preconditionFailed(key, o, expected, ledger.StateRejected); r != nil {
		r.Error.Message += " Nothing was recorded: re-read the order and call again with the same operation_key and the current version, if the change still makes sense."
		return nil, r
	}
	return o, nil
}

// preconditionFailed answers a stale expected version or a cancelled
// order, or returns nil when o may change.
func preconditionFailed(key string, o *Order, expected int, status ledger.State) *Response {
	var msg string
	switch {
	case o.Status == "cancelled":
		msg = fmt.Sprintf("Order %s is cancelled (version %d) and can no longer change.", o.OrderID, o.Version)
	case o.Version != expected:
		msg = fmt.Sprintf("Order %s is at version %d, not the expected version %d: it changed since you read it.", o.OrderID, o.Version, expected)
	default:
		return nil
	}
	r := errorResponse(key, status, CodePreconditionFailed, msg, NextFixRetry)
	r.Error.Details = mustJSON(map[string]any{"order_id": o.OrderID, "current_version": o.Version, "expected_version": expected, "order_status": o.Status})
	return r
}

// applyUpdateOrder changes the order if it is still at the version the
// approval was given for; otherwise the operation fails with
// precondition_failed and nothing is applied.
func applyUpdateOrder(tenant string, a updateOrderArgs) (ledger.ApplyFunc, error) {
	return applyOrderChange(tenant, a.OrderID, a.ExpectedVersion, "changed", func(o *Order) (*Order, error) {
		return changedOrder(o, a.Changes)
	}), nil
}

// applyOrderChange is the side effect shared by update_order and
// cancel_order: inside the ledger's transaction, re-read the order, refuse
// a vanished, cancelled or moved one (a saved failure, nothing applied),
// otherwise write change's result as the next version.
func applyOrderChange(tenant, id string, expected int, verb string, change func(*Order) (*Order, error)) ledger.ApplyFunc {
	return func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		o, err := getOrderTx(tx, tenant, id)
		if err != nil {
			return ledger.Outcome{}, err
		}
		if out, stop := staleOutcome(rec.Key, o, id, expected); stop {
			return out, nil
		}
		n, err := change(o)
		if err != nil {
			return ledger.Outcome{State: ledger.StateFailed, Error: opError(CodeInvalidArguments, err.Error())}, nil
		}
		n.Version++
		n.UpdatedAt = tx.Now()
		if err := replaceOrder(tx, tenant, n); err != nil {
			return ledger.Outcome{}, err
		}
		return ledger.Outcome{State: ledger.StateSucceeded, Result: mustJSON(map[string]any{"order": n}),
			Summary: fmt.Sprintf("order %s %s, version %d", n.OrderID, verb, n.Version), DownstreamRef: n.OrderID}, nil
	}
}

// staleOutcome is the saved failure of a change whose order vanished,
// was cancelled or moved past the approved version.
func staleOutcome(key string, o *Order, id string, expected int) (ledger.Outcome, bool) {
	if o == nil {
		return ledger.Outcome{State: ledger.StateFailed, Error: opError(CodeNotFound, "Order "+id+" no longer exists; nothing was applied.")}, true
	}
	if r := preconditionFailed(key, o, expected, ledger.StateFailed); r != nil {
		r.Error.Message += " Nothing was applied. Re-read the order and, if still wanted, request the change again under a new operation_key with the current version."
		return ledger.Outcome{State: ledger.StateFailed, Error: r.Error, Summary: "precondition_failed"}, true
	}
	return ledger.Outcome{}, false
}
