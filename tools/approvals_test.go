package tools

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/orders"
	"idemgate/schemas"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time { return c.t }

func newService(t *testing.T, clock *fakeClock, policy *approvals.Policy) *Service {
	t.Helper()
	opts := ledger.Options{}
	if clock != nil {
		opts.Now = clock.Now
	}
	store, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	v, err := schemas.New()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(store, v, Options{OutboxDir: t.TempDir(), Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

var (
	agent    = ledger.Actor{Tenant: "t1", Principal: "agent-1", Role: "agent"}
	approver = ledger.Actor{Tenant: "t1", Principal: "boss", Role: "approver"}
)

func orderArgs(key string, qty int) map[string]any {
	return map[string]any{"operation_key": key, "customer_id": "c1", "currency": "EUR",
		"items": []any{map[string]any{"sku": "s1", "quantity": float64(qty), "unit_price_minor": float64(500)}}}
}

func resultOrder(t *testing.T, r *Response) orders.Order {
	t.Helper()
	var res struct{ Order orders.Order }
	if err := json.Unmarshal(r.Result, &res); err != nil {
		t.Fatalf("result %s: %v", r.Result, err)
	}
	return res.Order
}

func TestCancelNeedsApprovalThenRuns(t *testing.T) {
	ctx := context.Background()
	svc := newService(t, nil, nil)
	created := svc.Call(ctx, agent, "create_order", orderArgs(uuid.NewString(), 1), nil)
	o := resultOrder(t, created)

	key := uuid.NewString()
	cancel := map[string]any{"operation_key": key, "order_id": o.OrderID, "expected_version": float64(1), "reason": "customer asked"}
	held := svc.Call(ctx, agent, "cancel_order", cancel, nil)
	if held.Status != ledger.StateAwaitingApproval || held.Error.Code != "approval_required" || held.Approval == nil {
		t.Fatalf("cancel = %+v, want awaiting_approval", held)
	}
	again := svc.Call(ctx, agent, "cancel_order", cancel, nil)
	if again.Approval == nil || again.Approval.ID != held.Approval.ID {
		t.Fatalf("retry while pending got approval %+v, want the same id %s", again.Approval, held.Approval.ID)
	}
	if r := svc.Call(ctx, agent, "decide_approval", map[string]any{"approval_id": held.Approval.ID, "decision": "approve"}, nil); r.Error == nil || r.Error.Code != "forbidden" {
		t.Fatalf("agent deciding = %+v, want forbidden", r)
	}
	self := approver
	self.Principal = agent.Principal
	if r := svc.Call(ctx, self, "decide_approval", map[string]any{"approval_id": held.Approval.ID, "decision": "approve"}, nil); r.Error == nil || r.Error.Code != "forbidden" {
		t.Fatalf("self approval = %+v, want forbidden", r)
	}
	other := approver
	other.Tenant = "t2"
	if r := svc.Call(ctx, other, "decide_approval", map[string]any{"approval_id": held.Approval.ID, "decision": "approve"}, nil); r.Error == nil || r.Error.Code != "not_found" {
		t.Fatalf("other tenant's approver = %+v, want not_found", r)
	}

	list := svc.Call(ctx, approver, "list_pending_approvals", map[string]any{}, nil)
	var l struct {
		Approvals []struct {
			ApprovalID string             `json:"approval_id"`
			Diff       []approvals.Change `json:"diff"`
			DiffText   string             `json:"diff_text"`
		}
	}
	json.Unmarshal(list.Result, &l)
	if len(l.Approvals) != 1 || l.Approvals[0].ApprovalID != held.Approval.ID || len(l.Approvals[0].Diff) != 2 || l.Approvals[0].Diff[0].Path != "status" || l.Approvals[0].Diff[1].Path != "cancel_reason" || l.Approvals[0].Diff[1].After != "customer asked" {
		t.Fatalf("pending = %s", list.Result)
	}

	done := svc.Call(ctx, approver, "decide_approval", map[string]any{"approval_id": held.Approval.ID, "decision": "approve", "comment": "ok"}, nil)
	if done.Status != ledger.StateSucceeded || resultOrder(t, done).Status != "cancelled" || resultOrder(t, done).Version != 2 {
		t.Fatalf("approve = %+v %s", done, done.Result)
	}
	second := svc.Call(ctx, approver, "decide_approval", map[string]any{"approval_id": held.Approval.ID, "decision": "approve"}, nil)
	if !second.Replayed || second.Status != ledger.StateSucceeded {
		t.Fatalf("second approve = %+v, want the recorded outcome replayed", second)
	}
	replay := svc.Call(ctx, agent, "cancel_order", cancel, nil)
	if !replay.Replayed || replay.Status != ledger.StateSucceeded || string(replay.Result) != string(done.Result) {
		t.Fatalf("agent retry = %+v, want replay of %s", replay, done.Result)
	}
}

func TestStaleVersionAtApprovalAppliesNothing(t *testing.T) {
	ctx := context.Background()
	svc := newService(t, nil, nil)
	o := resultOrder(t, svc.Call(ctx, agent, "create_order", orderArgs(uuid.NewString(), 1), nil))
	upd := func(note string) *Response {
		return svc.Call(ctx, agent, "update_order", map[string]any{"operation_key": uuid.NewString(), "order_id": o.OrderID, "expected_version": float64(1), "changes": map[string]any{"note": note}}, nil)
	}
	first, second := upd("first"), upd("second")
	ok := svc.Call(ctx, approver, "decide_approval", map[string]any{"approval_id": first.Approval.ID, "decision": "approve"}, nil)
	if ok.Status != ledger.StateSucceeded || resultOrder(t, ok).Note != "first" {
		t.Fatalf("first approve = %+v", ok)
	}
	stale := svc.Call(ctx, approver, "decide_approval", map[string]any{"approval_id": second.Approval.ID, "decision": "approve"}, nil)
	if stale.Status != ledger.StateFailed || stale.Error.Code != "precondition_failed" {
		t.Fatalf("stale approve = %+v", stale)
	}
	got := svc.Call(ctx, agent, "get_order", map[string]any{"order_id": o.OrderID}, nil)
	if n := resultOrder(t, got); n.Note != "first" || n.Version != 2 {
		t.Fatalf("order after stale approval = %+v, want note first version 2", n)
	}
}

func TestApprovalExpiry(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	svc := newService(t, clock, nil)
	big := orderArgs(uuid.NewString(), 1000) // 1000 × 500 = 500 000 ≥ threshold
	held := svc.Call(ctx, agent, "create_order", big, nil)
	if held.Status != ledger.StateAwaitingApproval {
		t.Fatalf("large order = %+v, want awaiting_approval", held)
	}
	clock.t = clock.t.Add(25 * time.Hour)
	late := svc.Call(ctx, approver, "decide_approval", map[string]any{"approval_id": held.Approval.ID, "decision": "approve"}, nil)
	if late.Status != ledger.StateRejected || late.Error.Code != "approval_required" {
		t.Fatalf("late approve = %+v, want rejected", late)
	}
	replay := svc.Call(ctx, agent, "create_order", big, nil)
	if replay.Status != ledger.StateRejected || !replay.Replayed {
		t.Fatalf("agent retry after expiry = %+v", replay)
	}
	list := svc.Call(ctx, agent, "list_orders", map[string]any{"customer_id": "c1"}, nil)
	var l struct{ Count int }
	json.Unmarshal(list.Result, &l)
	if l.Count != 0 {
		t.Fatalf("%d orders exist after an expired approval, want 0", l.Count)
	}
}

func TestPolicyDenies(t *testing.T) {
	ctx := context.Background()
	p := approvals.Default()
	p.AllowedCurrencies = []string{"USD"}
	p.DeniedTools = map[string][]string{"agent-1": {"send_notification"}}
	svc := newService(t, nil, &p)
	r := svc.Call(ctx, agent, "create_order", orderArgs(uuid.NewString(), 1), nil)
	if r.Error == nil || r.Error.Code != "forbidden" {
		t.Fatalf("EUR order = %+v, want forbidden", r)
	}
	r = svc.Call(ctx, agent, "send_notification", map[string]any{"operation_key": uuid.NewString(), "channel": "email", "to": []any{"a@b.example"}, "body": "x"}, nil)
	if r.Error == nil || r.Error.Code != "forbidden" {
		t.Fatalf("denied tool = %+v, want forbidden", r)
	}
}

// TestAnswersCarryNoResource: the order a change is for is kept on its
// approval (ledger.Approval.Resource) for approvers — the approvals API
// shows it — but the answers agents get never carry it: not the held
// answer, its replay while pending, get_operation_status, the decision's
// answer, nor the replay of the outcome. So neither the order's ship_to
// nor its note reaches them that way, the approval object is what it was
// before Resource was kept, and every answer is valid against the
// published output schema.
func TestAnswersCarryNoResource(t *testing.T) {
	ctx := context.Background()
	svc := newService(t, nil, nil)
	args := orderArgs(uuid.NewString(), 1)
	args["note"] = "the side door, code 4711"
	args["ship_to"] = map[string]any{"name": "Ada Lovelace", "line1": "12 Secret Lane", "city": "London", "postal_code": "N1 9GU", "country": "GB"}
	created := svc.Call(ctx, agent, "create_order", args, nil)
	if created.Status != ledger.StateSucceeded {
		t.Fatalf("create_order = %+v", created)
	}
	o := resultOrder(t, created)
	key := uuid.NewString()
	update := map[string]any{"operation_key": key, "order_id": o.OrderID, "expected_version": float64(1), "changes": map[string]any{"requested_delivery_date": "2030-01-02"}}
	v, err := schemas.New()
	if err != nil {
		t.Fatal(err)
	}
	// held: the operation has not run (its answer has no result, so the
	// order may not show anywhere in it).
	check := func(what string, held bool, r *Response) {
		t.Helper()
		b, err := r.Encoded()
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Approval map[string]json.RawMessage `json:"approval"`
		}
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		if got.Approval == nil {
			t.Errorf("%s: no approval in %s", what, b)
		}
		if _, ok := got.Approval["resource"]; ok {
			t.Errorf("%s: the approval carries the resource: %s", what, b)
		}
		approval, _ := json.Marshal(got.Approval)
		for _, leak := range []string{"Secret Lane", "code 4711"} {
			if strings.Contains(string(approval), leak) {
				t.Errorf("%s: the approval shows the order's %q: %s", what, leak, approval)
			}
		}
		if held && strings.Contains(string(b), "Secret Lane") {
			t.Errorf("%s: the answer shows the order's ship_to: %s", what, b)
		}
		if err := v.ValidateResult(json.RawMessage(b)); err != nil {
			t.Errorf("%s: not valid against the output schema: %v\n%s", what, err, b)
		}
	}
	held := svc.Call(ctx, agent, "update_order", update, nil)
	if held.Status != ledger.StateAwaitingApproval || held.Approval == nil {
		t.Fatalf("update_order = %+v, want held", held)
	}
	check("held", true, held)
	check("replay while pending", true, svc.Call(ctx, agent, "update_order", update, nil))
	check("get_operation_status while pending", true, svc.Call(ctx, agent, "get_operation_status", map[string]any{"operation_key": key}, nil))

	// The approvals API still shows the order the change is for.
	a, err := svc.ShowApproval(ctx, approver, held.Approval.ID)
	if err != nil || !strings.Contains(string(a.Resource), "Secret Lane") || a.Total == nil {
		t.Errorf("ShowApproval = %+v (%v), want the order as it was, with its total", a, err)
	}
	rec, err := svc.ledger.Get(ctx, agent.Tenant, key)
	if err != nil || rec.Approval == nil || len(rec.Approval.Resource) == 0 {
		t.Fatalf("the record's approval keeps no resource: %+v (%v)", rec, err)
	}

	done := svc.Call(ctx, approver, "decide_approval", map[string]any{"approval_id": held.Approval.ID, "decision": "approve"}, nil)
	if done.Status != ledger.StateSucceeded {
		t.Fatalf("approve = %+v", done)
	}
	check("the decision", false, done)
	check("a second decision", false, svc.Call(ctx, approver, "decide_approval", map[string]any{"approval_id": held.Approval.ID, "decision": "approve"}, nil))
	replay := svc.Call(ctx, agent, "update_order", update, nil)
	if !replay.Replayed {
		t.Errorf("the agent's retry = %+v, want a replay", replay)
	}
	check("replay of the outcome", false, replay)
	check("get_operation_status after", false, svc.Call(ctx, agent, "get_operation_status", map[string]any{"operation_key": key}, nil))
	if rec, _ := svc.ledger.Get(ctx, agent.Tenant, key); rec == nil || rec.Approval == nil || len(rec.Approval.Resource) == 0 {
		t.Errorf("answering changed the record's approval: %+v", rec)
	}
}
