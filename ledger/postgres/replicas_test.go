package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/ledger/postgres/pgtest"
)

// TestReplicasExecuteOnce: four ledgers on one database (four replicas'
// worth of connection pools) send the same claims at once, many
// goroutines each. Each key's effect is committed exactly once, and every
// caller gets the one execution's result.
func TestReplicasExecuteOnce(t *testing.T) {
	reps := openReplicas(t, pgtest.NewDatabase(t), 4)
	ctx := context.Background()
	const keys, callers = 8, 16
	for k := range keys {
		c := ledger.Claim{Actor: ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}, Key: uuid.NewString(),
			Tool: "create_order", Fingerprint: "fp", OnLeaseExpiry: ledger.StateRetryable}
		var wg sync.WaitGroup
		results := make([]string, callers)
		errs := make([]error, callers)
		for i := range callers {
			s := reps[i%len(reps)]
			wg.Go(func() {
				d, err := s.Execute(ctx, c, func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
					if err := tx.Put("effects", rec.Key+"/"+fmt.Sprint(i), []byte("x")); err != nil {
						return ledger.Outcome{}, err
					}
					return ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(fmt.Sprintf(`{"by":%d}`, i)), Summary: "effect"}, nil
				})
				errs[i] = err
				if err == nil && d.Record != nil {
					results[i] = string(d.Record.Result)
				}
			})
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("key %d caller %d: %v", k, i, err)
			}
			if results[i] != results[0] || results[i] == "" {
				t.Fatalf("key %d: callers got results %q, want one", k, results)
			}
		}
		effects := 0
		if err := reps[0].View(ctx, func(tx ledger.Tx) error {
			return tx.Scan("effects", c.Key+"/", false, func(string, []byte) (bool, error) { effects++; return true, nil })
		}); err != nil {
			t.Fatal(err)
		}
		if effects != 1 {
			t.Errorf("key %d: %d effects committed, want exactly 1", k, effects)
		}
	}
	for i, s := range reps {
		if _, err := s.VerifyAudit(ctx); err != nil {
			t.Errorf("replica %d: audit chain: %v", i, err)
		}
	}
}

// TestReplicasSealEachEntryOnce: several ledgers on one database journal
// audit entries and seal the journal at once, again and again. Every
// entry is chained exactly once: a sealer that read the journal while
// another was chaining it must not chain the same entries again.
func TestReplicasSealEachEntryOnce(t *testing.T) {
	reps := openReplicas(t, pgtest.NewDatabase(t), 3)
	ctx := context.Background()
	const rounds, perRound = 20, 50
	for r := range rounds {
		var wg sync.WaitGroup
		for i, s := range reps {
			wg.Go(func() {
				for j := range perRound {
					s.Audit(ledger.AuditEntry{Event: ledger.EventCall, Actor: ledger.Actor{Principal: "p", Tenant: "t1"},
						Tool: "get_order", Key: fmt.Sprint("k", r, "-", i, "-", j), Decision: "read"})
				}
				if err := s.FlushAudit(); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	es, err := reps[0].AuditLog(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]int{}
	for _, e := range es {
		seen[e.Key]++
	}
	want := rounds * perRound * len(reps)
	if len(es) != want || len(seen) != want {
		t.Errorf("the log holds %d entries of %d keys; want %d, each once", len(es), len(seen), want)
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("entry of %s chained %d times", k, n)
		}
	}
	if n, err := reps[1].VerifyAudit(ctx); err != nil || n != want {
		t.Errorf("verify = %d, %v; want %d", n, err, want)
	}
}
