package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
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

// distinctOrder is a small order of customer c1 unlike any other i's, so
// it is never held as a suspected duplicate.
func distinctOrder(i int) map[string]any {
	a := orderArgs(uuid.NewString(), 1)
	a["items"] = []any{map[string]any{"sku": fmt.Sprintf("sku-%d", i), "quantity": float64(1), "unit_price_minor": float64(500)}}
	return a
}

type orderPage struct {
	Orders     []orders.Order `json:"orders"`
	Count      int            `json:"count"`
	NextCursor *string        `json:"next_cursor"`
}

func listPage(t *testing.T, svc *Service, actor ledger.Actor, args map[string]any) orderPage {
	t.Helper()
	r := svc.Call(context.Background(), actor, "list_orders", args, nil)
	if r.IsError {
		t.Fatalf("list_orders %v = %+v", args, r.Error)
	}
	var p orderPage
	if err := json.Unmarshal(r.Result, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestListOrdersPagesCompletely lists a customer's 150 orders a page at a
// time while new orders keep arriving between pages: every order that
// existed when paging began comes exactly once, newest first, and the
// last page says so by having no next_cursor.
func TestListOrdersPagesCompletely(t *testing.T) {
	ctx := context.Background()
	svc := newService(t, nil, nil)
	create := func(i int) string {
		r := svc.Call(ctx, agent, "create_order", distinctOrder(i), nil)
		if r.IsError {
			t.Fatalf("create: %+v", r.Error)
		}
		return resultOrder(t, r).OrderID
	}
	var before []string // oldest first
	for i := range 150 {
		before = append(before, create(i))
	}
	// Another customer's orders never show.
	other := orderArgs(uuid.NewString(), 1)
	other["customer_id"] = "c2"
	svc.Call(ctx, agent, "create_order", other, nil)

	seen := map[string]int{}
	var got []orders.Order
	args := map[string]any{"customer_id": "c1", "limit": float64(7)}
	for pages := 0; ; pages++ {
		if pages > 40 {
			t.Fatal("paging does not end")
		}
		p := listPage(t, svc, agent, args)
		for _, o := range p.Orders {
			seen[o.OrderID]++
			got = append(got, o)
		}
		if p.NextCursor == nil {
			break
		}
		if p.Count != 7 {
			t.Fatalf("page %d has %d orders and a next_cursor, want 7", pages, p.Count)
		}
		create(1000 + pages) // a new order between pages
		args["cursor"] = *p.NextCursor
	}
	if len(got) != 150 {
		t.Fatalf("listed %d orders, want the 150 that existed when paging began", len(got))
	}
	for i, id := range before {
		if seen[id] != 1 {
			t.Fatalf("order %d (%s) listed %d times, want once", i, id, seen[id])
		}
		if got[149-i].OrderID != id {
			t.Fatalf("position %d is %s, want %s (newest first)", 149-i, got[149-i].OrderID, id)
		}
	}
}

func TestListOrdersRefusesForeignAndGarbledCursors(t *testing.T) {
	ctx := context.Background()
	svc := newService(t, nil, nil)
	for i := range 3 {
		svc.Call(ctx, agent, "create_order", distinctOrder(i), nil)
	}
	p := listPage(t, svc, agent, map[string]any{"customer_id": "c1", "limit": float64(1)})
	if p.NextCursor == nil {
		t.Fatal("no next_cursor with 3 orders and limit 1")
	}
	cur := *p.NextCursor
	if len(cur) > MaxCursorLen {
		t.Fatalf("cursor is %d characters", len(cur))
	}
	approverCursor := EncodeCursor([]string{"list_pending_approvals", "t1"}, []byte("x"))
	otherTenant := ledger.Actor{Tenant: "t2", Principal: "agent-1", Role: "agent"}
	cases := []struct {
		name  string
		actor ledger.Actor
		args  map[string]any
		want  string
	}{
		{"another customer", agent, map[string]any{"customer_id": "c2", "cursor": cur}, "another listing"},
		{"another tenant", otherTenant, map[string]any{"customer_id": "c1", "cursor": cur}, "another listing"},
		{"another tool", agent, map[string]any{"customer_id": "c1", "cursor": approverCursor}, "another listing"},
		{"garbled", agent, map[string]any{"customer_id": "c1", "cursor": "not a cursor!"}, "not one idemgate handed out"},
		{"truncated", agent, map[string]any{"customer_id": "c1", "cursor": cur[:len(cur)-5]}, "not one idemgate handed out"},
		{"too long", agent, map[string]any{"customer_id": "c1", "cursor": strings.Repeat("A", MaxCursorLen+1)}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := svc.Call(ctx, tc.actor, "list_orders", tc.args, nil)
			if !r.IsError || r.Error == nil || r.Error.Code != "invalid_arguments" || !strings.Contains(r.Error.Message, tc.want) {
				t.Fatalf("answer = %+v, want invalid_arguments mentioning %q", r.Error, tc.want)
			}
			if len(r.Error.Message) > 2000 {
				t.Fatalf("message is %d bytes", len(r.Error.Message))
			}
		})
	}
}

// TestListOrdersRefusesAlteredCursors: a cursor with one character
// changed — a model copying it back imperfectly — is refused, never read
// as another position (which would skip or repeat orders silently, or
// end the listing early).
func TestListOrdersRefusesAlteredCursors(t *testing.T) {
	ctx := context.Background()
	svc := newService(t, nil, nil)
	for i := range 3 {
		svc.Call(ctx, agent, "create_order", distinctOrder(i), nil)
	}
	p := listPage(t, svc, agent, map[string]any{"customer_id": "c1", "limit": float64(1)})
	if p.NextCursor == nil {
		t.Fatal("no next_cursor with 3 orders and limit 1")
	}
	cur := *p.NextCursor
	same := svc.Call(ctx, agent, "list_orders", map[string]any{"customer_id": "c1", "limit": float64(1), "cursor": cur}, nil)
	const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	tried := 0
	for i := range len(cur) {
		for _, c := range []byte{b64[(strings.IndexByte(b64, cur[i])+1)%64], b64[(strings.IndexByte(b64, cur[i])+17)%64]} {
			altered := cur[:i] + string(c) + cur[i+1:]
			tried++
			r := svc.Call(ctx, agent, "list_orders", map[string]any{"customer_id": "c1", "limit": float64(1), "cursor": altered}, nil)
			if !r.IsError && string(r.Result) == string(same.Result) {
				continue // a change only in bits base64 ignores: the same cursor
			}
			if !r.IsError || r.Error == nil || r.Error.Code != "invalid_arguments" {
				t.Fatalf("cursor with character %d changed (%q → %q) was accepted: %s", i, cur[i], c, r.Result)
			}
		}
	}
	t.Logf("%d altered cursors refused", tried)
	// The checksum still leaves room for the longest order API cursor.
	if n := len(EncodeCursor([]string{"list_orders", "t1", strings.Repeat("c", 64), "orders_api"}, make([]byte, maxAPICursor))); n > MaxCursorLen {
		t.Errorf("a cursor carrying a %d-byte order API cursor is %d characters, over %d", maxAPICursor, n, MaxCursorLen)
	}
}

// TestListPendingApprovalsPages pages through held operations oldest
// first while more are requested between pages: each appears once, in
// request order, including those requested during paging.
func TestListPendingApprovalsPages(t *testing.T) {
	ctx := context.Background()
	p := approvals.Default()
	p.CreateOrderThresholdMinor = 1 // every create is held
	svc := newService(t, nil, &p)
	var want []string
	hold := func(i int) {
		r := svc.Call(ctx, agent, "create_order", distinctOrder(i), nil)
		if r.Approval == nil {
			t.Fatalf("create not held: %+v", r)
		}
		want = append(want, r.Approval.ID)
	}
	for i := range 25 {
		hold(i)
	}
	var got []string
	args := map[string]any{"limit": float64(4)}
	for pages := 0; ; pages++ {
		if pages > 30 {
			t.Fatal("paging does not end")
		}
		r := svc.Call(ctx, approver, "list_pending_approvals", args, nil)
		if r.IsError {
			t.Fatalf("list: %+v", r.Error)
		}
		var page struct {
			Approvals []struct {
				ID string `json:"approval_id"`
			} `json:"approvals"`
			NextCursor *string `json:"next_cursor"`
		}
		if err := json.Unmarshal(r.Result, &page); err != nil {
			t.Fatal(err)
		}
		for _, a := range page.Approvals {
			got = append(got, a.ID)
		}
		if page.NextCursor == nil {
			break
		}
		if pages < 3 {
			hold(100 + pages)
		}
		args["cursor"] = *page.NextCursor
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("listed %d approvals\n%v\nwant %d, oldest first\n%v", len(got), got, len(want), want)
	}
	bad := svc.Call(ctx, approver, "list_pending_approvals", map[string]any{"cursor": EncodeCursor([]string{"list_orders", "t1", "c1", "embedded"}, []byte("x"))}, nil)
	if bad.Error == nil || bad.Error.Code != "invalid_arguments" {
		t.Fatalf("a list_orders cursor = %+v, want invalid_arguments", bad)
	}
}

// TestListOrdersPagesThroughTheOrderAPI: with the HTTP order API, the
// API's own next_cursor travels inside idemgate's cursor and comes back as
// the cursor parameter; an over-long API cursor is refused, not truncated.
func TestListOrdersPagesThroughTheOrderAPI(t *testing.T) {
	var ids []string
	for i := range 25 {
		ids = append(ids, fmt.Sprintf("ord_%02d", 24-i)) // newest first
	}
	longCursor := false
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("customer_id") != "c1" || r.Header.Get("X-Idemgate-Tenant") != "t1" {
			http.Error(w, "bad query", http.StatusBadRequest)
			return
		}
		start, _ := strconv.Atoi(q.Get("cursor"))
		limit, _ := strconv.Atoi(q.Get("limit"))
		end := min(start+limit, len(ids))
		var page []map[string]any
		for _, id := range ids[start:end] {
			page = append(page, map[string]any{"order_id": id, "version": 1, "customer_id": "c1"})
		}
		out := map[string]any{"orders": page}
		if end < len(ids) {
			out["next_cursor"] = strconv.Itoa(end)
			if longCursor {
				out["next_cursor"] = strings.Repeat("9", 600)
			}
		}
		json.NewEncoder(w).Encode(out)
	}))
	t.Cleanup(api.Close)
	oa, err := orders.NewAPI(api.URL, 5*time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	store, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	v, err := schemas.New()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(store, v, Options{OutboxDir: t.TempDir(), OrdersAPI: oa})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	args := map[string]any{"customer_id": "c1", "limit": float64(10)}
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("paging does not end")
		}
		p := listPage(t, svc, agent, args)
		for _, o := range p.Orders {
			got = append(got, o.OrderID)
		}
		if p.NextCursor == nil {
			break
		}
		args["cursor"] = *p.NextCursor
	}
	if strings.Join(got, ",") != strings.Join(ids, ",") {
		t.Fatalf("listed %v, want %v", got, ids)
	}
	longCursor = true
	r := svc.Call(context.Background(), agent, "list_orders", map[string]any{"customer_id": "c1", "limit": float64(10)}, nil)
	if r.Error == nil || r.Error.Code != "downstream_error" {
		t.Fatalf("an over-long API cursor = %+v, want downstream_error", r)
	}
}
