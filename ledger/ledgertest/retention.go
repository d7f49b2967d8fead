package ledgertest

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"idemgate/ledger"
)

// contractRetentionMoment: a record becomes a tombstone in the first
// sweep at or after CompletedAt+Retention, and not before, however its
// life went: completed long after it was first seen, completed before
// the sweep reached it, awaiting approval past its retention, and under a
// clock set back (before it was first seen, or between that and its
// completion). The sweep finds records by their first-seen time, so these
// are the cases where that time does not tell the due time.
func contractRetentionMoment(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	longLease := func(o *ledger.Options) { o.Lease = 1000 * time.Hour } // a claim stays in progress
	complete := func(e *env, c ledger.Claim, gen uint64) *ledger.Record {
		e.t.Helper()
		rec, err := e.s.Complete(e.ctx, c.Actor, c.Key, gen, ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(ResultOrder)})
		if err != nil {
			e.t.Fatalf("Complete(%s): %v", c.Key, err)
		}
		return rec
	}
	// compactedAt checks that c's record becomes a tombstone exactly at
	// due: a sweep a nanosecond before compacts nothing, one at due
	// compacts it (and nothing else), and its tombstone is deleted
	// TombstoneRetention later.
	compactedAt := func(e *env, c ledger.Claim, due time.Time) {
		e.t.Helper()
		if d := due.Add(-time.Nanosecond).Sub(e.clock.Now()); d < 0 {
			e.t.Fatalf("the clock (%v) is already past the due time's eve (%v)", e.clock.Now(), due)
		} else {
			e.clock.Advance(d)
		}
		if n, d, err := e.s.Sweep(e.ctx); err != nil || n != 0 || d != 0 {
			e.t.Fatalf("Sweep a nanosecond before the record is due = %d, %d, %v; want 0, 0, nil", n, d, err)
		}
		if rec := mustGet(e.t, e.s, c.Actor.Tenant, c.Key); rec.Tombstone {
			e.t.Fatalf("record shown as a tombstone before it is due: %s", recordJSON(e.t, rec))
		}
		e.clock.Advance(time.Nanosecond)
		if n, d, err := e.s.Sweep(e.ctx); err != nil || n != 1 || d != 0 {
			e.t.Fatalf("Sweep when the record is due = %d, %d, %v; want 1, 0, nil", n, d, err)
		}
		e.clock.Advance(e.opts.TombstoneRetention)
		if _, d, err := e.s.Sweep(e.ctx); err != nil || d < 1 {
			e.t.Fatalf("Sweep at tombstone retention = %d deleted, %v; want at least 1, nil", d, err)
		}
		if _, err := e.s.Get(e.ctx, c.Actor.Tenant, c.Key); !errors.Is(err, ledger.ErrNotFound) {
			e.t.Fatalf("Get after tombstone retention: err = %v, want ErrNotFound", err)
		}
	}
	sweepNothing := func(e *env, when string) {
		e.t.Helper()
		if n, d, err := e.s.Sweep(e.ctx); err != nil || n != 0 || d != 0 {
			e.t.Fatalf("Sweep %s = %d, %d, %v; want 0, 0, nil", when, n, d, err)
		}
	}

	t.Run("completed_long_after_first_seen", func(t *testing.T) {
		e := newEnv(t, open, longLease)
		c := newClaim("t1", "create_order", "fp-1")
		d := e.claim(c)
		wantKind(t, d, ledger.DecisionClaimed)
		e.clock.Advance(e.opts.Retention + time.Hour)
		sweepNothing(e, "past retention of an operation in progress")
		rec := complete(e, c, d.Record.Generation)
		sweepNothing(e, "just after the completion")
		compactedAt(e, c, rec.CompletedAt.Add(e.opts.Retention))
	})

	t.Run("completed_before_the_sweep_reached_it", func(t *testing.T) {
		e := newEnv(t, open, longLease)
		c := newClaim("t1", "create_order", "fp-1")
		d := e.claim(c)
		e.clock.Advance(e.opts.Retention / 2)
		rec := complete(e, c, d.Record.Generation)
		e.clock.Advance(e.opts.Retention / 2)
		sweepNothing(e, "at retention by the first-seen time")
		compactedAt(e, c, rec.CompletedAt.Add(e.opts.Retention))
	})

	t.Run("approval_expired_past_retention", func(t *testing.T) {
		e := newEnv(t, open, func(o *ledger.Options) { o.ApprovalTTL = 3 * o.Retention })
		c, held := e.held("t1", "fp-1")
		e.clock.Advance(e.opts.Retention + time.Minute)
		sweepNothing(e, "past retention of a pending approval")
		e.clock.Advance(held.Approval.ExpiresAt.Sub(e.clock.Now()))
		sweepNothing(e, "at the approval's expiry")
		wantState(t, mustGet(t, e.s, "t1", c.Key), ledger.StateRejected)
		compactedAt(e, c, held.Approval.ExpiresAt.Add(e.opts.Retention))
	})

	t.Run("approved_past_retention", func(t *testing.T) {
		e := newEnv(t, open, func(o *ledger.Options) { o.ApprovalTTL = 3 * o.Retention })
		c, held := e.held("t1", "fp-1")
		e.clock.Advance(e.opts.Retention + time.Minute)
		sweepNothing(e, "past retention of a pending approval")
		d, err := e.s.Decide(e.ctx, ledger.DecideRequest{Approver: approver("t1"), ApprovalID: held.Approval.ID, Approve: true}, e.ap.succeed(ResultOrder))
		if err != nil {
			t.Fatalf("Decide: %v", err)
		}
		wantState(t, d.Record, ledger.StateSucceeded)
		sweepNothing(e, "just after the approved run")
		compactedAt(e, c, d.Record.CompletedAt.Add(e.opts.Retention))
	})

	t.Run("clock_set_back_behind_the_sweep", func(t *testing.T) {
		e := newEnv(t, open, longLease)
		a := newClaim("t1", "create_order", "fp-a")
		e.exec(a, e.ap.succeed(ResultOrder))
		e.clock.Advance(e.opts.Retention)
		if n, _, err := e.s.Sweep(e.ctx); err != nil || n != 1 {
			t.Fatalf("Sweep at a's retention = %d compacted, %v; want 1", n, err)
		}
		// Set back to before a was first seen: what is first seen now
		// is behind what the sweep has looked at already.
		back := e.opts.Retention + time.Hour
		e.clock.Jump(-back)
		b := newClaim("t1", "create_order", "fp-b")
		done := e.exec(b, e.ap.succeed(ResultOrder)).Record
		c := newClaim("t1", "create_order", "fp-c")
		d := e.claim(c)
		if !done.FirstSeenAt.Before(mustGet(t, e.s, "t1", a.Key).FirstSeenAt) {
			t.Fatalf("b first seen at %v, not before a (the clock was not set back)", done.FirstSeenAt)
		}
		// b is due (CompletedAt+Retention) by the ledger's high-water
		// time, by which compaction goes: the next sweep compacts it.
		if n, _, err := e.s.Sweep(e.ctx); err != nil || n != 1 {
			t.Fatalf("Sweep after b, due by the high-water time = %d compacted, %v; want 1", n, err)
		}
		if rec := mustGet(t, e.s, "t1", b.Key); !rec.Tombstone {
			t.Fatalf("b is not a tombstone: %s", recordJSON(t, rec))
		}
		e.clock.Jump(back) // the clock is right again
		e.clock.Advance(time.Minute)
		rec := complete(e, c, d.Record.Generation)
		sweepNothing(e, "just after c's completion")
		compactedAt(e, c, rec.CompletedAt.Add(e.opts.Retention))
	})

	t.Run("clock_set_back_before_completion", func(t *testing.T) {
		e := newEnv(t, open, longLease)
		c := newClaim("t1", "create_order", "fp-1")
		d := e.claim(c)
		e.clock.Jump(-e.opts.Retention / 2)
		rec := complete(e, c, d.Record.Generation)
		if !rec.CompletedAt.Before(rec.FirstSeenAt) {
			t.Fatalf("completed at %v, not before first seen at %v", rec.CompletedAt, rec.FirstSeenAt)
		}
		compactedAt(e, c, rec.CompletedAt.Add(e.opts.Retention))
	})
}
