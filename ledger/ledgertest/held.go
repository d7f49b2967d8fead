package ledgertest

import (
	"errors"
	"testing"
	"time"

	"idemgate/ledger"
)

// contractOnHeld: the OnHeld hook runs once, in the transaction that
// creates a pending approval — a held claim, a suspected duplicate, a
// re-run held by Settle — and sees the new approval; its writes commit
// with it, its error rolls the whole claim back (no record), and a call
// answered from the held record does not run it again.
func contractOnHeld(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	calls := 0
	hook := func(tx ledger.Tx, rec *ledger.Record) error {
		calls++
		if rec.Approval == nil || rec.Approval.ID == "" || rec.State != ledger.StateAwaitingApproval {
			t.Errorf("OnHeld saw %s with approval %+v, want a pending approval", rec.State, rec.Approval)
			return nil
		}
		return tx.Put("notices", rec.Approval.ID, []byte(rec.Key))
	}

	// A held claim.
	c := newClaim("t1", "create_order", "fp-held")
	c.RequireApproval, c.OnHeld = true, hook
	d := e.exec(c, e.ap.succeed(ResultOrder))
	wantKind(t, d, ledger.DecisionApprovalRequested)
	if got := e.readData("notices", d.Record.Approval.ID); got != c.Key || calls != 1 {
		t.Errorf("after a held claim: notice %q, hook calls %d; want %q, 1", got, calls, c.Key)
	}
	wantKind(t, e.exec(c, e.ap.succeed(ResultOrder)), ledger.DecisionHeld)
	if calls != 1 {
		t.Errorf("a duplicate of a held claim ran OnHeld again (%d calls)", calls)
	}

	// Its error rolls the claim back.
	boom := errors.New("boom")
	failing := newClaim("t1", "create_order", "fp-failing")
	failing.RequireApproval = true
	failing.OnHeld = func(tx ledger.Tx, rec *ledger.Record) error {
		if err := tx.Put("notices", "failing", []byte("x")); err != nil {
			return err
		}
		return boom
	}
	if _, err := e.s.Execute(e.ctx, failing, e.ap.succeed(ResultOrder)); !errors.Is(err, boom) {
		t.Fatalf("Execute with a failing OnHeld: err = %v, want boom", err)
	}
	if _, err := e.s.Get(e.ctx, "t1", failing.Key); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("a failing OnHeld left a record (Get: %v)", err)
	}
	if got := e.readData("notices", "failing"); got != "" {
		t.Errorf("a failing OnHeld's write survived: %q", got)
	}

	// A suspected duplicate.
	first := newClaim("t1", "create_order", "fp-dup")
	wantKind(t, e.exec(first, e.ap.succeed(ResultOrder)), ledger.DecisionExecuted)
	dup := newClaim("t1", "create_order", "fp-dup")
	dup.SuspectDuplicates, dup.OnHeld = true, hook
	d = e.exec(dup, e.ap.succeed(ResultOrder))
	wantKind(t, d, ledger.DecisionSuspectedDuplicate)
	if got := e.readData("notices", d.Record.Approval.ID); got != dup.Key || calls != 2 {
		t.Errorf("after a suspected duplicate: notice %q, hook calls %d; want %q, 2", got, calls, dup.Key)
	}

	// A re-run held by Settle; other settlements do not run it.
	unknown := newClaim("t1", "create_order", "fp-unknown")
	unknown.OnLeaseExpiry = ledger.StateUnknown
	wantKind(t, e.claim(unknown), ledger.DecisionClaimed)
	e.clock.Advance(e.opts.Lease + time.Second)
	rec, err := e.s.Settle(e.ctx, ledger.SettleRequest{Actor: approver("t1"), Key: unknown.Key, From: []ledger.State{ledger.StateUnknown},
		Outcome: ledger.Outcome{State: ledger.StateAwaitingApproval}, Why: "re-run needs approval", OnHeld: hook})
	if err != nil {
		t.Fatalf("Settle(awaiting_approval): %v", err)
	}
	if got := e.readData("notices", rec.Approval.ID); got != unknown.Key || calls != 3 {
		t.Errorf("after a held re-run: notice %q, hook calls %d; want %q, 3", got, calls, unknown.Key)
	}
	if _, err := e.s.Settle(e.ctx, ledger.SettleRequest{Actor: approver("t1"), Key: unknown.Key, From: []ledger.State{ledger.StateAwaitingApproval},
		Outcome: ledger.Outcome{State: ledger.StateFailed}, Why: "resolved", OnHeld: hook}); err != nil {
		t.Fatalf("Settle(failed): %v", err)
	}
	if calls != 3 {
		t.Errorf("a settlement that holds nothing ran OnHeld (%d calls)", calls)
	}
}
