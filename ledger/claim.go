package ledger

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
)

// The claim and its completion: the atomic decision whether anything runs,
// the transitions and their index upkeep, and the fenced Complete.

// Execute implements Store.
func (s *Ledger) Execute(ctx context.Context, c Claim, apply ApplyFunc) (Decision, error) {
	return s.claim(ctx, c, apply)
}

// Claim implements Store.
func (s *Ledger) Claim(ctx context.Context, c Claim) (Decision, error) {
	return s.claim(ctx, c, nil)
}

func (s *Ledger) claim(ctx context.Context, c Claim, apply ApplyFunc) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	// Fast path: an existing record that only needs an answer is read
	// without a write transaction (one statement on PostgreSQL, a View on
	// bbolt: no fsync); its audit entry is buffered.
	var d Decision
	var answered bool
	var rec *Record
	err := s.readCommitted(ctx, bucketRecords, recordKey(c.Actor.Tenant, c.Key), func(v []byte) error {
		var err error
		rec, err = s.finals.record(c.Actor.Tenant, c.Key, v)
		return err
	})
	if err != nil {
		return Decision{}, err
	}
	if rec != nil {
		if st, kind := s.opts.decide(rec, c, s.opts.Now(), s.highWater()); st == stepAnswer {
			d, answered = s.answer(rec, kind), true
		}
	}
	if answered {
		e := s.callEntry(c, d)
		c.answered(d, &d.Answered)(&e)
		s.Audit(e)
		return d, nil
	}
	err = s.update(func(tx *ltx) error {
		var err error
		d, err = s.claimLocked(tx, c, apply)
		return err
	})
	return d, err
}

// finalRecords keeps the final records the claim's read path decoded
// lately, each with the stored bytes it was decoded from, so that a
// replay whose stored record is byte for byte the one decoded before takes
// a copy instead of inflating and decoding it again (the decode was a
// third of a replay's CPU in the tool service). A record whose bytes
// changed — a tombstone, another process's write — is decoded afresh:
// what a claim reads is always what is stored. Safe for concurrent use;
// the zero value is ready.
type finalRecords struct {
	mu sync.Mutex
	m  map[string]finalRecord // by recordKey
}

type finalRecord struct {
	stored []byte
	rec    *Record
}

// At most finalRecordsKept records are kept, each at most
// finalRecordMaxBytes as stored: a few MiB at worst.
const (
	finalRecordsKept    = 1024
	finalRecordMaxBytes = 4096
)

// record decodes v, the stored record of (tenant, key) (nil: none), or
// takes a copy of the record kept when v is byte for byte its stored
// form; a final record decoded here is kept. The record returned is the
// caller's own.
func (f *finalRecords) record(tenant, key string, v []byte) (*Record, error) {
	if v == nil {
		return nil, nil
	}
	k := recordKey(tenant, key)
	f.mu.Lock()
	kept, ok := f.m[string(k)]
	f.mu.Unlock()
	if ok && bytes.Equal(kept.stored, v) {
		return kept.rec.clone(), nil
	}
	rec, err := decodeStored(tenant, key, v)
	if err != nil || !rec.State.Final() || len(v) > finalRecordMaxBytes {
		return rec, err
	}
	kept = finalRecord{stored: bytes.Clone(v), rec: rec.clone()}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[string]finalRecord)
	}
	if _, ok := f.m[string(k)]; !ok && len(f.m) >= finalRecordsKept {
		for old := range f.m { // any one: map order is random enough
			delete(f.m, old)
			break
		}
	}
	f.m[string(k)] = kept
	return rec, nil
}

// clone is a copy of r that shares nothing with it.
func (r *Record) clone() *Record {
	c := *r
	c.Args, c.Result = bytes.Clone(r.Args), bytes.Clone(r.Result)
	c.AuditSeqs = slices.Clone(r.AuditSeqs)
	if r.Error != nil {
		e := *r.Error
		e.Details = bytes.Clone(e.Details)
		c.Error = &e
	}
	if r.Approval != nil {
		a := *r.Approval
		a.Diff, a.Resource = bytes.Clone(a.Diff), bytes.Clone(a.Resource)
		c.Approval = &a
	}
	return &c
}

func (s *Ledger) answer(rec *Record, kind DecisionKind) Decision {
	if kind == DecisionExpired {
		rec = tombstone(rec)
	}
	return Decision{Kind: kind, Record: rec}
}

func (s *Ledger) callEntry(c Claim, d Decision) AuditEntry {
	e := AuditEntry{At: s.opts.Now(), Event: EventCall, Actor: c.Actor, Tool: c.Tool, Key: c.Key, Fingerprint: c.Fingerprint, Decision: AuditDecision(d.Kind)}
	c.policyOf(&e)
	if d.Record != nil {
		e.StateBefore, e.StateAfter, e.Attempt = d.Record.State, d.Record.State, d.Record.Attempts
		e.Downstream = d.Record.Downstream
		e.noteApproval(d.Record)
	}
	if d.Kind == DecisionReplay {
		// A replay changes nothing and matched the operation's request:
		// its fingerprint, its state before (= after) and its downstream
		// are the operation's own, which its transition entries hold.
		e.Fingerprint, e.StateBefore, e.Downstream = "", "", ""
	}
	if d.Kind == DecisionMismatch {
		e.ErrorCode = string(CodeKeyReused)
	}
	return e
}

// claimLocked is the atomic claim; the caller holds the write tx.
func (s *Ledger) claimLocked(tx *ltx, c Claim, apply ApplyFunc) (Decision, error) {
	// What a new key's claim reads, in one round trip on PostgreSQL.
	prefetch(tx.BTx, bucketRecords, recordKey(c.Actor.Tenant, c.Key))
	if s.opts.RequireIssuedKeys {
		prefetch(tx.BTx, bucketIssued, recordKey(c.Actor.Tenant, c.Key))
	}
	if c.SuspectDuplicates {
		prefetch(tx.BTx, bucketFPIndex, fpKey(c.Actor.Tenant, c.Fingerprint))
	}
	prefetch(tx.BTx, bucketMeta, keyRetentionWalk) // scheduleCompact's
	now, high, _, err := s.ledgerTime(tx)
	if err != nil {
		return Decision{}, err
	}
	rec, err := getRecord(tx, c.Actor.Tenant, c.Key)
	if err != nil {
		return Decision{}, err
	}
	defer func() {
		if rec != nil {
			rec.Fresh = false // see Record.Fresh: only while the creating claim runs
		}
	}()
	before := State("")
	if rec != nil {
		st, kind := s.opts.decide(rec, c, now, high)
		if st == stepWrite {
			prev, why := s.opts.expireTransition(rec, now, high)
			if err := s.saveTransition(tx, c.Actor, rec, prev, why, now); err != nil {
				return Decision{}, err
			}
			st, kind = s.opts.decide(rec, c, now, high)
		}
		if st == stepAnswer {
			d := s.answer(rec, kind)
			e := s.callEntry(c, d)
			c.answered(d, &d.Answered)(&e)
			return d, s.appendObserved(tx, e)
		}
		if rec.Downstream != "" && rec.Downstream != c.Downstream {
			return Decision{}, &DownstreamMismatchError{Recorded: rec.Downstream, Configured: c.Downstream}
		}
		before = rec.State // retryable: run again
		rec.Attempts++
		rec.Generation++
		rec.Error, rec.Result = nil, nil
	} else {
		if s.opts.RequireIssuedKeys && tx.Bucket(bucketIssued).Get(recordKey(c.Actor.Tenant, c.Key)) == nil {
			return Decision{}, ErrKeyNotIssued
		}
		if c.SuspectDuplicates {
			d, held, err := s.holdSuspect(tx, c, now)
			if err != nil || held {
				return d, err
			}
		}
		if c.RequireApproval {
			rec := s.heldRecord(c, now, "")
			d := Decision{Kind: DecisionApprovalRequested, Record: rec}
			if err := s.saveNew(tx, c.Actor, rec, AuditHeld+AuditDecision(rec.Approval.Rule), now, c.policyOf, c.answered(d, &d.Answered)); err != nil {
				return Decision{}, err
			}
			fp, _ := json.Marshal(fpEntry{Key: c.Key, At: now})
			if err := tx.Bucket(bucketFPIndex).Put(fpKey(c.Actor.Tenant, c.Fingerprint), fp); err != nil {
				return Decision{}, err
			}
			if err := c.held(tx, now, rec); err != nil {
				return Decision{}, err
			}
			return d, nil
		}
		rec = &Record{
			Tenant: c.Actor.Tenant, Key: c.Key, Tool: c.Tool, Fingerprint: c.Fingerprint,
			Principal: c.Actor.Principal, Attempts: 1, Generation: 1, FirstSeenAt: now,
			Incarnation: newIncarnation(now), Fresh: true,
			Args:       c.Args, // a later re-run (after unknown, by approval) needs the request
			Downstream: c.Downstream,
		}
		if err := tx.Bucket(bucketByTime).Put(timeKey(now, rec.Tenant, rec.Key), nil); err != nil {
			return Decision{}, err
		}
	}
	rec.State = StateInProgress
	rec.LeaseOwner, rec.LeaseExpires = s.owner, now.Add(s.opts.Lease)
	rec.OnLeaseExpiry = c.OnLeaseExpiry
	rec.UpdatedAt = now
	fp, _ := json.Marshal(fpEntry{Key: c.Key, At: now})
	if err := tx.Bucket(bucketFPIndex).Put(fpKey(c.Actor.Tenant, c.Fingerprint), fp); err != nil {
		return Decision{}, err
	}
	if apply == nil {
		if err := s.saveTransition(tx, c.Actor, rec, before, AuditClaimed, now, c.policyOf); err != nil {
			return Decision{}, err
		}
		return Decision{Kind: DecisionClaimed, Record: rec}, nil
	}
	out, err := apply(&dataTx{tx: tx, now: now}, rec)
	if err != nil {
		return Decision{}, err
	}
	// The claim and its outcome commit together, so nobody ever saw the
	// record in_progress: one transition entry, from the state before the
	// claim to the outcome, records both (issue 12: one audit entry per
	// transition).
	s.finish(rec, out, now)
	d := Decision{Kind: DecisionExecuted, Record: rec}
	if err := s.saveTransition(tx, c.Actor, rec, before, AuditExecuted, now, c.policyOf, withCall(out.Call), c.answered(d, &d.Answered)); err != nil {
		return Decision{}, err
	}
	return d, nil
}

// holdSuspect creates an awaiting_approval record when c's fingerprint
// matches a recent operation of the tenant under another key.
func (s *Ledger) holdSuspect(tx *ltx, c Claim, now time.Time) (Decision, bool, error) {
	v := tx.Bucket(bucketFPIndex).Get(fpKey(c.Actor.Tenant, c.Fingerprint))
	if v == nil {
		return Decision{}, false, nil
	}
	var fe fpEntry
	if err := json.Unmarshal(v, &fe); err != nil {
		return Decision{}, false, err
	}
	if fe.Key == c.Key || !now.Before(fe.At.Add(s.opts.SuspectWindow)) {
		return Decision{}, false, nil
	}
	earlier, err := getRecord(tx, c.Actor.Tenant, fe.Key)
	if err != nil || earlier == nil {
		return Decision{}, false, err
	}
	if s.opts.expired(earlier, now) {
		earlier = tombstone(earlier)
	}
	rec := s.heldRecord(c, now, fe.Key)
	d := Decision{Kind: DecisionSuspectedDuplicate, Record: rec, Earlier: earlier}
	if err := s.saveNew(tx, c.Actor, rec, AuditSuspectedDuplicate+AuditDecision(fe.Key), now, c.policyOf, c.answered(d, &d.Answered)); err != nil {
		return Decision{}, false, err
	}
	if err := c.held(tx, now, rec); err != nil {
		return Decision{}, false, err
	}
	return d, true, nil
}

// held runs c.OnHeld, if set, for the held record rec; the caller holds
// the write tx.
func (c Claim) held(tx *ltx, now time.Time, rec *Record) error {
	if c.OnHeld == nil {
		return nil
	}
	return c.OnHeld(&dataTx{tx: tx, now: now}, rec)
}

// heldRecord builds the awaiting_approval record of c. A non-empty
// earlierKey marks a suspected duplicate of that key.
func (s *Ledger) heldRecord(c Claim, now time.Time, earlierKey string) *Record {
	a := Approval{Reason: "policy"}
	if c.Proposal != nil {
		a = *c.Proposal
	} else if c.BuildProposal != nil {
		if p := c.BuildProposal(); p != nil {
			a = *p
		}
	}
	if earlierKey != "" {
		a.Reason, a.Rule, a.EarlierKey = "suspected_duplicate", "suspected_duplicate", earlierKey
	}
	a.ID = "apr_" + uuid.NewString()
	a.Status = ApprovalPending
	a.RequestedBy = c.Actor.Principal
	a.CreatedAt, a.ExpiresAt = now, now.Add(s.opts.ApprovalTTL)
	return &Record{
		Tenant: c.Actor.Tenant, Key: c.Key, Tool: c.Tool, Fingerprint: c.Fingerprint,
		Principal: c.Actor.Principal, State: StateAwaitingApproval, Args: c.Args, Downstream: c.Downstream,
		FirstSeenAt: now, UpdatedAt: now, Approval: &a, Incarnation: newIncarnation(now),
	}
}

// newIncarnation returns a fresh Record.Incarnation for a record created
// at now: "t", now's unix milliseconds (11 hex digits), then 52 random bits
// (13 hex digits). Two operations under one key (the second after the
// first's tombstone was deleted) never share one, and incarnations sort by
// creation time, so the ids derived from them (orders.ID) are appended to
// their collections instead of written anywhere.
func newIncarnation(now time.Time) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("ledger: no randomness for an incarnation: " + err.Error()) // crypto/rand does not fail on supported systems
	}
	ms := uint64(max(now.UnixMilli(), 0)) & (1<<44 - 1)
	return fmt.Sprintf("t%011x%013x", ms, binary.BigEndian.Uint64(b[:])>>12)
}

// IncarnationTime returns the time-ordered prefix of an incarnation made
// by this build (its 11 hex digits of unix milliseconds) and true, or ""
// and false for one made before incarnations were time-ordered (16 random
// hex digits), whose derived ids must stay as they were.
func IncarnationTime(incarnation string) (string, bool) {
	if len(incarnation) != 25 || incarnation[0] != 't' {
		return "", false
	}
	for _, c := range incarnation[1:] {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", false
		}
	}
	return incarnation[1:12], true
}

// saveNew writes a record that did not exist, with its time index and,
// for a held record, the sweep that expires its approval.
func (s *Ledger) saveNew(tx *ltx, a Actor, rec *Record, why AuditDecision, now time.Time, more ...func(*AuditEntry)) error {
	if err := tx.Bucket(bucketByTime).Put(timeKey(rec.FirstSeenAt, rec.Tenant, rec.Key), nil); err != nil {
		return err
	}
	if rec.Approval != nil && rec.Approval.Status == ApprovalPending {
		due := dueKey(rec.Approval.ExpiresAt, dueApproval, rec.Tenant, rec.Key)
		if err := tx.Bucket(bucketExpiry).Put(due, []byte{dueApproval}); err != nil {
			return err
		}
	}
	return s.saveTransition(tx, a, rec, "", why, now, more...)
}

// finish applies out to an in_progress rec.
func (s *Ledger) finish(rec *Record, out Outcome, now time.Time) {
	rec.State = out.State
	rec.Result, rec.Error = out.Result, out.Error
	if out.Result != nil {
		rec.ResultFormat = ResultFormat
		// Answer with the bytes a replay will read back (compact, HTML-escaped).
		if b, err := json.Marshal(out.Result); err == nil {
			rec.Result = b
		}
	}
	rec.Summary, rec.DownstreamRef = out.Summary, out.DownstreamRef
	rec.LeaseOwner, rec.LeaseExpires = "", time.Time{}
	rec.UpdatedAt = now
	if rec.State.Final() {
		rec.CompletedAt = now
	}
}

// saveTransition writes rec, its audit entry and, for a final state, its
// retention schedule when the retention walk will not find it in time
// (scheduleCompact); the caller holds tx.
func (s *Ledger) saveTransition(tx *ltx, a Actor, rec *Record, before State, why AuditDecision, now time.Time, more ...func(*AuditEntry)) error {
	if rec.State.Final() {
		// A final operation never runs again: its fingerprint stands for
		// the request from now on, and the record is smaller.
		rec.Args = nil
	}
	e := transitionEntry(now, a, rec, before, why)
	for _, f := range more {
		f(&e)
	}
	if err := keepAuditSeqLocked(tx, rec, &e); err != nil {
		return err
	}
	if err := putRecord(tx, rec); err != nil {
		return err
	}
	if ap := rec.Approval; ap != nil {
		k := recordKey(rec.Tenant, ap.ID)
		if err := tx.Bucket(bucketApprovals).Put(k, []byte(rec.Key)); err != nil {
			return err
		}
		pending := tx.Bucket(bucketPending)
		var err error
		if ap.Status == ApprovalPending {
			err = pending.Put(k, []byte(rec.Key))
		} else {
			err = pending.Delete(k)
		}
		if err != nil {
			return err
		}
	}
	if err := indexOpen(tx, rec); err != nil {
		return err
	}
	if rec.State.Final() && before != rec.State {
		if err := s.scheduleCompact(tx, rec); err != nil {
			return err
		}
	}
	return s.appendObserved(tx, e)
}

// openStates are the states a record can be stuck in without a caller:
// the background sweeps find them through the open index.
var openStates = []State{StateInProgress, StateUnknown, StateRetryable}

func openKey(st State, tenant, key string) []byte {
	return []byte(string(st) + "\x00" + tenant + "\x00" + key)
}

// indexOpen keeps rec's entry in the open index in step with its state;
// the caller holds tx.
func indexOpen(tx *ltx, rec *Record) error {
	b := tx.Bucket(bucketOpen)
	for _, st := range openStates {
		k := openKey(st, rec.Tenant, rec.Key)
		var err error
		if st == rec.State {
			err = b.Put(k, nil)
		} else {
			err = b.Delete(k)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Complete implements Store.
func (s *Ledger) Complete(ctx context.Context, a Actor, key string, gen uint64, out Outcome) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rec *Record
	taken := false
	err := s.update(func(tx *ltx) error {
		taken = false // a run again starts over
		var err error
		rec, err = getRecord(tx, a.Tenant, key)
		if err != nil {
			return err
		}
		if rec == nil {
			return ErrNotFound
		}
		if rec.State != StateInProgress || rec.Generation != gen {
			return ErrStaleGeneration
		}
		now := s.opts.Now()
		s.finish(rec, out, now)
		if out.Also != nil && rec.State == StateSucceeded {
			if err := out.Also(&dataTx{tx: tx, now: now}); err != nil {
				return err
			}
		}
		return s.saveTransition(tx, a, rec, StateInProgress, AuditCompleted, now, withCall(out.Call), out.Answer.onto(rec, &taken))
	})
	out.Answer.settle(taken, err)
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// RenewLease implements Store.
func (s *Ledger) RenewLease(ctx context.Context, tenant, key string, gen uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.update(func(tx *ltx) error {
		rec, err := getRecord(tx, tenant, key)
		if err != nil {
			return err
		}
		if rec == nil {
			return ErrNotFound
		}
		now := s.opts.Now()
		if rec.State != StateInProgress || rec.Generation != gen || !now.Before(rec.LeaseExpires) {
			return ErrStaleGeneration
		}
		rec.LeaseExpires = now.Add(s.opts.Lease)
		rec.UpdatedAt = now
		return putRecord(tx, rec)
	})
}
