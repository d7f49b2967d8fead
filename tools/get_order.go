package tools

import (
	"context"

	"idemgate/ledger"
)

var specGetOrder = Spec{
	Name:        "get_order",
	Title:       "Get an order",
	Description: "Returns one order by order_id, with its current version and status. Read only.",
	ReadOnly:    true, Idempotent: true,
}

func (s *Service) getOrder(ctx context.Context, c *call) *Response {
	id, _ := c.req.Args["order_id"].(string)
	var o *Order
	err := s.ledger.View(ctx, func(tx ledger.Tx) error {
		var err error
		o, err = getOrderTx(tx, c.actor.Tenant, id)
		return err
	})
	if err != nil {
		return s.ledgerError(c, err)
	}
	if o == nil {
		return errorResponse("", ledger.StateFailed, "not_found",
			"There is no order "+id+" in your tenant. Check the id, or use list_orders with the customer_id to find it.", nextFixRetry)
	}
	return readResponse(map[string]any{"order": o})
}

// readResponse is the envelope of a successful read.
func readResponse(result any) *Response {
	return &Response{Status: ledger.StateSucceeded, Result: mustJSON(result), NextAction: nextNone}
}
