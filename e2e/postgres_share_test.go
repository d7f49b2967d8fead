package e2e

import (
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"idemgate/ledger/postgres/pgtest"
)

// TestPostgresDuplicateWokenAcrossReplicas: a duplicate on replica B of
// an operation running on replica A (both servers on one PostgreSQL
// ledger, in front of one order API that holds A's request) waits, and is
// answered with A's saved result once A finishes — woken by A's commit
// (LISTEN/NOTIFY), not by its one-second safety poll: B's log says the
// read that found the outcome was a wake-up's (the lag after A's answer
// is logged; timings on a loaded machine prove nothing).
func TestPostgresDuplicateWokenAcrossReplicas(t *testing.T) {
	db := pgtest.NewDatabase(t)
	outbox := filepath.Join(t.TempDir(), "outbox")
	api := newFakeAPI(t)
	slow := []string{"--orders-api-timeout", "20s", "--lease", "30s", "--wait", "30s"}
	a := startAPIServer(t, mcpGoModern, api, serverConfig{DB: db, OutboxDir: outbox}, slow...)
	b := startAPIServer(t, mcpGoModern, api, serverConfig{DB: db, OutboxDir: outbox}, append(slow, "--log-level", "debug")...)
	key := newKey()
	args := faOrder(key, "cust-pg-wake")
	h := api.InjectHold(fault{Kind: HoldBeforeCommit, Match: matchCreate})
	first := make(chan envelope, 1)
	go func() {
		e, err := a.call(testContext(t), "create_order", args)
		if err != nil {
			t.Errorf("A's call: %v", err)
		}
		first <- e
	}()
	h.Wait(t, 10*time.Second)

	dup := make(chan envelope, 1)
	go func() {
		e, err := b.callWithProgress(testContext(t), "create_order", args, "wake")
		if err != nil {
			t.Errorf("B's duplicate: %v", err)
		}
		dup <- e
	}()
	// B is waiting once it reports progress; let it pass a safety poll
	// or two while A's request is held.
	if !eventually(10*time.Second, func() bool { return len(b.progressEvents()) > 0 }) {
		t.Fatal("B's duplicate reported no progress: it is not waiting")
	}
	time.Sleep(1500 * time.Millisecond)
	select {
	case e := <-dup:
		t.Fatalf("B answered while A's request was held: %s", e)
	default:
	}
	h.Release()
	e := <-first
	answeredA := time.Now()
	if e.IsError || e.Status != "succeeded" || e.Replayed {
		t.Fatalf("A: %s, want succeeded (executed)", e)
	}
	var d envelope
	select {
	case d = <-dup:
	case <-time.After(10 * time.Second):
		t.Fatal("B's duplicate did not answer within 10 s of A's answer")
	}
	lag := time.Since(answeredA)
	t.Logf("B answered %s after A", lag)
	if d.IsError || d.Status != "succeeded" || !d.Replayed || d.orderID() != e.orderID() {
		t.Errorf("B's duplicate: %s, want A's order %s replayed", d, e.orderID())
	}
	if n := api.WritesFor(idemKey("", key)); n != 1 {
		t.Errorf("the order API saw %d create requests for the key, want 1", n)
	}
	// The read that found the outcome was a wake-up's, not the poll's.
	logs := b.stderr.String()
	m := regexp.MustCompile(`waited for a running operation.*last_read=(\w+) woken=(\d+) polled=(\d+)`).FindStringSubmatch(logs)
	if m == nil {
		t.Fatalf("B logged no wait summary:\n%s", logs)
	}
	if m[1] != "woken" || m[2] == "0" {
		t.Errorf("B's duplicate found the outcome by %s (woken %s, polled %s), want by a wake-up", m[1], m[2], m[3])
	}
}
