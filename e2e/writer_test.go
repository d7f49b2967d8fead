package e2e

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// TestWriterKilledUnderLoad: four `idemgate serve` processes on one ledger
// file, eight calls in flight each. The first process to open the file is
// its writer; the other three forward their transactions to it. The writer
// is killed with SIGKILL while they run; one of the others takes the file
// over. Every intent the three survivors send (each sends every one of
// them) must end succeeded with exactly one order, one executing answer
// and all three answers naming the same order — none lost, none run twice
// — and the killed writer's own intents have at most one order each.
func TestWriterKilledUnderLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: four servers under load")
	}
	if onPostgres() {
		t.Skip("the one-writer design is the ledger file's")
	}
	const (
		intents     = 120 // sent by each survivor
		ownIntents  = 200 // sent by the writer only
		concurrency = 8
	)
	db := newLedger(t)
	// The processes share the file itself, through the writer's
	// forwarding of storage transactions: the design of --own-ledger.
	// (A serve without it passes its calls to the file's one owner; see
	// TestOwnerKilledUnderLoad.)
	ownLedger := []string{"--own-ledger"}
	writer := startServer(t, mcpGoModern, serverConfig{DB: db, Principal: "agent-w", Args: ownLedger}) // first: the writer
	survivors := []*session{
		startServer(t, mcpGoModern, serverConfig{DB: db, Principal: "agent-a", Args: ownLedger}),
		startServer(t, goSDKModern, serverConfig{DB: db, Principal: "agent-b", Args: ownLedger}),
		startServer(t, mcpGoLegacy, serverConfig{DB: db, Principal: "agent-c", Args: ownLedger}),
	}
	ctx := testContext(t)
	keys := make([]string, intents)
	for i := range keys {
		keys[i] = newKey()
	}
	customer := func(i int) string { return fmt.Sprintf("cust-writer-%04d", i) }
	args := func(key string, i int) map[string]any {
		return orderArgs(key, customer(i), []item{{fmt.Sprintf("sku-%d", i%5), 1 + i%3, 100 + i}}, nil)
	}

	// The writer's own load, until it is killed.
	var writerCalls atomic.Int64
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		run(ctx, concurrency, func(yield func(func()) bool) {
			for i := range ownIntents {
				if !yield(func() {
					if e, err := writer.call(ctx, "create_order", args(newKey(), intents+i)); err == nil && !e.IsError {
						writerCalls.Add(1)
					}
				}) {
					return
				}
			}
		})
	}()

	var answered, answeredAtKill atomic.Int64
	killed := make(chan struct{})
	go func() { // kill the writer once a quarter of the survivors' calls are answered
		defer close(killed)
		for answered.Load() < int64(len(survivors)*intents/4) {
			time.Sleep(time.Millisecond)
		}
		answeredAtKill.Store(answered.Load())
		writer.Kill()
	}()
	answers := make([][]envelope, len(survivors))
	errs := make([][]error, len(survivors))
	for p := range survivors {
		answers[p], errs[p] = make([]envelope, intents), make([]error, intents)
	}
	run(ctx, len(survivors)*concurrency, func(yield func(func()) bool) {
		for i := range intents {
			for p, s := range survivors {
				if !yield(func() {
					answers[p][i], errs[p][i] = s.call(ctx, "create_order", args(keys[i], i))
					answered.Add(1)
				}) {
					return
				}
			}
		}
	})
	<-killed
	<-writerDone
	t.Logf("SIGKILL of the writer after %d of the survivors' %d calls were answered; the writer had answered %d of its own %d",
		answeredAtKill.Load(), len(survivors)*intents, writerCalls.Load(), ownIntents)

	failures := 0
	fail := func(format string, a ...any) {
		if failures++; failures <= 20 {
			t.Errorf(format, a...)
		}
	}
	for i := range intents {
		executed, order := 0, ""
		for p := range survivors {
			e, err := answers[p][i], errs[p][i]
			if err != nil {
				fail("intent %d, survivor %d: %v", i, p, err)
				continue
			}
			if e.IsError || e.Status != "succeeded" {
				fail("intent %d, survivor %d: %s", i, p, e)
				continue
			}
			if order == "" {
				order = e.orderID()
			} else if order != e.orderID() {
				fail("intent %d: different orders %s and %s", i, order, e.orderID())
			}
			if !e.Replayed {
				executed++
			}
		}
		if executed != 1 {
			fail("intent %d: %d answers executed it, want exactly 1", i, executed)
		}
		if ids := survivors[i%len(survivors)].listOrderIDs(t, customer(i)); len(ids) != 1 || ids[0] != order {
			fail("intent %d: list_orders = %v, want exactly [%s]", i, ids, order)
		}
		st, e, found := survivors[(i+1)%len(survivors)].status(t, keys[i])
		if !found || st.State != "succeeded" || st.Attempts != 1 || st.DownstreamRef != order {
			fail("intent %d: get_operation_status: %s", i, e)
		}
	}
	for i := range ownIntents {
		if ids := survivors[i%len(survivors)].listOrderIDs(t, customer(intents+i)); len(ids) > 1 {
			fail("the writer's intent %d has %d orders", i, len(ids))
		}
	}
	if failures > 20 {
		t.Errorf("… and %d more failures", failures-20)
	}
}
