package bolt

import (
	"path/filepath"
	"testing"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
)

// TestBoltAuditPrune runs the audit retention checks on a bbolt file.
func TestBoltAuditPrune(t *testing.T) {
	ledgertest.RunAuditPrune(t, func(t *testing.T) ledger.Backend {
		be, err := openBackend(filepath.Join(t.TempDir(), "ledger.db"), openReadWrite, true, deepCheckLimit)
		if err != nil {
			t.Fatal(err)
		}
		return be
	})
}
