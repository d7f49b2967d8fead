package tools

import (
	"context"

	"idemgate/ledger"
)

var specListOrders = Spec{
	Name:  "list_orders",
	Title: "List a customer's orders",
	Description: "Lists the orders of one customer, newest first (at most limit, default 20). Read only. " +
		"Use it to check whether an order already exists before placing one for an intent whose earlier attempt you lost track of — but to retry, reuse that attempt's operation_key instead.",
	ReadOnly: true, Idempotent: true,
}

func (s *Service) listOrders(ctx context.Context, c *call) *Response {
	customer, _ := c.req.Args["customer_id"].(string)
	limit := 20
	if l, ok := c.req.Args["limit"]; ok {
		limit = asInt(l, 20)
	}
	var orders []*Order
	var err error
	if s.api != nil {
		orders, err = s.api.List(ctx, c.actor.Tenant, customer, limit)
	} else {
		err = s.ledger.View(ctx, func(tx ledger.Tx) error {
			orders, err = listOrdersTx(tx, c.actor.Tenant, customer, limit)
			return err
		})
	}
	if err != nil {
		return s.downstreamError(c, err)
	}
	if orders == nil {
		orders = []*Order{}
	}
	return readResponse(map[string]any{"customer_id": customer, "orders": orders, "count": len(orders)})
}

// asInt reads a JSON number decoded by the schemas package.
func asInt(v any, def int) int {
	switch n := v.(type) {
	case float64:
		return int(n)
	case int:
		return n
	case int64:
		return int(n)
	case interface{ Int64() (int64, error) }:
		if i, err := n.Int64(); err == nil {
			return int(i)
		}
	}
	return def
}
