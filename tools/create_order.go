package tools

import (
	"context"
	"fmt"

	"idemgate/approvals"
	"idemgate/ledger"
)

var specCreateOrder = Spec{
	Name:  "create_order",
	Title: "Place an order (idempotent by operation_key)",
	Description: "Places one order for a customer. Safe to call again: the operation_key names this one business intent. " +
		"Get the key ONCE per intent from new_operation_key (or make a random UUID yourself before the first attempt), and reuse the SAME key on every retry of that intent — after a timeout, an error, or when unsure whether the first call went through. " +
		"A retry with the same key and arguments returns the same order (replayed: true) and never creates a second one. Never mint a new key because a call failed or timed out: a timeout is not a failure, the order may already exist. " +
		"The same key with different arguments is refused. A new key with the same arguments as an order placed minutes ago is held for human approval as a suspected duplicate, and so is a large order. " +
		"With notify_customer (default true) a confirmation message is queued in the same step.",
	Idempotent: true, Destructive: false, OpenWorld: false,
}

// createOrderTool places an order (embedded store or order API) and may
// queue its confirmation message.
func createOrderTool() descriptor {
	return define(specCreateOrder, (*Service).createOrder, &sideEffect[createOrderArgs]{
		noun: "order",
		facts: func(a createOrderArgs) approvals.Facts {
			sum, _ := total(a.Items) // the call refused an overflowing total before the policy
			return approvals.Facts{HasAmount: true, Amount: sum, Currency: a.Currency}
		},
		apply: applyCreateOrder,
		remote: func(api *OrderAPI, tenant string, a createOrderArgs) runner {
			return func(ctx context.Context, rec *ledger.Record) ledger.Outcome {
				o, err := api.Create(ctx, tenant, opRef(rec), a)
				out := outcomeOf(o, err, "order")
				if out.State != ledger.StateSucceeded {
					return out
				}
				return withStep(out, o, confirmationStep(tenant, rec, a, o))
			}
		},
		afterOrder: confirmationStep,
	})
}

type createOrderArgs struct {
	CustomerID            string   `json:"customer_id"`
	Items                 []Item   `json:"items"`
	Currency              string   `json:"currency"`
	ShipTo                *Address `json:"ship_to,omitempty"`
	RequestedDeliveryDate string   `json:"requested_delivery_date,omitempty"`
	Note                  string   `json:"note,omitempty"`
	NotifyCustomer        bool     `json:"notify_customer"`
}

func (s *Service) createOrder(ctx context.Context, c *call, a createOrderArgs) *Response {
	sum, err := total(a.Items)
	if err != nil {
		return errorResponse(c.req.OperationKey, ledger.StateRejected, CodeInvalidArguments,
			"The order total does not fit in 64-bit minor units; split the order. Nothing was recorded.", NextFixRetry)
	}
	preview := approvals.ToMap(a)
	preview["total_minor"] = sum
	return s.execute(ctx, c, proposal{diff: approvals.CreateDiff("order", preview)})
}

// applyCreateOrder places the order (and queues its confirmation) inside
// the ledger's transaction.
func applyCreateOrder(tenant string, a createOrderArgs) (ledger.ApplyFunc, error) {
	sum, err := total(a.Items)
	if err != nil {
		return nil, err
	}
	return func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		now := tx.Now()
		o := &Order{
			OrderID: orderID(tenant, opRef(rec)), Version: 1, Status: "placed",
			CustomerID: a.CustomerID, Items: a.Items, Currency: a.Currency, TotalMinor: sum,
			ShipTo: a.ShipTo, RequestedDeliveryDate: a.RequestedDeliveryDate, Note: a.Note,
			OperationKey: rec.Key, CreatedAt: now, UpdatedAt: now,
		}
		if err := putOrder(tx, tenant, o); err != nil {
			return ledger.Outcome{}, err
		}
		result := map[string]any{"order": o}
		if a.NotifyCustomer {
			view, queue := confirmation(tenant, rec, a, o)
			if err := queue(tx); err != nil {
				return ledger.Outcome{}, err
			}
			result["confirmation"] = view
		}
		return ledger.Outcome{State: ledger.StateSucceeded, Result: mustJSON(result), Summary: "order " + o.OrderID, DownstreamRef: o.OrderID}, nil
	}, nil
}

// confirmation is the second step of a create_order (rec): the message
// telling the customer, with its own stable id (derived from rec's key and
// incarnation, and the step). It returns what the result shows of it and
// the write that queues it in the outbox, to run in the transaction that
// records the order.
func confirmation(tenant string, rec *ledger.Record, a createOrderArgs, o *Order) (map[string]any, func(ledger.Tx) error) {
	sum, _ := total(a.Items) // validated when the order was requested
	m := &Message{
		Tenant: tenant, OperationKey: rec.Key, Incarnation: rec.Incarnation, Step: "confirmation", Channel: "email", OrderID: o.OrderID,
		To:      []string{"customer:" + a.CustomerID},
		Subject: "Order " + o.OrderID + " confirmed",
		Body:    fmt.Sprintf("Your order %s (%d item lines, total %s %s) has been placed.", o.OrderID, len(o.Items), formatMinor(sum), a.Currency),
	}
	view := map[string]any{"message_id": messageID(tenant, opRef(rec), m.Step), "state": MessageQueued}
	return view, func(tx ledger.Tx) error { return enqueue(tx, m) }
}

// confirmationStep is the confirmation of a create_order as a step of
// it; nil when the order was placed without notify_customer.
func confirmationStep(tenant string, rec *ledger.Record, a createOrderArgs, o *Order) *step {
	if !a.NotifyCustomer {
		return nil
	}
	view, queue := confirmation(tenant, rec, a, o)
	return &step{name: "confirmation", view: view, queue: queue}
}

// formatMinor renders minor units with two decimals (display only).
func formatMinor(v int64) string {
	return fmt.Sprintf("%d.%02d", v/100, v%100)
}
