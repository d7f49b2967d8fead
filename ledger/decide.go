package ledger

import (
	"log/slog"
	"time"
)

// Options configure a store. Zero values take the defaults.
type Options struct {
	// Retention is how long a finished record keeps its full result.
	Retention time.Duration // default 24h
	// TombstoneRetention is how long a tombstone is kept after Retention.
	TombstoneRetention time.Duration // default 30 days
	// Lease is how long a claim owns an in_progress record before another
	// caller may take it over.
	Lease time.Duration // default 30s
	// SuspectWindow is how far back a new key's fingerprint is compared with
	// the tenant's earlier operations.
	SuspectWindow time.Duration // default 10 min
	// ApprovalTTL is how long a pending approval waits before the operation
	// is rejected with approval_expired.
	ApprovalTTL time.Duration // default 24h
	// RequireIssuedKeys refuses keys that IssueKey did not hand out.
	RequireIssuedKeys bool
	// Now is the clock; tests swap it. Default time.Now.
	Now func() time.Time
	// Elapsed is a monotonic count of the time since this store was
	// opened, unaffected by changes of the wall clock; tests swap it.
	// Default: Go's monotonic clock (time.Since of the opening instant).
	Elapsed func() time.Duration
	// MaxClockJump is how far the wall clock may move ahead of the
	// ledger's trusted time in one step and still be believed at once: a
	// larger step — a clock jump, or a gap while no process had the file
	// open, which the ledger cannot tell apart — lets the trusted time
	// advance only with the time this process has measured passing
	// (Elapsed). See ledgerTime.
	MaxClockJump time.Duration // default 10 min
	// MaxClockLag bounds how far the trusted time may fall behind the wall
	// clock: after long idle periods the ledger catches up, and a forward
	// jump larger than this is believed beyond it.
	MaxClockLag time.Duration // default 30 days
	// Log receives the warnings of clock jumps. Default: slog.Default().
	Log *slog.Logger
	// Observe, when set, sees every audit entry: a transition's once its
	// transaction has committed, a call's (replay, refusal) when it is
	// recorded. It runs on the goroutine of the call that wrote the entry
	// and must not block; metrics use it.
	Observe func(AuditEntry)
}

func (o Options) withDefaults() Options {
	if o.Retention <= 0 {
		o.Retention = 24 * time.Hour
	}
	if o.TombstoneRetention <= 0 {
		o.TombstoneRetention = 30 * 24 * time.Hour
	}
	if o.Lease <= 0 {
		o.Lease = 30 * time.Second
	}
	if o.SuspectWindow <= 0 {
		o.SuspectWindow = 10 * time.Minute
	}
	if o.ApprovalTTL <= 0 {
		o.ApprovalTTL = 24 * time.Hour
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Elapsed == nil {
		opened := time.Now() // carries Go's monotonic clock reading
		o.Elapsed = func() time.Duration { return time.Since(opened) }
	}
	if o.MaxClockJump <= 0 {
		o.MaxClockJump = 10 * time.Minute
	}
	if o.MaxClockLag <= 0 {
		o.MaxClockLag = 30 * 24 * time.Hour
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	return o
}

// step is what decide says to do with an existing record.
type step int

const (
	stepAnswer step = iota // answer with the record as it is (kind in decision)
	stepRun                // (re)claim and run: retryable, or a lease expired into retryable
	stepWrite              // a transition is due first (lease or approval expired): needs a write tx
)

// decide maps an existing record and a claim to what happens, without
// writing. It is shared by every backend so they answer alike. now is the
// wall clock; high is the ledger's high-water time (the latest wall time
// it has recorded), by which approvals expire too, so that a clock set
// back does not keep an approval valid past its time.
func (o Options) decide(rec *Record, c Claim, now, high time.Time) (step, DecisionKind) {
	if rec.Tool != c.Tool || rec.Fingerprint != c.Fingerprint {
		return stepAnswer, DecisionMismatch
	}
	if o.expired(rec, now) {
		return stepAnswer, DecisionExpired
	}
	switch rec.State {
	case StateSucceeded, StateFailed, StateRejected:
		return stepAnswer, DecisionReplay
	case StateRetryable:
		return stepRun, ""
	case StateInProgress:
		if now.Before(rec.LeaseExpires) {
			return stepAnswer, DecisionBusy
		}
		return stepWrite, ""
	case StateAwaitingApproval:
		if rec.Approval != nil && !later(now, high).Before(rec.Approval.ExpiresAt) {
			return stepWrite, ""
		}
		return stepAnswer, DecisionHeld
	default: // unknown
		return stepAnswer, DecisionHeld
	}
}

// expired reports whether rec is past its retention: a tombstone.
func (o Options) expired(rec *Record, now time.Time) bool {
	if rec.Tombstone {
		return true
	}
	return rec.State.Final() && !rec.CompletedAt.IsZero() && !now.Before(rec.CompletedAt.Add(o.Retention))
}

// tombstone reduces rec to what is kept after retention.
func tombstone(rec *Record) *Record {
	t := *rec
	t.Result = nil
	t.Args = nil
	t.Error = nil
	t.Approval = nil
	if a := rec.Approval; a != nil { // the id stays so the sweep can drop its index entries
		t.Approval = &Approval{ID: a.ID, Status: a.Status}
	}
	t.Tombstone = true
	if rec.Error != nil {
		t.Error = &OpError{Code: rec.Error.Code}
	}
	return &t
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// expireTransition applies a due lease or approval expiry to rec in place
// and returns the state it left, or "" when nothing was due. Leases expire
// by the wall clock now; approvals by the later of now and high, the
// ledger's high-water time.
func (o Options) expireTransition(rec *Record, now, high time.Time) (State, AuditDecision) {
	before := rec.State
	switch {
	case rec.State == StateInProgress && !now.Before(rec.LeaseExpires):
		rec.State = rec.OnLeaseExpiry
		if rec.State == "" {
			rec.State = StateUnknown
		}
		rec.LeaseOwner, rec.LeaseExpires = "", time.Time{}
		rec.UpdatedAt = now
		return before, AuditLeaseExpired
	case rec.State == StateAwaitingApproval && rec.Approval != nil && !later(now, high).Before(rec.Approval.ExpiresAt):
		rec.State = StateRejected
		a := *rec.Approval
		a.Status = ApprovalExpired
		rec.Approval = &a
		rec.Error = &OpError{Code: string(CodeApprovalRequired), Message: "the approval request expired before anyone decided it (approval_expired); nothing was executed"}
		rec.Summary = "approval_expired"
		at := rec.Approval.ExpiresAt // when it happened, however late it is noticed
		rec.UpdatedAt, rec.CompletedAt = at, at
		return before, AuditApprovalExpired
	}
	return "", ""
}
