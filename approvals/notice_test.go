package approvals

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"idemgate/ledger"
)

// TestNoticeShape: the notice's JSON is exactly the documented version 1
// (docs/approvals.md, "Reaching approvers"): field names, order, UTC times, the
// console link under the public URL.
func TestNoticeShape(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 30, 0, 0, time.FixedZone("CET", 3600))
	rec := &ledger.Record{
		Tenant: "acme", Key: "0b9f7a52-3c1e-4d57-9a53-2f1c6a8e4d10", Tool: "create_order",
		State: ledger.StateAwaitingApproval, Principal: "alice",
		Approval: &ledger.Approval{
			ID: "apr_1", Status: ledger.ApprovalPending, Reason: "the order total 150000 (minor units) is at or above the approval threshold 100000",
			Rule: "amount_threshold", RequestedBy: "alice", DiffText: "create order:\n  + total_minor: 150000\n",
			CreatedAt: at, ExpiresAt: at.Add(24 * time.Hour),
		},
	}
	create := CreateDiff("order", map[string]any{"customer_id": "cust-42", "currency": "EUR", "items": []any{map[string]any{"sku": "TEA-001", "quantity": 100, "unit_price_minor": 1500}}, "total_minor": 150000})
	rec.Approval.Diff, _ = json.Marshal(create.Changes)
	n := NewNotice(rec, "msg_42", &Total{AmountMinor: 150000, Currency: "EUR"}, "https://gate.example.com/base/")
	got, err := json.Marshal(n)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"type":"approval_requested","version":1,"notice_id":"msg_42","approval_id":"apr_1","tenant":"acme",` +
		`"requested_by":"alice","requested_at":"2026-12-01T08:30:00Z","expires_at":"2026-12-02T08:30:00Z",` +
		`"tool":"create_order","operation_key":"0b9f7a52-3c1e-4d57-9a53-2f1c6a8e4d10",` +
		`"rule":"amount_threshold","reason":"the order total 150000 (minor units) is at or above the approval threshold 100000",` +
		`"summary":"create order:\n  + total_minor: 150000","total":{"amount_minor":150000,"currency":"EUR"},` +
		`"console_url":"https://gate.example.com/base/ui/approvals/apr_1",` +
		`"headline":"Place an order for customer cust-42",` +
		`"text":"Approval needed: Place an order for customer cust-42\nline TEA-001: 100 × 15.00 EUR\nTotal: 1500.00 EUR\n` +
		`Asked by alice; held: the order total 150000 (minor units) is at or above the approval threshold 100000. Expires 2026-12-02 08:30 UTC.\n` +
		`Approve or reject: https://gate.example.com/base/ui/approvals/apr_1"}`
	if string(got) != want {
		t.Errorf("notice JSON\n got %s\nwant %s", got, want)
	}

	// A suspected duplicate names the earlier key; no total, no field.
	rec.Approval.Rule, rec.Approval.EarlierKey = "suspected_duplicate", "k-earlier"
	got, _ = json.Marshal(NewNotice(rec, "msg_43", nil, "http://127.0.0.1:8080"))
	var m map[string]any
	if err := json.Unmarshal(got, &m); err != nil {
		t.Fatal(err)
	}
	if m["earlier_operation_key"] != "k-earlier" {
		t.Errorf("earlier_operation_key = %v", m["earlier_operation_key"])
	}
	if _, ok := m["total"]; ok {
		t.Errorf("a notice without a total has a total field: %s", got)
	}
	if m["console_url"] != "http://127.0.0.1:8080/ui/approvals/apr_1" {
		t.Errorf("console_url = %v", m["console_url"])
	}
	if text, _ := m["text"].(string); !strings.Contains(text, "the same request as the earlier operation k-earlier") || !strings.HasSuffix(text, "\nApprove or reject: http://127.0.0.1:8080/ui/approvals/apr_1") {
		t.Errorf("a suspected duplicate's text does not name the earlier key or end in the link:\n%s", text)
	}
}

// TestNoticeSummaryBounded: a long diff is cut at a character boundary
// and marked, within NoticeSummaryMax bytes.
func TestNoticeSummaryBounded(t *testing.T) {
	rec := &ledger.Record{Approval: &ledger.Approval{ID: "apr_x", DiffText: strings.Repeat("ä", NoticeSummaryMax)}}
	s := NewNotice(rec, "m", nil, "http://h").Summary
	if len(s) > NoticeSummaryMax || !utf8.ValidString(s) || !strings.HasSuffix(s, "…") {
		t.Errorf("summary: %d bytes, valid %v, ends %q", len(s), utf8.ValidString(s), s[len(s)-4:])
	}
}

func TestCheckPublicURL(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"https://gate.example.com", "https://gate.example.com", true},
		{"https://gate.example.com/", "https://gate.example.com", true},
		{"http://127.0.0.1:8080/idemgate/", "http://127.0.0.1:8080/idemgate", true},
		{"", "", false},
		{"gate.example.com", "", false},
		{"ftp://gate.example.com", "", false},
		{"https://", "", false},
		{"https://u:secret@gate.example.com", "", false},
		{"https://gate.example.com/?a=1", "", false},
		{"https://gate.example.com/#x", "", false},
		{"https://gate.example.com/%zz", "", false},
	}
	for _, tc := range tests {
		got, err := CheckPublicURL(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("CheckPublicURL(%q) = %q, %v; want %q, ok %v", tc.in, got, err, tc.want, tc.ok)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("CheckPublicURL(%q): the error shows the password: %v", tc.in, err)
		}
	}
}
