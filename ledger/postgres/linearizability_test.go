package postgres

import (
	"testing"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
	"idemgate/ledger/postgres/pgtest"
)

// TestLedgerLinearizable runs the contract's porcupine check on one
// PostgreSQL database opened as TWO stores, as two replicas would.
func TestLedgerLinearizable(t *testing.T) {
	url := pgtest.NewDatabase(t)
	ledgertest.Linearizable(t, []ledger.Store{mustOpenURL(t, url), mustOpenURL(t, url)})
}

func mustOpenURL(t testing.TB, url string) *DB {
	t.Helper()
	s, err := Open(url, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
