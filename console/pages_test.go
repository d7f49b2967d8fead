package console

import (
	"encoding/json"
	"html"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/orders"
)

var (
	alice = ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}
	bob   = ledger.Actor{Tenant: "acme", Principal: "bob", Role: "agent"}
)

func orderRequest(key, customer string, qty int) map[string]any {
	return map[string]any{"operation_key": key, "customer_id": customer, "currency": "EUR", "notify_customer": false,
		"items": []any{map[string]any{"sku": "COFFEE", "quantity": qty, "unit_price_minor": 3700}}}
}

// call runs a tool call and checks the state it answers.
func (tc *testConsole) call(t *testing.T, a ledger.Actor, tool string, args map[string]any, want ledger.State) *orders.Order {
	t.Helper()
	r := tc.cfg.Service.Call(t.Context(), a, tool, args, nil)
	if r.Status != want {
		t.Fatalf("%s: %+v, want %s", tool, r, want)
	}
	var res struct{ Order *orders.Order }
	if len(r.Result) > 0 {
		_ = json.Unmarshal(r.Result, &res)
	}
	return res.Order
}

// listedKeys are the operation keys of the operations table of body.
func listedKeys(body string) []string {
	var out []string
	for _, m := range regexp.MustCompile(`<tr><td[^>]*><a href="/ui/operations/([^"]+)"><code>`).FindAllStringSubmatch(section(body, "ops"), -1) {
		out = append(out, m[1])
	}
	slices.Sort(out)
	return out
}

func sorted(s ...string) []string { s = slices.Clone(s); slices.Sort(s); return s }

// TestOperationsFilters: each filter of the operations list — state, tool,
// principal, customer, time — lists exactly the tenant's operations that
// match it, and they combine; a key in the search box opens that
// operation's page (and one of no operation answers 404).
func TestOperationsFilters(t *testing.T) {
	tc := newTestConsole(t)
	aliceA, bobB, note, cancel := newKey(t), newKey(t), newKey(t), newKey(t)
	o := tc.call(t, alice, "create_order", orderRequest(aliceA, "cust-a", 1), ledger.StateSucceeded)
	tc.call(t, bob, "create_order", orderRequest(bobB, "cust-b", 2), ledger.StateSucceeded)
	tc.call(t, alice, "send_notification", map[string]any{"operation_key": note, "channel": "email", "to": []any{"ops@example.com"}, "subject": "hi", "body": "shipped"}, ledger.StateSucceeded)
	tc.call(t, alice, "cancel_order", map[string]any{"operation_key": cancel, "order_id": o.OrderID, "expected_version": 1, "reason": "asked"}, ledger.StateAwaitingApproval)
	globex := newKey(t)
	tc.call(t, ledger.Actor{Tenant: "globex", Principal: "alice", Role: "agent"}, "create_order", orderRequest(globex, "cust-a", 1), ledger.StateSucceeded)
	// The console's clock is two hours ahead of the ledger's: every
	// operation is older than an hour and younger than a day.
	tc.setNow(time.Now().Add(2 * time.Hour))
	cookie := tc.login(t, "boss-token")
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"", sorted(aliceA, bobB, note, cancel)},
		{"?state=awaiting_approval", sorted(cancel)},
		{"?state=succeeded", sorted(aliceA, bobB, note)},
		{"?state=unknown", nil},
		{"?tool=send_notification", sorted(note)},
		{"?tool=cancel_order", sorted(cancel)},
		{"?principal=bob", sorted(bobB)},
		{"?principal=alice", sorted(aliceA, note, cancel)},
		{"?customer=cust-a", sorted(aliceA, cancel)}, // the cancel's customer is its order's
		{"?customer=cust-b", sorted(bobB)},
		{"?since=1h", nil},
		{"?since=24h", sorted(aliceA, bobB, note, cancel)},
		{"?since=7d&principal=alice&tool=create_order", sorted(aliceA)},
		{"?state=succeeded&customer=cust-a", sorted(aliceA)},
	} {
		t.Run(c.query, func(t *testing.T) {
			status, body := tc.get(t, "/ui/operations"+c.query, cookie)
			if status != http.StatusOK {
				t.Fatalf("status %d", status)
			}
			if got := listedKeys(body); !slices.Equal(got, c.want) {
				t.Errorf("listed %q, want %q", got, c.want)
			}
			if len(c.want) == 0 && !strings.Contains(body, `id="no-ops"`) {
				t.Errorf("an empty list does not say None")
			}
		})
	}

	r := tc.do("GET", "/ui/operations?key=+"+bobB+"+", nil, cookie)
	if loc := r.Header.Get("Location"); r.StatusCode != http.StatusSeeOther || loc != "/ui/operations/"+bobB {
		t.Fatalf("key search: %d to %q, want 303 to the operation's page", r.StatusCode, loc)
	}
	status, body := tc.get(t, r.Header.Get("Location"), cookie)
	if status != http.StatusOK || !strings.Contains(body, `<code class="key">`+bobB+`</code>`) || !strings.Contains(body, `id="op-customer">cust-b<`) || !strings.Contains(body, `id="op-state">succeeded<`) {
		t.Errorf("the searched operation's page (status %d) does not show its key, customer and state", status)
	}
	if status, _ := tc.get(t, "/ui/operations/"+globex, cookie); status != http.StatusNotFound {
		t.Errorf("another tenant's key: status %d, want 404", status)
	}
}

// TestHistoryShowsExpired: an approval nobody decided is listed on the
// approvals page until it expires; once the clock has passed its expiry
// it is gone from there and the history shows it as expired, with no
// decider — beside a rejected one, which names who rejected it.
func TestHistoryShowsExpired(t *testing.T) {
	tc := newTestConsole(t)
	o1 := tc.call(t, alice, "create_order", orderRequest(newKey(t), "cust-a", 1), ledger.StateSucceeded)
	o2 := tc.call(t, alice, "create_order", orderRequest(newKey(t), "cust-b", 1), ledger.StateSucceeded)
	cancelArgs := func(id string) map[string]any {
		return map[string]any{"operation_key": newKey(t), "order_id": id, "expected_version": 1, "reason": "asked"}
	}
	expiring := tc.cfg.Service.Call(t.Context(), alice, "cancel_order", cancelArgs(o1.OrderID), nil).Approval.ID
	rejected := tc.cfg.Service.Call(t.Context(), alice, "cancel_order", cancelArgs(o2.OrderID), nil).Approval.ID
	tc.setNow(time.Now())
	cookie := tc.login(t, "boss-token")
	if r := tc.do("POST", "/ui/approvals/"+rejected+"/decide", formOf("decision", "reject", "comment", "keep it"), cookie); r.StatusCode != http.StatusOK {
		t.Fatalf("reject: status %d", r.StatusCode)
	}
	if _, body := tc.get(t, "/ui/approvals", cookie); !strings.Contains(body, `id="apr-`+expiring+`"`) {
		t.Fatalf("the pending approval is not listed before its expiry")
	}
	if _, body := tc.get(t, "/ui/history", cookie); strings.Contains(body, `id="apr-`+expiring+`"`) {
		t.Fatalf("the history lists the approval before its expiry")
	}

	// The ledger's clock (and the console's) passes the one-hour expiry.
	tc.mu.Lock()
	tc.skew = 2 * time.Hour
	tc.mu.Unlock()
	tc.setNow(time.Now().Add(2 * time.Hour))
	cookie = tc.login(t, "boss-token") // the session of an hour's lifetime ended with the jump
	if _, body := tc.get(t, "/ui/approvals", cookie); strings.Contains(body, `id="apr-`+expiring+`"`) || !strings.Contains(body, `id="none-pending"`) {
		t.Errorf("the expired approval is still listed as pending")
	}
	_, body := tc.get(t, "/ui/history", cookie)
	card := cardOf(body, expiring)
	if card == "" {
		t.Fatalf("the history does not list the expired approval:\n%s", body)
	}
	if !strings.Contains(card, `<span class="status s-expired">expired</span>`) || strings.Contains(card, "decided-by") || strings.Contains(card, `class="decide"`) {
		t.Errorf("the expired approval's card does not show it expired and undecided, without a form:\n%s", card)
	}
	if other := cardOf(body, rejected); !strings.Contains(other, "s-rejected") || !strings.Contains(other, `class="decided-by">boss `) || !strings.Contains(other, "keep it") {
		t.Errorf("the rejected approval's card does not show who rejected it and why:\n%s", other)
	}
}

// TestUpdateOrderCard: a held update_order's card says which order of
// which customer changes, and each changed field in the order's terms —
// the line matched by SKU (COFFEE quantity 1 → 2), the line added — with
// the totals before and after in currency and the difference; the order's
// lines before the change and the raw JSON are behind disclosures. The
// requester sees the card without the decide buttons.
func TestUpdateOrderCard(t *testing.T) {
	tc := newTestConsole(t)
	o := tc.call(t, alice, "create_order", orderRequest(newKey(t), "cust-a", 1), ledger.StateSucceeded)
	key := newKey(t)
	r := tc.cfg.Service.Call(t.Context(), alice, "update_order", map[string]any{"operation_key": key, "order_id": o.OrderID, "expected_version": 1,
		"changes": map[string]any{"items": []any{map[string]any{"sku": "COFFEE", "quantity": 2, "unit_price_minor": 3700}, map[string]any{"sku": "TEA", "quantity": 1, "unit_price_minor": 900}}}}, nil)
	if r.Status != ledger.StateAwaitingApproval {
		t.Fatalf("update_order: %+v, want held", r)
	}
	tc.setNow(time.Now())
	cookie := tc.login(t, "boss-token")
	status, body := tc.get(t, "/ui/approvals/"+r.Approval.ID, cookie)
	if status != http.StatusOK {
		t.Fatalf("approval page: status %d", status)
	}
	card := cardOf(body, r.Approval.ID)
	var rows [][3]string
	for _, m := range regexp.MustCompile(`<tr><td class="path">([^<]*)</td><td class="before">([^<]*)</td><td class="after">([^<]*)</td></tr>`).FindAllStringSubmatch(card, -1) {
		rows = append(rows, [3]string{html.UnescapeString(m[1]), html.UnescapeString(m[2]), html.UnescapeString(m[3])})
	}
	want := [][3]string{
		{"COFFEE quantity", "1", "2"},
		{"line TEA added", "—", "1 × 9.00 EUR"},
	}
	if !slices.Equal(rows, want) {
		t.Errorf("diff rows = %q, want %q", rows, want)
	}
	for _, want := range []string{
		`>Change order ` + o.OrderID + ` for customer cust-a</a>`,
		`<strong class="order-id">` + o.OrderID + `</strong>`, `<strong class="customer">cust-a</strong>`,
		`<dd class="total-before">37.00 EUR</dd>`, `<dd class="total">83.00 EUR</dd>`, `<dd class="total-diff">&#43;46.00 EUR</dd>`,
		`<td>COFFEE</td><td>1</td><td>37.00 EUR</td><td>37.00 EUR</td>`,
		"order version 1", `<code class="key">` + key + `</code>`, `<pre class="raw-diff">`,
		`button type="submit" name="decision" value="approve"`,
	} {
		if !strings.Contains(card, want) {
			t.Errorf("the card lacks %s:\n%s", want, card)
		}
	}

	// The requester (alice holds no approver role; here an approver who
	// asked) sees no buttons, and why.
	r2 := tc.cfg.Service.Call(t.Context(), ledger.Actor{Tenant: "acme", Principal: "boss", Role: "agent"}, "update_order", map[string]any{"operation_key": newKey(t), "order_id": o.OrderID, "expected_version": 1,
		"changes": map[string]any{"note": "ring twice"}}, nil)
	if r2.Status != ledger.StateAwaitingApproval {
		t.Fatalf("update_order by boss: %+v, want held", r2)
	}
	_, body = tc.get(t, "/ui/approvals/"+r2.Approval.ID, cookie)
	own := cardOf(body, r2.Approval.ID)
	if strings.Contains(own, `value="approve"`) || !strings.Contains(own, `class="own-request"`) {
		t.Errorf("the requester's own request shows decide buttons, or not why it does not:\n%s", own)
	}
	if !strings.Contains(own, `<dd class="total-diff">no change</dd>`) || !strings.Contains(own, `<td class="path">note</td><td class="before">—</td><td class="after">ring twice</td>`) {
		t.Errorf("a note change does not show the note and the unchanged total:\n%s", own)
	}
}

// cardOf is the approval card of id in body, "" when there is none.
func cardOf(body, id string) string {
	i := strings.Index(body, `<article class="card" id="apr-`+id+`"`)
	if i < 0 {
		return ""
	}
	rest := body[i:]
	if j := strings.Index(rest, "</article>"); j >= 0 {
		return rest[:j]
	}
	return rest
}

// formOf is a form of key, value pairs.
func formOf(kv ...string) url.Values {
	f := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		f.Add(kv[i], kv[i+1])
	}
	return f
}
