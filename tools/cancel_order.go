package tools

import (
	"context"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/orders"
)

var specCancelOrder = Spec{
	Name:  "cancel_order",
	Title: "Cancel an order (needs approval)",
	Description: "Cancels an existing order. Pass the order's version as you read it (expected_version) and a reason. " +
		"Every cancellation waits for a human approver, who sees the order being cancelled; the answer is awaiting_approval with an approval id. " +
		"Make ONE operation_key per cancellation (new_operation_key) and reuse it on every retry and while waiting: repeating the call returns the approval's state and, once approved, the outcome. Never mint a new key to retry.",
	Idempotent: true, Destructive: true, OpenWorld: false,
}

// cancelOrderTool cancels an order at the version the caller read.
func cancelOrderTool() descriptor {
	return define(specCancelOrder, (*Service).cancelOrder, &sideEffect[cancelOrderArgs]{
		alwaysApprove: true,
		apply:         (*Service).applyCancelOrder,
		remote: func(ctx context.Context, api RemoteOrders, tenant, ref string, a cancelOrderArgs) (*orders.Order, error) {
			return api.Cancel(ctx, tenant, ref, a.request())
		},
		remoteSummary: "cancelled order",
	})
}

type cancelOrderArgs struct {
	OrderID         string `json:"order_id"`
	ExpectedVersion int    `json:"expected_version"`
	Reason          string `json:"reason"`
}

func (s *Service) cancelOrder(ctx context.Context, c *call, a cancelOrderArgs) *Response {
	cur, resp := s.currentOrder(ctx, c, a.OrderID, a.ExpectedVersion)
	if resp != nil {
		return resp
	}
	if cur == nil {
		return s.execute(ctx, c, nil)
	}
	return s.execute(ctx, c, func() proposal {
		diff := approvals.CancelDiff("order", cur.OrderID, cur.Version, approvals.ToMap(cur), a.Reason)
		return proposal{diff: diff, resourceVersion: cur.Version, resource: cur, total: &approvals.Total{AmountMinor: cur.TotalMinor, Currency: cur.Currency}}
	})
}

// request is the cancellation the arguments ask for.
func (a cancelOrderArgs) request() orders.CancelRequest {
	return orders.CancelRequest{OrderID: a.OrderID, ExpectedVersion: a.ExpectedVersion, Reason: a.Reason}
}

// applyCancelOrder cancels the order if it is still at the approved
// version.
func (s *Service) applyCancelOrder(tenant string, a cancelOrderArgs) (ledger.ApplyFunc, error) {
	return func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		n, err := s.local.CancelTx(tx, tenant, a.request())
		return orderChangeOutcome(rec.Key, a.OrderID, a.ExpectedVersion, "cancelled", n, err)
	}, nil
}
