package bolt

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
)

// TestLaterRidesTheNextCommit: a write queued with Later commits with the
// next write transaction (no commit of its own), a Later write that fails
// is told so without failing the transaction that carried it, and a
// queued write with no write to carry it commits within the flush
// interval.
func TestLaterRidesTheNextCommit(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, ledger.Options{})
	ap := &applier{}
	put := func(key string) func(ledger.Tx) error {
		return func(tx ledger.Tx) error { return tx.Put("later_test", key, []byte("v")) }
	}
	got := make(chan error, 3)
	s.Later(put("a"), func(err error) { got <- err })
	boom := errors.New("boom")
	s.Later(func(tx ledger.Tx) error {
		if err := tx.Put("later_test", "never", []byte("v")); err != nil {
			return err
		}
		return boom
	}, func(err error) { got <- err })
	c0 := s.CommitStats().Commits
	if _, err := s.Execute(ctx, newClaim("t1", "create_order", "fp"), ap.succeed(ledgertest.ResultOrder)); err != nil {
		t.Fatalf("the carrying claim failed: %v", err)
	}
	if c := s.CommitStats().Commits - c0; c != 1 {
		t.Errorf("%d commits for a claim carrying two queued writes, want 1", c)
	}
	results := []error{<-got, <-got}
	if !(errors.Is(results[0], boom) && results[1] == nil) {
		t.Errorf("done = %v, want the failed write's error, then nil", results)
	}
	var a, never []byte
	s.View(ctx, func(tx ledger.Tx) error {
		a, _ = tx.Get("later_test", "a")
		never, _ = tx.Get("later_test", "never")
		a, never = append([]byte(nil), a...), append([]byte(nil), never...)
		return nil
	})
	if string(a) != "v" || len(never) != 0 {
		t.Errorf("after the claim: a=%q never=%q; want the first write only", a, never)
	}
	s.Later(put(uuid.NewString()), func(err error) { got <- err })
	select {
	case err := <-got:
		if err != nil {
			t.Errorf("flushed write: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a queued write with nothing to carry it was not committed by the flush")
	}
}

// TestFlushWaitsWhileWritesCarry: while write transactions keep
// committing, each carrying what is buffered (a Later write queued after
// each, as a pass's record or a call's answer entry is), the background
// flush commits nothing of its own; it commits only what has waited the
// flush interval. (It committed whatever it found buffered at each of its
// ticks: five commits a second of a steady sequence of calls.)
func TestFlushWaitsWhileWritesCarry(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, ledger.Options{})
	c0 := s.CommitStats().Commits
	writes := 0
	for start := time.Now(); time.Since(start) < 1200*time.Millisecond; writes++ {
		if err := s.Update(ctx, func(tx ledger.Tx) error { return tx.Put("later_test", uuid.NewString(), []byte("v")) }); err != nil {
			t.Fatal(err)
		}
		s.Later(func(tx ledger.Tx) error { return tx.Put("later_test", uuid.NewString(), []byte("l")) }, func(error) {})
		time.Sleep(5 * time.Millisecond)
	}
	if extra := s.CommitStats().Commits - c0 - int64(writes); extra > 1 {
		t.Errorf("%d commits of the background flush beside %d writes that carried its buffer, want at most 1", extra, writes)
	}
}
