package ledger

import (
	"context"
	"slices"

	"github.com/google/uuid"
)

// Settlement of operations no caller owns.

// Settle implements Store.
func (s *Ledger) Settle(ctx context.Context, r SettleRequest) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rec *Record
	taken := false
	err := s.update(func(tx *ltx) error {
		taken = false // a run again starts over
		var err error
		rec, err = getRecord(tx, r.Actor.Tenant, r.Key)
		if err != nil {
			return err
		}
		if rec == nil {
			return ErrNotFound
		}
		now, high, _, err := s.ledgerTime(tx)
		if err != nil {
			return err
		}
		if prev, why := s.opts.expireTransition(rec, now, high); why == AuditLeaseExpired {
			if err := s.saveTransition(tx, r.Actor, rec, prev, why, now); err != nil {
				return err
			}
		}
		if !slices.Contains(r.From, rec.State) {
			return ErrWrongState
		}
		before := rec.State
		if r.Outcome.State == StateAwaitingApproval {
			a := Approval{Reason: r.Why, Rule: "rerun_after_unknown"}
			if r.Proposal != nil {
				a = *r.Proposal
			}
			a.ID = "apr_" + uuid.NewString()
			a.Status = ApprovalPending
			a.RequestedBy = r.Actor.Principal
			a.CreatedAt, a.ExpiresAt = now, now.Add(s.opts.ApprovalTTL)
			rec.Approval = &a
			rec.State = StateAwaitingApproval
			rec.UpdatedAt = now
			due := dueKey(a.ExpiresAt, dueApproval, rec.Tenant, rec.Key)
			if err := tx.Bucket(bucketExpiry).Put(due, []byte{dueApproval}); err != nil {
				return err
			}
		} else {
			if a := rec.Approval; before == StateAwaitingApproval && a != nil && a.Status == ApprovalPending {
				// What the approval was for is settled without it.
				sa := *a
				sa.Status = ApprovalSuperseded
				rec.Approval = &sa
			}
			s.finish(rec, r.Outcome, now)
			if r.Outcome.Also != nil && rec.State == StateSucceeded {
				if err := r.Outcome.Also(&dataTx{tx: tx, now: now}); err != nil {
					return err
				}
			}
		}
		settled := func(e *AuditEntry) {
			if before == StateUnknown && rec.State != StateUnknown {
				e.Settled = r.How
				if e.Settled == "" {
					e.Settled = SettledOther
				}
			}
		}
		if err := s.saveTransition(tx, r.Actor, rec, before, AuditDecision(r.Why), now, withCall(r.Outcome.Call), settled, r.Outcome.Answer.onto(rec, &taken)); err != nil {
			return err
		}
		if r.OnHeld != nil && rec.State == StateAwaitingApproval {
			return r.OnHeld(&dataTx{tx: tx, now: now}, rec)
		}
		return nil
	})
	r.Outcome.Answer.settle(taken, err)
	if err != nil {
		return nil, err
	}
	return rec, nil
}
