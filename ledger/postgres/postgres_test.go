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
