package ledger

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
)

// Approvals: decisions and the pending list.

// Decide implements Store.
func (s *Ledger) Decide(ctx context.Context, r DecideRequest, apply ApplyFunc) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	var d Decision
	err := s.update(func(tx *ltx) error {
		var err error
		d, err = s.decideLocked(tx, r, apply)
		return err
	})
	// Refusals are answers, not failures of the batch: they wrote nothing
	// but the expiry, which decideLocked commits by returning nil.
	if err == nil && d.refusal != nil {
		return d, d.refusal
	}
	return d, err
}

func (s *Ledger) decideLocked(tx *ltx, r DecideRequest, apply ApplyFunc) (Decision, error) {
	now, high, _, err := s.ledgerTime(tx)
	if err != nil {
		return Decision{}, err
	}
	tenant := r.Approver.Tenant
	key := tx.Bucket(bucketApprovals).Get(recordKey(tenant, r.ApprovalID))
	if key == nil {
		return Decision{refusal: ErrNotFound}, nil
	}
	rec, err := getRecord(tx, tenant, string(key))
	if err != nil {
		return Decision{}, err
	}
	if rec == nil || rec.Approval == nil || rec.Approval.ID != r.ApprovalID {
		return Decision{refusal: ErrNotFound}, nil
	}
	if prev, why := s.opts.expireTransition(rec, now, high); why == AuditApprovalExpired {
		if err := s.saveTransition(tx, r.Approver, rec, prev, why, now); err != nil {
			return Decision{}, err
		}
		return Decision{Kind: DecisionReplay, Record: rec, refusal: ErrApprovalExpired}, nil
	}
	if rec.State != StateAwaitingApproval || rec.Approval.Status != ApprovalPending {
		return Decision{Kind: DecisionReplay, Record: s.present(rec), refusal: ErrAlreadyDecided}, nil
	}
	if SamePrincipal(r.Approver.Principal, rec.Principal) {
		return Decision{Kind: DecisionHeld, Record: rec, refusal: ErrSelfApproval}, nil
	}
	a := *rec.Approval
	a.DecidedBy, a.DecidedAt, a.Comment = r.Approver.Principal, now, r.Comment
	rec.Approval = &a
	rec.UpdatedAt = now
	if !r.Approve {
		a.Status = ApprovalRejected
		rec.State = StateRejected
		msg := "An approver (" + r.Approver.Principal + ") rejected this operation; nothing was executed."
		if r.Comment != "" {
			msg += " Comment: " + r.Comment
		}
		rec.Error = &OpError{Code: string(CodeForbidden), Message: msg}
		rec.Summary = "rejected by " + r.Approver.Principal
		rec.CompletedAt = now
		if err := s.saveTransition(tx, r.Approver, rec, StateAwaitingApproval, AuditRejectedBy+AuditDecision(r.Approver.Principal), now); err != nil {
			return Decision{}, err
		}
		return Decision{Kind: DecisionExecuted, Record: rec}, nil
	}
	if rec.Downstream != "" && rec.Downstream != r.Downstream {
		return Decision{}, &DownstreamMismatchError{Recorded: rec.Downstream, Configured: r.Downstream}
	}
	a.Status = ApprovalApproved
	rec.State = StateInProgress
	rec.Attempts++
	rec.Generation++
	rec.LeaseOwner, rec.LeaseExpires = s.owner, now.Add(s.opts.Lease)
	if apply == nil {
		if err := s.saveTransition(tx, r.Approver, rec, StateAwaitingApproval, AuditApprovedBy+AuditDecision(r.Approver.Principal), now); err != nil {
			return Decision{}, err
		}
		return Decision{Kind: DecisionClaimed, Record: rec}, nil
	}
	out, err := apply(&dataTx{tx: tx, now: now}, rec)
	if err != nil {
		return Decision{}, err
	}
	if err := s.appendObserved(tx, transitionEntry(now, r.Approver, rec, StateAwaitingApproval, AuditApprovedBy+AuditDecision(r.Approver.Principal))); err != nil {
		return Decision{}, err
	}
	s.finish(rec, out, now)
	if err := s.saveTransition(tx, r.Approver, rec, StateInProgress, AuditExecutedAfterApproval, now, withCall(out.Call)); err != nil {
		return Decision{}, err
	}
	fp, _ := json.Marshal(fpEntry{Key: rec.Key, At: now})
	if err := tx.Bucket(bucketFPIndex).Put(fpKey(rec.Tenant, rec.Fingerprint), fp); err != nil {
		return Decision{}, err
	}
	return Decision{Kind: DecisionExecuted, Record: rec}, nil
}

// PendingApprovals implements Store. It reads every pending approval of
// the tenant (they are few: each expires after the approval TTL) to order
// them by request time.
func (s *Ledger) PendingApprovals(ctx context.Context, tenant, after string, limit int) ([]*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	type pending struct {
		pos string
		rec *Record
	}
	var all []pending
	err := s.view(func(tx *ltx) error {
		c := tx.Bucket(bucketPending).Cursor()
		prefix := recordKey(tenant, "")
		for k, key := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, key = c.Next() {
			rec, err := getRecord(tx, tenant, string(key))
			if err != nil {
				return err
			}
			if rec == nil || rec.Approval == nil {
				continue
			}
			pos := ApprovalPosition(rec)
			if after != "" && pos <= after {
				continue
			}
			if rec = s.present(rec); rec.State == StateAwaitingApproval {
				all = append(all, pending{pos, rec})
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(all, func(a, b pending) int {
		if a.pos < b.pos {
			return -1
		}
		if a.pos > b.pos {
			return 1
		}
		return 0
	})
	out := make([]*Record, 0, min(limit, len(all)))
	for _, p := range all[:min(limit, len(all))] {
		out = append(out, p.rec)
	}
	return out, nil
}

// ApprovalRecord implements Store.
func (s *Ledger) ApprovalRecord(ctx context.Context, tenant, approvalID string) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rec *Record
	err := s.view(func(tx *ltx) error {
		key := tx.Bucket(bucketApprovals).Get(recordKey(tenant, approvalID))
		if key == nil {
			return nil
		}
		var err error
		rec, err = getRecord(tx, tenant, string(key))
		return err
	})
	if err != nil {
		return nil, err
	}
	if rec == nil || rec.Approval == nil || rec.Approval.ID != approvalID {
		return nil, ErrNotFound // an approval superseded by a newer one is gone
	}
	return s.present(rec), nil
}
