package bolt

import (
	"testing"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
)

// TestLedgerLinearizable runs the contract's porcupine check on one ledger
// file, opened once (one process at a time opens a file).
func TestLedgerLinearizable(t *testing.T) {
	ledgertest.Linearizable(t, []ledger.Store{mustOpen(t, ledger.Options{})})
}

// TestLedgerLinearizabilityModelRejects: the model refuses histories that
// are not linearizable, so a pass of TestLedgerLinearizable means something.
func TestLedgerLinearizabilityModelRejects(t *testing.T) { ledgertest.LinearizabilityModelRejects(t) }
