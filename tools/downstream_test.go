package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/orders"
	"idemgate/outbox"
	"idemgate/schemas"
)

// TestFollowUps: a create_order with notify_customer has exactly one
// follow-up step, the confirmation, whose message id is derived from the
// operation (key and incarnation) and the step; other operations, and a
// create_order without notify_customer, have none; and a follow-up is only
// added to a succeeded outcome.
func TestFollowUps(t *testing.T) {
	s := newService(t, nil, nil)
	o := &orders.Order{OrderID: "ord_1", Items: []orders.Item{{SKU: "a", Quantity: 2, UnitPriceMinor: 150}}}
	create := &ledger.Record{Tenant: "t1", Key: "k1", Incarnation: "00ff", Tool: "create_order"}
	notify := json.RawMessage(`{"customer_id":"c1","items":[{"sku":"a","quantity":2,"unit_price_minor":150}],"currency":"EUR","notify_customer":true}`)
	quiet := json.RawMessage(`{"customer_id":"c1","items":[],"currency":"EUR","notify_customer":false}`)

	steps := s.followUps("t1", create, notify, o)
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
		if steps := s.followUps("t1", tc.rec, tc.args, o); len(steps) != 0 {
			t.Errorf("%s: %d follow-up steps, want none", name, len(steps))
		}
	}

	failed := ledger.Outcome{State: ledger.StateFailed}
	if out := s.withFollowUps(failed, "t1", create, notify, o, map[string]any{"order": o}); out.Also != nil || out.Result != nil {
		t.Errorf("a failed outcome gained follow-ups: %+v", out)
	}
	ok := s.withFollowUps(outcomeOf(o, nil, "order"), "t1", create, notify, o, map[string]any{"order": o})
	var res struct {
		Confirmation map[string]any `json:"confirmation"`
	}
	if ok.Also == nil || json.Unmarshal(ok.Result, &res) != nil || res.Confirmation["message_id"] != steps[0].view["message_id"] {
		t.Errorf("succeeded outcome: result %s, Also set %v; want the confirmation shown and queued", ok.Result, ok.Also != nil)
	}
}

// memOrders is an order system written from the RemoteOrders interface
// alone, in memory: proof that tools needs nothing of orders.API beyond
// it. Its first write "times out" after taking effect.
type memOrders struct {
	mu     sync.Mutex
	byRef  map[string]*orders.Order // tenant:ref → order
	writes int
	lose   bool // the next write takes effect but answers indeterminate
}

func (m *memOrders) Downstream() string { return "mem" }

func (m *memOrders) Get(_ context.Context, tenant, id string) (*orders.Order, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, o := range m.byRef {
		if strings.HasPrefix(k, tenant+":") && o.OrderID == id {
			c := *o
			return &c, nil
		}
	}
	return nil, nil
}

func (m *memOrders) List(_ context.Context, tenant, customer string, limit int, cursor string) ([]*orders.Order, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*orders.Order
	for k, o := range m.byRef {
		if strings.HasPrefix(k, tenant+":") && o.CustomerID == customer && len(out) < limit {
			c := *o
			out = append(out, &c)
		}
	}
	return out, "", nil
}

func (m *memOrders) Create(_ context.Context, tenant, ref string, req orders.CreateRequest) (*orders.Order, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := orders.IdempotencyKey(tenant, ref)
	o, ok := m.byRef[key]
	if !ok {
		m.writes++
		sum, _ := orders.Total(req.Items)
		o = &orders.Order{OrderID: fmt.Sprintf("mem_%d", m.writes), Version: 1, Status: orders.StatusPlaced,
			CustomerID: req.CustomerID, Items: req.Items, Currency: req.Currency, TotalMinor: sum}
		m.byRef[key] = o
	}
	if m.lose {
		m.lose = false
		return nil, &orders.APIError{Class: orders.Indeterminate, Msg: "timed out after the request was written"}
	}
	c := *o
	return &c, nil
}

func (m *memOrders) Update(context.Context, string, string, orders.UpdateRequest) (*orders.Order, error) {
	return nil, &orders.APIError{Class: orders.Definitive, Code: "downstream_error", Msg: "not supported"}
}

func (m *memOrders) Cancel(context.Context, string, string, orders.CancelRequest) (*orders.Order, error) {
	return nil, &orders.APIError{Class: orders.Definitive, Code: "downstream_error", Msg: "not supported"}
}

func (m *memOrders) Lookup(_ context.Context, tenant, ref string) (*orders.Order, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	o, ok := m.byRef[orders.IdempotencyKey(tenant, ref)]
	if !ok {
		return nil, orders.ErrAbsent
	}
	c := *o
	return &c, nil
}

func (m *memOrders) SafeRetry() bool { return false }

// TestRemoteOrdersFromTheInterface: an order system that implements only
// RemoteOrders runs create_order end to end — a write whose answer is
// lost leaves the operation unknown, the retry reconciles it by Lookup
// (one order, not two) with its confirmation step queued — and serves
// get_order and list_orders.
func TestRemoteOrdersFromTheInterface(t *testing.T) {
	ctx := context.Background()
	mem := &memOrders{byRef: map[string]*orders.Order{}, lose: true}
	store, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	v, _ := schemas.New()
	svc, err := New(store, v, Options{OutboxDir: t.TempDir(), OrdersAPI: mem, Lease: time.Second, CallTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	key := uuid.NewString()
	first := svc.Call(ctx, agent, "create_order", orderArgs(key, 2), nil)
	if first.Status != ledger.StateUnknown || first.Error == nil || first.Error.Code != "outcome_unknown" {
		t.Fatalf("first = %+v %+v, want unknown (outcome_unknown)", first, first.Error)
	}
	again := svc.Call(ctx, agent, "create_order", orderArgs(key, 2), nil)
	if again.Status != ledger.StateSucceeded {
		t.Fatalf("retry = %+v %+v, want succeeded by reconciliation", again, again.Error)
	}
	mem.mu.Lock()
	writes := mem.writes
	mem.mu.Unlock()
	if writes != 1 {
		t.Errorf("%d orders written, want 1", writes)
	}
	rec, err := store.Get(ctx, "t1", key)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Order        orders.Order   `json:"order"`
		Confirmation map[string]any `json:"confirmation"`
	}
	if err := json.Unmarshal(again.Result, &res); err != nil || res.Order.OrderID != "mem_1" ||
		res.Confirmation["message_id"] != outbox.MessageID("t1", opRef(rec), "confirmation") {
		t.Errorf("result %s, want order mem_1 with its confirmation", again.Result)
	}
	var msgs []*outbox.Message
	store.View(ctx, func(tx ledger.Tx) (err error) {
		msgs, err = outbox.OfOperation(tx, "t1", key, rec.Incarnation)
		return err
	})
	if len(msgs) != 1 || msgs[0].Step != "confirmation" || msgs[0].OrderID != "mem_1" {
		t.Errorf("queued messages %+v, want the one confirmation of mem_1", msgs)
	}
	if r := svc.Call(ctx, agent, "get_order", map[string]any{"order_id": "mem_1"}, nil); r.IsError || resultOrder(t, r).OrderID != "mem_1" {
		t.Errorf("get_order = %+v %s", r, r.Result)
	}
	if r := svc.Call(ctx, agent, "list_orders", map[string]any{"customer_id": "c1"}, nil); r.IsError || !strings.Contains(string(r.Result), `"count":1`) {
		t.Errorf("list_orders = %+v %s", r, r.Result)
	}
}
