package postgres_test

import (
	"os"
	"testing"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
	"idemgate/ledger/postgres"
	"idemgate/ledger/postgres/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func openDB(t *testing.T, o ledger.Options) *postgres.DB {
	t.Helper()
	s, err := postgres.Open(pgtest.NewDatabase(t), o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// openReplicas opens n ledgers on the database at url (n replicas'
// worth of connection pools), closed when t ends.
func openReplicas(t *testing.T, url string, n int) []*postgres.DB {
	t.Helper()
	var reps []*postgres.DB
	for range n {
		s, err := postgres.Open(url, ledger.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		reps = append(reps, s)
	}
	return reps
}

// TestContract runs the ledger's whole contract on PostgreSQL.
func TestContract(t *testing.T) {
	ledgertest.Run(t, func(t *testing.T, o ledger.Options) ledger.Store {
		s := openDB(t, o)
		t.Cleanup(func() {
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		return s
	})
}

// TestBackend runs the backend-level checks on PostgreSQL.
func TestBackend(t *testing.T) {
	ledgertest.RunBackend(t, func(t *testing.T) ledger.Backend {
		b, err := postgres.OpenBackend(pgtest.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}
