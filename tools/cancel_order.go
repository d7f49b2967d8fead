package tools

import (
	"context"

	"idemgate/approvals"
	"idemgate/ledger"
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
		apply: applyCancelOrder,
		remote: func(api *OrderAPI, tenant string, a cancelOrderArgs) runner {
			return func(ctx context.Context, rec *ledger.Record) ledger.Outcome {
				o, err := api.Cancel(ctx, tenant, opRef(rec), a.OrderID, a.ExpectedVersion, a.Reason)
				return outcomeOf(o, err, "cancelled order")
			}
		},
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
		return s.execute(ctx, c, proposal{})
	}
	diff := approvals.CancelDiff("order", cur.OrderID, cur.Version, approvals.ToMap(cur), a.Reason)
	return s.execute(ctx, c, proposal{diff: diff, resourceVersion: cur.Version})
}

// applyCancelOrder cancels the order if it is still at the approved
// version.
func applyCancelOrder(tenant string, a cancelOrderArgs) (ledger.ApplyFunc, error) {
	return applyOrderChange(tenant, a.OrderID, a.ExpectedVersion, "cancelled", func(o *Order) (*Order, error) {
		n := *o
		n.Status, n.CancelReason = "cancelled", a.Reason
		return &n, nil
	}), nil
}
