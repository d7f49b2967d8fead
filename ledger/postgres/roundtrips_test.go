package postgres_test

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/ledger/postgres"
	"idemgate/ledger/postgres/pgtest"
)

// TestRoundTripsPerClaim counts the exchanges with the database of a
// claim that executes (a new key whose effect writes a key of its own it
// first reads, as an order's does), of its replay and of a Get of its
// record (get_operation_status): 4, 1 and 1. The first
// look at the record is one statement outside a transaction; the claim's
// transaction reads its clocks, its record, the fingerprint index and
// the retention walk's place with BEGIN, in one round trip; the effect's
// own read is one more; its writes go with COMMIT. The least of a few
// tries is taken: the ledger's background work (the audit sealer) may
// add an exchange of its own to one.
func TestRoundTripsPerClaim(t *testing.T) {
	s := openDB(t, ledger.Options{})
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	execute := func(key string) ledger.Decision {
		c := ledger.Claim{Actor: ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}, Key: key,
			Tool: "create_order", Fingerprint: "fp-" + key, OnLeaseExpiry: ledger.StateRetryable, SuspectDuplicates: true}
		d, err := s.Execute(ctx, c, func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
			if v, err := tx.Get("effects", rec.Key); err != nil || v != nil {
				t.Fatalf("the effect's key: %q, %v", v, err)
			}
			if err := tx.Put("effects", rec.Key, []byte("x")); err != nil {
				return ledger.Outcome{}, err
			}
			return ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{}`), Summary: "effect"}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	execute(uuid.NewString()) // the collections exist, the statements are prepared
	counted := func(fn func()) int64 {
		before, _ := s.Stats()
		fn()
		after, _ := s.Stats()
		return after - before
	}
	least := func(fn func()) int64 {
		n := counted(fn)
		for range 4 {
			n = min(n, counted(fn))
		}
		return n
	}
	var key string
	if n := least(func() {
		key = uuid.NewString()
		if d := execute(key); d.Kind != ledger.DecisionExecuted {
			t.Fatalf("a new key: %s", d.Kind)
		}
	}); n != 4 {
		t.Errorf("an executed claim took %d round trips, want 4", n)
	}
	if n := least(func() {
		if d := execute(key); d.Kind != ledger.DecisionReplay {
			t.Fatalf("the same key again: %s", d.Kind)
		}
	}); n != 1 {
		t.Errorf("a replay took %d round trips, want 1", n)
	}
	if n := least(func() {
		if _, err := s.Get(ctx, "acme", key); err != nil {
			t.Fatal(err)
		}
	}); n != 1 {
		t.Errorf("a Get took %d round trips, want 1", n)
	}
}

// TestPrefetchedKeyWrittenBeforeItsRead: a key prefetched, then written
// before the transaction's next round trip, which carries both the read
// and the write (a cursor flushes its collection's writes first): the
// transaction goes on reading what it wrote, not the row as it was.
func TestPrefetchedKeyWrittenBeforeItsRead(t *testing.T) {
	b, err := postgres.OpenBackend(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx := context.Background()
	coll, key := ledger.Collections()[0], []byte("k")
	if err := b.Update(ctx, func(tx ledger.BTx) error { return tx.Bucket([]byte(coll)).Put(key, []byte("old")) }); err != nil {
		t.Fatal(err)
	}
	var got []byte
	if err := b.Update(ctx, func(tx ledger.BTx) error {
		bk := tx.Bucket([]byte(coll))
		p, ok := bk.(ledger.Prefetcher)
		if !ok {
			t.Fatal("the PostgreSQL bucket is no Prefetcher")
		}
		p.Prefetch(key)
		if err := bk.Put(key, []byte("new")); err != nil {
			return err
		}
		bk.Cursor().First() // one round trip: the prefetched read and the write
		got = bytes.Clone(bk.Get(key))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if string(got) != "new" {
		t.Errorf("read %q after writing %q, want what was written", got, "new")
	}
}
