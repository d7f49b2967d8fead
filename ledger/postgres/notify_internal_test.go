package postgres

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"sync"
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

// watchRunning claims key on a and watches it from b as a waiter does:
// Watch, then GetWatched, which marks the running record watched. It
// returns b's channel and the claim's generation.
func watchRunning(t *testing.T, a, b *DB, key string) (<-chan struct{}, uint64) {
	t.Helper()
	gen := claimOn(t, a, key)
	changed, stop := b.Watch("acme", key)
	t.Cleanup(stop)
	rec, err := b.GetWatched(context.Background(), "acme", key)
	if err != nil || rec.State != ledger.StateInProgress {
		t.Fatalf("B reads %v %v, want in_progress", rec, err)
	}
	return changed, gen
}

func completeOn(t *testing.T, d *DB, key string, gen uint64) {
	t.Helper()
	if _, err := d.Complete(context.Background(), ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}, key, gen,
		ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{"order":"o-1"}`), Summary: "done"}); err != nil {
		t.Fatal(err)
	}
}

// topicOf is the notice of the record (acme, key) (ledger's recordTopic).
func topicOf(key string) string {
	sum := sha256.Sum256([]byte("acme\x00" + key))
	return hex.EncodeToString(sum[:12])
}

func woken(t *testing.T, changed <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not woken within 10 s", what)
	}
}

// TestWatchWokenByAnotherReplica: a watcher on replica B of a record
// running on replica A is woken by A's completion — the watch channel
// fires, which only a notice can make it do (nothing polls here) — and
// then reads the saved result.
func TestWatchWokenByAnotherReplica(t *testing.T) {
	reps := openReplicas(t, 2)
	a, b := reps[0], reps[1]
	listening(t, b) // its first connect wakes everyone once
	key := uuid.NewString()
	changed, gen := watchRunning(t, a, b, key)
	completeOn(t, a, key, gen)
	done := time.Now()
	woken(t, changed, "B's watch after A's commit")
	t.Logf("woken %s after A's commit returned", time.Since(done))
	rec, err := b.Get(context.Background(), "acme", key)
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

// TestWatchOtherRecordNotWoken: a notice of one record does not wake the
// watchers of another.
func TestWatchOtherRecordNotWoken(t *testing.T) {
	reps := openReplicas(t, 2)
	a, b := reps[0], reps[1]
	listening(t, b)
	changed, _ := watchRunning(t, a, b, uuid.NewString())
	_, other := watchRunning(t, a, b, "other") // marked watched, so its change is notified
	completeOn(t, a, "other", other)
	// A notice sent after the other one's marks the point by which the
	// other's would have arrived.
	probe, gen := watchRunning(t, a, b, "probe")
	completeOn(t, a, "probe", gen)
	woken(t, probe, "the probe")
	select {
	case <-changed:
		t.Error("a change of another record woke the watcher")
	default:
	}
}

// TestOnlyWatchedChangesNotify: a commit that changes a record nobody
// watches sends no NOTIFY (so it takes no part in PostgreSQL's
// database-wide lock of notifying commits); one that changes a watched
// record sends its notice and removes the mark.
func TestOnlyWatchedChangesNotify(t *testing.T) {
	reps := openReplicas(t, 2)
	a, b := reps[0], reps[1]
	ctx := context.Background()
	pc, err := a.be.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	conn := pc.Hijack() // out of the pool: it listens
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "LISTEN "+notifyChannel); err != nil {
		t.Fatal(err)
	}
	quiet := uuid.NewString()
	completeOn(t, a, quiet, claimOn(t, a, quiet)) // claimed and completed, unwatched
	listening(t, b)
	watched := uuid.NewString()
	changed, gen := watchRunning(t, a, b, watched)
	var marks int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM idemgate_kv WHERE collection = $1", ledger.WatchedCollection).Scan(&marks); err != nil || marks != 1 {
		t.Fatalf("%d marks (%v) while B waits, want 1", marks, err)
	}
	completeOn(t, a, watched, gen)
	woken(t, changed, "B's watch")
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := topicOf(watched); n.Payload != want {
		t.Errorf("the first notice is %q, want only the watched record's %q (an unwatched change notified)", n.Payload, want)
	}
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM idemgate_kv WHERE collection = $1", ledger.WatchedCollection).Scan(&marks); err != nil || marks != 0 {
		t.Errorf("%d marks (%v) after the notice, want 0", marks, err)
	}
	wctx, cancel2 := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel2()
	if n, err := conn.WaitForNotification(wctx); err == nil {
		t.Errorf("a second notice %q, want none", n.Payload)
	}
}

// TestWatchRacingCompletionsNeverMissed: waiters on B mark records while
// A completes them at the same moment; each waiter is woken by a notice
// or reads the outcome, every time — nothing here polls, so a mark made
// after the completion looked for it and before it committed would leave
// its waiter asleep.
func TestWatchRacingCompletionsNeverMissed(t *testing.T) {
	reps := openReplicas(t, 2)
	a, b := reps[0], reps[1]
	ctx := context.Background()
	listening(t, b)
	var wg sync.WaitGroup
	for i := range 60 {
		key := uuid.NewString()
		gen := claimOn(t, a, key)
		wg.Go(func() {
			time.Sleep(time.Duration(i%6) * time.Millisecond)
			completeOn(t, a, key, gen)
		})
		wg.Go(func() {
			for {
				changed, stop := b.Watch("acme", key)
				rec, err := b.GetWatched(ctx, "acme", key)
				if err != nil {
					stop()
					t.Error(err)
					return
				}
				if rec.State != ledger.StateInProgress {
					stop()
					return
				}
				select {
				case <-changed:
					stop()
				case <-time.After(10 * time.Second):
					stop()
					t.Errorf("key %d: the waiter was not woken within 10 s of its record's completion", i)
					return
				}
			}
		})
	}
	wg.Wait()
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
	changed, gen := watchRunning(t, a, b, key)
	completeOn(t, a, key, gen)
	woken(t, changed, "a notice after the reconnect")
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
	changed, gen := watchRunning(t, a, b, key)
	completeOn(t, a, key, gen)
	woken(t, changed, "a commit after the restart, the other replica's watcher")
}
