package postgres_test

import (
	"testing"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
	"idemgate/ledger/postgres"
	"idemgate/ledger/postgres/pgtest"
)

// TestAuditPrune runs the audit retention checks on PostgreSQL.
func TestAuditPrune(t *testing.T) {
	ledgertest.RunAuditPrune(t, func(t *testing.T) ledger.Backend {
		b, err := postgres.OpenBackend(pgtest.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		return b
	})
}
