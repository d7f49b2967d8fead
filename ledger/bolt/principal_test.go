package bolt

import (
	"testing"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
)

func TestSamePrincipal(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"alice-assistant", "alice-assistant", true},
		{"ALICE-assistant", "alice-assistant", true},
		{" alice-assistant ", "alice-assistant", true},
		{"ａｌｉｃｅ-assistant", "alice-assistant", true}, // full-width letters
		{"STRASSE", "straße", true},
		{"alice-assistant-2", "alice-assistant", false},
		{"bob", "alice", false},
	} {
		if got := ledger.SamePrincipal(tc.a, tc.b); got != tc.same {
			t.Errorf("SamePrincipal(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
}

// TestDecideRefusesCaseVariantSelfApproval: the requester cannot approve
// their own operation under a name that differs only in case or form.
func TestDecideRefusesCaseVariantSelfApproval(t *testing.T) {
	ctx := t.Context()
	s := mustOpen(t, ledgertest.Opts())
	c := newClaim("t1", "cancel_order", "fp")
	c.Actor.Principal = "alice-assistant"
	c.RequireApproval = true
	d, err := s.Execute(ctx, c, nil)
	if err != nil || d.Record.Approval == nil {
		t.Fatalf("held claim: %v", err)
	}
	for _, name := range []string{"ALICE-assistant", " alice-assistant", "ａｌｉｃｅ-ASSISTANT"} {
		_, err := s.Decide(ctx, ledger.DecideRequest{Approver: ledger.Actor{Tenant: "t1", Principal: name, Role: "approver"}, ApprovalID: d.Record.Approval.ID, Approve: true}, nil)
		if err != ledger.ErrSelfApproval {
			t.Fatalf("Decide by %q = %v, want ErrSelfApproval", name, err)
		}
	}
	if _, err := s.Decide(ctx, ledger.DecideRequest{Approver: ledger.Actor{Tenant: "t1", Principal: "boss", Role: "approver"}, ApprovalID: d.Record.Approval.ID, Approve: false}, nil); err != nil {
		t.Fatalf("Decide by another principal: %v", err)
	}
}
