package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// concurrent runs n calls of create_order with args on s at once and
// returns the answers.
func concurrent(ctx context.Context, s *session, n int, args map[string]any) ([]envelope, []error) {
	answers := make([]envelope, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			answers[i], errs[i] = s.call(ctx, "create_order", args)
		}()
	}
	close(start)
	wg.Wait()
	return answers, errs
}

// checkOneOrder asserts that answers all succeeded with one order id and
// that exactly one of them executed; it returns the order id.
func checkOneOrder(t *testing.T, answers []envelope, errs []error) string {
	t.Helper()
	ids := map[string]int{}
	executed := 0
	for i, e := range answers {
		if errs[i] != nil {
			t.Errorf("call %d: %v", i, errs[i])
			continue
		}
		if e.IsError || e.Status != "succeeded" {
			t.Errorf("call %d: %s", i, e)
			continue
		}
		ids[e.orderID()]++
		if !e.Replayed {
			executed++
		}
	}
	if len(ids) != 1 {
		t.Errorf("answers carry %d distinct order ids, want 1: %v", len(ids), ids)
	}
	if executed != 1 {
		t.Errorf("%d answers say replayed=false (executed), want exactly 1", executed)
	}
	for id := range ids {
		return id
	}
	return ""
}

// TestConcurrentSameKeyOneClient: 32 simultaneous create_order calls with
// one key from one client (the server runs them on its worker pool, so they
// really race inside one process) make exactly one order.
func TestConcurrentSameKeyOneClient(t *testing.T) {
	for _, f := range []flavor{mcpGoModern, goSDKLegacy} {
		t.Run(f.Name, func(t *testing.T) {
			s := startServer(t, f, serverConfig{})
			customer := "cust-race-one"
			answers, errs := concurrent(testContext(t), s, 32, orderArgs(newKey(), customer, coffee, nil))
			id := checkOneOrder(t, answers, errs)
			ids := s.listOrderIDs(t, customer)
			if len(ids) != 1 || ids[0] != id {
				t.Errorf("list_orders = %v, want exactly [%s]", ids, id)
			}
		})
	}
}

// TestConcurrentSameKeyTwoProcesses: two server processes on one ledger
// file (what two MCP clients spawning their own server look like), 16
// simultaneous calls each with the same key, make exactly one order.
func TestConcurrentSameKeyTwoProcesses(t *testing.T) {
	db := newLedger(t)
	a := startServer(t, mcpGoModern, serverConfig{DB: db, Principal: "agent-a"})
	b := startServer(t, goSDKModern, serverConfig{DB: db, Principal: "agent-b"})
	customer := "cust-race-two"
	args := orderArgs(newKey(), customer, coffee, nil)
	ctx := testContext(t)
	var (
		wg             sync.WaitGroup
		ansA, ansB     []envelope
		errsA, errsB   []error
		startA, startB = make(chan struct{}), make(chan struct{})
	)
	wg.Add(2)
	go func() { defer wg.Done(); <-startA; ansA, errsA = concurrent(ctx, a, 16, args) }()
	go func() { defer wg.Done(); <-startB; ansB, errsB = concurrent(ctx, b, 16, args) }()
	close(startA)
	close(startB)
	wg.Wait()
	id := checkOneOrder(t, append(ansA, ansB...), append(errsA, errsB...))
	for _, s := range []*session{a, b} {
		if ids := s.listOrderIDs(t, customer); len(ids) != 1 || ids[0] != id {
			t.Errorf("[%s] list_orders = %v, want exactly [%s]", s.flavor.Name, ids, id)
		}
	}
}

// TestMixedLoadTwoProcesses: 2 000 create_order calls from two server
// processes on one ledger — 1 000 distinct intents (keys), each sent once
// by each process at about the same time, 16 in flight per process. No
// intent may be lost and none may be executed twice: every key ends
// succeeded with its own order, both answers for a key name that order,
// exactly one of them executed it, and each customer has exactly one order.
func TestMixedLoadTwoProcesses(t *testing.T) {
	const (
		intents     = 1000
		concurrency = 16
	)
	if testing.Short() {
		t.Skip("-short: the mixed load takes several seconds")
	}
	db := newLedger(t)
	procs := []*session{
		startServer(t, mcpGoModern, serverConfig{DB: db, Principal: "agent-a"}),
		startServer(t, mcpGoLegacy, serverConfig{DB: db, Principal: "agent-b"}),
	}
	keys := make([]string, intents)
	for i := range keys {
		keys[i] = newKey()
	}
	customer := func(i int) string { return fmt.Sprintf("cust-mix-%04d", i) }
	args := func(i int) map[string]any {
		return orderArgs(keys[i], customer(i), []item{{fmt.Sprintf("sku-%d", i%7), 1 + i%5, 100 + i}}, nil)
	}
	ctx := testContext(t)

	// answers[p][i] is process p's answer for intent i.
	answers := [2][]envelope{make([]envelope, intents), make([]envelope, intents)}
	errs := [2][]error{make([]error, intents), make([]error, intents)}
	began := time.Now()
	run(ctx, len(procs)*concurrency, func(yield func(func()) bool) {
		// Both processes walk the intents in the same order, so the two
		// calls of a key are in flight at about the same time.
		for i := range intents {
			for p := range procs {
				if !yield(func() { answers[p][i], errs[p][i] = procs[p].call(ctx, "create_order", args(i)) }) {
					return
				}
			}
		}
	})
	elapsed := time.Since(began)
	t.Logf("mixed load: %d create_order calls from 2 processes in %v: %.0f calls/s", 2*intents, elapsed.Round(time.Millisecond), float64(2*intents)/elapsed.Seconds())

	failures := 0
	fail := func(format string, a ...any) {
		if failures++; failures <= 20 {
			t.Errorf(format, a...)
		}
	}
	orderOf := make([]string, intents)
	for i := range intents {
		executed := 0
		for p := range procs {
			e, err := answers[p][i], errs[p][i]
			if err != nil {
				fail("intent %d, process %d: %v", i, p, err)
				continue
			}
			if e.IsError || e.Status != "succeeded" {
				fail("intent %d, process %d: %s", i, p, e)
				continue
			}
			if orderOf[i] == "" {
				orderOf[i] = e.orderID()
			} else if orderOf[i] != e.orderID() {
				fail("intent %d: the processes got different orders %s and %s", i, orderOf[i], e.orderID())
			}
			if !e.Replayed {
				executed++
			}
		}
		if executed != 1 {
			fail("intent %d: %d answers executed it, want exactly 1", i, executed)
		}
	}

	// The ledger's view, key by key, and the order store's, customer by
	// customer (reads alternate between the two processes).
	statusOf := make([]envelope, intents)
	lists := make([]envelope, intents)
	gets := make([]envelope, intents)
	readErrs := make([]error, 3*intents)
	run(ctx, 2*concurrency, func(yield func(func()) bool) {
		for i := range intents {
			s := procs[i%2]
			if !yield(func() {
				statusOf[i], readErrs[3*i] = s.call(ctx, "get_operation_status", map[string]any{"operation_key": keys[i]})
			}) || !yield(func() {
				lists[i], readErrs[3*i+1] = procs[1-i%2].call(ctx, "list_orders", map[string]any{"customer_id": customer(i)})
			}) || !yield(func() {
				if orderOf[i] != "" {
					gets[i], readErrs[3*i+2] = s.call(ctx, "get_order", map[string]any{"order_id": orderOf[i]})
				}
			}) {
				return
			}
		}
	})
	distinct := map[string]int{}
	for i := range intents {
		for _, err := range readErrs[3*i : 3*i+3] {
			if err != nil {
				fail("intent %d: read: %v", i, err)
			}
		}
		st, err := decodeStatus(statusOf[i])
		if err != nil || statusOf[i].IsError || st.State != "succeeded" || st.Tool != "create_order" {
			fail("intent %d: get_operation_status: %s", i, statusOf[i])
			continue
		}
		if st.DownstreamRef != orderOf[i] {
			fail("intent %d: get_operation_status names order %s, the calls got %s", i, st.DownstreamRef, orderOf[i])
		}
		if st.Attempts != 1 {
			fail("intent %d: attempts %d, want 1", i, st.Attempts)
		}
		distinct[st.DownstreamRef]++
		ids, err := listOrderIDs(lists[i])
		if err != nil || len(ids) != 1 || ids[0] != orderOf[i] {
			fail("intent %d: list_orders(%s) = %v (%v), want exactly [%s]", i, customer(i), ids, err, orderOf[i])
		}
		if gets[i].IsError || gets[i].orderID() != orderOf[i] {
			fail("intent %d: get_order(%s): %s", i, orderOf[i], gets[i])
		}
	}
	if len(distinct) != intents {
		t.Errorf("%d distinct order ids across %d keys, want %d", len(distinct), intents, intents)
	}
	if failures > 20 {
		t.Errorf("… and %d more failures", failures-20)
	}
}

// run executes the tasks a generator yields on n workers and waits for
// them. It stops early when ctx is done.
func run(ctx context.Context, n int, gen func(yield func(func()) bool)) {
	tasks := make(chan func())
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for task := range tasks {
				task()
			}
		}()
	}
	gen(func(task func()) bool {
		select {
		case tasks <- task:
			return true
		case <-ctx.Done():
			return false
		}
	})
	close(tasks)
	wg.Wait()
}

// listOrderIDs is list_orders(customer) as order ids.
func (s *session) listOrderIDs(t testing.TB, customer string) []string {
	t.Helper()
	e := s.mustSucceed(t, "list_orders", map[string]any{"customer_id": customer, "limit": 100})
	ids, err := listOrderIDs(e)
	if err != nil {
		t.Fatalf("list_orders: %v: %s", err, e)
	}
	return ids
}
