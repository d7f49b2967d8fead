package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
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
// connections cut) while two ledgers on it execute claims, each followed
// by its replay from the other ledger. They recover without being
// reopened, and nothing is lost or doubled: every claim that succeeded
// has exactly one effect and a succeeded record, and its replay is a
// replay of it; a transaction cut before its COMMIT is run again, so the
// only failure allowed is the documented one — a COMMIT whose outcome
// could not be read back (ErrCommitUnknown), at most one per worker — and
// such a key settles: its record and effect are there together or not at
// all, and the caller's retry ends succeeded with exactly one effect.
func TestDatabaseRestartUnderLoad(t *testing.T) {
	c := pgtest.NewCluster(t) // a cluster of its own: the restart must not disturb other tests
	ctx := context.Background()
	url, err := c.CreateDatabase(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reps := openReplicas(t, url, 2)
	claim := func(key string) ledger.Claim {
		return ledger.Claim{Actor: ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}, Key: key,
			Tool: "create_order", Fingerprint: "fp", OnLeaseExpiry: ledger.StateRetryable}
	}
	execute := func(s *postgres.DB, key string) (ledger.Decision, error) {
		return s.Execute(ctx, claim(key), func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
			if err := tx.Put("effects", rec.Key+"/"+uuid.NewString(), []byte("x")); err != nil {
				return ledger.Outcome{}, err
			}
			return ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{}`), Summary: "effect"}, nil
		})
	}
	effects := func(key string) int {
		t.Helper()
		n := 0
		if err := reps[0].View(ctx, func(tx ledger.Tx) error {
			return tx.Scan("effects", key+"/", false, func(string, []byte) (bool, error) { n++; return true, nil })
		}); err != nil {
			t.Fatal(err)
		}
		return n
	}

	type call struct {
		key         string
		err         error // the first Execute's
		d           ledger.Decision
		replay      ledger.Decision // the other ledger's Execute of the same key, after a success
		replayErr   error
		replayTried bool
	}
	var (
		stop  atomic.Bool
		wg    sync.WaitGroup
		mu    sync.Mutex
		calls []*call
	)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				cl := &call{key: fmt.Sprintf("k-%d-%d", w, i)}
				cl.d, cl.err = execute(reps[w%2], cl.key)
				if cl.err == nil { // the same key again, from the other ledger: a replay
					cl.replayTried = true
					cl.replay, cl.replayErr = execute(reps[(w+1)%2], cl.key)
				}
				mu.Lock()
				calls = append(calls, cl)
				mu.Unlock()
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

	// Every claim after the restart works, on the same ledgers.
	for _, s := range reps {
		if _, err := execute(s, uuid.NewString()); err != nil {
			t.Fatalf("a claim after the restart, on the same ledger: %v", err)
		}
	}
	failed := 0
	for _, cl := range calls {
		n := effects(cl.key)
		if cl.err == nil {
			if cl.d.Kind != ledger.DecisionExecuted || cl.d.Record == nil || cl.d.Record.State != ledger.StateSucceeded {
				t.Errorf("key %s: answered %s %+v, want executed and succeeded", cl.key, cl.d.Kind, cl.d.Record)
			}
			if n != 1 {
				t.Errorf("key %s: the call succeeded and %d effects are committed, want exactly 1", cl.key, n)
			}
			if cl.replayErr != nil {
				t.Errorf("key %s: its replay on the other ledger failed: %v", cl.key, cl.replayErr)
			} else if cl.replay.Kind != ledger.DecisionReplay || cl.replay.Record == nil || cl.replay.Record.State != ledger.StateSucceeded {
				t.Errorf("key %s: its replay on the other ledger answered %s %+v, want a replay of the success", cl.key, cl.replay.Kind, cl.replay.Record)
			}
			continue
		}
		failed++
		if !errors.Is(cl.err, postgres.ErrCommitUnknown) {
			t.Errorf("key %s: failed with %v, want only ErrCommitUnknown (a transaction cut before COMMIT is run again)", cl.key, cl.err)
		}
		// What the failed call left is all or nothing: its record (the
		// claim's transaction) with its one effect, or neither.
		rec, gerr := reps[1].Get(ctx, "acme", cl.key)
		switch {
		case gerr == nil && (rec.State != ledger.StateSucceeded || n != 1):
			t.Errorf("key %s: after a failed COMMIT the record is %s with %d effects, want succeeded with 1 (or no record and none)", cl.key, rec.State, n)
		case errors.Is(gerr, ledger.ErrNotFound) && n != 0:
			t.Errorf("key %s: after a failed COMMIT there is no record but %d effects", cl.key, n)
		case gerr != nil && !errors.Is(gerr, ledger.ErrNotFound):
			t.Fatalf("key %s: Get: %v", cl.key, gerr)
		}
		// The caller's retry settles it: succeeded, with one effect.
		d, err := execute(reps[0], cl.key)
		if err != nil || d.Record == nil || d.Record.State != ledger.StateSucceeded {
			t.Errorf("key %s: the retry after a failed COMMIT: %+v, %v, want succeeded", cl.key, d.Record, err)
		}
		if n := effects(cl.key); n != 1 {
			t.Errorf("key %s: %d effects after the retry, want exactly 1", cl.key, n)
		}
	}
	if failed > 4 {
		t.Errorf("%d of %d calls failed around the restart, want at most one per worker (a COMMIT cut)", failed, len(calls))
	}
	t.Logf("%d calls, %d failed during their COMMIT", len(calls), failed)
	if len(calls) < 20 {
		t.Errorf("only %d calls ran around the restart: the load did not straddle it", len(calls))
	}
	if _, err := reps[1].VerifyAudit(ctx); err != nil {
		t.Errorf("audit chain after the restart: %v", err)
	}
}

// TestHealthFollowsTheDatabase: Health is OK while the database answers,
// not OK (promptly, naming the cause) while it is stopped, and OK again
// once it is back, without reopening.
func TestHealthFollowsTheDatabase(t *testing.T) {
	c := pgtest.NewCluster(t)
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
