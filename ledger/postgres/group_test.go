package postgres

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
	"idemgate/ledger/postgres/pgtest"
)

// TestGroupCommitBatchMemberFails forces the batch: the 32 callers are all
// queued before the blocker's transaction ends, so they run as one batch
// that fails on one member and is re-run member by member.
func TestGroupCommitBatchMemberFails(t *testing.T) {
	applies := ledgertest.RunBatchWithOneFailure(t, func(t *testing.T, o ledger.Options) ledger.Store {
		return mustOpenURLWith(t, pgtest.NewDatabase(t), o)
	}, func(st ledger.Store) {
		b := st.(*DB).be
		deadline := time.Now().Add(10 * time.Second)
		for {
			b.gcMu.Lock()
			q := len(b.gcQueue) // the blocker's job was taken off; only the 32 wait
			b.gcMu.Unlock()
			if q == 32 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("only %d callers queued behind the blocker", q)
			}
			time.Sleep(time.Millisecond)
		}
	})
	if applies < 33 {
		t.Errorf("applies ran %d times, want at least 33 (batch, then solo re-runs)", applies)
	}
}

// TestGroupCommitBatches: concurrent Updates of one process share
// physical transactions (fewer transactions than functions), and each
// function's write is committed exactly once, readable afterwards.
func TestGroupCommitBatches(t *testing.T) {
	s := mustOpenURLWith(t, pgtest.NewDatabase(t), ledger.Options{})
	tx0, fn0 := s.GroupCommitStats()
	const n = 200
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- s.Update(context.Background(), func(tx ledger.Tx) error {
				return tx.Put("group_test", fmt.Sprintf("k%04d", i), []byte("v"))
			})
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	tx1, fn1 := s.GroupCommitStats()
	if fn1-fn0 != n {
		t.Errorf("functions committed = %d, want %d", fn1-fn0, n)
	}
	if tx1-tx0 >= n {
		t.Errorf("%d transactions for %d functions: no batch formed", tx1-tx0, n)
	}
	t.Logf("%d functions in %d transactions", fn1-fn0, tx1-tx0)
	got := 0
	err := s.View(context.Background(), func(tx ledger.Tx) error {
		return tx.Scan("group_test", "", false, func(string, []byte) (bool, error) { got++; return true, nil })
	})
	if err != nil || got != n {
		t.Fatalf("rows = %d (%v), want %d", got, err, n)
	}
}

func mustOpenURLWith(t testing.TB, url string, o ledger.Options) *DB {
	t.Helper()
	s, err := Open(url, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
