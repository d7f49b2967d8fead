package tools

import (
	"context"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/outbox"
)

var specSendNotification = Spec{
	Name:  "send_notification",
	Title: "Send a notification (idempotent by operation_key)",
	Description: "Sends one notification (email, sms or webhook) to a list of recipients. Safe to call again: reuse the SAME operation_key on every retry of this one message — after a timeout, an error, or when unsure whether it went out — and the message is sent once. " +
		"Get the key ONCE per intent from new_operation_key; never mint a new key because a call failed or timed out, that is how customers get the same message twice. " +
		"The message is queued durably in the same step and delivered in the background; get_operation_status shows its delivery state. Messages to many recipients wait for a human approver.",
	Idempotent: true, Destructive: false, OpenWorld: true,
}

// sendNotificationTool queues a message in the outbox.
func sendNotificationTool() descriptor {
	return define(specSendNotification, (*Service).sendNotification, &sideEffect[sendNotificationArgs]{
		noun:       "notification",
		downstream: "outbox",
		facts: func(a sendNotificationArgs) approvals.Facts {
			return approvals.Facts{Channel: a.Channel, Recipients: a.To}
		},
		apply: (*Service).applySendNotification,
	})
}

type sendNotificationArgs struct {
	Channel string   `json:"channel"`
	To      []string `json:"to"`
	Subject string   `json:"subject,omitempty"`
	Body    string   `json:"body"`
	OrderID string   `json:"order_id,omitempty"`
}

func (s *Service) sendNotification(ctx context.Context, c *call, a sendNotificationArgs) *Response {
	return s.execute(ctx, c, func() proposal {
		return proposal{diff: approvals.CreateDiff("notification", approvals.ToMap(a))}
	})
}

// applySendNotification queues the message in the outbox inside the
// ledger's transaction.
func (s *Service) applySendNotification(tenant string, a sendNotificationArgs) (ledger.ApplyFunc, error) {
	return func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		m := &outbox.Message{
			Tenant: tenant, OperationKey: rec.Key, Incarnation: rec.Incarnation, Step: "notification",
			Channel: a.Channel, To: a.To, Subject: a.Subject, Body: a.Body, OrderID: a.OrderID,
		}
		if err := enqueue(tx, rec, m); err != nil {
			return ledger.Outcome{}, err
		}
		result := map[string]any{"message": map[string]any{"message_id": m.MessageID, "channel": m.Channel, "recipients": len(m.To), "state": m.State}}
		return ledger.Outcome{State: ledger.StateSucceeded, Result: mustJSON(result), Summary: "message " + m.MessageID, DownstreamRef: m.MessageID}, nil
	}, nil
}
