package tools

import (
	"context"
	"fmt"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/orders"
	"idemgate/outbox"
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
		apply: (*Service).applyCreateOrder,
		remote: func(ctx context.Context, api RemoteOrders, tenant, ref string, a createOrderArgs) (*orders.Order, error) {
			return api.Create(ctx, tenant, ref, a.request())
		},
		remoteSummary: "order",
		followUps:     createOrderFollowUps,
	})
}

type createOrderArgs struct {
	CustomerID            string          `json:"customer_id"`
	Items                 []orders.Item   `json:"items"`
	Currency              string          `json:"currency"`
	ShipTo                *orders.Address `json:"ship_to,omitempty"`
	RequestedDeliveryDate string          `json:"requested_delivery_date,omitempty"`
	Note                  string          `json:"note,omitempty"`
	NotifyCustomer        bool            `json:"notify_customer"`
}

func (s *Service) createOrder(ctx context.Context, c *call, a createOrderArgs) *Response {
	sum, err := total(a.Items)
	if err != nil {
		return errorResponse(c.req.OperationKey, ledger.StateRejected, CodeInvalidArguments,
			"The order total does not fit in 64-bit minor units; split the order. Nothing was recorded.", NextFixRetry)
	}
	return s.execute(ctx, c, func() proposal {
		preview := approvals.ToMap(a)
		preview["total_minor"] = sum
		return proposal{diff: approvals.CreateDiff("order", preview)}
	})
}

// request is the order the arguments ask for.
func (a createOrderArgs) request() orders.CreateRequest {
	return orders.CreateRequest{
		CustomerID: a.CustomerID, Items: a.Items, Currency: a.Currency, ShipTo: a.ShipTo,
		RequestedDeliveryDate: a.RequestedDeliveryDate, Note: a.Note, NotifyCustomer: a.NotifyCustomer,
	}
}

// applyCreateOrder places the order in the embedded store and queues its
// follow-up steps, all inside the ledger's transaction.
func (s *Service) applyCreateOrder(tenant string, a createOrderArgs) (ledger.ApplyFunc, error) {
	if _, err := total(a.Items); err != nil {
		return nil, err
	}
	return func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		o, err := s.local.CreateTx(tx, tenant, rec.Key, opRef(rec), rec.Fresh, a.request())
		if err != nil {
			return ledger.Outcome{}, err
		}
		result := map[string]any{"order": o}
		if err := queueSteps(tx, createOrderFollowUps(tenant, rec, a, o), result); err != nil {
			return ledger.Outcome{}, err
		}
		return ledger.Outcome{State: ledger.StateSucceeded, Result: mustJSON(result), Summary: "order " + o.OrderID, DownstreamRef: o.OrderID}, nil
	}, nil
}

// createOrderFollowUps is the follow-up steps of a create_order (rec)
// whose order is o: the customer's confirmation when notify_customer asks
// for it, none otherwise.
func createOrderFollowUps(tenant string, rec *ledger.Record, a createOrderArgs, o *orders.Order) []followUp {
	if !a.NotifyCustomer {
		return nil
	}
	return []followUp{confirmation(tenant, rec, a, o)}
}

// confirmation is the confirmation step of a create_order (rec): the
// message telling the customer, with its own stable id (derived from rec's
// key and incarnation, and the step).
func confirmation(tenant string, rec *ledger.Record, a createOrderArgs, o *orders.Order) followUp {
	sum, _ := total(a.Items) // validated when the order was requested
	m := &outbox.Message{
		Tenant: tenant, OperationKey: rec.Key, Incarnation: rec.Incarnation, Step: "confirmation", Channel: "email", OrderID: o.OrderID,
		To:      []string{"customer:" + a.CustomerID},
		Subject: "Order " + o.OrderID + " confirmed",
		Body:    fmt.Sprintf("Your order %s (%d item lines, total %s %s) has been placed.", o.OrderID, len(o.Items), formatMinor(sum), a.Currency),
	}
	view := map[string]any{"message_id": outbox.MessageID(tenant, opRef(rec), m.Step), "state": outbox.MessageQueued}
	return followUp{name: "confirmation", view: view, queue: func(tx ledger.Tx) error { return enqueue(tx, rec, m) }}
}

// formatMinor renders minor units with two decimals (display only).
func formatMinor(v int64) string {
	return fmt.Sprintf("%d.%02d", v/100, v%100)
}
