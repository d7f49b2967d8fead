package ledger

import (
	"encoding/json"
	"testing"
)

// TestSettledHowReadsTheTypedField: a settlement is classified by the
// Settled field its entry carries, whatever its decision text says.
func TestSettledHowReadsTheTypedField(t *testing.T) {
	for _, tc := range []struct {
		decision AuditDecision
		settled  Settlement
	}{
		{"found it by asking the warehouse", SettledReconciledFound},
		{"reconciled: the order system has order ord_1 for this key", SettledResolvedByHand}, // the field wins over prose
		{"", SettledReconciledAbsentNeedsApproval},
		{"resolved by someone", SettledOther},
	} {
		e := AuditEntry{Event: "transition", StateBefore: StateUnknown, StateAfter: StateSucceeded, Decision: tc.decision, Settled: tc.settled}
		if got := e.SettledHow(); got != tc.settled {
			t.Errorf("SettledHow(%q, settled %q) = %q", tc.decision, tc.settled, got)
		}
	}
}

// TestSettledHowLegacyEntries: entries written by builds before the
// Settled field carry only their decision text; they are still read, and
// classified as those builds' metrics classified them, and their hash
// chain still verifies.
func TestSettledHowLegacyEntries(t *testing.T) {
	for decision, want := range map[AuditDecision]Settlement{
		"reconciled: the order system has order ord_9 for this key":                            SettledReconciledFound,
		"reconciled: the order system has nothing for this key, and same-key retries are safe": SettledReconciledAbsentRetry,
		"reconciled: absent at the order system; re-run needs approval":                        SettledReconciledAbsentNeedsApproval,
		"resolved by alice: succeeded; evidence: ticket 42":                                    SettledResolvedByHand,
		"late answer of attempt 1, after its lease had passed: succeeded":                      SettledOther,
	} {
		old := AuditEntry{Seq: 7, Event: "transition", Key: "k", Decision: decision, StateBefore: StateUnknown, StateAfter: StateSucceeded}
		if err := old.chain("prev"); err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(old)
		if err != nil {
			t.Fatal(err)
		}
		var read AuditEntry
		if err := json.Unmarshal(b, &read); err != nil {
			t.Fatal(err)
		}
		if got := read.SettledHow(); got != want {
			t.Errorf("legacy %q: SettledHow = %q, want %q", decision, got, want)
		}
		if err := read.verifyChain("prev"); err != nil {
			t.Errorf("legacy entry no longer verifies: %v", err)
		}
	}
}

// TestAuditDecisionIs: the prefixes match entries that start with them,
// the words only themselves.
func TestAuditDecisionIs(t *testing.T) {
	e := AuditEntry{Decision: AuditApprovedBy + "bob"}
	if !e.Is(AuditApprovedBy) || e.Is(AuditRejectedBy) || e.Is(AuditClaimed) {
		t.Errorf("Is on %q is wrong", e.Decision)
	}
	e = AuditEntry{Decision: "suspected_duplicate of k1"}
	if !e.Is(AuditSuspectedDuplicate) {
		t.Errorf("Is(suspected duplicate) false on %q", e.Decision)
	}
	e = AuditEntry{Decision: "claimed again"}
	if e.Is(AuditClaimed) {
		t.Errorf("the word %q matched %q", AuditClaimed, e.Decision)
	}
}
