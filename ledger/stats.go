package ledger

import "context"

// Stats are the reliability numbers the project keeps apart (DESIGN §7),
// computed from the audit log.
type Stats struct {
	// Operations counts distinct operations seen in transitions: a (tenant,
	// key), or more than one when the key was used again after the sweep
	// deleted its tombstone (an "deleted" audit entry) — a new operation.
	Operations int `json:"operations"`
	Calls      int `json:"calls"` // tool calls answered by the ledger (refusals before it excluded)
	// RetryAmplification is calls per operation: how often the same intent
	// was sent. 1.0 means nobody retried.
	RetryAmplification float64 `json:"retry_amplification"`
	Executions         int     `json:"executions"` // operations that reached succeeded
	// DuplicateSideEffects counts operations that reached succeeded more
	// than once (extra executions). Must be 0. An operation under a key
	// freed by the deletion of its tombstone is a new operation, not a
	// duplicate; one created under a key whose earlier operation was never
	// deleted is counted with it.
	DuplicateSideEffects int `json:"duplicate_side_effects"`
	ReplaysServed        int `json:"replays_served"`
	MismatchesRefused    int `json:"fingerprint_mismatches_refused"`
	InvalidRefused       int `json:"invalid_arguments_refused"`
	SuspectedDuplicates  int `json:"suspected_duplicates_held"`
	// FalseDedupes counts suspected duplicates an approver then approved:
	// requests the duplicate rule held that were meant as new intents.
	FalseDedupes int `json:"false_dedupes"`
	// Unknown counts operations whose outcome became unknown, and Settled
	// how each was settled, by how (reconciled_found, reconciled_absent_retry,
	// reconciled_absent_needs_approval, resolved_by_hand, other).
	Unknown     int            `json:"unknown_outcomes"`
	Settled     map[string]int `json:"unknown_settled"`
	StillUnsure int            `json:"unknown_unsettled"`
	// LateReplays counts calls that arrived after retention and got
	// key_expired instead of a re-execution.
	LateReplays int `json:"late_replays_after_retention"`
}

// ComputeStats reads the whole audit log (for tenant, or every tenant when
// tenant is "") and returns the numbers.
func ComputeStats(ctx context.Context, s Store, tenant string) (Stats, error) {
	st := Stats{Settled: map[string]int{}}
	type keyOf struct{ tenant, key string }
	type opKey struct {
		keyOf
		incarnation int // operations under the key so far, less one
	}
	incarnation := map[keyOf]int{} // the key's current operation
	freed := map[keyOf]bool{}      // its tombstone was deleted: the next record is a new operation
	ops := map[opKey]bool{}
	succeeded := map[opKey]int{}
	unknownNow := map[opKey]bool{}
	suspect := map[opKey]bool{}
	var after uint64
	for {
		entries, err := s.AuditLog(ctx, after, 10000)
		if err != nil {
			return st, err
		}
		for _, e := range entries {
			after = e.Seq
			if tenant != "" && e.Actor.Tenant != tenant {
				continue
			}
			kk := keyOf{e.Actor.Tenant, e.Key}
			if e.Event == "transition" && e.StateBefore == "" && freed[kk] {
				incarnation[kk]++
				delete(freed, kk)
			}
			k := opKey{kk, incarnation[kk]}
			switch e.Event {
			case EventDeleted:
				freed[kk] = true
			case "call":
				if e.Is(AuditRefused) {
					if e.ErrorCode == "invalid_arguments" {
						st.InvalidRefused++
					}
					continue // refused before the ledger: no operation to count it against
				}
				if e.Key == "" {
					continue
				}
				st.Calls++
				switch DecisionKind(e.Decision) {
				case DecisionReplay:
					st.ReplaysServed++
				case DecisionMismatch:
					st.MismatchesRefused++
				case DecisionExpired:
					st.LateReplays++
				}
			case "transition":
				ops[k] = true
				if e.StateBefore == "" || e.StateBefore == StateRetryable {
					st.Calls++ // the call that claimed it
				}
				if e.Is(AuditSuspectedDuplicate) {
					st.SuspectedDuplicates++
					suspect[k] = true
				}
				if suspect[k] && e.Is(AuditApprovedBy) {
					st.FalseDedupes++
				}
				if e.StateAfter == StateSucceeded && e.StateBefore != StateSucceeded {
					succeeded[k]++
				}
				if e.StateAfter == StateUnknown && e.StateBefore != StateUnknown {
					st.Unknown++
					unknownNow[k] = true
				}
				if e.StateBefore == StateUnknown && e.StateAfter != StateUnknown {
					delete(unknownNow, k)
					st.Settled[string(e.SettledHow())]++
				}
			}
		}
		if len(entries) < 10000 {
			break
		}
	}
	st.Operations = len(ops)
	for _, n := range succeeded {
		st.Executions++
		st.DuplicateSideEffects += n - 1
	}
	st.StillUnsure = len(unknownNow)
	if st.Operations > 0 {
		st.RetryAmplification = float64(st.Calls) / float64(st.Operations)
	}
	return st, nil
}
