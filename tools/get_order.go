package tools

import (
	"context"
	"errors"

	"idemgate/ledger"
	"idemgate/orders"
)

var specGetOrder = Spec{
	Name:        "get_order",
	Title:       "Get an order",
	Description: "Returns one order by order_id, with its current version and status. Read only.",
	ReadOnly:    true, Idempotent: true,
}

// getOrderTool reads one order.
func getOrderTool() descriptor { return define(specGetOrder, (*Service).getOrder, nil) }

type getOrderArgs struct {
	OrderID string `json:"order_id"`
}

func (s *Service) getOrder(ctx context.Context, c *call, a getOrderArgs) *Response {
	id := a.OrderID
	o, err := s.readOrder(ctx, c.actor.Tenant, id)
	if err != nil {
		return s.downstreamError(c, err)
	}
	if o == nil {
		return errorResponse("", ledger.StateFailed, CodeNotFound,
			"There is no order "+id+" in your tenant. Check the id, or use list_orders with the customer_id to find it.", NextFixRetry)
	}
	return readResponse(map[string]any{"order": o})
}

// readResponse is the envelope of a successful read.
func readResponse(result any) *Response {
	return &Response{Status: ledger.StateSucceeded, Result: mustJSON(result), NextAction: NextNone}
}

// readOrder reads an order from wherever orders live; (nil, nil) when it
// does not exist.
func (s *Service) readOrder(ctx context.Context, tenant, id string) (*orders.Order, error) {
	return s.orders.Get(ctx, tenant, id)
}

// downstreamError answers a failed read of the order API (or the ledger).
func (s *Service) downstreamError(c *call, err error) *Response {
	var ae *orders.APIError
	if errors.As(err, &ae) {
		return errorResponse("", ledger.StateFailed, CodeDownstreamError,
			"The order system could not answer: "+ae.Error()+". Nothing was changed; try again shortly.", NextWaitPoll)
	}
	return s.ledgerError(c, err)
}
