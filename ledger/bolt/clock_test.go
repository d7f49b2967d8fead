package bolt

import (
	"context"
	"errors"
	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
	"path/filepath"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"
)

func clockOpts(clock *fakeClock) ledger.Options {
	o := ledgertest.Opts() // Retention 1h, TombstoneRetention 24h, ApprovalTTL 2h
	o.Now, o.Elapsed = clock.Now, clock.Elapsed
	return o
}

// TestClockJumpForwardDoesNotFreeKeys: the wall clock set a day past a
// tombstone's deletion time does not delete it — not in the process that
// saw the jump, not after a restart — while the key's claims answer
// key_expired and nothing runs; once that much time has really passed, the
// sweep deletes it.
func TestClockJumpForwardDoesNotFreeKeys(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	clock := newFakeClock()
	o := clockOpts(clock)
	s := mustOpenPath(t, path, o)
	ap := &applier{}
	c := newClaim("t1", "create_order", "fp-1")
	if d, err := s.Execute(ctx, c, ap.succeed(`{}`)); err != nil || d.Kind != ledger.DecisionExecuted {
		t.Fatalf("first run: %v %v", d.Kind, err)
	}
	clock.Advance(time.Minute)
	if _, _, err := s.Sweep(ctx); err != nil {
		t.Fatal(err)
	}

	clock.Jump(48 * time.Hour) // past Retention+TombstoneRetention (25 h) by the wall clock only
	_, deleted, err := s.Sweep(ctx)
	if err != nil || deleted != 0 {
		t.Fatalf("Sweep after a jump of 48h: deleted %d, %v; want 0", deleted, err)
	}
	if rec, err := s.Get(ctx, "t1", c.Key); err != nil || !rec.Tombstone {
		t.Fatalf("after the jump: %v %v, want the tombstone kept", rec, err)
	}
	if d, err := s.Execute(ctx, c, ap.succeed(`{}`)); err != nil || d.Kind != ledger.DecisionExpired {
		t.Fatalf("a late retry after the jump: %v %v, want key_expired", d.Kind, err)
	}
	if ap.n() != 1 {
		t.Fatalf("the operation ran %d times, want 1", ap.n())
	}

	// A restart does not launder the jump.
	s.Close()
	s = mustOpenPath(t, path, o)
	clock.Advance(time.Minute)
	for range 2 {
		if _, deleted, err := s.Sweep(ctx); err != nil || deleted != 0 {
			t.Fatalf("Sweep after a restart under the jumped clock: deleted %d, %v; want 0", deleted, err)
		}
	}

	// Time that really passes counts.
	clock.Advance(25 * time.Hour)
	if _, deleted, err := s.Sweep(ctx); err != nil || deleted != 1 {
		t.Fatalf("Sweep once 25h really passed: deleted %d, %v; want 1", deleted, err)
	}
	if _, err := s.Get(ctx, "t1", c.Key); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("Get after deletion: %v, want ErrNotFound", err)
	}
}

// TestClockFollowsSmallGaps: without a jump, the sweep deletes a tombstone
// as soon as its time is up by the wall clock, across a restart after a
// gap shorter than MaxClockJump.
func TestClockFollowsSmallGaps(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	clock := newFakeClock()
	o := clockOpts(clock)
	o.Retention, o.TombstoneRetention = time.Minute, time.Minute
	s := mustOpenPath(t, path, o)
	c := newClaim("t1", "create_order", "fp-1")
	if _, err := s.Execute(ctx, c, (&applier{}).succeed(`{}`)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	clock.Jump(2 * time.Minute) // the process was gone: the wall clock moved, Elapsed did not
	s = mustOpenPath(t, path, o)
	if _, deleted, err := s.Sweep(ctx); err != nil || deleted != 1 {
		t.Fatalf("Sweep after a small gap: deleted %d, %v; want 1", deleted, err)
	}
}

// TestClockBackwardDoesNotExtendApprovals: an approval whose time passed
// by the latest time the ledger recorded stays expired when the wall clock
// is set back before it: it cannot be approved, and reads show it expired.
func TestClockBackwardDoesNotExtendApprovals(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	s := mustOpen(t, clockOpts(clock))
	held := newClaim("t1", "cancel_order", "fp-held")
	held.RequireApproval = true
	held.Proposal = &ledger.Approval{Reason: "policy", Rule: "always"}
	d, err := s.Execute(ctx, held, (&applier{}).succeed(`{}`))
	if err != nil || d.Kind != ledger.DecisionApprovalRequested {
		t.Fatalf("held claim: %v %v", d.Kind, err)
	}
	approvalID := d.Record.Approval.ID

	clock.Advance(3 * time.Hour) // past the 2h TTL; a write records the time
	if _, err := s.Execute(ctx, newClaim("t1", "create_order", "fp-other"), (&applier{}).succeed(`{}`)); err != nil {
		t.Fatal(err)
	}
	clock.Jump(-3 * time.Hour) // the wall clock is set back to when the approval was asked

	if rec, err := s.Get(ctx, "t1", held.Key); err != nil || rec.State != ledger.StateRejected {
		t.Errorf("Get after the clock went back: %v %v, want rejected (approval expired)", rec, err)
	}
	ap := &applier{}
	_, err = s.Decide(ctx, ledger.DecideRequest{Approver: ledger.Actor{Tenant: "t1", Principal: "boss", Role: "approver"}, ApprovalID: approvalID, Approve: true}, ap.succeed(`{}`))
	if !errors.Is(err, ledger.ErrApprovalExpired) || ap.n() != 0 {
		t.Fatalf("approving after the clock went back: %v (ran %d), want ErrApprovalExpired and nothing run", err, ap.n())
	}
}

// TestStatsKeyReuseIsNotADuplicate: an operation under a key whose
// tombstone the sweep deleted is a second operation with its own
// incarnation, not a duplicate side effect.
func TestStatsKeyReuseIsNotADuplicate(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	o := clockOpts(clock)
	s := mustOpen(t, o)
	c := newClaim("t1", "create_order", "fp-1")
	d1, err := s.Execute(ctx, c, (&applier{}).succeed(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(o.Retention + o.TombstoneRetention)
	if _, deleted, err := s.Sweep(ctx); err != nil || deleted != 1 {
		t.Fatalf("Sweep: deleted %d, %v", deleted, err)
	}
	c.Fingerprint = "fp-2"
	d2, err := s.Execute(ctx, c, (&applier{}).succeed(`{}`))
	if err != nil || d2.Kind != ledger.DecisionExecuted {
		t.Fatalf("reuse: %v %v", d2.Kind, err)
	}
	if d1.Record.Incarnation == "" || d1.Record.Incarnation == d2.Record.Incarnation {
		t.Errorf("incarnations %q and %q, want two different ones", d1.Record.Incarnation, d2.Record.Incarnation)
	}
	st, err := ledger.ComputeStats(ctx, s, "")
	if err != nil {
		t.Fatal(err)
	}
	if st.Operations != 2 || st.Executions != 2 || st.DuplicateSideEffects != 0 {
		t.Errorf("stats %+v, want 2 operations, 2 executions, 0 duplicates", st)
	}
}

// TestIncarnationStableAcrossReruns: a retryable re-run and an approved
// run keep the incarnation the record was created with, so they name the
// same downstream order; a record without one (written before incarnations
// existed) keeps none.
func TestIncarnationStableAcrossReruns(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	o := clockOpts(clock)
	s := mustOpen(t, o)
	c := newClaim("t1", "create_order", "fp-1")
	d, err := s.Claim(ctx, c)
	if err != nil || d.Kind != ledger.DecisionClaimed || d.Record.Incarnation == "" {
		t.Fatalf("claim: %v %v %q", d.Kind, err, d.Record.Incarnation)
	}
	first := d.Record.Incarnation
	clock.Advance(o.Lease) // the lease expires into retryable
	d, err = s.Claim(ctx, c)
	if err != nil || d.Kind != ledger.DecisionClaimed || d.Record.Attempts != 2 || d.Record.Incarnation != first {
		t.Fatalf("re-run: %v %v attempts %d incarnation %q, want the first's %q", d.Kind, err, d.Record.Attempts, d.Record.Incarnation, first)
	}

	held := newClaim("t1", "cancel_order", "fp-held")
	held.RequireApproval = true
	held.Proposal = &ledger.Approval{Reason: "policy", Rule: "always"}
	hd, err := s.Execute(ctx, held, (&applier{}).succeed(`{}`))
	if err != nil || hd.Record.Incarnation == "" {
		t.Fatalf("held: %v %q", err, hd.Record.Incarnation)
	}
	var ranWith string
	_, err = s.Decide(ctx, ledger.DecideRequest{Approver: ledger.Actor{Tenant: "t1", Principal: "boss", Role: "approver"}, ApprovalID: hd.Record.Approval.ID, Approve: true},
		func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
			ranWith = rec.Incarnation
			return ledger.Outcome{State: ledger.StateSucceeded}, nil
		})
	if err != nil || ranWith != hd.Record.Incarnation {
		t.Fatalf("approved run: %v, incarnation %q, want %q", err, ranWith, hd.Record.Incarnation)
	}
}

// TestLegacyRecordKeepsNoIncarnation: a record written before
// incarnations existed (no "incarnation" in its JSON) is re-run without
// one, so its downstream identities stay the key-only ones it had.
func TestLegacyRecordKeepsNoIncarnation(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	o := clockOpts(clock)
	s := mustOpen(t, o)
	c := newClaim("t1", "create_order", "fp-1")
	if _, err := s.Claim(ctx, c); err != nil {
		t.Fatal(err)
	}
	if err := s.update(func(tx *bbolt.Tx) error { // as an older build wrote it
		rec, err := getRecord(tx, "t1", c.Key)
		if err != nil {
			return err
		}
		rec.Incarnation = ""
		return putRecord(tx, rec)
	}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(o.Lease)
	d, err := s.Claim(ctx, c)
	if err != nil || d.Kind != ledger.DecisionClaimed || d.Record.Incarnation != "" {
		t.Fatalf("re-run of a legacy record: %v %v incarnation %q, want none", d.Kind, err, d.Record.Incarnation)
	}
}
