package tools

import (
	"context"
	"testing"

	"github.com/google/uuid"

	"idemgate/ledger"
)

// TestResolveRefusesCaseVariantRequester: the requester of an unknown
// operation cannot settle it by hand under a case variant of its name.
func TestResolveRefusesCaseVariantRequester(t *testing.T) {
	ctx := context.Background()
	svc, fake := externalService(t, false)
	key := uuid.NewString()
	fake.hangNext = true
	if first := svc.Call(ctx, agent, "create_order", orderArgs(key, 1), nil); first.Status != ledger.StateUnknown {
		t.Fatalf("first = %+v, want unknown", first)
	}
	args := map[string]any{"operation_key": key, "outcome": "not_executed", "evidence": "checked the order screen: nothing there"}
	self := ledger.Actor{Tenant: agent.Tenant, Principal: "AGENT-1", Role: "approver"}
	if r := svc.Call(ctx, self, "resolve_operation", args, nil); r.Error == nil || r.Error.Code != "forbidden" {
		t.Fatalf("resolve by %s (requester %s) = %+v, want forbidden", self.Principal, agent.Principal, r)
	}
	rec, err := svc.ledger.Get(ctx, agent.Tenant, key)
	if err != nil || rec.State != ledger.StateUnknown {
		t.Fatalf("after the refused resolve: %v %v, want unknown", rec, err)
	}
	if r := svc.Call(ctx, approver, "resolve_operation", args, nil); r.IsError && r.Error.Code == "forbidden" {
		t.Fatalf("resolve by another approver = %+v", r)
	}
}
