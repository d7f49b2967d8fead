package postgres

import (
	"context"
	"fmt"
	"strings"
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

// TestTransactionMemoryAgreesWithTheDatabase: what a transaction answers
// from memory (rows read, the collection's last row) agrees with the
// database through writes, deletes of the last row and flushes, inside one
// transaction and after it.
func TestTransactionMemoryAgreesWithTheDatabase(t *testing.T) {
	be, err := OpenBackend(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	ctx := context.Background()
	const coll = "mem_test"
	last := func(tx ledger.BTx) string {
		b, _ := tx.Data(coll, true)
		k, _ := b.Cursor().Last()
		return string(k)
	}
	check := func(what, got, want string) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %q, want %q", what, got, want)
		}
	}
	err = be.Update(ctx, func(tx ledger.BTx) error {
		b, _ := tx.Data(coll, true)
		check("last of an empty collection", last(tx), "")
		b.Put([]byte("b"), []byte("1"))
		check("last after a put", last(tx), "b")
		b.Delete([]byte("b"))
		check("last after deleting it", last(tx), "")
		for _, k := range []string{"a", "b", "c"} {
			b.Put([]byte(k), []byte(k))
		}
		check("last of three", last(tx), "c")
		check("absent, read", string(b.Get([]byte("x"))), "")
		b.Put([]byte("x"), []byte("X"))
		check("last after x", last(tx), "x")
		if k, _ := b.Cursor().Seek([]byte("c")); string(k) != "c" { // sends the writes
			t.Errorf("seek c: %q", k)
		}
		check("x read after it was sent", string(b.Get([]byte("x"))), "X")
		b.Delete([]byte("x"))
		check("last after deleting the sent last row", last(tx), "c")
		check("x after its delete", string(b.Get([]byte("x"))), "")
		c := b.Cursor()
		c.Last()
		k, _ := c.Prev()
		check("prev of the last", string(k), "b")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	err = be.View(ctx, func(tx ledger.BTx) error {
		b, _ := tx.Data(coll, false)
		var keys []string
		c := b.Cursor()
		for k, _ := c.First(); k != nil; k, _ = c.Next() {
			keys = append(keys, string(k))
		}
		check("committed keys", fmt.Sprint(keys), "[a b c]")
		check("last in a view", last(tx), "c")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestWriterConnectionGoesBackWhenIdle: under concurrent Updates and
// Views the leader keeps one connection for the batches, gives it back to
// the pool once no writer queues, and on a pool of one connection (where
// keeping it would starve the reads) never keeps it: every call
// finishes, and Close returns.
func TestWriterConnectionGoesBackWhenIdle(t *testing.T) {
	for _, tc := range []struct {
		name  string
		param string
		keep  bool
	}{{"default pool", "", true}, {"pool of one", "pool_max_conns=1", false}} {
		t.Run(tc.name, func(t *testing.T) {
			url := pgtest.NewDatabase(t)
			if tc.param != "" {
				sep := "?"
				if strings.Contains(url, "?") {
					sep = "&"
				}
				url += sep + tc.param
			}
			be, err := openBackend(url, true, false)
			if err != nil {
				t.Fatal(err)
			}
			if be.keepWriter != tc.keep {
				t.Errorf("keepWriter %v, want %v", be.keepWriter, tc.keep)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var wg sync.WaitGroup
			errs := make(chan error, 200)
			for i := range 100 {
				wg.Add(2)
				go func() {
					defer wg.Done()
					errs <- be.Update(ctx, func(tx ledger.BTx) error {
						b, _ := tx.Data("idle_test", true)
						return b.Put([]byte(fmt.Sprintf("k%03d", i)), []byte("v"))
					})
				}()
				go func() {
					defer wg.Done()
					errs <- be.View(ctx, func(tx ledger.BTx) error {
						if b, _ := tx.Data("idle_test", false); b != nil {
							b.Get([]byte("k000"))
						}
						return nil
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
			be.gcMu.Lock()
			held, running := be.wconn != nil, be.gcRunning
			be.gcMu.Unlock()
			if held || running {
				t.Errorf("after the last Update: writer connection held %v, leader running %v", held, running)
			}
			if n := be.pool.Stat().AcquiredConns(); n != 0 {
				t.Errorf("%d connections still acquired from the pool", n)
			}
			closed := make(chan error, 1)
			go func() { closed <- be.Close() }()
			select {
			case err := <-closed:
				if err != nil {
					t.Error(err)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Close did not return")
			}
		})
	}
}
