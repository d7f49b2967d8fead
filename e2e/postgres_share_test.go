package e2e

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
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
	// (The log line is written before the answer, but read through a
	// pipe: it may reach this buffer a moment later.)
	summary := regexp.MustCompile(`waited for a running operation.*last_read=(\w+) woken=(\d+) polled=(\d+)`)
	var m []string
	eventually(5*time.Second, func() bool { m = summary.FindStringSubmatch(b.stderr.String()); return m != nil })
	if m == nil {
		t.Fatalf("B logged no wait summary:\n%s", b.stderr.String())
	}
	t.Logf("B: %s", m[0])
	if m[1] != "woken" || m[2] == "0" {
		t.Errorf("B's duplicate found the outcome by %s (woken %s, polled %s), want by a wake-up", m[1], m[2], m[3])
	}
}

// countingGateway is a notification gateway that records every POST
// by Idempotency-Key (the message id), with its arrival time; each
// answer takes delay, and with holdFirst the first POST is not answered
// until release is closed.
type countingGateway struct {
	srv       *httptest.Server
	delay     time.Duration
	holdFirst bool
	held      chan struct{} // closed when the first POST arrived (holdFirst)
	release   chan struct{}

	mu       sync.Mutex
	arrivals map[string][]time.Time
	n        int
}

func newCountingGateway(t *testing.T, delay time.Duration, holdFirst bool) *countingGateway {
	g := &countingGateway{delay: delay, holdFirst: holdFirst, held: make(chan struct{}), release: make(chan struct{}), arrivals: map[string][]time.Time{}}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		g.mu.Lock()
		g.arrivals[key] = append(g.arrivals[key], time.Now())
		g.n++
		first := g.n == 1
		g.mu.Unlock()
		if first && g.holdFirst {
			close(g.held)
			<-g.release
		}
		time.Sleep(g.delay)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(func() {
		select {
		case <-g.release:
		default:
			close(g.release)
		}
		g.srv.CloseClientConnections()
		g.srv.Close()
	})
	return g
}

// snapshot is the gateway's POSTs so far: message id → arrival times.
func (g *countingGateway) snapshot() map[string][]time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[string][]time.Time{}
	for k, v := range g.arrivals {
		out[k] = slices.Clone(v)
	}
	return out
}

// startWebhookReplicas starts n `serve --http` replicas on db that
// deliver notifications to gw, each with --lease lease.
func startWebhookReplicas(t *testing.T, db, tokens string, gw *countingGateway, lease string, n int) []*httpProc {
	t.Helper()
	var reps []*httpProc
	for range n {
		reps = append(reps, startHTTP(t, db, tokens, 0, "--notify-webhook", gw.srv.URL, "--lease", lease))
	}
	return reps
}

// createWithNotification places one order with its confirmation
// (notify_customer defaults to true) and fails the test unless it
// succeeded.
func createWithNotification(t *testing.T, s *session, customer string) {
	t.Helper()
	e := s.callTool(t, "create_order", orderArgs(newKey(), customer, coffee, nil))
	if e.IsError || e.Status != "succeeded" {
		t.Errorf("create_order for %s: %s", customer, e)
	}
}

// TestPostgresReplicasDeliverEachMessageOnce: two replicas on one
// PostgreSQL ledger deliver to one slow webhook gateway. Orders are
// placed on both at once, so each replica's delivery passes (the one its
// own order kicks, and its periodic scan of the whole outbox) see the
// other's queued messages too. Every confirmation reaches the gateway,
// and exactly once: a message is claimed by one replica before it is
// sent.
func TestPostgresReplicasDeliverEachMessageOnce(t *testing.T) {
	db := pgtest.NewDatabase(t)
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	gw := newCountingGateway(t, 40*time.Millisecond, false)
	reps := startWebhookReplicas(t, db, tokens, gw, "30s", 2)
	const perReplica = 12
	var wg sync.WaitGroup
	for i, p := range reps {
		s := httpSession(t, p.base, alice)
		wg.Go(func() {
			for j := range perReplica {
				createWithNotification(t, s, fmt.Sprintf("cust-share-%d-%d", i, j))
			}
		})
	}
	wg.Wait()
	want := perReplica * len(reps)
	if !eventually(30*time.Second, func() bool { return len(gw.snapshot()) == want }) {
		t.Fatalf("the gateway got %d distinct messages, want %d", len(gw.snapshot()), want)
	}
	// Room for a second delivery to show: two periodic scans.
	time.Sleep(2500 * time.Millisecond)
	for id, at := range gw.snapshot() {
		if len(at) != 1 {
			t.Errorf("message %s reached the gateway %d times, want once", id, len(at))
		}
	}
}

// TestPostgresKilledDelivererTakenOver: replica A is SIGKILLed while the
// gateway holds its delivery of a message (after the send, before A could
// record it). Replica B leaves that message to A's claim while it lasts
// (the ledger's lease, 5 s here) and then delivers it: it reaches the
// gateway twice — the one window in which that can happen, with the same
// Idempotency-Key both times — and every other message, placed on B
// meanwhile, exactly once. Nothing is lost.
func TestPostgresKilledDelivererTakenOver(t *testing.T) {
	db := pgtest.NewDatabase(t)
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	gw := newCountingGateway(t, 0, true)
	const lease = 5 * time.Second
	a := startWebhookReplicas(t, db, tokens, gw, lease.String(), 1)[0]
	createWithNotification(t, httpSession(t, a.base, alice), "cust-killed-deliverer")
	select {
	case <-gw.held:
	case <-time.After(15 * time.Second):
		t.Fatal("A's delivery did not reach the gateway")
	}
	b := startWebhookReplicas(t, db, tokens, gw, lease.String(), 1)[0]
	onB := httpSession(t, b.base, alice)
	const more = 5
	for j := range more {
		createWithNotification(t, onB, fmt.Sprintf("cust-after-kill-%d", j))
	}
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-a.exited
	close(gw.release) // the held request's answer goes nowhere

	if !eventually(30*time.Second, func() bool {
		n := 0
		for _, at := range gw.snapshot() {
			n += len(at)
		}
		return len(gw.snapshot()) == more+1 && n >= more+2
	}) {
		t.Fatalf("after the kill the gateway got %v, want %d messages, the held one twice", gw.snapshot(), more+1)
	}
	time.Sleep(2500 * time.Millisecond) // room for a further delivery to show
	twice := 0
	for id, at := range gw.snapshot() {
		switch len(at) {
		case 1:
		case 2:
			twice++
			if gap := at[1].Sub(at[0]); gap < lease-time.Second {
				t.Errorf("message %s was sent again %s after A sent it, before A's %s claim could expire", id, gap, lease)
			}
		default:
			t.Errorf("message %s reached the gateway %d times", id, len(at))
		}
	}
	if twice != 1 {
		t.Errorf("%d messages reached the gateway twice, want exactly the one A was killed delivering", twice)
	}
}

// TestPostgresReconcileRunsOnOneReplica: of two replicas on one
// PostgreSQL ledger, one at a time runs the lease-expiry and
// reconciliation pass; the other skips it. When the one running it is
// SIGKILLed, the other takes the pass over once the dead one's hold has
// expired (the lease, 1 s here).
func TestPostgresReconcileRunsOnOneReplica(t *testing.T) {
	db := pgtest.NewDatabase(t)
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	addToken(t, tokens, "alice", "acme", "agent")
	var reps []*httpProc
	for range 2 {
		reps = append(reps, startHTTP(t, db, tokens, 0, "--lease", "1s", "--log-level", "debug"))
	}
	holds := func(p *httpProc) bool {
		return strings.Contains(p.stderr.String(), `msg="background task" task=reconcile held=true`)
	}
	if !eventually(10*time.Second, func() bool { return holds(reps[0]) || holds(reps[1]) }) {
		t.Fatal("no replica took the reconciliation pass")
	}
	time.Sleep(2 * time.Second) // a few passes (every 333 ms)
	if holds(reps[0]) == holds(reps[1]) {
		t.Fatalf("replicas holding the reconciliation pass: A %v, B %v; want exactly one", holds(reps[0]), holds(reps[1]))
	}
	holder, other := reps[0], reps[1]
	if holds(other) {
		holder, other = other, holder
	}
	if err := holder.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-holder.exited
	if !eventually(10*time.Second, func() bool { return holds(other) }) {
		t.Fatal("the surviving replica did not take the reconciliation pass over")
	}
}

// TestLedgerFileProcessesDeliverEachMessageOnce: the delivery claims are
// written through the ledger, so they hold for processes sharing one
// ledger file as for replicas on PostgreSQL: two stdio servers on one
// file, placing orders at once, hand each confirmation to a slow webhook
// gateway exactly once.
func TestLedgerFileProcessesDeliverEachMessageOnce(t *testing.T) {
	gw := newCountingGateway(t, 40*time.Millisecond, false)
	db := filepath.Join(t.TempDir(), "ledger.db")
	var procs []*session
	for range 2 {
		procs = append(procs, startServer(t, mcpGoModern, serverConfig{DB: db, Args: []string{"--notify-webhook", gw.srv.URL}}))
	}
	const perProcess = 10
	var wg sync.WaitGroup
	for i, s := range procs {
		wg.Go(func() {
			for j := range perProcess {
				createWithNotification(t, s, fmt.Sprintf("cust-file-share-%d-%d", i, j))
			}
		})
	}
	wg.Wait()
	want := perProcess * len(procs)
	if !eventually(30*time.Second, func() bool { return len(gw.snapshot()) == want }) {
		t.Fatalf("the gateway got %d distinct messages, want %d", len(gw.snapshot()), want)
	}
	time.Sleep(2500 * time.Millisecond) // room for a second delivery to show
	for id, at := range gw.snapshot() {
		if len(at) != 1 {
			t.Errorf("message %s reached the gateway %d times, want once", id, len(at))
		}
	}
}
