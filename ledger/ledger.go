package ledger

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Ledger is the execution ledger over a Backend: every rule of the
// package is here, written once; the backend stores the bytes. It
// implements Store. Open one with New (a backend package's Open does).
type Ledger struct {
	opts     Options
	b        Backend
	owner    string // lease owner id of this process's claims
	readOnly bool

	auditMu  sync.Mutex
	auditBuf []AuditEntry

	clock clockState

	stop chan struct{}
	done chan struct{}
}

var _ Store = (*Ledger)(nil)

// New returns the ledger kept in b, with opts. It starts the background
// flush of buffered audit entries; Close stops it and closes b.
func New(b Backend, opts Options) *Ledger {
	s := &Ledger{opts: opts.withDefaults(), b: b, owner: uuid.NewString(), readOnly: b.ReadOnly(), stop: make(chan struct{}), done: make(chan struct{})}
	go s.flushLoop()
	return s
}

// Backend returns the backend the ledger runs on.
func (s *Ledger) Backend() Backend { return s.b }

// auditFlushInterval bounds how long buffered replay and refusal audit
// entries wait for a write transaction to carry them.
const auditFlushInterval = 200 * time.Millisecond

// ltx is a backend transaction as the rules see it: it collects the
// audit entries written by transitions, which Options.Observe sees once
// the transaction has committed.
type ltx struct {
	BTx
	observed []AuditEntry
}

// view runs fn in a read-only transaction.
func (s *Ledger) view(fn func(*ltx) error) error {
	return s.b.View(context.Background(), func(tx BTx) error { return fn(&ltx{BTx: tx}) })
}

// update runs fn in a read-write transaction, with the buffered audit
// entries (written first). fn may be run more than once (see
// Backend.Update), so it must reset whatever it reports at its start.
func (s *Ledger) update(fn func(*ltx) error) error {
	audits := s.takeAudit()
	var observed []AuditEntry
	err := s.b.Update(context.Background(), func(bt BTx) error {
		observed = nil
		tx := &ltx{BTx: bt}
		if err := appendAudit(tx, audits...); err != nil {
			return err
		}
		if err := fn(tx); err != nil {
			return err
		}
		observed = tx.observed
		return nil
	})
	if err != nil {
		s.restoreAudit(audits)
		return err
	}
	if s.opts.Observe != nil {
		for _, e := range observed {
			s.opts.Observe(e)
		}
	}
	return nil
}

// Close flushes buffered audit entries and closes the file.
func (s *Ledger) Close() error {
	select {
	case <-s.stop:
		return nil
	default:
	}
	close(s.stop)
	<-s.done
	err := s.flushAudit()
	return errors.Join(err, s.b.Close())
}

// flushLoop writes buffered audit entries every auditFlushInterval. It
// exits when Close is called.
func (s *Ledger) flushLoop() {
	defer close(s.done)
	t := time.NewTicker(auditFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.flushAudit()
		}
	}
}

func (s *Ledger) flushAudit() error {
	if s.readOnly {
		return nil
	}
	s.auditMu.Lock()
	empty := len(s.auditBuf) == 0
	s.auditMu.Unlock()
	if empty {
		return nil
	}
	return s.update(func(*ltx) error { return nil }) // commit carries the buffer
}

// Audit buffers e; it is written with the next write transaction, within
// auditFlushInterval. Used for calls that change nothing (replays,
// refusals, reads).
func (s *Ledger) Audit(e AuditEntry) {
	if e.At.IsZero() {
		e.At = s.opts.Now()
	}
	if s.readOnly {
		return // a read-only store never writes: the entry is dropped
	}
	s.auditMu.Lock()
	s.auditBuf = append(s.auditBuf, e)
	s.auditMu.Unlock()
	if s.opts.Observe != nil {
		s.opts.Observe(e)
	}
}

func (s *Ledger) takeAudit() []AuditEntry {
	s.auditMu.Lock()
	defer s.auditMu.Unlock()
	b := s.auditBuf
	s.auditBuf = nil
	return b
}

func (s *Ledger) restoreAudit(b []AuditEntry) {
	if len(b) == 0 {
		return
	}
	s.auditMu.Lock()
	s.auditBuf = append(b, s.auditBuf...)
	s.auditMu.Unlock()
}

// appendObserved appends entries written by a transition; Options.Observe
// sees them once their transaction has committed.
func (s *Ledger) appendObserved(tx *ltx, entries ...AuditEntry) error {
	if err := appendAudit(tx, entries...); err != nil {
		return err
	}
	if s.opts.Observe != nil {
		tx.observed = append(tx.observed, entries...)
	}
	return nil
}

// appendAudit adds entries to the hash chain and to the per-key index;
// the caller holds tx.
func appendAudit(tx BTx, entries ...AuditEntry) error {
	if len(entries) == 0 {
		return nil
	}
	b := tx.Bucket(bucketAudit)
	var seq uint64
	prev := ""
	if k, v := b.Cursor().Last(); k != nil {
		var last AuditEntry
		if err := json.Unmarshal(v, &last); err != nil {
			return fmt.Errorf("ledger: audit tail: %w", err)
		}
		seq, prev = last.Seq, last.Hash
	}
	// Entries a build without the index appended (another process on the
	// same file) are indexed now, before the new ones.
	if err := indexAudit(tx, seq); err != nil {
		return err
	}
	idx := tx.Bucket(bucketAuditByKey)
	for _, e := range entries {
		seq++
		e.Seq = seq
		if err := e.chain(prev); err != nil {
			return err
		}
		v, err := json.Marshal(e)
		if err != nil {
			return err
		}
		if err := b.Put(be64(seq), v); err != nil {
			return err
		}
		if e.Key != "" {
			if err := idx.Put(auditKeyIndex(e.Actor.Tenant, e.Key, seq), nil); err != nil {
				return err
			}
		}
		prev = e.Hash
	}
	return tx.Bucket(bucketMeta).Put(keyAuditIndexed, be64(seq))
}

// auditKeyIndex is the per-key audit index key of entry seq of (tenant,
// key): tenant \x00 key \x00 seq (8 bytes BE).
func auditKeyIndex(tenant, key string, seq uint64) []byte {
	return append(recordKey(tenant, key+"\x00"), be64(seq)...)
}

// auditIndexed is the sequence number up to which every audit entry is in
// the per-key index.
func auditIndexed(tx BTx) uint64 {
	if v := tx.Bucket(bucketMeta).Get(keyAuditIndexed); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// indexAudit adds the entries after the index's watermark, up to through,
// to the per-key index and moves the watermark; the caller holds tx.
func indexAudit(tx BTx, through uint64) error {
	done := auditIndexed(tx)
	if done >= through {
		return nil
	}
	idx := tx.Bucket(bucketAuditByKey)
	c := tx.Bucket(bucketAudit).Cursor()
	for k, v := c.Seek(be64(done + 1)); k != nil && binary.BigEndian.Uint64(k) <= through; k, v = c.Next() {
		var e struct {
			Seq   uint64 `json:"seq"`
			Key   string `json:"key"`
			Actor struct {
				Tenant string `json:"tenant"`
			} `json:"actor"`
		}
		if err := json.Unmarshal(v, &e); err != nil {
			return fmt.Errorf("ledger: audit entry %x: %w", k, err)
		}
		if e.Key != "" {
			if err := idx.Put(auditKeyIndex(e.Actor.Tenant, e.Key, binary.BigEndian.Uint64(k)), nil); err != nil {
				return err
			}
		}
	}
	return tx.Bucket(bucketMeta).Put(keyAuditIndexed, be64(through))
}

func beUint64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

func be64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func recordKey(tenant, key string) []byte { return []byte(tenant + "\x00" + key) }

func timeKey(t time.Time, tenant, key string) []byte {
	return append(be64(uint64(t.UnixNano())), recordKey(tenant, key)...)
}

func getRecord(tx *ltx, tenant, key string) (*Record, error) {
	v := tx.Bucket(bucketRecords).Get(recordKey(tenant, key))
	if v == nil {
		return nil, nil
	}
	var r Record
	if err := json.Unmarshal(v, &r); err != nil {
		return nil, fmt.Errorf("ledger: record %s/%s: %w", tenant, key, err)
	}
	if r.ResultFormat > ResultFormat {
		// Written by a newer idemgate: replaying a result this build does
		// not understand could hand back something it never returned.
		return nil, fmt.Errorf("%w: record %s/%s has result format %d, this build reads up to %d", ErrSchemaVersion, tenant, key, r.ResultFormat, ResultFormat)
	}
	return &r, nil
}

func putRecord(tx *ltx, r *Record) error {
	v, err := json.Marshal(r)
	if err != nil {
		return err
	}
	return tx.Bucket(bucketRecords).Put(recordKey(r.Tenant, r.Key), v)
}

// Expiry index values say which sweep action is due.
const (
	dueCompact      = 'r' // full record → tombstone
	dueDeleteTomb   = 't' // tombstone → deleted
	dueDeleteIssued = 'i' // issued key → forgotten
	dueApproval     = 'a' // pending approval → rejected (approval_expired)
)

// dueKey is an expiry index key: due time, action, tenant \x00 key. The
// action is part of the key so two actions due at the same instant for the
// same record do not overwrite each other.
func dueKey(t time.Time, action byte, tenant, key string) []byte {
	return append(append(be64(uint64(t.UnixNano())), action), recordKey(tenant, key)...)
}

type fpEntry struct {
	Key string    `json:"key"`
	At  time.Time `json:"at"`
}

func fpKey(tenant, fp string) []byte { return []byte(tenant + "\x00" + fp) }

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
	// Fast path: an existing record that only needs an answer is read with
	// a read-only transaction (no fsync); its audit entry is buffered.
	var d Decision
	var answered bool
	err := s.view(func(tx *ltx) error {
		rec, err := getRecord(tx, c.Actor.Tenant, c.Key)
		if err != nil || rec == nil {
			return err
		}
		now := s.opts.Now()
		if st, kind := s.opts.decide(rec, c, now, s.highWater()); st == stepAnswer {
			d, answered = s.answer(rec, kind), true
		}
		return nil
	})
	if err != nil {
		return Decision{}, err
	}
	if answered {
		s.Audit(s.callEntry(c, d))
		return d, nil
	}
	err = s.update(func(tx *ltx) error {
		var err error
		d, err = s.claimLocked(tx, c, apply)
		return err
	})
	return d, err
}

func (s *Ledger) answer(rec *Record, kind DecisionKind) Decision {
	if kind == DecisionExpired {
		rec = tombstone(rec)
	}
	return Decision{Kind: kind, Record: rec}
}

func (s *Ledger) callEntry(c Claim, d Decision) AuditEntry {
	e := AuditEntry{At: s.opts.Now(), Event: "call", Actor: c.Actor, Tool: c.Tool, Key: c.Key, Fingerprint: c.Fingerprint, Decision: string(d.Kind)}
	c.policyOf(&e)
	if d.Record != nil {
		e.StateBefore, e.StateAfter, e.Attempt = d.Record.State, d.Record.State, d.Record.Attempts
		e.Downstream = d.Record.Downstream
		e.noteApproval(d.Record)
	}
	if d.Kind == DecisionMismatch {
		e.ErrorCode = "key_reused_with_different_request"
	}
	return e
}

// claimLocked is the atomic claim; the caller holds the write tx.
func (s *Ledger) claimLocked(tx *ltx, c Claim, apply ApplyFunc) (Decision, error) {
	now, high, _, err := s.ledgerTime(tx)
	if err != nil {
		return Decision{}, err
	}
	rec, err := getRecord(tx, c.Actor.Tenant, c.Key)
	if err != nil {
		return Decision{}, err
	}
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
			return d, s.appendObserved(tx, s.callEntry(c, d))
		}
		if rec.Downstream != "" && rec.Downstream != c.Downstream {
			return Decision{}, fmt.Errorf("%w: the operation belongs to %s, this process is configured for %s", ErrDownstreamMismatch, rec.Downstream, c.Downstream)
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
			if err := s.saveNew(tx, c.Actor, rec, AuditHeld+AuditDecision(rec.Approval.Rule), now, c.policyOf); err != nil {
				return Decision{}, err
			}
			fp, _ := json.Marshal(fpEntry{Key: c.Key, At: now})
			if err := tx.Bucket(bucketFPIndex).Put(fpKey(c.Actor.Tenant, c.Fingerprint), fp); err != nil {
				return Decision{}, err
			}
			return Decision{Kind: DecisionApprovalRequested, Record: rec}, nil
		}
		rec = &Record{
			Tenant: c.Actor.Tenant, Key: c.Key, Tool: c.Tool, Fingerprint: c.Fingerprint,
			Principal: c.Actor.Principal, Attempts: 1, Generation: 1, FirstSeenAt: now,
			Incarnation: newIncarnation(),
			Args:        c.Args, // a later re-run (after unknown, by approval) needs the request
			Downstream:  c.Downstream,
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
	claimed := transitionEntry(now, c.Actor, rec, before, AuditClaimed)
	c.policyOf(&claimed)
	if err := s.appendObserved(tx, claimed); err != nil {
		return Decision{}, err
	}
	s.finish(rec, out, now)
	if err := s.saveTransition(tx, c.Actor, rec, StateInProgress, AuditExecuted, now, c.policyOf, withCall(out.Call)); err != nil {
		return Decision{}, err
	}
	return Decision{Kind: DecisionExecuted, Record: rec}, nil
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
	if err := s.saveNew(tx, c.Actor, rec, AuditSuspectedDuplicate+AuditDecision(fe.Key), now, c.policyOf); err != nil {
		return Decision{}, false, err
	}
	return Decision{Kind: DecisionSuspectedDuplicate, Record: rec, Earlier: earlier}, true, nil
}

// heldRecord builds the awaiting_approval record of c. A non-empty
// earlierKey marks a suspected duplicate of that key.
func (s *Ledger) heldRecord(c Claim, now time.Time, earlierKey string) *Record {
	a := Approval{Reason: "policy"}
	if c.Proposal != nil {
		a = *c.Proposal
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
		FirstSeenAt: now, UpdatedAt: now, Approval: &a, Incarnation: newIncarnation(),
	}
}

// newIncarnation returns a fresh Record.Incarnation: 64 random bits, so
// two operations under one key (the second after the first's tombstone
// was deleted) never share one.
func newIncarnation() string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("ledger: no randomness for an incarnation: " + err.Error()) // crypto/rand does not fail on supported systems
	}
	return hex.EncodeToString(b[:])
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
// retention schedule; the caller holds tx.
func (s *Ledger) saveTransition(tx *ltx, a Actor, rec *Record, before State, why AuditDecision, now time.Time, more ...func(*AuditEntry)) error {
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
		due := dueKey(rec.CompletedAt.Add(s.opts.Retention), dueCompact, rec.Tenant, rec.Key)
		if err := tx.Bucket(bucketExpiry).Put(due, []byte{dueCompact}); err != nil {
			return err
		}
	}
	e := transitionEntry(now, a, rec, before, why)
	for _, f := range more {
		f(&e)
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

// OpenRecords implements Store.
func (s *Ledger) OpenRecords(ctx context.Context, st State, after string, limit int) ([]*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	var out []*Record
	err := s.view(func(tx *ltx) error {
		c := tx.Bucket(bucketOpen).Cursor()
		prefix := []byte(string(st) + "\x00")
		k, _ := c.Seek(prefix)
		if after != "" {
			start := append(bytes.Clone(prefix), after...)
			if k, _ = c.Seek(start); bytes.Equal(k, start) {
				k, _ = c.Next()
			}
		}
		for ; k != nil && bytes.HasPrefix(k, prefix) && len(out) < limit; k, _ = c.Next() {
			tenant, key, _ := bytes.Cut(k[len(prefix):], []byte{0})
			rec, err := getRecord(tx, string(tenant), string(key))
			if err != nil {
				return err
			}
			if rec != nil {
				out = append(out, rec)
			}
		}
		return nil
	})
	return out, err
}

// ExpireLeases implements Store.
func (s *Ledger) ExpireLeases(ctx context.Context) (int, error) {
	stale, err := s.OpenRecords(ctx, StateInProgress, "", 1000)
	if err != nil {
		return 0, err
	}
	now := s.opts.Now()
	n := 0
	for _, r := range stale {
		if now.Before(r.LeaseExpires) {
			continue
		}
		moved := false
		err := s.update(func(tx *ltx) error {
			moved = false // update may run this twice
			rec, err := getRecord(tx, r.Tenant, r.Key)
			if err != nil || rec == nil {
				return err
			}
			now, high, _, err := s.ledgerTime(tx)
			if err != nil {
				return err
			}
			prev, why := s.opts.expireTransition(rec, now, high)
			if why != AuditLeaseExpired {
				return nil // finished or renewed meanwhile
			}
			moved = true
			return s.saveTransition(tx, Actor{Tenant: rec.Tenant, Principal: "ledger-sweep"}, rec, prev, why, now)
		})
		if err != nil {
			return n, err
		}
		if moved {
			n++
		}
	}
	return n, nil
}

// Settle implements Store.
func (s *Ledger) Settle(ctx context.Context, r SettleRequest) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rec *Record
	err := s.update(func(tx *ltx) error {
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
		return s.saveTransition(tx, r.Actor, rec, before, AuditDecision(r.Why), now, withCall(r.Outcome.Call), settled)
	})
	if err != nil {
		return nil, err
	}
	return rec, nil
}

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
		rec.Error = &OpError{Code: "forbidden", Message: msg}
		rec.Summary = "rejected by " + r.Approver.Principal
		rec.CompletedAt = now
		if err := s.saveTransition(tx, r.Approver, rec, StateAwaitingApproval, AuditRejectedBy+AuditDecision(r.Approver.Principal), now); err != nil {
			return Decision{}, err
		}
		return Decision{Kind: DecisionExecuted, Record: rec}, nil
	}
	if rec.Downstream != "" && rec.Downstream != r.Downstream {
		return Decision{}, fmt.Errorf("%w: the operation belongs to %s, this process is configured for %s", ErrDownstreamMismatch, rec.Downstream, r.Downstream)
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

// Complete implements Store.
func (s *Ledger) Complete(ctx context.Context, a Actor, key string, gen uint64, out Outcome) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rec *Record
	err := s.update(func(tx *ltx) error {
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
		return s.saveTransition(tx, a, rec, StateInProgress, AuditCompleted, now, withCall(out.Call))
	})
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

// Get implements Store. Due expiries (lease, approval, retention) are shown
// as they will be recorded, without writing.
func (s *Ledger) Get(ctx context.Context, tenant, key string) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rec *Record
	err := s.view(func(tx *ltx) error {
		var err error
		rec, err = getRecord(tx, tenant, key)
		return err
	})
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, ErrNotFound
	}
	return s.present(rec), nil
}

func (s *Ledger) present(rec *Record) *Record {
	now := s.opts.Now()
	s.opts.expireTransition(rec, now, s.highWater())
	if s.opts.expired(rec, now) {
		return tombstone(rec)
	}
	return rec
}

// List implements Store.
func (s *Ledger) List(ctx context.Context, f Filter) ([]*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var out []*Record
	err := s.view(func(tx *ltx) error {
		c := tx.Bucket(bucketByTime).Cursor()
		var k []byte
		if f.After == "" {
			k, _ = c.Last()
		} else if k, _ = c.Seek([]byte(f.After)); k == nil {
			k, _ = c.Last() // every key is before the position
		} else {
			k, _ = c.Prev() // the last key strictly before the position
		}
		for ; k != nil && len(out) < f.Limit; k, _ = c.Prev() {
			tenant, key, ok := bytes.Cut(k[8:], []byte{0})
			if !ok || (f.Tenant != "" && string(tenant) != f.Tenant) {
				continue
			}
			rec, err := getRecord(tx, string(tenant), string(key))
			if err != nil {
				return err
			}
			if rec == nil {
				continue
			}
			rec = s.present(rec)
			if f.State != "" && rec.State != f.State {
				continue
			}
			out = append(out, rec)
		}
		return nil
	})
	return out, err
}

// IssueKey implements Store.
func (s *Ledger) IssueKey(ctx context.Context, tenant, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.update(func(tx *ltx) error {
		now := s.opts.Now()
		if err := tx.Bucket(bucketIssued).Put(recordKey(tenant, key), be64(uint64(now.UnixNano()))); err != nil {
			return err
		}
		return tx.Bucket(bucketExpiry).Put(dueKey(now.Add(s.opts.Retention), dueDeleteIssued, tenant, key), []byte{dueDeleteIssued})
	})
}

// View implements Store.
func (s *Ledger) View(ctx context.Context, fn func(Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.view(func(tx *ltx) error { return fn(&dataTx{tx: tx, now: s.opts.Now()}) })
}

// Update implements Store.
func (s *Ledger) Update(ctx context.Context, fn func(Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.update(func(tx *ltx) error { return fn(&dataTx{tx: tx, now: s.opts.Now()}) })
}

// sweepChunk bounds the work of one sweep transaction, and sweepScan the
// index entries it reads past (tombstones not yet due by the trusted time).
const (
	sweepChunk = 1000
	sweepScan  = 20 * sweepChunk
)

// Sweep implements Store. Pending approvals expire, and issued keys are
// forgotten, by the later of the wall clock and the ledger's high-water
// time; records past retention become tombstones by that time too. A
// tombstone is deleted — freeing its key — only once its age is past
// Retention+TombstoneRetention by both the wall clock and the ledger's
// trusted time (see ledgerTime): a clock set forward does not free keys
// early, a clock set back does not either. Each deletion is audited
// (EventDeleted). Index entries are checked against their record, so an
// entry of an earlier operation under a reused key never touches the new
// one, and a changed retention reschedules rather than loses an entry.
func (s *Ledger) Sweep(ctx context.Context) (compacted, deleted int, err error) {
	for {
		if err := ctx.Err(); err != nil {
			return compacted, deleted, err
		}
		var c, d int
		var more bool
		err := s.update(func(tx *ltx) error {
			c, d, more = 0, 0, false
			now, high, trusted, err := s.ledgerTime(tx)
			if err != nil {
				return err
			}
			cutoff := later(now, high)
			freeBy := now
			if trusted.Before(freeBy) {
				freeBy = trusted
			}
			exp := tx.Bucket(bucketExpiry)
			type entry struct {
				k      []byte
				due    time.Time
				action byte
			}
			var due []entry
			cur := exp.Cursor()
			scanned := 0
			for k, v := cur.First(); k != nil && len(v) > 0 && scanned < sweepScan; k, v = cur.Next() {
				scanned++
				at := time.Unix(0, int64(binary.BigEndian.Uint64(k[:8])))
				if at.After(cutoff) {
					break
				}
				if v[0] == dueDeleteTomb && at.After(freeBy) {
					continue // due by the wall clock, not yet by the trusted time
				}
				due = append(due, entry{bytes.Clone(k), at, v[0]})
				if len(due) == sweepChunk {
					break
				}
			}
			// What this pass does may make more due now (an expired
			// approval's compaction, a compaction's deletion): another
			// pass looks, until one finds nothing.
			more = len(due) > 0
			var deletedEntries []AuditEntry
			for _, e := range due {
				if err := exp.Delete(e.k); err != nil {
					return err
				}
				tenant, key, _ := bytes.Cut(e.k[9:], []byte{0})
				if e.action == dueDeleteIssued {
					if err := tx.Bucket(bucketIssued).Delete(e.k[9:]); err != nil {
						return err
					}
					continue
				}
				rec, err := getRecord(tx, string(tenant), string(key))
				if err != nil {
					return err
				}
				if rec == nil {
					continue
				}
				switch e.action {
				case dueApproval:
					if rec.State != StateAwaitingApproval {
						continue
					}
					if prev, why := s.opts.expireTransition(rec, now, high); why != "" {
						if err := s.saveTransition(tx, Actor{Tenant: rec.Tenant, Principal: "ledger-sweep"}, rec, prev, why, now); err != nil {
							return err
						}
					}
				case dueCompact:
					if rec.Tombstone || !rec.State.Final() || rec.CompletedAt.IsZero() {
						continue // not this entry's record (an earlier operation's entry), or done
					}
					if want := rec.CompletedAt.Add(s.opts.Retention); want.After(cutoff) {
						if err := exp.Put(dueKey(want, dueCompact, rec.Tenant, rec.Key), []byte{dueCompact}); err != nil {
							return err
						}
						continue
					}
					if err := putRecord(tx, tombstone(rec)); err != nil {
						return err
					}
					at := dueKey(rec.CompletedAt.Add(s.opts.Retention+s.opts.TombstoneRetention), dueDeleteTomb, rec.Tenant, rec.Key)
					if err := exp.Put(at, []byte{dueDeleteTomb}); err != nil {
						return err
					}
					c++
				case dueDeleteTomb:
					if !rec.Tombstone {
						continue // a newer operation under the key, or not yet compacted
					}
					if want := rec.CompletedAt.Add(s.opts.Retention + s.opts.TombstoneRetention); want.After(freeBy) {
						if err := exp.Put(dueKey(want, dueDeleteTomb, rec.Tenant, rec.Key), []byte{dueDeleteTomb}); err != nil {
							return err
						}
						continue
					}
					if err := s.deleteRecordLocked(tx, rec); err != nil {
						return err
					}
					deletedEntries = append(deletedEntries, AuditEntry{At: now, Event: EventDeleted,
						Actor: Actor{Tenant: rec.Tenant, Principal: "ledger-sweep"}, Tool: rec.Tool, Key: rec.Key,
						Fingerprint: rec.Fingerprint, StateBefore: rec.State,
						Decision: string(AuditTombstoneDeleted), Detail: "incarnation " + rec.Incarnation})
					d++
				}
			}
			return s.appendObserved(tx, deletedEntries...)
		})
		compacted, deleted = compacted+c, deleted+d
		if err != nil || !more {
			return compacted, deleted, err
		}
	}
}

func (s *Ledger) deleteRecordLocked(tx *ltx, rec *Record) error {
	if err := tx.Bucket(bucketRecords).Delete(recordKey(rec.Tenant, rec.Key)); err != nil {
		return err
	}
	if err := tx.Bucket(bucketByTime).Delete(timeKey(rec.FirstSeenAt, rec.Tenant, rec.Key)); err != nil {
		return err
	}
	if rec.Approval != nil {
		k := recordKey(rec.Tenant, rec.Approval.ID)
		if err := tx.Bucket(bucketApprovals).Delete(k); err != nil {
			return err
		}
		if err := tx.Bucket(bucketPending).Delete(k); err != nil {
			return err
		}
	}
	fpb := tx.Bucket(bucketFPIndex)
	if v := fpb.Get(fpKey(rec.Tenant, rec.Fingerprint)); v != nil {
		var fe fpEntry
		if json.Unmarshal(v, &fe) == nil && fe.Key == rec.Key {
			return fpb.Delete(fpKey(rec.Tenant, rec.Fingerprint))
		}
	}
	return nil
}

// AuditLog returns up to limit entries with Seq > after, oldest first.
func (s *Ledger) AuditLog(ctx context.Context, after uint64, limit int) ([]AuditEntry, error) {
	if err := s.flushAudit(); err != nil {
		return nil, err
	}
	var out []AuditEntry
	err := s.view(func(tx *ltx) error {
		c := tx.Bucket(bucketAudit).Cursor()
		for k, v := c.Seek(be64(after + 1)); k != nil && (limit <= 0 || len(out) < limit); k, v = c.Next() {
			var e AuditEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("ledger: audit entry %x: %w", k, err)
			}
			out = append(out, e)
		}
		return nil
	})
	return out, err
}

// AuditTail returns the newest n entries, oldest first.
func (s *Ledger) AuditTail(ctx context.Context, n int) ([]AuditEntry, error) {
	if err := s.flushAudit(); err != nil {
		return nil, err
	}
	var out []AuditEntry
	err := s.view(func(tx *ltx) error {
		c := tx.Bucket(bucketAudit).Cursor()
		for k, v := c.Last(); k != nil && len(out) < n; k, v = c.Prev() {
			var e AuditEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("ledger: audit entry %x: %w", k, err)
			}
			out = append(out, e)
		}
		return nil
	})
	slices.Reverse(out)
	return out, err
}

// AuditForKey returns the audit entries of (tenant, key) — its calls,
// replays, refusals, transitions and answers — oldest first: the newest
// limit of them (limit <= 0: all), and how many there are in all. It reads
// the per-key index, so its cost is that of the key's own entries, not of
// the whole log (plus a scan of the entries appended since the index's
// watermark, which only a build without the index leaves behind).
// Buffered entries are written first, so the history is complete.
func (s *Ledger) AuditForKey(ctx context.Context, tenant, key string, limit int) ([]AuditEntry, int, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if err := s.flushAudit(); err != nil {
		return nil, 0, err
	}
	var out []AuditEntry
	total := 0
	err := s.view(func(tx *ltx) error {
		out, total = nil, 0
		audit := tx.Bucket(bucketAudit)
		var seqs []uint64
		prefix := recordKey(tenant, key+"\x00")
		// A file of the build before the index, opened read-only, has no
		// index bucket: its watermark is 0, so the scan below reads it all.
		if idx := tx.Bucket(bucketAuditByKey); idx != nil {
			c := idx.Cursor()
			for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
				if len(k) == len(prefix)+8 {
					seqs = append(seqs, binary.BigEndian.Uint64(k[len(prefix):]))
				}
			}
		}
		done := auditIndexed(tx)
		ac := audit.Cursor()
		for k, v := ac.Seek(be64(done + 1)); k != nil; k, v = ac.Next() {
			var e AuditEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("ledger: audit entry %x: %w", k, err)
			}
			if e.Key == key && e.Actor.Tenant == tenant {
				seqs = append(seqs, e.Seq)
			}
		}
		total = len(seqs)
		if limit > 0 && len(seqs) > limit {
			seqs = seqs[len(seqs)-limit:]
		}
		for _, seq := range seqs {
			v := audit.Get(be64(seq))
			if v == nil {
				continue
			}
			var e AuditEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("ledger: audit entry %d: %w", seq, err)
			}
			if e.Key == key && e.Actor.Tenant == tenant {
				out = append(out, e)
			}
		}
		return nil
	})
	return out, total, err
}

// VerifyAudit checks the whole hash chain and returns the number of
// entries, or an error naming the first entry that does not verify.
func (s *Ledger) VerifyAudit(ctx context.Context) (int, error) {
	n := 0
	prev := ""
	err := s.view(func(tx *ltx) error {
		c := tx.Bucket(bucketAudit).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			var e AuditEntry
			if err := json.Unmarshal(v, &e); err != nil {
				return fmt.Errorf("audit entry %x: not JSON: %w", k, err)
			}
			if e.Seq != binary.BigEndian.Uint64(k) {
				return fmt.Errorf("audit entry %d: stored under sequence %d", e.Seq, binary.BigEndian.Uint64(k))
			}
			if err := e.verifyChain(prev); err != nil {
				return err
			}
			prev = e.Hash
			n++
		}
		return nil
	})
	return n, err
}

// dataTx is the Tx given to downstreams: the backend's data collections.
type dataTx struct {
	tx  BTx
	now time.Time
}

func (t *dataTx) Now() time.Time { return t.now }

func (t *dataTx) Get(collection, key string) ([]byte, error) {
	b, err := t.tx.Data(collection, false)
	if b == nil || err != nil {
		return nil, err
	}
	return b.Get([]byte(key)), nil
}

func (t *dataTx) Put(collection, key string, value []byte) error {
	b, err := t.tx.Data(collection, true)
	if err != nil {
		return err
	}
	return b.Put([]byte(key), value)
}

func (t *dataTx) Delete(collection, key string) error {
	b, err := t.tx.Data(collection, false)
	if b == nil || err != nil {
		return err
	}
	return b.Delete([]byte(key))
}

func (t *dataTx) Scan(collection, prefix string, reverse bool, fn func(key string, value []byte) (bool, error)) error {
	b, err := t.tx.Data(collection, false)
	if b == nil || err != nil {
		return err
	}
	c := b.Cursor()
	p := []byte(prefix)
	var k, v []byte
	if !reverse {
		k, v = c.Seek(p)
	} else {
		k, v = seekLast(c, p)
	}
	for k != nil && bytes.HasPrefix(k, p) {
		more, err := fn(string(k), v)
		if err != nil || !more {
			return err
		}
		if reverse {
			k, v = c.Prev()
		} else {
			k, v = c.Next()
		}
	}
	return nil
}

// seekLast positions c at the last key with prefix p.
func seekLast(c Cursor, p []byte) ([]byte, []byte) {
	end := bytes.Clone(p)
	for len(end) > 0 && end[len(end)-1] == 0xff {
		end = end[:len(end)-1]
	}
	if len(end) == 0 {
		return c.Last()
	}
	end[len(end)-1]++ // the first key after every key with prefix p
	if k, _ := c.Seek(end); k == nil {
		return c.Last()
	}
	return c.Prev()
}

// The ledger's clocks (see ledgerTime), kept in the meta bucket.
var (
	keyClockHigh    = []byte("clock_high_water") // 8 bytes BE unix ns: the latest wall time a write recorded
	keyClockTrusted = []byte("clock_trusted")    // 8 bytes BE unix ns: the ledger's trusted time
)

// EventDeleted is the audit event of a tombstone deleted by the sweep:
// from then on its key is free, and a call under it is a new operation.
const EventDeleted = "deleted"

// clockState is what this process knows of the ledger's clocks.
type clockState struct {
	mu       sync.Mutex
	seen     bool          // this process has read the trusted time at least once
	trusted  time.Time     // the trusted time it last read or wrote
	at       time.Duration // Options.Elapsed then
	high     time.Time     // the latest high-water time it has read or written
	warnedAt time.Duration // Options.Elapsed at the last clock warning
}

func (s *Ledger) highWater() time.Time {
	s.clock.mu.Lock()
	defer s.clock.mu.Unlock()
	return s.clock.high
}

func getTime(b Bucket, k []byte) time.Time {
	v := b.Get(k)
	if len(v) != 8 {
		return time.Time{}
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(v)))
}

// ledgerTime reads the clocks for a write transaction and moves them on.
// It returns the wall clock (now), the high-water time (the latest wall
// time any write has recorded: a clock set back is never believed below
// it for approvals, see Options.decide) and the trusted time, which is
// what deletes tombstones and so frees keys:
//
//   - the trusted time never goes back;
//   - it follows the wall clock while the wall clock moves ahead of it by
//     at most MaxClockJump;
//   - beyond that (a jump forward, or a gap while no process used the
//     ledger) it advances only by the time this process has measured
//     passing with the monotonic clock since it last looked, never past
//     the wall clock;
//   - it never falls more than MaxClockLag behind the wall clock.
//
// Both are kept in the meta bucket, written in the caller's transaction
// only when they move (no fsync of their own).
func (s *Ledger) ledgerTime(tx *ltx) (now, high, trusted time.Time, err error) {
	now = s.opts.Now()
	elapsed := s.opts.Elapsed()
	meta := tx.Bucket(bucketMeta)
	h0, t0 := getTime(meta, keyClockHigh), getTime(meta, keyClockTrusted)
	if h0.IsZero() {
		h0 = now
	}
	if t0.IsZero() { // a new ledger, or one written before the clocks were kept
		t0 = now
	}
	s.clock.mu.Lock()
	trusted = t0
	if now.After(t0) {
		next := now
		if now.Sub(t0) > s.opts.MaxClockJump {
			next = t0
			if s.clock.seen {
				if measured := s.clock.trusted.Add(elapsed - s.clock.at); measured.After(next) {
					next = measured
				}
			}
			if floor := now.Add(-s.opts.MaxClockLag); floor.After(next) {
				next = floor
			}
			if next.After(now) {
				next = now
			}
		}
		trusted = later(t0, next)
	}
	high = later(h0, now)
	warn := ""
	var by time.Duration
	switch {
	case h0.Sub(now) > time.Second:
		warn, by = "the wall clock is behind the latest time this ledger recorded (set back?): approvals expire by the recorded time; tombstones are deleted only when both clocks agree", h0.Sub(now)
	case now.Sub(trusted) > s.opts.MaxClockJump:
		warn, by = "the wall clock is ahead of the ledger's trusted time (a jump forward, or the ledger was idle): tombstones are deleted, and keys freed, only by the trusted time, which follows the time measured passing", now.Sub(trusted)
	}
	if warn != "" && (s.clock.warnedAt == 0 || elapsed-s.clock.warnedAt >= time.Minute) {
		s.clock.warnedAt = max(elapsed, 1)
		s.opts.Log.Warn("ledger clock: "+warn, "by", by.Round(time.Second).String(), "wall", now.UTC(), "trusted", trusted.UTC(), "high_water", high.UTC())
	}
	s.clock.seen, s.clock.trusted, s.clock.at = true, trusted, elapsed
	s.clock.high = later(s.clock.high, high)
	s.clock.mu.Unlock()
	// Written when they moved by clockGrain or more, so most transactions
	// of a busy ledger do not rewrite the meta bucket.
	if stored := getTime(meta, keyClockHigh); stored.IsZero() || high.Sub(stored) >= clockGrain {
		if err := meta.Put(keyClockHigh, be64(uint64(high.UnixNano()))); err != nil {
			return now, high, trusted, err
		}
	}
	if stored := getTime(meta, keyClockTrusted); stored.IsZero() || trusted.Sub(stored) >= clockGrain {
		if err := meta.Put(keyClockTrusted, be64(uint64(trusted.UnixNano()))); err != nil {
			return now, high, trusted, err
		}
	}
	return now, high, trusted, nil
}

// clockGrain is how far the ledger's clocks move before they are written
// again: they are that much behind at most, which only delays (never
// hastens) an expiry or a deletion by them.
const clockGrain = time.Second
