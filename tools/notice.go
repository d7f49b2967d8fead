package tools

import (
	"encoding/json"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/outbox"
)

// Reaching approvers (docs/approvals.md, "Reaching approvers"): every new approval
// request queues one notice in the outbox, in the transaction that records
// the request, so the notice exists exactly when the request does and is
// delivered, retried and dead-lettered like any message.

// noticeStep is the outbox step of the notice of approval id: one notice
// per approval request, so an operation held again later (a re-run after
// an unknown outcome) notifies again, under another id.
func noticeStep(approvalID string) string { return "approval_notice:" + approvalID }

// routeNotices is the deliverer's sink: notices to notices (or, when this
// process has no notice sink, to one that fails saying so), everything
// else to sink.
func routeNotices(sink, notices outbox.Sink) outbox.Sink {
	if notices == nil {
		notices = outbox.UnconfiguredSink{What: "[approvals] notify_webhook"}
	}
	return &outbox.Router{Default: sink, Channels: map[string]outbox.Sink{outbox.ChannelApprovalNotice: notices}}
}

// heldNotice is the ledger hook that queues the approvers' notice of a
// new approval request, with the order total total() (nil: none); nil
// when notices are off.
func (s *Service) heldNotice(total func() *approvals.Total) ledger.HeldFunc {
	if s.opts.NoticeSink == nil {
		return nil
	}
	return func(tx ledger.Tx, rec *ledger.Record) error {
		if rec.Approval == nil {
			return nil
		}
		m := &outbox.Message{
			Tenant: rec.Tenant, OperationKey: rec.Key, Incarnation: rec.Incarnation,
			Step: noticeStep(rec.Approval.ID), Channel: outbox.ChannelApprovalNotice,
			To:      []string{"approvers of tenant " + rec.Tenant},
			Subject: rec.Tool + " by " + rec.Approval.RequestedBy + " waits for approval",
		}
		id := outbox.MessageID(rec.Tenant, opRef(rec), m.Step)
		b, err := json.Marshal(approvals.NewNotice(rec, id, total(), s.opts.ConsoleURL))
		if err != nil {
			return err
		}
		m.Body = string(b)
		return outbox.Enqueue(tx, m)
	}
}

// totalOf is the order total of rec's request when its tool has one (a
// create_order), for the notice of a re-run approval.
func (s *Service) totalOf(rec *ledger.Record) *approvals.Total {
	eff := s.effectOf(rec.Tool)
	if eff == nil || len(rec.Args) == 0 {
		return nil
	}
	f, err := eff.policyFacts(rec.Args, nil)
	if err != nil || !f.HasAmount {
		return nil
	}
	return &approvals.Total{AmountMinor: f.Amount, Currency: f.Currency}
}
