package approvals

import (
	"encoding/json"
	"math"
	"slices"
	"strings"
	"testing"
)

// order is an order as the tools keep it on an approval (its JSON).
func heldOrder(items []Line, total int64, extra map[string]any) map[string]any {
	m := map[string]any{"order_id": "ord_1", "version": 1, "status": "placed", "customer_id": "cust-42", "currency": "EUR", "items": items, "total_minor": total}
	for k, v := range extra {
		m[k] = v
	}
	return ToMap(m)
}

func describe(t *testing.T, tool string, d Diff, resource map[string]any) *OrderChange {
	t.Helper()
	diff, _ := json.Marshal(d.Changes)
	var res json.RawMessage
	if resource != nil {
		res, _ = json.Marshal(resource)
	}
	oc, ok := DescribeOrder(tool, diff, res)
	if !ok {
		t.Fatalf("DescribeOrder(%s) did not read %s", tool, diff)
	}
	return oc
}

// TestDescribeOrderChange: a change of an order's lines is one row per
// changed field, lines matched by SKU — a quantity 2 → 5, a unit price, a
// line added, a line removed — with the address field by field and the
// totals before and after in currency.
func TestDescribeOrderChange(t *testing.T) {
	before := heldOrder([]Line{{"TEA-001", 2, 1250}, {"MUG-2", 1, 900}, {"SPOON", 4, 100}}, 3800,
		map[string]any{"ship_to": map[string]any{"name": "Ada", "line1": "1 Main St", "city": "Berlin", "postal_code": "10115", "country": "DE"}})
	after := heldOrder([]Line{{"TEA-001", 5, 1250}, {"MUG-2", 1, 950}, {"CUP-9", 2, 300}}, 7700,
		map[string]any{"ship_to": map[string]any{"name": "Ada", "line1": "1 Main St", "city": "Hamburg", "postal_code": "20095", "country": "DE"}})
	pick := func(m map[string]any) map[string]any {
		return map[string]any{"items": m["items"], "total_minor": m["total_minor"], "ship_to": m["ship_to"]}
	}
	oc := describe(t, "update_order", UpdateDiff("order", "ord_1", 1, pick(before), pick(after)), before)
	want := []Row{
		{"TEA-001 quantity", "2", "5"},
		{"MUG-2 unit price", "9.00 EUR", "9.50 EUR"},
		{"line CUP-9 added", "", "2 × 3.00 EUR"},
		{"line SPOON removed", "4 × 1.00 EUR", ""},
		{"ship to city", "Berlin", "Hamburg"},
		{"ship to postal code", "10115", "20095"},
	}
	if !slices.Equal(oc.Rows, want) {
		t.Errorf("rows\n got %q\nwant %q", oc.Rows, want)
	}
	if got := oc.Headline(); got != "Change order ord_1 for customer cust-42" {
		t.Errorf("headline %q", got)
	}
	if *oc.TotalBefore != 3800 || *oc.TotalAfter != 7700 || oc.Difference() != "+39.00 EUR" {
		t.Errorf("totals %d → %d (%s)", *oc.TotalBefore, *oc.TotalAfter, oc.Difference())
	}
	if w := oc.Words(); !strings.Contains(w, "TEA-001 quantity: 2 → 5") || !strings.Contains(w, "Total: 38.00 EUR → 77.00 EUR (+39.00 EUR)") {
		t.Errorf("words:\n%s", w)
	}

	// A change of the note alone keeps the total, shown unchanged.
	note := describe(t, "update_order", UpdateDiff("order", "ord_1", 1, map[string]any{"note": nil}, map[string]any{"note": "ring twice"}), before)
	if !slices.Equal(note.Rows, []Row{{"note", "", "ring twice"}}) || note.Difference() != "no change" {
		t.Errorf("note change: %q, %s", note.Rows, note.Difference())
	}
}

// TestDescribeOrderCreateCancel: a create is its lines and total; a
// cancel is its status, its reason, the lines it cancels and their total.
func TestDescribeOrderCreateCancel(t *testing.T) {
	req := ToMap(map[string]any{"customer_id": "cust-42", "currency": "EUR", "items": []Line{{"TEA-001", 2, 1250}}, "note": "gift", "notify_customer": true})
	req["total_minor"] = 2500
	c := describe(t, "create_order", CreateDiff("order", req), nil)
	if c.Headline() != "Place an order for customer cust-42" || *c.TotalAfter != 2500 || c.TotalBefore != nil {
		t.Errorf("create: %q, %v", c.Headline(), c)
	}
	if !slices.Equal(c.Rows, []Row{{"line TEA-001", "", "2 × 12.50 EUR"}, {"note", "", "gift"}}) {
		t.Errorf("create rows %q", c.Rows)
	}
	o := heldOrder([]Line{{"TEA-001", 2, 1250}}, 2500, nil)
	x := describe(t, "cancel_order", CancelDiff("order", "ord_1", 1, o, "customer called"), o)
	if x.Headline() != "Cancel order ord_1 for customer cust-42" || x.CancelReason != "customer called" || x.Status != "placed" {
		t.Errorf("cancel: %q %+v", x.Headline(), x)
	}
	if !slices.Equal(x.Rows, []Row{{"status", "placed", "cancelled"}}) {
		t.Errorf("cancel rows %q", x.Rows)
	}
	if w := x.Words(); !strings.Contains(w, "Reason: customer called") || !strings.Contains(w, "cancelled line TEA-001: 2 × 12.50 EUR") || !strings.Contains(w, "Total cancelled: 25.00 EUR") {
		t.Errorf("cancel words:\n%s", w)
	}
	if _, ok := DescribeOrder("send_notification", []byte(`[]`), nil); ok {
		t.Errorf("a notification was described as an order")
	}
}

// TestMoney: totals in minor units are shown as amounts of their currency.
func TestMoney(t *testing.T) {
	for _, c := range []struct {
		minor int64
		cur   string
		want  string
	}{
		{3700, "EUR", "37.00 EUR"}, {5, "USD", "0.05 USD"}, {-250, "EUR", "-2.50 EUR"},
		{1200, "JPY", "1200 JPY"}, {math.MinInt64, "EUR", "-92233720368547758.08 EUR"},
	} {
		if got := Money(c.minor, c.cur); got != c.want {
			t.Errorf("Money(%d, %q) = %q, want %q", c.minor, c.cur, got, c.want)
		}
	}
}
