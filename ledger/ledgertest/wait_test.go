package ledgertest_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"idemgate/ledger"
)

// TestWatchWokenInProcess: over a backend that carries no notices (the
// toy one, as bbolt), a watcher of a record is woken by the commit that
// changes it in the same process — not by a rolled-back one, nor by a
// change of another record — and WaitPoll stays short, since another
// process's change could be seen only by reading.
func TestWatchWokenInProcess(t *testing.T) {
	s := ledger.New(newMemBackend(), ledger.Options{})
	defer s.Close()
	ctx := context.Background()
	if p := s.WaitPoll(); p > 50*time.Millisecond {
		t.Errorf("WaitPoll without notices is %s, want a short poll", p)
	}
	actor := ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}
	claim := func(key string) uint64 {
		t.Helper()
		d, err := s.Claim(ctx, ledger.Claim{Actor: actor, Key: key, Tool: "create_order", Fingerprint: "fp-" + key, OnLeaseExpiry: ledger.StateRetryable})
		if err != nil || d.Kind != ledger.DecisionClaimed {
			t.Fatalf("claim %s: %v %v", key, d.Kind, err)
		}
		return d.Record.Generation
	}
	fired := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	gen := claim("k1")
	changed, stop := s.Watch("acme", "k1")
	defer stop()

	claim("k2") // another record
	if fired(changed) {
		t.Fatal("a change of another record woke the watcher")
	}
	// A transaction that fails leaves nothing, and wakes nobody.
	boom := errors.New("boom")
	if _, err := s.Execute(ctx, ledger.Claim{Actor: actor, Key: "k3", Tool: "create_order", Fingerprint: "fp-k3", OnLeaseExpiry: ledger.StateRetryable},
		func(ledger.Tx, *ledger.Record) (ledger.Outcome, error) { return ledger.Outcome{}, boom }); !errors.Is(err, boom) {
		t.Fatalf("failing execute: %v", err)
	}
	if fired(changed) {
		t.Fatal("a rolled-back transaction woke the watcher")
	}
	if _, err := s.Complete(ctx, actor, "k1", gen, ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{}`), Summary: "done"}); err != nil {
		t.Fatal(err)
	}
	if !fired(changed) {
		t.Fatal("the commit that completed the record did not wake its watcher (by the time Complete returned)")
	}
}
