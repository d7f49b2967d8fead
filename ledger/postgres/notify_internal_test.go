package postgres

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/ledger/postgres/pgtest"
)

func openReplicas(t *testing.T, n int) []*DB {
	t.Helper()
	url := pgtest.NewDatabase(t)
	var out []*DB
	for range n {
		d, err := Open(url, ledger.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		out = append(out, d)
	}
	return out
}

func claimOn(t *testing.T, d *DB, key string) uint64 {
	t.Helper()
	dec, err := d.Claim(context.Background(), ledger.Claim{Actor: ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"},
		Key: key, Tool: "create_order", Fingerprint: "fp", OnLeaseExpiry: ledger.StateRetryable})
	if err != nil || dec.Kind != ledger.DecisionClaimed {
		t.Fatalf("claim: %v %v", dec.Kind, err)
	}
	return dec.Record.Generation
}

// TestWatchWokenByAnotherReplica: a watcher on replica B of a record
// running on replica A is woken by A's completion — the watch channel
// fires, which only a notice can make it do (nothing polls here) — and
// then reads the saved result.
func TestWatchWokenByAnotherReplica(t *testing.T) {
	reps := openReplicas(t, 2)
	a, b := reps[0], reps[1]
	ctx := context.Background()
	key := uuid.NewString()
	gen := claimOn(t, a, key)

	changed, stop := b.Watch("acme", key)
	defer stop()
	rec, err := b.Get(ctx, "acme", key)
	if err != nil || rec.State != ledger.StateInProgress {
		t.Fatalf("B reads %v %v, want in_progress", rec, err)
	}
	<-changed // the listener's first connect wakes everyone once
	changed, stop2 := b.Watch("acme", key)
	defer stop2()

	if _, err := a.Complete(ctx, ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}, key, gen,
		ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{"order":"o-1"}`), Summary: "done"}); err != nil {
		t.Fatal(err)
	}
	done := time.Now()
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("B's watch was not woken within 10 s of A's commit")
	}
	t.Logf("woken %s after A's commit returned", time.Since(done))
	rec, err = b.Get(ctx, "acme", key)
	if err != nil || rec.State != ledger.StateSucceeded || string(rec.Result) != `{"order":"o-1"}` {
		t.Errorf("after the wake-up B reads %+v %v, want succeeded with A's result", rec, err)
	}
}

// listening starts d's listener and waits until it listens (its
// connect-time wake-up has fired).
func listening(t *testing.T, d *DB) {
	t.Helper()
	c, stop := d.Watch("acme", "warmup")
	defer stop()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatal("the listener did not connect within 10 s")
	}
}

// TestWatchOtherRecordNotWoken: a change to one record does not wake the
// watchers of another.
func TestWatchOtherRecordNotWoken(t *testing.T) {
	reps := openReplicas(t, 2)
	a, b := reps[0], reps[1]
	watched, other := uuid.NewString(), uuid.NewString()
	listening(t, b)
	changed, stop := b.Watch("acme", watched)
	defer stop()
	claimOn(t, a, other)
	// A notice for the watched record, sent after the other one's, marks
	// the point by which the other's would have arrived.
	probe, stopProbe := b.Watch("acme", "probe")
	defer stopProbe()
	claimOn(t, a, "probe")
	select {
	case <-probe:
	case <-time.After(10 * time.Second):
		t.Fatal("the probe's notice did not arrive")
	}
	select {
	case <-changed:
		t.Error("a change of another record woke the watcher")
	default:
	}
}

// TestListenerReconnectWakesEveryone: when the listening connection is
// lost (terminated by the server), the backend listens again on a new
// connection and wakes every watcher, since notices sent meanwhile are
// lost; notices then reach it again.
func TestListenerReconnectWakesEveryone(t *testing.T) {
	reps := openReplicas(t, 2)
	a, b := reps[0], reps[1]
	ctx := context.Background()
	listening(t, b)
	if n := b.be.listen.connects.Load(); n != 1 {
		t.Fatalf("%d connects before the cut, want 1", n)
	}
	changed, stop := b.Watch("acme", "anything")
	defer stop()
	b.be.listen.mu.Lock()
	pid := b.be.listen.conn.PgConn().PID()
	b.be.listen.mu.Unlock()
	if _, err := a.be.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("watchers were not woken after the listening connection was lost")
	}
	if !eventually(10*time.Second, func() bool { return b.be.listen.connects.Load() == 2 }) {
		t.Fatalf("%d connects after the cut, want 2", b.be.listen.connects.Load())
	}
	key := uuid.NewString()
	changed, stop2 := b.Watch("acme", key)
	defer stop2()
	claimOn(t, a, key)
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("a notice after the reconnect did not arrive")
	}
}

func eventually(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestListenerSurvivesDatabaseRestart: PostgreSQL restarts (pg_ctl
// restart, every connection cut). The waiters are woken to re-read, the
// listener connects again once the server is back, and a commit after the
// restart wakes the watcher of its record on the other replica.
func TestListenerSurvivesDatabaseRestart(t *testing.T) {
	c := pgtest.NewCluster(t) // a cluster of its own: the restart must not disturb other tests
	url, err := c.CreateDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var reps []*DB
	for range 2 {
		d, err := Open(url, ledger.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		reps = append(reps, d)
	}
	a, b := reps[0], reps[1]
	listening(t, b)
	changed, stop := b.Watch("acme", "before-restart")
	defer stop()
	if err := c.Restart(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(30 * time.Second):
		t.Fatal("the waiters were not woken when the listening connection was cut")
	}
	if !eventually(30*time.Second, func() bool { return b.be.listen.connects.Load() >= 2 }) {
		t.Fatal("the listener did not connect again after the restart")
	}
	key := uuid.NewString()
	changed, stop2 := b.Watch("acme", key)
	defer stop2()
	claimOn(t, a, key)
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("a commit after the restart did not wake the other replica's watcher")
	}
}
