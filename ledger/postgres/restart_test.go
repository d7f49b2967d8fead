package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/ledger/postgres"
	"idemgate/ledger/postgres/pgtest"
)

// TestDatabaseRestartUnderLoad: PostgreSQL is restarted (pg_ctl restart,
// connections cut) while two ledgers on it execute claims. They recover
// without being reopened: a transaction cut before its COMMIT is run
// again (only one cut during COMMIT may fail, as an unknown outcome),
// every claim after the restart succeeds, and no key's effect is
// committed twice.
func TestDatabaseRestartUnderLoad(t *testing.T) {
	pgtest.Require(t)        // skips (or fails under CI) as the other tests do
	c, err := pgtest.Start() // a cluster of its own: the restart must not disturb other tests
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	}()
	ctx := context.Background()
	url, err := c.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var reps []*postgres.DB
	for range 2 {
		s, err := postgres.Open(url, ledger.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		reps = append(reps, s)
	}
	execute := func(s *postgres.DB, key string) error {
		cl := ledger.Claim{Actor: ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}, Key: key,
			Tool: "create_order", Fingerprint: "fp", OnLeaseExpiry: ledger.StateRetryable}
		_, err := s.Execute(ctx, cl, func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
			if err := tx.Put("effects", rec.Key+"/"+uuid.NewString(), []byte("x")); err != nil {
				return ledger.Outcome{}, err
			}
			return ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{}`), Summary: "effect"}, nil
		})
		return err
	}

	var (
		stop      atomic.Bool
		wg        sync.WaitGroup
		mu        sync.Mutex
		keys      []string
		failedErr []error
	)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				key := fmt.Sprintf("k-%d-%d", w, i)
				err := execute(reps[w%2], key)
				mu.Lock()
				keys = append(keys, key)
				if err != nil {
					failedErr = append(failedErr, err)
				}
				mu.Unlock()
				// The same key again, from the other ledger: a replay.
				if err == nil {
					if err := execute(reps[(w+1)%2], key); err != nil {
						mu.Lock()
						failedErr = append(failedErr, fmt.Errorf("replay of %s: %w", key, err))
						mu.Unlock()
					}
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	if err := c.Restart(); err != nil {
		stop.Store(true)
		wg.Wait()
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	stop.Store(true)
	wg.Wait()

	// Claims in flight during the restart may fail (a COMMIT cut is an
	// unknown outcome, reported as an error); every claim after it works.
	for _, s := range reps {
		if err := execute(s, uuid.NewString()); err != nil {
			t.Fatalf("a claim after the restart, on the same ledger: %v", err)
		}
	}
	// Transactions cut before COMMIT are run again; only one cut during
	// its COMMIT (at most one per worker) may fail.
	if len(failedErr) > 4 {
		t.Errorf("%d of %d calls failed around the restart, want at most one per worker (a COMMIT cut); first: %v", len(failedErr), len(keys), failedErr[0])
	} else if len(failedErr) > 0 {
		t.Logf("%d calls failed during their COMMIT: %v", len(failedErr), failedErr)
	}
	for _, key := range keys {
		n := 0
		if err := reps[0].View(ctx, func(tx ledger.Tx) error {
			return tx.Scan("effects", key+"/", false, func(string, []byte) (bool, error) { n++; return true, nil })
		}); err != nil {
			t.Fatal(err)
		}
		if n > 1 {
			t.Errorf("key %s: %d effects committed, want at most 1", key, n)
		}
	}
	if _, err := reps[1].VerifyAudit(ctx); err != nil {
		t.Errorf("audit chain after the restart: %v", err)
	}
}

// TestHealthFollowsTheDatabase: Health is OK while the database answers,
// not OK (promptly, naming the cause) while it is stopped, and OK again
// once it is back, without reopening.
func TestHealthFollowsTheDatabase(t *testing.T) {
	pgtest.Require(t)
	c, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ctx := context.Background()
	url, err := c.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s, err := postgres.Open(url, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if h := s.Health(ctx); !h.OK {
		t.Fatalf("health of a running database: %+v", h)
	}
	if err := c.Pause(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	h := s.Health(ctx)
	if h.OK || !strings.Contains(h.Problem, "cannot be read") {
		t.Errorf("health with the database stopped: %+v, want not OK naming the cause", h)
	}
	if d := time.Since(start); d > 6*time.Second {
		t.Errorf("health took %s with the database stopped", d)
	}
	if err := c.Resume(); err != nil {
		t.Fatal(err)
	}
	if h := s.Health(ctx); !h.OK {
		t.Errorf("health after the database is back: %+v", h)
	}
}
