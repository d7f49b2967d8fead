package bolt

import (
	"path/filepath"
	"testing"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
)

// TestLedgerLinearizable runs the contract's porcupine check on one ledger
// file opened as TWO stores, as two processes would, taking turns on the
// file lock.
func TestLedgerLinearizable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	ledgertest.Linearizable(t, []ledger.Store{mustOpenPath(t, path, ledger.Options{}), mustOpenPath(t, path, ledger.Options{})})
}

// TestLedgerLinearizabilityModelRejects: the model refuses histories that
// are not linearizable, so a pass of TestLedgerLinearizable means something.
func TestLedgerLinearizabilityModelRejects(t *testing.T) { ledgertest.LinearizabilityModelRejects(t) }
