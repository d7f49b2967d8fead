package main

import (
	"testing"

	"idemgate/ledger"
)

// TestOpsShowReadsBothForms: ops show's WHAT and ANSWER columns say the
// same of a replay written as one call entry carrying its answer (this
// build) as of one written as a call and an answer entry (builds before).
func TestOpsShowReadsBothForms(t *testing.T) {
	sha := "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	call := ledger.AuditEntry{Event: ledger.EventCall, Decision: ledger.AuditDecision(ledger.DecisionReplay), StateAfter: ledger.StateSucceeded, Attempt: 1}
	oldAnswer := ledger.AnswerEntry(ledger.Actor{}, "create_order", "k", ledger.Answer{State: ledger.StateSucceeded, Attempt: 1, Replayed: true, ResponseSHA256: sha, DurationMS: 0.5})
	merged := call
	merged.Replayed, merged.ResponseSHA256, merged.DurationMS = true, sha, 0.5

	if got := what(call) + " | " + what(oldAnswer); got != "replay | succeeded (replayed)" {
		t.Errorf("earlier form: what = %q", got)
	}
	if got := answer(call) + " | " + answer(oldAnswer); got != "- | sha256:0123456789ab 0.5ms" {
		t.Errorf("earlier form: answer = %q", got)
	}
	if got, want := what(merged)+" | "+answer(merged), "replay: succeeded | sha256:0123456789ab 0.5ms"; got != want {
		t.Errorf("one entry: %q, want %q", got, want)
	}
	refused := ledger.AuditEntry{Event: ledger.EventCall, Decision: ledger.AuditRefused, ErrorCode: "invalid_arguments", ResponseSHA256: sha}
	if got := what(refused); got != "refused invalid_arguments" {
		t.Errorf("refusal: what = %q", got)
	}
}
