package ledgertest_test

import (
	"testing"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
)

// TestMemoryAuditPrune runs the audit retention checks on the toy backend.
func TestMemoryAuditPrune(t *testing.T) {
	ledgertest.RunAuditPrune(t, func(t *testing.T) ledger.Backend { return newMemBackend() })
}

// TestJournalingAuditPrune runs them on the toy backend declared
// Concurrent (journaled audit entries, chained by the sealer).
func TestJournalingAuditPrune(t *testing.T) {
	ledgertest.RunAuditPrune(t, func(t *testing.T) ledger.Backend { return journalingMem{newMemBackend()} })
}
