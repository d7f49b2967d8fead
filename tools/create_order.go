package tools

import (
	"context"
	"encoding/json"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/orders"
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

type createOrderArgs struct {
	CustomerID            string          `json:"customer_id"`
	Items                 []orders.Item   `json:"items"`
	Currency              string          `json:"currency"`
	ShipTo                *orders.Address `json:"ship_to,omitempty"`
	RequestedDeliveryDate string          `json:"requested_delivery_date,omitempty"`
	Note                  string          `json:"note,omitempty"`
	NotifyCustomer        bool            `json:"notify_customer"`
}

func (s *Service) createOrder(ctx context.Context, c *call) *Response {
	var a createOrderArgs
	if err := c.req.Decode(&a); err != nil {
		return s.ledgerError(c, err)
	}
	sum, err := total(a.Items)
	if err != nil {
		return errorResponse(c.req.OperationKey, ledger.StateRejected, "invalid_arguments",
			"The order total does not fit in 64-bit minor units; split the order. Nothing was recorded.", nextFixRetry)
	}
	preview := approvals.ToMap(a)
	preview["total_minor"] = sum
	return s.execute(ctx, c, proposal{diff: approvals.CreateDiff("order", preview)})
}

// request is the order the arguments ask for.
func (a createOrderArgs) request() orders.CreateRequest {
	return orders.CreateRequest{
		CustomerID: a.CustomerID, Items: a.Items, Currency: a.Currency, ShipTo: a.ShipTo,
		RequestedDeliveryDate: a.RequestedDeliveryDate, Note: a.Note, NotifyCustomer: a.NotifyCustomer,
	}
}

// applyCreateOrder places the order (and queues its follow-up steps)
// inside the ledger's transaction.
func (s *Service) applyCreateOrder(tenant string, raw json.RawMessage) (ledger.ApplyFunc, error) {
	var a createOrderArgs
	if err := json.Unmarshal(raw, &a); err != nil {
		return nil, err
	}
	if _, err := total(a.Items); err != nil {
		return nil, err
	}
	return func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		o, err := s.local.CreateTx(tx, tenant, rec.Key, opRef(rec), a.request())
		if err != nil {
			return ledger.Outcome{}, err
		}
		result := map[string]any{"order": o}
		for _, st := range followUps(tenant, rec, raw, o) {
			if err := st.queue(tx); err != nil {
				return ledger.Outcome{}, err
			}
			result[st.name] = st.view
		}
		return ledger.Outcome{State: ledger.StateSucceeded, Result: mustJSON(result), Summary: "order " + o.OrderID, DownstreamRef: o.OrderID}, nil
	}, nil
}
