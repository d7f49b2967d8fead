package ledger

import "errors"

// EventOperator is the audit event of an operator's action that is not a
// state change of an operation — a dead-lettered message put back in the
// queue (decision AuditRequeued). ComputeStats counts none of them.
const EventOperator AuditEvent = "operator"

// AuditRequeued is the decision of an EventOperator entry that records a
// requeue; Detail names the message, Call.MessageIDs holds its id.
const AuditRequeued AuditDecision = "requeued"

// AppendAudit appends e to the audit chain inside tx, a transaction of
// Store.Update: the entry commits with what fn changed, or not at all.
// At defaults to the transaction's time. It is for actions on the
// downstream collections that the log must name (who, what, when); a
// state change of an operation writes its own entry. Returns an error for
// a tx not from Store.Update, or a read-only one.
func AppendAudit(tx Tx, e AuditEntry) error {
	dt, ok := tx.(*dataTx)
	if !ok {
		return errors.New("ledger: AppendAudit needs a transaction of Store.Update")
	}
	if e.At.IsZero() {
		e.At = dt.now
	}
	return appendAudit(dt.tx, e)
}
