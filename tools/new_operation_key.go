package tools

import (
	"context"

	"github.com/google/uuid"

	"idemgate/ledger"
)

var specNewOperationKey = Spec{
	Name:  "new_operation_key",
	Title: "Get a fresh operation key",
	Description: "Returns a fresh random operation_key (a UUID) for ONE new business intent — one order, one message. " +
		"Call it once when you decide to do something, before the first attempt, and reuse the returned key on every retry of that intent. " +
		"Do not call it again to retry: a new key means a new, separate operation. Do not copy keys from examples or documentation.",
	ReadOnly: false, Destructive: false, Idempotent: false, OpenWorld: false,
}

// newOperationKeyTool hands out a fresh key.
func newOperationKeyTool() descriptor {
	return define(specNewOperationKey, (*Service).newOperationKey, nil)
}

func (s *Service) newOperationKey(ctx context.Context, c *call, _ noArgs) *Response {
	key := uuid.NewString()
	if err := s.ledger.IssueKey(ctx, c.actor.Tenant, key); err != nil {
		return s.ledgerError(c, err)
	}
	return &Response{OperationKey: key, Status: ledger.StateSucceeded, NextAction: NextNone,
		Result: mustJSON(map[string]any{"operation_key": key, "use": "Pass this operation_key with the side-effecting call for this one intent and reuse it on every retry of it."})}
}
