package ledger

import "strings"

// AuditEvent is what kind of thing an audit entry records (AuditEntry.Event).
type AuditEvent string

// The events of tool calls and operations. The sweep, the operator's
// actions and the audit prune have their own (EventDeleted, EventOperator,
// EventAuditPruned).
const (
	// EventCall: what the ledger (or, with decision AuditRefused, the
	// policy or argument validation) decided for a call that changed
	// nothing.
	EventCall AuditEvent = "call"
	// EventTransition: a state change of an operation, written in the
	// transaction that made it.
	EventTransition AuditEvent = "transition"
	// EventAnswer: the end of a side-effecting tool call: what the client
	// was sent (status, error code, SHA-256 of the result's JSON text) and
	// how long the call took — when the entry of the call's decision could
	// not carry it (see Claim.Answer, AnswerEntry).
	EventAnswer AuditEvent = "answer"
)

// AuditDecision is what an audit entry says was decided (AuditEntry.Decision):
// for a call, its DecisionKind or AuditRefused; for a transition, one of
// the words below, a prefix below followed by a name, or a settlement's
// reason (SettleRequest.Why). Code that classifies entries uses the typed
// constants and fields (Is, SettledHow), never other prose.
type AuditDecision string

// The decisions the ledger writes on transitions and calls.
const (
	// AuditClaimed: a claim whose side effect runs outside the ledger's
	// transaction (Claim); its outcome follows as AuditCompleted.
	AuditClaimed AuditDecision = "claimed"
	// AuditExecuted: a claim whose side effect ran in its transaction
	// (Execute), one entry from the state before the claim (none, or
	// retryable) to the outcome. Files of earlier releases hold a
	// "claimed" entry before it.
	AuditExecuted              AuditDecision = "executed"
	AuditCompleted             AuditDecision = "completed"
	AuditExecutedAfterApproval AuditDecision = "executed after approval"
	AuditLeaseExpired          AuditDecision = "lease_expired"
	AuditApprovalExpired       AuditDecision = "approval_expired"
	AuditTombstoneDeleted      AuditDecision = "tombstone deleted after retention; the key is free"
	// AuditRefused is a call refused before the ledger was asked (invalid
	// arguments, policy deny).
	AuditRefused AuditDecision = "refused"

	// Prefixes, followed by the approval rule, the earlier key or the
	// approver's name.
	AuditHeld               AuditDecision = "held: "
	AuditSuspectedDuplicate AuditDecision = "suspected_duplicate of "
	AuditApprovedBy         AuditDecision = "approved by "
	AuditRejectedBy         AuditDecision = "rejected by "
)

// Is reports whether e records decision d: equal to it, or, for a prefix
// (AuditHeld, AuditSuspectedDuplicate, AuditApprovedBy, AuditRejectedBy),
// starting with it.
func (e AuditEntry) Is(d AuditDecision) bool {
	switch d {
	case AuditSuspectedDuplicate:
		// Entries of every build start with the bare word.
		return strings.HasPrefix(string(e.Decision), "suspected_duplicate")
	case AuditHeld, AuditApprovedBy, AuditRejectedBy:
		return strings.HasPrefix(string(e.Decision), string(d))
	}
	return e.Decision == d
}

// Settlement is how an operation whose outcome was unknown was settled,
// as the settler said (SettleRequest.How), written on the transition that
// settled it (AuditEntry.Settled) and counted by ComputeStats and the
// metrics.
type Settlement string

// The settlements.
const (
	// SettledReconciledFound: the downstream has the operation's effect.
	SettledReconciledFound Settlement = "reconciled_found"
	// SettledReconciledAbsentRetry: the downstream has nothing, and
	// same-key retries are safe: the operation is retryable.
	SettledReconciledAbsentRetry Settlement = "reconciled_absent_retry"
	// SettledReconciledAbsentNeedsApproval: the downstream has nothing,
	// and a re-run needs a human's approval.
	SettledReconciledAbsentNeedsApproval Settlement = "reconciled_absent_needs_approval"
	// SettledResolvedByHand: a person settled it with evidence.
	SettledResolvedByHand Settlement = "resolved_by_hand"
	// SettledOther: any other settlement (a late answer, say).
	SettledOther Settlement = "other"
)

// SettledHow says how the transition e, out of unknown, settled its
// operation: e.Settled, which every build since it existed writes on such
// transitions. Entries written by older builds lack it; for them (only)
// it is recovered from the decision text those builds wrote.
func (e AuditEntry) SettledHow() Settlement {
	if e.Settled != "" {
		return e.Settled
	}
	return legacySettlement(string(e.Decision))
}

// legacySettlement classifies the decision text of a settlement written
// by a build before AuditEntry.Settled. Its phrases are frozen: they are
// what those builds wrote.
func legacySettlement(decision string) Settlement {
	switch {
	case strings.HasPrefix(decision, "reconciled: the order system has order"):
		return SettledReconciledFound
	case strings.Contains(decision, "same-key retries are safe"):
		return SettledReconciledAbsentRetry
	case strings.Contains(decision, "re-run needs approval"):
		return SettledReconciledAbsentNeedsApproval
	case strings.HasPrefix(decision, "resolved by"):
		return SettledResolvedByHand
	}
	return SettledOther
}
