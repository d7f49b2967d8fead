package tools

import (
	"context"
	"fmt"

	"idemgate/ledger"
	"idemgate/orders"
)

var specListOrders = Spec{
	Name:  "list_orders",
	Title: "List a customer's orders",
	Description: "Lists the orders of one customer, newest first (at most limit, default 20). Read only. " +
		"When more orders follow, the answer has next_cursor: call again with the same customer_id and cursor set to it for the next page; the last page has no next_cursor. " +
		"Use it to check whether an order already exists before placing one for an intent whose earlier attempt you lost track of — but to retry, reuse that attempt's operation_key instead.",
	ReadOnly: true, Idempotent: true,
}

// maxAPICursor bounds the order API's own cursor, carried inside ours.
const maxAPICursor = 512

// listOrdersTool pages through one customer's orders.
func listOrdersTool() descriptor { return define(specListOrders, (*Service).listOrders, nil) }

type listOrdersArgs struct {
	CustomerID string `json:"customer_id"`
	Limit      int    `json:"limit"` // the schema's default when absent
	Cursor     string `json:"cursor"`
}

func (s *Service) listOrders(ctx context.Context, c *call, a listOrdersArgs) *Response {
	customer, limit := a.CustomerID, a.Limit
	backend := "embedded"
	if s.remote != nil {
		backend = "orders_api"
	}
	query := []string{"list_orders", c.actor.Tenant, customer, backend}
	var after string
	if cur := a.Cursor; cur != "" {
		pos, err := DecodeCursor(cur, query)
		if err != nil {
			return errorResponse("", ledger.StateRejected, CodeInvalidArguments, "cursor: "+err.Error()+".", NextFixRetry)
		}
		after = string(pos)
	}
	page, next, err := s.orders.List(ctx, c.actor.Tenant, customer, limit, after)
	if err == nil && s.remote != nil && len(next) > maxAPICursor {
		err = &orders.APIError{Class: orders.Definitive, Code: CodeDownstreamError, Msg: fmt.Sprintf("the order API's next_cursor is %d bytes; at most %d are carried", len(next), maxAPICursor)}
	}
	if err != nil {
		return s.downstreamError(c, err)
	}
	if page == nil {
		page = []*orders.Order{}
	}
	out := map[string]any{"customer_id": customer, "orders": page, "count": len(page)}
	if next != "" {
		out["next_cursor"] = EncodeCursor(query, []byte(next))
	}
	return readResponse(out)
}
