package e2e

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestTenantsIsolated: keys live per tenant. Two servers on ONE ledger file,
// --tenant t1 and --tenant t2: the same key is two independent operations
// (two orders, both executed on their first call), and neither tenant can
// see the other's records or orders.
func TestTenantsIsolated(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	t1 := startServer(t, mcpGoModern, serverConfig{DB: db, Tenant: "t1"})
	t2 := startServer(t, goSDKLegacy, serverConfig{DB: db, Tenant: "t2"})

	shared := newKey()
	args := orderArgs(shared, "cust-tenant", coffee, nil)
	e1 := t1.mustSucceed(t, "create_order", args)
	e2 := t2.mustSucceed(t, "create_order", args)
	if e1.Replayed || e2.Replayed {
		t.Errorf("first call per tenant must execute: t1 replayed=%v, t2 replayed=%v", e1.Replayed, e2.Replayed)
	}
	if e1.orderID() == "" || e1.orderID() == e2.orderID() {
		t.Errorf("the same key in two tenants made orders %q and %q, want two different orders", e1.orderID(), e2.orderID())
	}
	// Each tenant sees exactly its own order for the shared customer.
	if ids := t1.listOrderIDs(t, "cust-tenant"); len(ids) != 1 || ids[0] != e1.orderID() {
		t.Errorf("t1 list_orders = %v, want [%s]", ids, e1.orderID())
	}
	if ids := t2.listOrderIDs(t, "cust-tenant"); len(ids) != 1 || ids[0] != e2.orderID() {
		t.Errorf("t2 list_orders = %v, want [%s]", ids, e2.orderID())
	}
	// Replays stay in their tenant.
	if r := t2.mustSucceed(t, "create_order", args); !r.Replayed || !bytes.Equal(r.Result, e2.Result) {
		t.Errorf("t2 replay: %s", r)
	}

	// The suspected-duplicate rule is per tenant too: t1's payload under a
	// new key in t2 is not "the same request made moments ago".
	fresh := t2.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-only-t1", coffee, nil))
	if fresh.Replayed || fresh.orderID() == "" {
		t.Errorf("t2 placing the same order as t1 under a new key: %s", fresh)
	}

	// A key and an order only t1 has are invisible to t2.
	only1 := newKey()
	o1 := t1.mustSucceed(t, "create_order", orderArgs(only1, "cust-only-t1", coffee, nil))
	if _, e, found := t2.status(t, only1); found {
		t.Errorf("t2 get_operation_status(t1's key) found t1's record: %s", e)
	}
	t2.mustFail(t, "get_order", map[string]any{"order_id": o1.orderID()}, "not_found")
	t2.mustFail(t, "get_order", map[string]any{"order_id": e1.orderID()}, "not_found")
	if ids := t2.listOrderIDs(t, "cust-only-t1"); len(ids) != 1 || ids[0] != fresh.orderID() {
		t.Errorf("t2 list_orders(cust-only-t1) = %v, want only its own order %s (t1's is %s)", ids, fresh.orderID(), o1.orderID())
	}
	// And t2 may use that key for something else entirely.
	other := t2.mustSucceed(t, "create_order", orderArgs(only1, "cust-other", []item{{"tea", 1, 990}}, nil))
	if other.Replayed || other.orderID() == o1.orderID() {
		t.Errorf("t2 reusing t1's key for another request: %s", other)
	}
	if st, _, _ := t1.status(t, only1); st.DownstreamRef != o1.orderID() {
		t.Errorf("t1's record changed after t2 used the key: %+v", st)
	}
}

// TestCrashReplay: an order succeeds, the server is SIGKILLed (no clean
// shutdown of any kind), and a new server on the same file replays the
// saved result byte for byte without creating anything.
func TestCrashReplay(t *testing.T) {
	for _, f := range []flavor{mcpGoLegacy, goSDKModern} {
		t.Run(f.Name, func(t *testing.T) {
			db := filepath.Join(t.TempDir(), "ledger.db")
			s := startServer(t, f, serverConfig{DB: db})
			args := orderArgs(newKey(), "cust-crash", coffee, nil)
			first := s.mustSucceed(t, "create_order", args)
			s.Kill()

			s2 := startServer(t, f, serverConfig{DB: db})
			again := s2.mustSucceed(t, "create_order", args)
			if !again.Replayed || !bytes.Equal(again.Result, first.Result) {
				t.Errorf("after SIGKILL: %s\nwant replay of %s", again, first.Result)
			}
			if n := s2.orderCount(t, "cust-crash"); n != 1 {
				t.Errorf("list_orders count %d, want 1", n)
			}
		})
	}
}

// TestCrashMidLoad: a server is SIGKILLed while 16 create_order calls are
// in flight. Afterwards every intent is either wholly done or wholly
// absent: an answered success replays with the same order, an unanswered
// call either replays (it committed) or runs now (it did not) — and every
// customer ends with exactly one order.
func TestCrashMidLoad(t *testing.T) {
	const intents = 200
	db := filepath.Join(t.TempDir(), "ledger.db")
	s := startServer(t, mcpGoModern, serverConfig{DB: db})
	keys := make([]string, intents)
	for i := range keys {
		keys[i] = newKey()
	}
	args := func(i int) map[string]any {
		return orderArgs(keys[i], fmt.Sprintf("cust-midcrash-%03d", i), coffee, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	answered := make([]envelope, intents)
	var done atomic.Int32
	var killOnce sync.Once
	run(ctx, 16, func(yield func(func()) bool) {
		for i := range intents {
			if !yield(func() {
				e, err := s.call(ctx, "create_order", args(i))
				if err == nil {
					answered[i] = e
				}
				if done.Add(1) == intents/4 {
					killOnce.Do(func() { _ = s.cmd.Process.Kill() })
				}
			}) {
				return
			}
		}
	})
	s.Close()

	s2 := startServer(t, mcpGoModern, serverConfig{DB: db})
	before, committedUnanswered, ranNow := 0, 0, 0
	for i := range intents {
		e := s2.mustSucceed(t, "create_order", args(i))
		switch {
		case answered[i].Status == "succeeded":
			before++
			if !e.Replayed || !bytes.Equal(e.Result, answered[i].Result) {
				t.Errorf("intent %d was answered succeeded before the crash but now: %s", i, e)
			}
		case e.Replayed:
			committedUnanswered++
		default:
			ranNow++
		}
		if n := s2.orderCount(t, fmt.Sprintf("cust-midcrash-%03d", i)); n != 1 {
			t.Errorf("intent %d: %d orders, want 1", i, n)
		}
	}
	t.Logf("before the kill %d intents were answered; %d had committed without an answer; %d ran after the restart", before, committedUnanswered, ranNow)
	if before == 0 || before == intents {
		t.Errorf("the kill did not land mid-load (%d of %d answered)", before, intents)
	}
}

// TestRetentionExpired: once a finished operation is past --retention its
// full result is gone but a tombstone still refuses to run it again: the
// same request answers key_expired and creates nothing; a different request
// under that key is still key_reused_with_different_request.
func TestRetentionExpired(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	key := newKey()
	args := orderArgs(key, "cust-retention", coffee, nil)
	s := startServer(t, mcpGoModern, serverConfig{DB: db})
	first := s.mustSucceed(t, "create_order", args)
	s.Close()

	// Every record is past a retention of one nanosecond.
	s2 := startServer(t, goSDKModern, serverConfig{DB: db, Args: []string{"--retention", "1ns"}})
	e := s2.mustFail(t, "create_order", args, "key_expired")
	if len(e.Result) != 0 || e.NextAction != "do_not_retry" || e.Status != "succeeded" {
		t.Errorf("key_expired answer: %s", e)
	}
	if n := s2.orderCount(t, "cust-retention"); n != 1 {
		t.Errorf("list_orders count %d after a late replay, want 1 (nothing may run again)", n)
	}
	s2.mustSucceed(t, "get_order", map[string]any{"order_id": first.orderID()})
	s2.mustFail(t, "create_order", orderArgs(key, "cust-retention", []item{{"coffee-1kg", 5, 1850}}, nil), "key_reused_with_different_request")
	st, _, found := s2.status(t, key)
	if !found || !st.Expired || st.State != "succeeded" || len(st.Result) != 0 {
		t.Errorf("get_operation_status of an expired operation: found=%v %+v", found, st)
	}
	if n := s2.orderCount(t, "cust-retention"); n != 1 {
		t.Errorf("list_orders count %d at the end, want 1", n)
	}
}
