package console

import (
	"idemgate/ledger"
	"idemgate/tools"
)

// outcome is the answer to one approver's decision, as the page after
// it shows it.
type outcome struct {
	// Heading says what happened to this approver's action — not the
	// operation's state alone: "Approved: the order was placed",
	// "Refused: you requested this operation; another approver must
	// decide", "Already decided by boss2 at …: succeeded". A decision
	// that was not applied never has a heading starting "Approved" or
	// "Rejected".
	Heading string
	// Took is true when this approver's decision was applied; false when
	// it was refused or came too late (the heading then says why).
	Took     bool
	Decision string
	Status   string
	Replayed bool
	Code     string
	Message  string
	// Summary is the result in words (summarize), Result its JSON.
	Summary string
	Result  string
	Key     string
}

// headingOf says what became of decision (approve or reject) by this
// approver, from the approvals API's answer to it and the tool of the
// operation decided. It reads only the answer's structured fields: its
// status, whether it was replayed, the error's code and the approval's
// record — never a message's text.
func headingOf(decision tools.Decision, resp *tools.Response, tool string) (heading string, took bool) {
	code := ""
	if resp.Error != nil {
		code = resp.Error.Code
	}
	a := resp.Approval
	switch {
	case resp.Replayed && a != nil && (a.Status == ledger.ApprovalApproved || a.Status == ledger.ApprovalRejected):
		// Another approver was first: this one's decision did nothing.
		by := a.DecidedBy
		if by == "" {
			by = "another approver"
		}
		at := ""
		if !a.DecidedAt.IsZero() {
			at = " at " + a.DecidedAt.UTC().Format("2006-01-02 15:04:05 UTC")
		}
		return "Already decided by " + by + at + ": " + string(resp.Status), false
	case resp.Replayed && a != nil && a.Status == ledger.ApprovalExpired:
		return "Too late: this approval had already expired; nothing ran", false
	case resp.Replayed:
		// Settled while pending (reconciled or resolved by hand).
		return "Already settled without this approval: " + string(resp.Status), false
	case code == string(tools.CodeForbidden) && resp.Status == ledger.StateAwaitingApproval:
		return "Refused: you requested this operation; another approver must decide", false
	case code == string(tools.CodeApprovalRequired) && resp.Status == ledger.StateRejected:
		return "Too late: this approval expired before your decision; nothing ran", false
	case decision == tools.Reject && resp.Status == ledger.StateRejected:
		return "Rejected: nothing ran", true
	case decision == tools.Approve && resp.Status == ledger.StateSucceeded:
		what := "the operation succeeded"
		if verb := done[tool]; verb != "" {
			what = "the order was " + verb
		} else if tool == "send_notification" {
			what = "the notification was queued for delivery"
		}
		return "Approved: " + what, true
	case decision == tools.Approve && resp.Status == ledger.StateFailed:
		return "Approved, but the operation failed (" + code + "): nothing was changed", true
	case decision == tools.Approve && resp.Status == ledger.StateUnknown:
		return "Approved, but the outcome is unknown: the order system did not say whether it happened", true
	case decision == tools.Approve && (resp.Status == ledger.StateInProgress || resp.Status == ledger.StateRetryable):
		return "Approved: the operation is running", true
	}
	if code == "" {
		code = string(resp.Status)
	}
	return "Refused: " + code, false
}
