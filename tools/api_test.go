package tools

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/orders"
)

// legacyApprovalView is how list_pending_approvals built an approval
// before ApprovalView existed: the reference for its bytes.
func legacyApprovalView(rec *ledger.Record) map[string]any {
	a := rec.Approval
	v := map[string]any{
		"approval_id": a.ID, "status": a.Status, "operation_key": rec.Key, "tool": rec.Tool,
		"requested_by": a.RequestedBy, "reason": a.Reason, "rule": a.Rule,
		"created_at": a.CreatedAt, "expires_at": a.ExpiresAt,
		"diff": a.Diff, "diff_text": a.DiffText,
	}
	if a.ResourceVersion != 0 {
		v["resource_version"] = a.ResourceVersion
	}
	if a.EarlierKey != "" {
		v["earlier_operation_key"] = a.EarlierKey
	}
	if a.DecidedBy != "" {
		v["decided_by"], v["decided_at"], v["comment"] = a.DecidedBy, a.DecidedAt, a.Comment
	}
	// Added since: the resource and the total, only when there are some.
	if len(a.Resource) > 0 {
		v["resource"] = a.Resource
	}
	if t := approvalTotal(a); t != nil {
		v["total"] = t
	}
	return v
}

// TestApprovalViewBytes: the typed approval view encodes to exactly the
// bytes the map it replaced did, for pending and decided approvals, with
// and without the optional fields.
func TestApprovalViewBytes(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 600, time.UTC)
	base := func() *ledger.Record {
		return &ledger.Record{Key: "k1", Tool: "cancel_order", Approval: &ledger.Approval{
			ID: "ap_1", Status: ledger.ApprovalPending, Reason: "cancel_order always needs a human approver", Rule: "always_approve",
			RequestedBy: "agent-1", CreatedAt: at, ExpiresAt: at.Add(24 * time.Hour),
			Diff: json.RawMessage(`[{"path":"status","before":"placed","after":"cancelled"}]`), DiffText: "cancel order o1:\n  ~ status\n",
		}}
	}
	full := base()
	full.Approval.ResourceVersion, full.Approval.EarlierKey = 3, "k0"
	decided := base()
	decided.Approval.Status, decided.Approval.DecidedBy, decided.Approval.DecidedAt = ledger.ApprovalRejected, "boss", at.Add(time.Minute)
	decidedNoComment := base()
	decidedNoComment.Approval.Status, decidedNoComment.Approval.DecidedBy, decidedNoComment.Approval.DecidedAt, decidedNoComment.Approval.Comment = ledger.ApprovalApproved, "boss", at, "ok <&> \"quoted\""
	noDiff := base()
	noDiff.Approval.Diff, noDiff.Approval.DiffText, noDiff.Approval.Rule = nil, "", ""
	withResource := base()
	withResource.Approval.Resource = json.RawMessage(`{"order_id":"o1","currency":"EUR","total_minor":3700}`)
	for name, rec := range map[string]*ledger.Record{"pending": base(), "all optional fields": full, "decided": decided, "decided with comment": decidedNoComment, "no diff": noDiff, "with resource": withResource} {
		t.Run(name, func(t *testing.T) {
			got, want := mustJSON(approvalView(rec)), mustJSON(legacyApprovalView(rec))
			if string(got) != string(want) {
				t.Errorf("approval view\n got %s\nwant %s", got, want)
			}
		})
	}
	list := &ApprovalList{Approvals: []ApprovalView{}, NextCursor: "c"}
	if got, want := string(mustJSON(list)), string(mustJSON(map[string]any{"approvals": []map[string]any{}, "count": 0, "next_cursor": "c"})); got != want {
		t.Errorf("list %s, want %s", got, want)
	}
}

// TestApprovalTotal: an approval's total is the order's total once the
// operation is done, read from the structured diff and the resource — a
// create's and a changed total from the diff, a cancel's and an unchanged
// one from the resource — and nil when either the amount or the currency
// is unknown.
func TestApprovalTotal(t *testing.T) {
	order := json.RawMessage(`{"order_id":"o1","currency":"EUR","total_minor":3700,"customer_id":"c1"}`)
	for _, c := range []struct {
		name     string
		diff     string
		resource json.RawMessage
		want     *approvals.Total
	}{
		{"create", `[{"path":"currency","before":null,"after":"JPY"},{"path":"total_minor","before":null,"after":1200}]`, nil, &approvals.Total{AmountMinor: 1200, Currency: "JPY"}},
		{"change of the items", `[{"path":"total_minor","before":3700,"after":4600}]`, order, &approvals.Total{AmountMinor: 4600, Currency: "EUR"}},
		{"change of the note", `[{"path":"note","before":null,"after":"ring twice"}]`, order, &approvals.Total{AmountMinor: 3700, Currency: "EUR"}},
		{"cancel", `[{"path":"status","before":"placed","after":"cancelled"}]`, order, &approvals.Total{AmountMinor: 3700, Currency: "EUR"}},
		{"change recorded without its resource", `[{"path":"total_minor","before":3700,"after":4600}]`, nil, nil},
		{"notification", `[{"path":"channel","before":null,"after":"email"}]`, nil, nil},
		{"no diff", ``, nil, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := approvalTotal(&ledger.Approval{Diff: json.RawMessage(c.diff), Resource: c.resource})
			if (got == nil) != (c.want == nil) || (got != nil && *got != *c.want) {
				t.Errorf("approvalTotal = %+v, want %+v", got, c.want)
			}
		})
	}
}

// TestApprovalsAPI: the typed API refuses non-approvers with forbidden
// (an *Error carrying the tool's answer), lists and shows what the tool
// shows, and Decide runs the held operation once.
func TestApprovalsAPI(t *testing.T) {
	ctx := context.Background()
	svc := newService(t, nil, nil)
	o := resultOrder(t, svc.Call(ctx, agent, "create_order", orderArgs(uuid.NewString(), 1), nil))
	held := svc.Call(ctx, agent, "cancel_order", map[string]any{"operation_key": uuid.NewString(), "order_id": o.OrderID, "expected_version": float64(1), "reason": "asked"}, nil)
	if held.Approval == nil {
		t.Fatalf("cancel = %+v, want held", held)
	}
	var e *Error
	if _, err := svc.ListApprovals(ctx, agent, ListApprovalsRequest{}); !errors.As(err, &e) || e.Code() != CodeForbidden {
		t.Fatalf("agent listing: err %v, want forbidden", err)
	}
	if _, err := svc.ShowApproval(ctx, approver, "ap_nope"); !errors.As(err, &e) || e.Code() != CodeNotFound {
		t.Fatalf("show missing: err %v, want not_found", err)
	}
	list, err := svc.ListApprovals(ctx, approver, ListApprovalsRequest{})
	if err != nil || list.Count != 1 || list.Approvals[0].ApprovalID != held.Approval.ID {
		t.Fatalf("ListApprovals = %+v, %v; want the one held", list, err)
	}
	tool := svc.Call(ctx, approver, "list_pending_approvals", map[string]any{}, nil)
	if string(tool.Result) != string(mustJSON(list)) {
		t.Errorf("tool answers %s, API lists %s", tool.Result, mustJSON(list))
	}
	// The held cancel keeps the order it is for, as data, and its total.
	var was orders.Order
	if v := list.Approvals[0]; json.Unmarshal(v.Resource, &was) != nil || was.OrderID != o.OrderID || was.Version != 1 || was.Status != "placed" ||
		v.Total == nil || v.Total.AmountMinor != o.TotalMinor || v.Total.Currency != o.Currency {
		t.Errorf("held cancel: resource %s, total %+v; want order %s at version 1 and its total %d %s", v.Resource, v.Total, o.OrderID, o.TotalMinor, o.Currency)
	}
	r := svc.Decide(ctx, approver, DecideRequest{ApprovalID: held.Approval.ID, Decision: Approve})
	if r.Status != ledger.StateSucceeded || resultOrder(t, r).Status != "cancelled" {
		t.Fatalf("Decide = %+v, want the cancellation run", r)
	}
	again := svc.Decide(ctx, approver, DecideRequest{ApprovalID: held.Approval.ID, Decision: Approve})
	if !again.Replayed || resultOrder(t, again).Version != 2 {
		t.Fatalf("second Decide = %+v, want the recorded outcome replayed (version 2, once)", again)
	}
}

// TestEffectFacts: the policy sees what each side-effecting tool's
// descriptor computes from its typed arguments.
func TestEffectFacts(t *testing.T) {
	svc := newService(t, nil, nil)
	tests := []struct {
		tool string
		args string
		want approvals.Facts
	}{
		{"create_order", `{"customer_id":"c1","currency":"EUR","items":[{"sku":"a","quantity":3,"unit_price_minor":250},{"sku":"b","quantity":2,"unit_price_minor":100}]}`,
			approvals.Facts{HasAmount: true, Amount: 950, Currency: "EUR"}},
		{"send_notification", `{"channel":"email","to":["a@example.com","b@example.com"],"body":"hi"}`,
			approvals.Facts{Channel: "email", Recipients: []string{"a@example.com", "b@example.com"}}},
		{"update_order", `{"order_id":"o1","expected_version":1,"changes":{"note":"x"}}`, approvals.Facts{AlwaysApprove: true}},
		{"cancel_order", `{"order_id":"o1","expected_version":1,"reason":"x"}`, approvals.Facts{AlwaysApprove: true}},
	}
	for _, tt := range tests {
		t.Run(tt.tool, func(t *testing.T) {
			got, err := svc.effectOf(tt.tool).policyFacts(json.RawMessage(tt.args), nil)
			if err != nil {
				t.Fatal(err)
			}
			if string(mustJSON(got)) != string(mustJSON(tt.want)) {
				t.Errorf("facts = %+v, want %+v", got, tt.want)
			}
		})
	}
	for _, name := range []string{"get_order", "list_orders", "decide_approval", "new_operation_key"} {
		if svc.effectOf(name) != nil {
			t.Errorf("%s has a side effect", name)
		}
	}
}

// TestTotalRefusesOverflow: an order total that does not fit in int64 is
// an error, never a wrapped number (the policy's amount comes from it).
func TestTotalRefusesOverflow(t *testing.T) {
	if _, err := total([]orders.Item{{SKU: "s", Quantity: 1e4, UnitPriceMinor: 1e15}}); err == nil {
		t.Error("total accepted a total that overflows")
	}
	if sum, err := total([]orders.Item{{SKU: "s", Quantity: 2, UnitPriceMinor: 250}, {SKU: "t", Quantity: 3, UnitPriceMinor: 100}}); err != nil || sum != 800 {
		t.Errorf("total = %d, %v, want 800, nil", sum, err)
	}
}
