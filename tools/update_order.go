package tools

import (
	"context"
	"errors"
	"fmt"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/orders"
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
		alwaysApprove: true,
		apply:         (*Service).applyUpdateOrder,
		remote: func(ctx context.Context, api RemoteOrders, tenant, ref string, a updateOrderArgs) (*orders.Order, error) {
			return api.Update(ctx, tenant, ref, a.request())
		},
		remoteSummary: "changed order",
	})
}

type updateOrderArgs struct {
	OrderID         string         `json:"order_id"`
	ExpectedVersion int            `json:"expected_version"`
	Changes         orders.Changes `json:"changes"`
}

// request is the change the arguments ask for.
func (a updateOrderArgs) request() orders.UpdateRequest {
	return orders.UpdateRequest{OrderID: a.OrderID, ExpectedVersion: a.ExpectedVersion, Changes: a.Changes}
}

// diffFields are the fields of an order a change can touch, as shown to
// approvers.
func diffFields(o *orders.Order) map[string]any {
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
		return s.execute(ctx, c, nil)
	}
	next, err := a.Changes.Apply(cur)
	if err != nil {
		return errorResponse(c.req.OperationKey, ledger.StateRejected, CodeInvalidArguments, "The new order total does not fit in 64-bit minor units. Nothing was recorded.", NextFixRetry)
	}
	return s.execute(ctx, c, func() proposal {
		diff := approvals.UpdateDiff("order", cur.OrderID, cur.Version, diffFields(cur), diffFields(next))
		return proposal{diff: diff, resourceVersion: cur.Version, resource: cur, total: &approvals.Total{AmountMinor: next.TotalMinor, Currency: next.Currency}}
	})
}

// currentOrder checks a change's preconditions before anything is
// recorded: the order exists in the caller's tenant, is not cancelled, and
// is still at expected. It returns (nil, nil) when the ledger already has
// a record for the key — the record decides then (replay, pending
// approval, mismatch), whatever the order looks like now.
func (s *Service) currentOrder(ctx context.Context, c *call, id string, expected int) (*orders.Order, *Response) {
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
func preconditionFailed(key string, o *orders.Order, expected int, status ledger.State) *Response {
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
func (s *Service) applyUpdateOrder(tenant string, a updateOrderArgs) (ledger.ApplyFunc, error) {
	return func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		n, err := s.local.UpdateTx(tx, tenant, a.request())
		return orderChangeOutcome(rec.Key, a.OrderID, a.ExpectedVersion, "changed", n, err)
	}, nil
}

// orderChangeOutcome is the outcome of an embedded update_order or
// cancel_order that wrote n or failed with err: a vanished, cancelled or
// moved order, or an invalid change, is a saved failure (nothing applied);
// any other error rolls the transaction back.
func orderChangeOutcome(key, id string, expected int, verb string, n *orders.Order, err error) (ledger.Outcome, error) {
	var stale *orders.StaleError
	switch {
	case errors.Is(err, orders.ErrNotFound):
		return staleOutcome(key, nil, id, expected), nil
	case errors.As(err, &stale):
		return staleOutcome(key, stale.Order, id, expected), nil
	case errors.Is(err, orders.ErrTotalOverflow):
		return ledger.Outcome{State: ledger.StateFailed, Error: opError(CodeInvalidArguments, err.Error())}, nil
	case err != nil:
		return ledger.Outcome{}, err
	}
	return ledger.Outcome{State: ledger.StateSucceeded, Result: mustJSON(map[string]any{"order": n}),
		Summary: fmt.Sprintf("order %s %s, version %d", n.OrderID, verb, n.Version), DownstreamRef: n.OrderID}, nil
}

// staleOutcome is the saved failure of a change whose order vanished
// (o is nil), was cancelled or moved past the approved version.
func staleOutcome(key string, o *orders.Order, id string, expected int) ledger.Outcome {
	if o == nil {
		return ledger.Outcome{State: ledger.StateFailed, Error: opError(CodeNotFound, "Order "+id+" no longer exists; nothing was applied.")}
	}
	r := preconditionFailed(key, o, expected, ledger.StateFailed)
	r.Error.Message += " Nothing was applied. Re-read the order and, if still wanted, request the change again under a new operation_key with the current version."
	return ledger.Outcome{State: ledger.StateFailed, Error: r.Error, Summary: string(CodePreconditionFailed)}
}
