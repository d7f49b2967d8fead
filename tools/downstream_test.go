package tools

import (
	"encoding/json"
	"testing"

	"idemgate/ledger"
	"idemgate/orders"
	"idemgate/outbox"
)

// TestFollowUps: a create_order with notify_customer has exactly one
// follow-up step, the confirmation, whose message id is derived from the
// operation (key and incarnation) and the step; other operations, and a
// create_order without notify_customer, have none; and a follow-up is only
// added to a succeeded outcome.
func TestFollowUps(t *testing.T) {
	o := &orders.Order{OrderID: "ord_1", Items: []orders.Item{{SKU: "a", Quantity: 2, UnitPriceMinor: 150}}}
	create := &ledger.Record{Tenant: "t1", Key: "k1", Incarnation: "00ff", Tool: "create_order"}
	notify := json.RawMessage(`{"customer_id":"c1","items":[{"sku":"a","quantity":2,"unit_price_minor":150}],"currency":"EUR","notify_customer":true}`)
	quiet := json.RawMessage(`{"customer_id":"c1","items":[],"currency":"EUR","notify_customer":false}`)

	steps := followUps("t1", create, notify, o)
	if len(steps) != 1 || steps[0].name != "confirmation" {
		t.Fatalf("create_order with notify_customer: %d steps %+v, want one confirmation", len(steps), steps)
	}
	if got, want := steps[0].view["message_id"], outbox.MessageID("t1", "k1:00ff", "confirmation"); got != want {
		t.Errorf("confirmation message_id %v, want %s", got, want)
	}
	if got := steps[0].view["state"]; got != outbox.MessageQueued {
		t.Errorf("confirmation state %v, want queued", got)
	}
	for name, tc := range map[string]struct {
		rec  *ledger.Record
		args json.RawMessage
	}{
		"no notify_customer": {create, quiet},
		"update_order":       {&ledger.Record{Tenant: "t1", Key: "k2", Tool: "update_order"}, notify},
		"unreadable args":    {create, json.RawMessage(`{`)},
	} {
		if steps := followUps("t1", tc.rec, tc.args, o); len(steps) != 0 {
			t.Errorf("%s: %d follow-up steps, want none", name, len(steps))
		}
	}

	failed := ledger.Outcome{State: ledger.StateFailed}
	if out := withFollowUps(failed, "t1", create, notify, o, map[string]any{"order": o}); out.Also != nil || out.Result != nil {
		t.Errorf("a failed outcome gained follow-ups: %+v", out)
	}
	ok := withFollowUps(outcomeOf(o, nil, "order"), "t1", create, notify, o, map[string]any{"order": o})
	var res struct {
		Confirmation map[string]any `json:"confirmation"`
	}
	if ok.Also == nil || json.Unmarshal(ok.Result, &res) != nil || res.Confirmation["message_id"] != steps[0].view["message_id"] {
		t.Errorf("succeeded outcome: result %s, Also set %v; want the confirmation shown and queued", ok.Result, ok.Also != nil)
	}
}
