package console

import (
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/tools"
)

// TestHeadingOf: the heading of the page after a decision says what
// became of this approver's action, for each kind of answer the
// approvals API gives.
func TestHeadingOf(t *testing.T) {
	at := time.Date(2026, 12, 3, 20, 31, 5, 0, time.UTC)
	decided := func(status string) *ledger.Approval {
		return &ledger.Approval{Status: status, DecidedBy: "boss2", DecidedAt: at}
	}
	errOf := func(code ledger.Code) *ledger.OpError { return &ledger.OpError{Code: string(code)} }
	for _, c := range []struct {
		name     string
		decision tools.Decision
		resp     tools.Response
		tool     string
		want     string
		took     bool
	}{
		{"placed", tools.Approve, tools.Response{Status: ledger.StateSucceeded}, "create_order", "Approved: the order was placed", true},
		{"unnamed tool", tools.Approve, tools.Response{Status: ledger.StateSucceeded}, "", "Approved: the operation succeeded", true},
		{"own request", tools.Approve, tools.Response{Status: ledger.StateAwaitingApproval, Error: errOf(ledger.CodeForbidden)}, "cancel_order", "Refused: you requested this operation; another approver must decide", false},
		{"own request rejected", tools.Reject, tools.Response{Status: ledger.StateAwaitingApproval, Error: errOf(ledger.CodeForbidden)}, "cancel_order", "Refused: you requested this operation; another approver must decide", false},
		{"lost the race", tools.Approve, tools.Response{Status: ledger.StateSucceeded, Replayed: true, Approval: decided(ledger.ApprovalApproved)}, "cancel_order", "Already decided by boss2 at 2026-12-03 20:31:05 UTC: succeeded", false},
		{"rejected first", tools.Approve, tools.Response{Status: ledger.StateRejected, Replayed: true, Approval: decided(ledger.ApprovalRejected)}, "cancel_order", "Already decided by boss2 at 2026-12-03 20:31:05 UTC: rejected", false},
		{"expired now", tools.Approve, tools.Response{Status: ledger.StateRejected, Error: errOf(ledger.CodeApprovalRequired)}, "cancel_order", "Too late: this approval expired before your decision; nothing ran", false},
		{"expired before", tools.Approve, tools.Response{Status: ledger.StateRejected, Replayed: true, Approval: &ledger.Approval{Status: ledger.ApprovalExpired}}, "cancel_order", "Too late: this approval had already expired; nothing ran", false},
		{"settled while pending", tools.Approve, tools.Response{Status: ledger.StateSucceeded, Replayed: true, Approval: &ledger.Approval{Status: ledger.ApprovalSuperseded}}, "create_order", "Already settled without this approval: succeeded", false},
		{"rejected", tools.Reject, tools.Response{Status: ledger.StateRejected, Error: errOf(ledger.CodeForbidden)}, "cancel_order", "Rejected: nothing ran", true},
		{"failed", tools.Approve, tools.Response{Status: ledger.StateFailed, Error: errOf(ledger.CodePreconditionFailed)}, "update_order", "Approved, but the operation failed (precondition_failed): nothing was changed", true},
		{"unknown", tools.Approve, tools.Response{Status: ledger.StateUnknown, Error: errOf(ledger.CodeOutcomeUnknown)}, "create_order", "Approved, but the outcome is unknown: the order system did not say whether it happened", true},
		{"internal", tools.Approve, tools.Response{Status: ledger.StateAwaitingApproval, Error: errOf(ledger.CodeInternal)}, "create_order", "Refused: internal", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, took := headingOf(c.decision, &c.resp, c.tool)
			if got != c.want || took != c.took {
				t.Errorf("headingOf = %q, %v; want %q, %v", got, took, c.want, c.took)
			}
		})
	}
}
