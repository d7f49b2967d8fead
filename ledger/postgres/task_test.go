package postgres_test

import (
	"context"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/postgres/pgtest"
)

// TestTaskOneHolderAcrossReplicas: of two replicas on one database, one
// holds a background task at a time; the holder extends it, the other is
// refused until the holder ends it or its hold expires (by the
// database's clock), and then takes it.
func TestTaskOneHolderAcrossReplicas(t *testing.T) {
	reps := openReplicas(t, pgtest.NewDatabase(t), 2)
	a, b := reps[0], reps[1]
	ctx := context.Background()
	take := func(s ledger.Store, holder string, hold time.Duration) bool {
		t.Helper()
		ok, err := ledger.TakeTask(ctx, s, "reconcile", holder, hold)
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if !take(a, "A", time.Minute) {
		t.Fatal("A could not take a free task")
	}
	if take(b, "B", time.Minute) {
		t.Fatal("B took the task A holds")
	}
	if !take(a, "A", time.Minute) {
		t.Fatal("A could not extend its own task")
	}
	if err := ledger.EndTask(ctx, b, "reconcile", "B"); err != nil {
		t.Fatal(err)
	}
	if take(b, "B", time.Minute) {
		t.Fatal("B's EndTask of a task it did not hold released A's")
	}
	if err := ledger.EndTask(ctx, a, "reconcile", "A"); err != nil {
		t.Fatal(err)
	}
	if !take(b, "B", 300*time.Millisecond) {
		t.Fatal("B could not take the task A ended")
	}
	if take(a, "A", time.Minute) {
		t.Fatal("A took the task B holds")
	}
	time.Sleep(400 * time.Millisecond) // B "dies": its hold expires
	if !take(a, "A", time.Minute) {
		t.Fatal("A could not take the task after B's hold expired")
	}
}
