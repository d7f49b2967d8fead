package tools

import (
	"context"
	"errors"

	"idemgate/ledger"
	"idemgate/outbox"
)

var specGetOperationStatus = Spec{
	Name:  "get_operation_status",
	Title: "Get an operation's status",
	Description: "Returns what the ledger knows about an operation_key in your tenant: its state, saved result or error, attempts, pending approval, delivery state of its messages, timestamps, and next_action (what to do now). Read only. " +
		"Use it after a timeout or an in_progress answer instead of minting a new key.",
	ReadOnly: true, Idempotent: true,
}

// getOperationStatusTool reports what the ledger knows of a key.
func getOperationStatusTool() descriptor {
	return define(specGetOperationStatus, (*Service).getOperationStatus, nil)
}

// getOperationStatus reads the key from c.req.OperationKey (validated and
// lowercased like every operation_key).
func (s *Service) getOperationStatus(ctx context.Context, c *call, _ noArgs) *Response {
	key := c.req.OperationKey
	rec, err := s.ledger.Get(ctx, c.actor.Tenant, key)
	if errors.Is(err, ledger.ErrNotFound) {
		return errorResponse(key, ledger.StateRejected, CodeNotFound,
			"No operation with this operation_key exists in your tenant: nothing was ever recorded for it (or its record is past retention). If you never sent it, send the intended call with this key.",
			NextFixRetry)
	}
	if err != nil {
		return s.ledgerError(c, err)
	}
	var msgs []*outbox.Message
	if err := s.ledger.View(ctx, func(tx ledger.Tx) error {
		msgs, err = outbox.OfOperation(tx, c.actor.Tenant, key, rec.Incarnation)
		return err
	}); err != nil {
		return s.ledgerError(c, err)
	}
	r := fromRecord(rec)
	// The status call itself succeeded: isError is false and the envelope
	// has no top-level error; the operation's own state and error are
	// reported in status and result.
	r.IsError = false
	opErr := rec.Error // the record's own error, not the default an error answer would carry
	r.Error = nil
	status := map[string]any{
		"tool": rec.Tool, "state": rec.State, "attempts": rec.Attempts,
		"fingerprint": rec.Fingerprint, "updated_at": rec.UpdatedAt,
	}
	if rec.Result != nil {
		status["result"] = rec.Result
	}
	if opErr != nil {
		status["error"] = opErr
	}
	if rec.DownstreamRef != "" {
		status["downstream_ref"] = rec.DownstreamRef
	}
	if rec.Summary != "" {
		status["summary"] = rec.Summary
	}
	if rec.Tombstone {
		status["expired"] = true
	}
	if len(msgs) > 0 {
		steps := make([]map[string]any, 0, len(msgs))
		for _, m := range msgs {
			step := map[string]any{"step": m.Step, "message_id": m.MessageID, "state": m.State, "attempts": m.Attempts, "last_error": m.LastError}
			if !m.NextAttemptAt.IsZero() {
				step["next_attempt_at"] = m.NextAttemptAt
			}
			if m.State == outbox.MessageDead {
				step["note"] = "delivery stopped after repeated failures; an operator can requeue it (idemgate outbox requeue " + m.MessageID + ")"
			}
			steps = append(steps, step)
		}
		status["deliveries"] = steps
	}
	r.Result = mustJSON(status)
	return r
}
