package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestReplay, for every client library and protocol era: a finished
// create_order is answered from the ledger — same key and arguments replay
// the saved result byte for byte and create nothing; a changed request
// under the key is refused and creates nothing; key order, whitespace,
// 1 vs 1.0 and the case of the key do not make a different request.
func TestReplay(t *testing.T) {
	forEachFlavor(t, allFlavors, func(t *testing.T, f flavor) {
		s := startServer(t, f, serverConfig{})
		key := newKey()
		customer := "cust-replay"
		args := orderArgs(key, customer, coffee, nil)

		first := s.mustSucceed(t, "create_order", args)
		if first.Replayed || first.OperationKey != key || first.NextAction != "none" || first.Attempts != 1 ||
			first.FirstSeenAt == "" || first.CompletedAt == "" {
			t.Fatalf("first create_order: %s", first)
		}
		orderID := first.orderID()
		if !strings.HasPrefix(orderID, "ord_") {
			t.Fatalf("first create_order has no order id: %s", first)
		}

		t.Run("same key and arguments replay byte-identical", func(t *testing.T) {
			again := s.mustSucceed(t, "create_order", args)
			if !again.Replayed {
				t.Errorf("replay: replayed=false: %s", again)
			}
			if again.orderID() != orderID {
				t.Errorf("replay: order %s, want %s", again.orderID(), orderID)
			}
			if !bytes.Equal(again.Result, first.Result) {
				t.Errorf("replayed result is not byte-identical:\nfirst:  %s\nreplay: %s", first.Result, again.Result)
			}
			if again.Attempts != 1 {
				t.Errorf("replay: attempts %d, want 1", again.Attempts)
			}
		})

		t.Run("same key with a different quantity is refused", func(t *testing.T) {
			changed := orderArgs(key, customer, []item{{"coffee-1kg", 3, 1850}}, nil)
			e := s.mustFail(t, "create_order", changed, "key_reused_with_different_request")
			if e.Replayed || len(e.Result) != 0 || e.NextAction != "use_new_key_for_new_intent" {
				t.Errorf("mismatch answer: %s", e)
			}
			if e.Error.Message == "" {
				t.Error("mismatch answer has no message")
			}
		})

		t.Run("same key for another tool is refused", func(t *testing.T) {
			s.mustFail(t, "send_notification", map[string]any{
				"operation_key": key, "channel": "email", "to": []string{"a@example.com"}, "body": "hi",
			}, "key_reused_with_different_request")
		})

		t.Run("reordered keys, whitespace and 1.0 replay", func(t *testing.T) {
			raw := json.RawMessage(fmt.Sprintf(`{
				"items" : [ { "unit_price_minor": 1850.0, "quantity": 2.00, "sku": "coffee-1kg" } ],
				"currency": "EUR",   "operation_key": %q,
				"customer_id": %q }`, key, customer))
			e := s.mustSucceed(t, "create_order", raw)
			if !e.Replayed || !bytes.Equal(e.Result, first.Result) {
				t.Errorf("canonically equal arguments did not replay the saved result: %s", e)
			}
			// notify_customer's default (true) written out is the same request.
			withDefault := orderArgs(key, customer, coffee, map[string]any{"notify_customer": true})
			if e := s.mustSucceed(t, "create_order", withDefault); !e.Replayed || !bytes.Equal(e.Result, first.Result) {
				t.Errorf("explicit default did not replay: %s", e)
			}
		})

		t.Run("uppercase key is the same operation", func(t *testing.T) {
			upper := strings.ToUpper(key)
			e := s.mustSucceed(t, "create_order", orderArgs(upper, customer, coffee, nil))
			if !e.Replayed || e.orderID() != orderID || !bytes.Equal(e.Result, first.Result) {
				t.Errorf("uppercase key: %s", e)
			}
			if e.OperationKey != key {
				t.Errorf("uppercase key answered under operation_key %q, want %q", e.OperationKey, key)
			}
			st, _, found := s.status(t, upper)
			if !found || st.State != "succeeded" || st.DownstreamRef != orderID {
				t.Errorf("get_operation_status(uppercase key): found=%v %+v", found, st)
			}
		})

		// Whatever was sent above, exactly one order exists.
		if n := s.orderCount(t, customer); n != 1 {
			t.Errorf("list_orders(%s).count = %d, want 1", customer, n)
		}
		got := s.mustSucceed(t, "get_order", map[string]any{"order_id": orderID})
		var o struct {
			Order struct {
				OrderID      string `json:"order_id"`
				OperationKey string `json:"operation_key"`
				TotalMinor   int64  `json:"total_minor"`
				Items        []struct {
					Quantity int `json:"quantity"`
				} `json:"items"`
			} `json:"order"`
		}
		if err := json.Unmarshal(got.Result, &o); err != nil {
			t.Fatal(err)
		}
		if o.Order.OrderID != orderID || o.Order.OperationKey != key || o.Order.TotalMinor != 3700 ||
			len(o.Order.Items) != 1 || o.Order.Items[0].Quantity != 2 {
			t.Errorf("get_order: %s", got.Result)
		}
	})
}

// TestReplayAcrossClients: an order made through one client library and
// era is replayed byte for byte by every other one, each in its own server
// process on the same ledger file — the saved result does not depend on
// who asks.
func TestReplayAcrossClients(t *testing.T) {
	db := newLedger(t)
	key := newKey()
	args := orderArgs(key, "cust-across", coffee, nil)
	first := startServer(t, mcpGoModern, serverConfig{DB: db}).mustSucceed(t, "create_order", args)
	for _, f := range allFlavors {
		s := startServer(t, f, serverConfig{DB: db})
		e := s.mustSucceed(t, "create_order", args)
		if !e.Replayed || !bytes.Equal(e.Result, first.Result) {
			t.Errorf("[%s] replay: %s\nwant result %s", f.Name, e, first.Result)
		}
		if n := s.orderCount(t, "cust-across"); n != 1 {
			t.Errorf("[%s] list_orders count %d, want 1", f.Name, n)
		}
		s.Close()
	}
}

// TestListOrdersNewestFirst: list_orders returns a customer's orders newest
// first and honours limit, so "does this order already exist?" can be
// answered from the first entries.
func TestListOrdersNewestFirst(t *testing.T) {
	s := startServer(t, goSDKLegacy, serverConfig{})
	var ids []string
	for i := range 3 {
		e := s.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-list", []item{{fmt.Sprintf("sku-%d", i), 1, 100}}, nil))
		ids = append(ids, e.orderID())
	}
	got, err := listOrderIDs(s.mustSucceed(t, "list_orders", map[string]any{"customer_id": "cust-list", "limit": 2}))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{ids[2], ids[1]}; !slices.Equal(got, want) {
		t.Errorf("list_orders limit 2 = %v, want newest first %v", got, want)
	}
}
