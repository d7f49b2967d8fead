package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"idemgate/ledger"
	"idemgate/ledger/postgres/pgtest"
)

// TestCommitMarkerLockedFirst: an Update holds its commit marker's lock
// from its first round trip on, even while that round trip waits for
// another lock — here one that also carries COMMIT (a key prefetched, one
// written, nothing read). Otherwise a read-back after a connection lost
// during the wait would take the marker's lock at once, find no marker,
// and run the transaction again while the first could still commit.
func TestCommitMarkerLockedFirst(t *testing.T) {
	url := pgtest.NewDatabase(t)
	be, err := openBackend(url, true, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { be.Close() })
	ctx := context.Background()
	other, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close(ctx) })
	const coll = "records"
	held := lockID(coll, []byte("a"))
	// The marker's lock id is random: several transactions, so that one
	// whose marker sorts after the held key's comes up.
	for range 8 {
		if _, err := other.Exec(ctx, "SELECT pg_advisory_lock($1)", held); err != nil {
			t.Fatal(err)
		}
		markers := make(chan int64, 1)
		done := make(chan error, 1)
		go func() {
			done <- be.Update(ctx, func(bt ledger.BTx) error {
				markers <- markerLockKey(bt.(*btx).marker)
				b := bt.Bucket([]byte(coll))
				b.(ledger.Prefetcher).Prefetch([]byte("a"))
				return b.Put([]byte("b"), []byte("x"))
			})
		}()
		marker := <-markers
		// Wait until the Update waits for the held lock.
		for deadline := time.Now().Add(10 * time.Second); ; {
			var waiting bool
			if err := other.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'advisory' AND NOT granted)").Scan(&waiting); err != nil {
				t.Fatal(err)
			}
			if waiting {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the Update never waited for the held lock")
			}
			time.Sleep(10 * time.Millisecond)
		}
		var free bool
		if err := other.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", marker).Scan(&free); err != nil {
			t.Fatal(err)
		}
		if free {
			other.Exec(ctx, "SELECT pg_advisory_unlock($1)", marker)
			t.Fatal("while its first round trip waited for another lock, the Update did not hold its commit marker's lock")
		}
		if _, err := other.Exec(ctx, "SELECT pg_advisory_unlock($1)", held); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("the Update, once the lock was released: %v", err)
		}
	}
}
