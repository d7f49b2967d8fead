package tools

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"idemgate/ledger"
)

// TestSettlementsAreTyped: each way an unknown outcome is settled —
// reconciled and found, reconciled and absent (retry safe, or a re-run
// needing approval), resolved by hand — is written on the settling audit
// entry as its typed Settlement, and that is what the stats count.
func TestSettlementsAreTyped(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		safeRetry bool
		setup     func(*miniAPI)
		settle    func(t *testing.T, svc *Service, key string)
		want      ledger.Settlement
	}{
		{"reconciled_found", false, func(a *miniAPI) { a.hangNext = true }, func(t *testing.T, svc *Service, key string) {
			svc.Call(ctx, agent, "create_order", orderArgs(key, 1), nil)
		}, ledger.SettledReconciledFound},
		{"reconciled_absent_retry", true, func(a *miniAPI) { a.absentNext = true }, func(t *testing.T, svc *Service, key string) {
			svc.Call(ctx, agent, "create_order", orderArgs(key, 1), nil)
		}, ledger.SettledReconciledAbsentRetry},
		{"reconciled_absent_needs_approval", false, func(a *miniAPI) { a.absentNext = true }, func(t *testing.T, svc *Service, key string) {
			svc.Call(ctx, agent, "create_order", orderArgs(key, 1), nil)
		}, ledger.SettledReconciledAbsentNeedsApproval},
		{"resolved_by_hand", false, func(a *miniAPI) { a.hangNext = true }, func(t *testing.T, svc *Service, key string) {
			args := map[string]any{"operation_key": key, "outcome": "not_executed", "evidence": "checked the order screen: nothing there"}
			if r := svc.Call(ctx, approver, "resolve_operation", args, nil); r.IsError {
				t.Fatalf("resolve = %+v", r)
			}
		}, ledger.SettledResolvedByHand},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc, fake := externalService(t, tc.safeRetry)
			key := uuid.NewString()
			tc.setup(fake)
			if first := svc.Call(ctx, agent, "create_order", orderArgs(key, 1), nil); first.Status != ledger.StateUnknown {
				t.Fatalf("first = %+v, want unknown", first)
			}
			tc.settle(t, svc, key)
			entries, _, err := svc.ledger.AuditForKey(ctx, agent.Tenant, key, 0)
			if err != nil {
				t.Fatal(err)
			}
			var settling []ledger.AuditEntry
			for _, e := range entries {
				if e.Event == "transition" && e.StateBefore == ledger.StateUnknown && e.StateAfter != ledger.StateUnknown {
					settling = append(settling, e)
				}
			}
			if len(settling) != 1 || settling[0].Settled != tc.want {
				t.Fatalf("settling entries = %+v, want one with settled %q", settling, tc.want)
			}
			st, err := ledger.ComputeStats(ctx, svc.ledger, "")
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Settled) != 1 || st.Settled[string(tc.want)] != 1 {
				t.Errorf("stats settled = %v, want {%s: 1}", st.Settled, tc.want)
			}
		})
	}
}
