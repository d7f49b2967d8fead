package e2e

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"
)

// TestKeyReusedAfterTombstone: once a key's tombstone is gone the key is
// free, and a create_order under it is a new operation: it makes a second
// order with its own id and its own confirmation message, and leaves the
// first order and the first confirmation exactly as they were. stats
// counts two operations and no duplicate side effect.
func TestKeyReusedAfterTombstone(t *testing.T) {
	dir := t.TempDir()
	db, outbox := filepath.Join(dir, "ledger.db"), filepath.Join(dir, "sink")
	cfg := serverConfig{DB: db, OutboxDir: outbox, Args: []string{"--retention", "2s", "--tombstone-retention", "4s"}}
	key := newKey()
	const customer = "cust-reuse"

	s1 := startServer(t, mcpGoModern, cfg)
	first := s1.mustSucceed(t, "create_order", orderArgs(key, customer, []item{{"coffee-1kg", 2, 1250}}, nil))
	firstStatus := waitDelivered(t, s1, key)
	s1.Close()
	if len(firstStatus.Deliveries) != 1 {
		t.Fatalf("first operation's deliveries: %+v", firstStatus.Deliveries)
	}
	firstMsg := firstStatus.Deliveries[0].MessageID
	stopOwner(t, db) // the next server starts an owner, which sweeps as it starts

	// Past retention (2 s) and tombstone retention (4 s): the sweep a
	// server runs when it starts deletes the tombstone.
	time.Sleep(6500 * time.Millisecond)
	s2 := startServer(t, goSDKModern, cfg)
	if !eventually(10*time.Second, func() bool { _, _, found := s2.status(t, key); return !found }) {
		t.Fatalf("the tombstone of %s was not deleted", key)
	}

	second := s2.mustSucceed(t, "create_order", orderArgs(key, customer, []item{{"coffee-1kg", 5, 1250}}, nil))
	if second.Replayed {
		t.Fatalf("a create under a freed key was answered as a replay: %s", second)
	}
	if second.orderID() == "" || second.orderID() == first.orderID() {
		t.Fatalf("reused key: second order %q, first %q; want a new order", second.orderID(), first.orderID())
	}
	ids := s2.listOrderIDs(t, customer)
	if len(ids) != 2 || ids[0] == ids[1] {
		t.Errorf("list_orders = %v, want two different orders", ids)
	}
	got := s2.mustSucceed(t, "get_order", map[string]any{"order_id": first.orderID()})
	var o struct {
		Order struct {
			TotalMinor int64 `json:"total_minor"`
			Items      []struct {
				Quantity int `json:"quantity"`
			} `json:"items"`
		} `json:"order"`
	}
	if err := json.Unmarshal(got.Result, &o); err != nil {
		t.Fatal(err)
	}
	if o.Order.TotalMinor != 2500 || len(o.Order.Items) != 1 || o.Order.Items[0].Quantity != 2 {
		t.Errorf("the first order changed: %s", got.Result)
	}

	secondStatus := waitDelivered(t, s2, key)
	if len(secondStatus.Deliveries) != 1 || secondStatus.Deliveries[0].MessageID == firstMsg {
		t.Fatalf("second operation's deliveries %+v; the first's message was %s", secondStatus.Deliveries, firstMsg)
	}
	files := outboxFiles(t, outbox)
	if len(files) != 2 {
		t.Fatalf("outbox files %v, want two confirmations", files)
	}
	m1 := readMessage(t, filepath.Join(outbox, firstMsg+".json"))
	m2 := readMessage(t, filepath.Join(outbox, secondStatus.Deliveries[0].MessageID+".json"))
	if m1.OrderID != first.orderID() || m2.OrderID != second.orderID() {
		t.Errorf("confirmations name orders %s and %s, want %s and %s", m1.OrderID, m2.OrderID, first.orderID(), second.orderID())
	}
	s2.Close()

	r := runCLI(t, 20*time.Second, "stats", "--db", db, "--json")
	if r.Code != 0 {
		t.Fatalf("idemgate stats exited %d: %s", r.Code, r.Stderr)
	}
	var st struct {
		Operations           int `json:"operations"`
		Executions           int `json:"executions"`
		DuplicateSideEffects int `json:"duplicate_side_effects"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("stats output: %v\n%s", err, r.Stdout)
	}
	if st.Operations != 2 || st.Executions != 2 || st.DuplicateSideEffects != 0 {
		t.Errorf("stats = %+v, want 2 operations, 2 executions, 0 duplicate side effects", st)
	}
}
