package ledger

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
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
	// journal: the backend is Concurrent, so transitions journal their
	// audit entries and the sealer chains them (see sealJournal).
	journal bool

	auditMu  sync.Mutex
	auditBuf []AuditEntry
	laterBuf []laterWrite // guarded by auditMu
	// bufSince is when the buffers last went from empty to not (this
	// process's clock; zero while empty), guarded by auditMu.
	bufSince time.Time
	// bufKick wakes the background flush when the buffers go from empty
	// to not, so an idle ledger's flush sleeps instead of ticking.
	bufKick chan struct{}
	// carryMu is held shared by every write transaction from the moment
	// it takes the buffers until it has committed them or given them
	// back; a reader of the audit log takes it exclusively, once, to wait
	// for the entries buffered before it that another transaction is
	// carrying (flushAudit).
	carryMu sync.RWMutex
	// unsealed: this process journaled audit entries since it last
	// sealed the journal, guarded by auditMu.
	unsealed bool
	// txOrder numbers this process's transactions for the journal (see
	// JournalCollection).
	txOrder atomic.Uint64

	clock  clockState
	watch  watchers     // see wait.go
	finals finalRecords // see claim.go

	stop chan struct{}
	done chan struct{}
}

var _ Store = (*Ledger)(nil)

// New returns the ledger kept in b, with opts. It starts the background
// flush of buffered audit entries; Close stops it and closes b.
func New(b Backend, opts Options) *Ledger {
	if c, ok := b.(Clock); ok && opts.Now == nil {
		opts.Now = c.Now
	}
	s := &Ledger{opts: opts.withDefaults(), b: b, owner: uuid.NewString(), readOnly: b.ReadOnly(), stop: make(chan struct{}), done: make(chan struct{}), bufKick: make(chan struct{}, 1)}
	if c, ok := b.(Concurrent); ok && c.Concurrent() {
		s.journal = true
		if !s.readOnly {
			// Entries a process journaled and did not seal (it died)
			// are sealed now, within the flush interval.
			s.unsealed, s.bufSince = true, time.Now()
			s.bufKick <- struct{}{}
		}
	}
	go s.flushLoop()
	return s
}

// auditFlushInterval bounds how long buffered replay and refusal audit
// entries (and Later's writes) wait for a write transaction to carry
// them: the background flush commits them only
// once the oldest has waited this long, so while calls are committing —
// each carrying what is buffered — it commits nothing of its own.
const auditFlushInterval = 200 * time.Millisecond

// ltx is a backend transaction as the rules see it: it collects the
// audit entries written by transitions, which Options.Observe sees once
// the transaction has committed.
type ltx struct {
	BTx
	ledger *Ledger
	// journal: audit entries go to the journal, not the chain (see
	// Concurrent); journaled: how many this transaction wrote there,
	// under its order.
	journal   bool
	journaled uint32
	order     uint64
	observed  []AuditEntry
	topics    []string        // records written, to wake their watchers (wait.go)
	topicSet  map[string]bool // topics, as a set
}

// view runs fn in a read-only transaction.
func (s *Ledger) view(fn func(*ltx) error) error {
	return s.b.View(context.Background(), func(tx BTx) error { return fn(&ltx{BTx: tx, ledger: s, journal: s.journal}) })
}

// readCommitted calls fn with the committed value of key in collection
// (nil: none), valid only during the call: in one exchange with the store
// when the backend is a PointReader, else in a View.
func (s *Ledger) readCommitted(ctx context.Context, collection, key []byte, fn func(v []byte) error) error {
	if p, ok := s.b.(PointReader); ok {
		v, err := p.ReadCommitted(ctx, string(collection), key)
		if err != nil {
			return err
		}
		return fn(v)
	}
	return s.view(func(tx *ltx) error { return fn(tx.Bucket(collection).Get(key)) })
}

// laterWrite is a write queued by Later.
type laterWrite struct {
	fn   func(Tx) error
	done func(error)
}

// laterFailed is a Later write whose fn failed: the carrying transaction
// is run again without it.
type laterFailed struct {
	i   int
	err error
}

func (e *laterFailed) Error() string { return e.err.Error() }

// update runs fn in a read-write transaction, with the buffered audit
// entries (written first) and the writes queued by Later. fn may be run
// more than once (see Backend.Update), so it must reset whatever it
// reports at its start.
func (s *Ledger) update(fn func(*ltx) error) error {
	return s.updateIn(context.Background(), fn)
}

// updateIn is update with the context given to the backend: Background
// marks the retention sweep's transactions.
func (s *Ledger) updateIn(ctx context.Context, fn func(*ltx) error) error {
	return s.updateCarrying(ctx, fn, !s.journal)
}

// updateCarrying is updateIn; carryLaters says whether the transaction also
// carries the writes queued by Later. On a Concurrent backend only the
// flush does: a caller's transaction would take the locks of keys it has
// no business with (the deliverer's records of a hundred messages) and
// make other callers wait for them.
func (s *Ledger) updateCarrying(ctx context.Context, fn func(*ltx) error, carryLaters bool) error {
	s.carryMu.RLock() // until what it takes is committed or given back (see carryMu)
	defer s.carryMu.RUnlock()
	audits, laters := s.takeAudit(carryLaters)
	committed := false
	defer func() {
		if !committed { // failed, or fn panicked: the entries wait for the next write
			s.restoreAudit(audits, laters)
		}
	}()
	var observed []AuditEntry
	var topics []string
	journaled := false
	for {
		err := s.b.Update(ctx, func(bt BTx) error {
			observed, topics, journaled = nil, nil, false
			tx := &ltx{BTx: bt, ledger: s, journal: s.journal}
			if err := appendAudit(tx, audits...); err != nil {
				return err
			}
			for i, l := range laters {
				if err := l.fn(&dataTx{tx: tx, now: s.opts.Now()}); err != nil {
					return &laterFailed{i: i, err: err}
				}
			}
			if err := fn(tx); err != nil {
				return err
			}
			observed, topics, journaled = tx.observed, tx.topics, tx.journaled > 0
			if n, ok := bt.(NotifyTx); ok && len(topics) > 0 {
				n.Notify(topics) // sent at commit, to the other processes' watchers
			}
			return nil
		})
		var lf *laterFailed
		if errors.As(err, &lf) && lf.i < len(laters) {
			// A queued write failed on its own: it is told so, and the
			// transaction that carried it runs again without it.
			l := laters[lf.i]
			laters = append(laters[:lf.i:lf.i], laters[lf.i+1:]...)
			l.done(lf.err)
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	committed = true
	if journaled {
		s.auditMu.Lock()
		s.unsealed = true
		s.buffered()
		s.auditMu.Unlock()
	}
	s.wakeAll(topics)
	for _, l := range laters {
		l.done(nil)
	}
	if s.opts.Observe != nil {
		for _, e := range observed {
			s.opts.Observe(e)
		}
	}
	return nil
}

// Journaling reports whether transitions journal their audit entries for
// the sealer to chain (the backend is Concurrent) instead of chaining them
// themselves.
func (s *Ledger) Journaling() bool { return s.journal }

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

// flushLoop commits buffered audit entries (and Later's writes) once the
// oldest has waited auditFlushInterval without a write transaction
// carrying them. It sleeps while the buffers are empty (buffered wakes
// it), so an idle ledger makes no wake-ups. It exits when Close is called.
func (s *Ledger) flushLoop() {
	defer close(s.done)
	timer := time.NewTimer(auditFlushInterval)
	timer.Stop()
	defer timer.Stop()
	var fire <-chan time.Time // nil while no timer is armed
	// arm sets the timer for when the oldest buffered entry is due, or
	// leaves it unarmed when the buffers are empty.
	arm := func() {
		s.auditMu.Lock()
		since := s.bufSince
		s.auditMu.Unlock()
		if since.IsZero() {
			fire = nil
			return
		}
		timer.Reset(max(0, auditFlushInterval-time.Since(since)))
		fire = timer.C
	}
	for {
		select {
		case <-s.stop:
			return
		case <-s.bufKick:
			if fire == nil {
				arm()
			}
		case <-fire:
			s.auditMu.Lock()
			since := s.bufSince
			s.auditMu.Unlock()
			if !since.IsZero() && time.Since(since) >= auditFlushInterval {
				s.flush(false)
			}
			arm() // what was buffered since, or what a commit left
		}
	}
}

// buffered notes that the buffers now hold something; auditMu is held.
func (s *Ledger) buffered() {
	if s.bufSince.IsZero() {
		s.bufSince = time.Now()
		select {
		case s.bufKick <- struct{}{}:
		default: // a wake-up is already pending
		}
	}
}

// FlushAudit commits the audit entries buffered so far (Audit), so that
// what reads the audit log next sees every call answered before.
func (s *Ledger) FlushAudit() error { return s.flushAudit() }

// flushAudit commits the buffers and, on a journaling ledger, seals the
// journal, for a reader of the audit log: it also waits for the entries
// another transaction took from the buffers before it and is carrying.
func (s *Ledger) flushAudit() error { return s.flush(true) }

// flush is flushAudit; the background flush does not wait for other
// transactions' carried entries (they commit them themselves).
func (s *Ledger) flush(wait bool) error {
	if s.readOnly {
		if s.journal {
			return s.awaitSealed()
		}
		return nil
	}
	s.auditMu.Lock()
	empty := len(s.auditBuf) == 0 && len(s.laterBuf) == 0
	queued := len(s.laterBuf)
	s.auditMu.Unlock()
	if !empty {
		// The commit carries the buffers. On a Concurrent backend, a
		// transaction per queued write (takeAudit hands out one): one
		// holding the keys of several (a deliverer's records of several
		// passes) would hold thousands of locks.
		for i := 0; i < max(1, queued); i++ {
			if err := s.updateCarrying(context.Background(), func(*ltx) error { return nil }, true); err != nil {
				return err
			}
			if !s.journal {
				break
			}
		}
	}
	if wait {
		s.carryMu.Lock()
		s.carryMu.Unlock() //nolint:staticcheck // an empty critical section: waiting is the point
	}
	if s.journal {
		return s.sealJournal()
	}
	return nil
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
	s.buffered()
	s.auditMu.Unlock()
	if s.opts.Observe != nil {
		s.opts.Observe(e)
	}
}

// Later queues fn to run in the next write transaction this process
// commits — a claim's, another caller's, or the background flush within
// auditFlushInterval — and calls done once that transaction has
// committed (nil), or with fn's own error (none of fn's writes happen; the
// transaction that carried it is not affected). It is for writes that need
// not be durable before the caller goes on, such as the deliverer's record
// of a pass: they share a commit instead of paying one of their own. fn
// may run more than once (see Backend.Update) and must reset what it
// reports at its start; it must not block. A write that fails to commit
// waits for the next one. On a read-only ledger fn runs at once, in an
// Update that fails.
func (s *Ledger) Later(fn func(Tx) error, done func(error)) {
	select {
	case <-s.stop:
		done(ErrClosed)
		return
	default:
	}
	if s.readOnly {
		done(s.Update(context.Background(), fn))
		return
	}
	s.auditMu.Lock()
	s.laterBuf = append(s.laterBuf, laterWrite{fn: fn, done: done})
	s.buffered()
	s.auditMu.Unlock()
}

func (s *Ledger) takeAudit(laters bool) ([]AuditEntry, []laterWrite) {
	s.auditMu.Lock()
	defer s.auditMu.Unlock()
	b := s.auditBuf
	s.auditBuf = nil
	var l []laterWrite
	switch {
	case laters && s.journal && len(s.laterBuf) > 0:
		l, s.laterBuf = s.laterBuf[:1:1], s.laterBuf[1:]
	case laters:
		l, s.laterBuf = s.laterBuf, nil
	}
	if !s.unsealed && len(s.laterBuf) == 0 { // else the flush has work left
		s.bufSince = time.Time{}
	}
	return b, l
}

func (s *Ledger) restoreAudit(b []AuditEntry, l []laterWrite) {
	if len(b) == 0 && len(l) == 0 {
		return
	}
	s.auditMu.Lock()
	s.auditBuf = append(b, s.auditBuf...)
	s.laterBuf = append(l, s.laterBuf...)
	s.buffered()
	s.auditMu.Unlock()
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
	return decodeStored(tenant, key, v)
}

// decodeStored decodes v, the stored record of (tenant, key).
func decodeStored(tenant, key string, v []byte) (*Record, error) {
	r, err := DecodeRecord(v)
	if err != nil {
		return nil, fmt.Errorf("ledger: record %s/%s: %w", tenant, key, err)
	}
	return r, nil
}

func putRecord(tx *ltx, r *Record) error {
	v, err := EncodeRecord(r)
	if err != nil {
		return err
	}
	if !r.Fresh { // nobody watches a record before it exists
		tx.changed(r.Tenant, r.Key)
	}
	return tx.Bucket(bucketRecords).Put(recordKey(r.Tenant, r.Key), v)
}

// Expiry index values say which sweep action is due.
const (
	dueCompact      = 'r' // full record → tombstone (see scheduleCompact)
	dueDeleteTomb   = 't' // tombstone → deleted
	dueDeleteIssued = 'i' // issued key → forgotten
	dueApproval     = 'a' // pending approval → rejected (approval_expired)
)

// keyRetentionWalk is the meta key of the retention walk's place in
// by_time: the time index key of the last record it looked at (absent:
// it has looked at none). Every record under a key at or before it was
// either compacted, given its dueCompact entry, or not final then — and a
// record's completion writes the entry when its key is at or before this
// one (see scheduleCompact).
var keyRetentionWalk = []byte("retention_walk")

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

// Get implements Store. Due expiries (lease, approval, retention) are shown
// as they will be recorded, without writing.
func (s *Ledger) Get(ctx context.Context, tenant, key string) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rec *Record
	err := s.readCommitted(ctx, bucketRecords, recordKey(tenant, key), func(v []byte) error {
		if v == nil {
			return ErrNotFound
		}
		var err error
		rec, err = decodeStored(tenant, key, v)
		return err
	})
	if err != nil {
		return nil, err
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
