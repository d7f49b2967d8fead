package postgres_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/ledger/postgres"
	"idemgate/ledger/postgres/pgtest"
)

// TestConnectionCutDuringCommit: a proxy between the ledger and
// PostgreSQL drops the connection as COMMIT is sent — once after the
// server got it (committed, reply lost), once before (never committed).
// Either way the claim's answer is the truth, read back from the
// database: committed means succeeded with the one effect, not committed
// means the transaction is run again; never a second effect, never an
// error for a transaction that committed.
func TestConnectionCutDuringCommit(t *testing.T) {
	p := pgtest.NewCutProxy(t, pgtest.NewDatabase(t))
	s, err := postgres.Open(p.URL(), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, mode := range []pgtest.CutMode{pgtest.CutAfter, pgtest.CutBefore} {
		t.Run("cut "+mode.String(), func(t *testing.T) {
			cl := ledger.Claim{Actor: ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}, Key: uuid.NewString(),
				Tool: "create_order", Fingerprint: "fp", OnLeaseExpiry: ledger.StateRetryable}
			apply := func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
				if err := tx.Put("effects", rec.Key+"/"+uuid.NewString(), []byte("x")); err != nil {
					return ledger.Outcome{}, err
				}
				return ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{"ok":true}`), Summary: "effect"}, nil
			}
			before := p.Cuts()
			p.Arm(mode, cl.Key)
			d, err := s.Execute(ctx, cl, apply)
			if p.Cuts() != before+1 {
				t.Fatalf("the proxy did not cut a COMMIT (Execute: %+v, %v)", d, err)
			}
			if err != nil {
				t.Fatalf("Execute across a connection cut during COMMIT: %v", err)
			}
			if d.Kind != ledger.DecisionExecuted || d.Record == nil || d.Record.State != ledger.StateSucceeded {
				t.Fatalf("decision %s %+v, want executed and succeeded (this call ran it, once)", d.Kind, d.Record)
			}
			effects := func() int {
				t.Helper()
				n := 0
				if err := s.View(ctx, func(tx ledger.Tx) error {
					return tx.Scan("effects", cl.Key+"/", false, func(string, []byte) (bool, error) { n++; return true, nil })
				}); err != nil {
					t.Fatal(err)
				}
				return n
			}
			// What was answered is what the database holds: the record and
			// its one effect, committed before the answer.
			if n := effects(); n != 1 {
				t.Errorf("answered succeeded with %d effects committed, want exactly 1", n)
			}
			if rec, err := s.Get(ctx, "acme", cl.Key); err != nil || rec.State != ledger.StateSucceeded {
				t.Errorf("answered succeeded, the record reads %+v, %v", rec, err)
			}
			again, err := s.Execute(ctx, cl, apply)
			if err != nil || again.Kind != ledger.DecisionReplay || again.Record == nil || again.Record.State != ledger.StateSucceeded {
				t.Fatalf("the same claim again: %s %+v, %v, want a replay of the success", again.Kind, again.Record, err)
			}
			if n := effects(); n != 1 {
				t.Errorf("%d effects committed after the replay, want exactly 1", n)
			}
		})
	}
}
