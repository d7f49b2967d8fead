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
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	bolt "go.etcd.io/bbolt"
)

// BoltStore is the embedded ledger: one bbolt file, shared safely by every
// process that opens it (see handle). Write transactions from concurrent
// goroutines are committed together (group commit: one fsync for many
// claims); reads never write, so a replay costs no fsync.
type BoltStore struct {
	opts     Options
	h        *handle
	owner    string // lease owner id of this process's claims
	path     string
	readOnly bool

	healthMu   sync.Mutex
	lastCommit commitResult // the newest commit's outcome (see Health)
	lastOK     time.Time    // when a commit last succeeded
	probeAt    time.Time    // when Health last probed, and its outcome
	probeErr   error

	gcMu      sync.Mutex
	gcQueue   []*gcJob
	gcRunning bool

	auditMu  sync.Mutex
	auditBuf []AuditEntry

	observed []AuditEntry // entries of the transaction being committed; only the commit leader touches it

	clock clockState

	stop chan struct{}
	done chan struct{}
}

var _ Store = (*BoltStore)(nil)

// auditFlushInterval bounds how long buffered replay and refusal audit
// entries wait for a write transaction to carry them.
const auditFlushInterval = 200 * time.Millisecond

// maxBatch bounds the claims committed in one transaction.
const maxBatch = 256

// OpenBolt opens the ledger file at path for reading and writing, creating
// a new ledger only where no file exists (the parent directory must
// exist). It refuses an empty file (ErrEmptyFile), a file that is not an
// idemgate ledger (ErrNotLedger) and a damaged one (ErrDamaged), each with
// one line naming the file and what to do. The file may be opened by
// several processes at once; each sees every other's committed writes.
func OpenBolt(path string, opts Options) (*BoltStore, error) {
	return openBolt(path, opts, openReadWrite, true, true)
}

// OpenBoltExisting is OpenBolt for an existing ledger only: where no file
// exists it returns ErrNoLedger and creates nothing (the commands that
// change a ledger but should never start one: approvals, resolve, outbox).
func OpenBoltExisting(path string, opts Options) (*BoltStore, error) {
	return openBolt(path, opts, openReadWrite, false, true)
}

// OpenBoltReadOnly opens an existing ledger for reading only: the file is
// opened O_RDONLY and never written (it may be read-only, in a read-only
// directory). Every write returns ErrReadOnly; audit entries of calls are
// dropped.
func OpenBoltReadOnly(path string, opts Options) (*BoltStore, error) {
	return openBolt(path, opts, openReadOnly, false, true)
}

// InitBolt creates a new, empty ledger at path. It never touches an
// existing file: where one exists (even an empty one) it returns ErrExists.
func InitBolt(path string) error {
	if _, err := os.Lstat(path); err == nil {
		return &fileError{kind: ErrExists, path: path, todo: "idemgate init never overwrites a file; remove it first if it should be replaced"}
	}
	if err := createLedger(path); err != nil {
		return err
	}
	s, err := OpenBolt(path, Options{})
	if err != nil {
		return err
	}
	return s.Close()
}

type openMode bool

const (
	openReadWrite openMode = false
	openReadOnly  openMode = true
)

// openBolt opens the store; deep runs the full page check at the first
// open (files up to deepCheckLimit).
func openBolt(path string, opts Options, mode openMode, mayCreate, deep bool) (*BoltStore, error) {
	if !mayCreate {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, noLedgerError(path) // before any lock file is created beside it
		}
	}
	s := &BoltStore{opts: opts.withDefaults(), owner: uuid.NewString(), stop: make(chan struct{}), done: make(chan struct{}), readOnly: mode == openReadOnly, path: path}
	h, err := newHandle(path, s.readOnly, mayCreate, func(db *bolt.DB, first bool) error { return openSchema(path, db, s.readOnly, first && deep) })
	if err != nil {
		return nil, err
	}
	s.h = h
	// Open once now so a bad path, a foreign file or a newer schema fails
	// here, not at the first tool call.
	if _, err := h.acquire(); err != nil {
		h.close()
		return nil, err
	}
	h.release()
	go s.flushLoop()
	return s, nil
}

// deepCheckLimit bounds the file size for which the first open in a
// process runs the full page check (deepCheck); bigger files get only the
// cheap checks at open, and "idemgate check" on demand.
const deepCheckLimit = 32 << 20

// createLedger writes a new ledger beside path and links it into place,
// so a ledger file either does not exist or is complete with its identity
// (a crash half-way leaves only a temporary file). It returns ErrExists if
// another process created path first.
func createLedger(path string) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	tmp, err := os.CreateTemp(dir, "."+base+".new-*")
	if err != nil {
		return fmt.Errorf("ledger: create %s: %w", path, err)
	}
	name := tmp.Name()
	tmp.Close()
	os.Remove(name) // bbolt initialises a file it creates itself
	defer os.Remove(name)
	db, err := bolt.Open(name, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return fmt.Errorf("ledger: create %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, name := range allBuckets {
			if _, err := tx.CreateBucketIfNotExists(name); err != nil {
				return err
			}
		}
		m := tx.Bucket(bucketMeta)
		if err := m.Put(keyMagic, []byte(ledgerMagic)); err != nil {
			return err
		}
		if err := m.Put(keyCreatedAt, []byte(time.Now().UTC().Format(time.RFC3339Nano))); err != nil {
			return err
		}
		return m.Put(keySchemaVersion, []byte(strconv.Itoa(boltSchemaVersion)))
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("ledger: create %s: %w", path, err)
	}
	if err := os.Link(name, path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return ErrExists
		}
		return fmt.Errorf("ledger: create %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync() // the new name is durable
		d.Close()
	}
	return nil
}

// openSchema runs at every open. It refuses a file that is not an idemgate
// ledger and a file of a newer schema version, and checks that the file's
// pages are sound: cheaply at every open (precheck ran before), and in
// full (deepCheck) at the first open of a file up to deepCheckLimit. A
// writable open adds the buckets of this build that the file lacks.
//
// A ledger is recognised by meta/magic, written when the file is created.
// Files created before the magic existed (schema version 1) are recognised
// by their exact shape: every top-level bucket is one of idemgate's, the
// core buckets exist, and the meta bucket holds schema_version "1" and
// nothing else. Anything else is another program's file, and nothing in it
// is changed.
func openSchema(path string, db *bolt.DB, readOnly, first bool) error {
	var (
		version  []byte
		magic    []byte
		missing  []string
		foreign  []string
		metaKeys int
		// unindexed: audit entries past the per-key index's watermark
		// (written by a build before the index, or by one sharing the file).
		unindexed bool
	)
	err := guard(path, func() error {
		return db.View(func(tx *bolt.Tx) error {
			if b := tx.Bucket(bucketMeta); b != nil {
				version = bytes.Clone(b.Get(keySchemaVersion))
				magic = bytes.Clone(b.Get(keyMagic))
				metaKeys = b.Stats().KeyN
			}
			for _, name := range allBuckets {
				if tx.Bucket(name) == nil {
					missing = append(missing, string(name))
				}
			}
			if b := tx.Bucket(bucketAudit); b != nil && tx.Bucket(bucketMeta) != nil {
				if k, _ := b.Cursor().Last(); len(k) == 8 && binary.BigEndian.Uint64(k) > auditIndexed(tx) {
					unindexed = true
				}
			}
			return tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
				if !slices.ContainsFunc(allBuckets, func(b []byte) bool { return bytes.Equal(b, name) }) && len(foreign) < 5 {
					foreign = append(foreign, strconv.Quote(string(name)))
				}
				return nil
			})
		})
	})
	if err != nil {
		return err
	}
	switch {
	case string(magic) == ledgerMagic:
	case magic != nil:
		return notLedgerError(path, fmt.Sprintf("its meta bucket holds magic %q", oneLine(string(magic), 40)))
	case len(foreign) > 0:
		return notLedgerError(path, "a bbolt file with buckets idemgate does not use: "+strings.Join(foreign, ", "))
	case version == nil:
		return notLedgerError(path, "a bbolt file without idemgate's identity")
	case string(version) == "1" && metaKeys == 1 && !slices.ContainsFunc(missing, func(m string) bool {
		return slices.Contains(legacyCore, m)
	}):
		// A ledger of the build before the magic: a writable open marks it,
		// so later builds (which may add keys to meta) still know it.
		if !readOnly {
			if err := guard(path, func() error {
				return db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(keyMagic, []byte(ledgerMagic)) })
			}); err != nil {
				return err
			}
		}
	case string(version) != "1" && metaKeys == 1:
		// schema version checked below
	default:
		return notLedgerError(path, "a bbolt file whose meta bucket is not idemgate's")
	}
	v, err := strconv.Atoi(string(version))
	if err != nil || v > boltSchemaVersion || v < 1 {
		return fmt.Errorf("%w: %s has %q, this build reads up to %d", ErrSchemaVersion, path, version, boltSchemaVersion)
	}
	if first {
		fi, err := os.Stat(path)
		if err != nil {
			return err
		}
		if fi.Size() <= deepCheckLimit {
			if problems := deepCheck(path, db, 1); len(problems) > 0 {
				return problems[0]
			}
		}
	}
	if len(missing) == 0 && !unindexed {
		return nil
	}
	if readOnly {
		// Readers cope without the per-key audit index (AuditForKey then
		// scans the log), so a file of the build before it is readable.
		missing = slices.DeleteFunc(missing, func(m string) bool { return m == string(bucketAuditByKey) })
		if len(missing) == 0 {
			return nil
		}
		return fmt.Errorf("ledger %s lacks the buckets %s (written by an older idemgate): open it once with idemgate serve to add them", path, strings.Join(missing, ", "))
	}
	// A ledger written before a bucket, or the per-key audit index, was
	// added.
	return guard(path, func() error {
		return db.Update(func(tx *bolt.Tx) error {
			for _, name := range allBuckets {
				if _, err := tx.CreateBucketIfNotExists(name); err != nil {
					return err
				}
			}
			if k, _ := tx.Bucket(bucketAudit).Cursor().Last(); len(k) == 8 {
				return indexAudit(tx, binary.BigEndian.Uint64(k))
			}
			return nil
		})
	})
}

// Close flushes buffered audit entries and closes the file.
func (s *BoltStore) Close() error {
	select {
	case <-s.stop:
		return nil
	default:
	}
	close(s.stop)
	<-s.done
	err := s.flushAudit()
	return errors.Join(err, s.h.close())
}

// flushLoop writes buffered audit entries every auditFlushInterval. It
// exits when Close is called.
func (s *BoltStore) flushLoop() {
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

func (s *BoltStore) flushAudit() error {
	if s.readOnly {
		return nil
	}
	s.auditMu.Lock()
	empty := len(s.auditBuf) == 0
	s.auditMu.Unlock()
	if empty {
		return nil
	}
	return s.update(func(*bolt.Tx) error { return nil }) // commit carries the buffer
}

// Audit buffers e; it is written with the next write transaction, within
// auditFlushInterval. Used for calls that change nothing (replays,
// refusals, reads).
func (s *BoltStore) Audit(e AuditEntry) {
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

func (s *BoltStore) takeAudit() []AuditEntry {
	s.auditMu.Lock()
	defer s.auditMu.Unlock()
	b := s.auditBuf
	s.auditBuf = nil
	return b
}

func (s *BoltStore) restoreAudit(b []AuditEntry) {
	if len(b) == 0 {
		return
	}
	s.auditMu.Lock()
	s.auditBuf = append(b, s.auditBuf...)
	s.auditMu.Unlock()
}

// view runs fn in a read-only transaction. A fault or a bbolt panic on a
// damaged page is returned as ErrDamaged (see guard), never a crash.
func (s *BoltStore) view(fn func(*bolt.Tx) error) error {
	db, err := s.h.acquire()
	if err != nil {
		return err
	}
	defer s.h.release()
	err = guard(s.path, func() error { return db.View(fn) })
	if errors.Is(err, ErrDamaged) {
		s.h.damaged()
	}
	return err
}

type gcJob struct {
	fn       func(*bolt.Tx) error
	err      error
	panicked any
	wake     chan bool // false: done; true: lead the next batch
}

// run calls j.fn, turning a panic into an error so the batch is rolled
// back and the lead is handed over; update re-panics in j's caller. A
// panic raised by bbolt on a damaged page (or a fault on the mapped file)
// is not re-raised: it is the error ErrDamaged.
func (j *gcJob) run(tx *bolt.Tx, path string) (err error) {
	j.panicked = nil // a re-run alone may succeed where the batch panicked
	defer func() {
		if r := recover(); r != nil {
			if isDamagePanic(r) {
				err = damagedError(path, fmt.Sprint(r))
				return
			}
			j.panicked = r
			err = fmt.Errorf("ledger: panic in transaction: %v", r)
		}
	}()
	return j.fn(tx)
}

// errBatchRetry marks a batch that failed because one of its functions did;
// each function is then run in a transaction of its own.
var errBatchRetry = errors.New("ledger: batch member failed")

// update runs fn in a read-write transaction, committed together with the
// functions of concurrent callers (one fsync for all). fn may be run twice:
// if another member of its batch fails, every member is re-run alone, so fn
// must reset whatever it reports at its start. The first caller to find no
// commit running leads; when its batch is committed it hands the lead to the
// next waiter, so no caller waits for more than one commit beyond its own.
func (s *BoltStore) update(fn func(*bolt.Tx) error) error {
	if s.readOnly {
		return ErrReadOnly
	}
	j := &gcJob{fn: fn, wake: make(chan bool, 1)}
	s.gcMu.Lock()
	s.gcQueue = append(s.gcQueue, j)
	if s.gcRunning {
		s.gcMu.Unlock()
		if lead := <-j.wake; !lead {
			if j.panicked != nil {
				panic(j.panicked)
			}
			return j.err
		}
		s.gcMu.Lock()
	} else {
		s.gcRunning = true
	}
	n := min(len(s.gcQueue), maxBatch)
	batch := s.gcQueue[:n:n]
	s.gcQueue = append([]*gcJob(nil), s.gcQueue[n:]...)
	s.gcMu.Unlock()

	s.commit(batch)

	for _, b := range batch[1:] { // batch[0] is j
		b.wake <- false
	}
	s.gcMu.Lock()
	if len(s.gcQueue) > 0 {
		s.gcQueue[0].wake <- true
	} else {
		s.gcRunning = false
	}
	s.gcMu.Unlock()
	if j.panicked != nil {
		panic(j.panicked)
	}
	return j.err
}

func (s *BoltStore) commit(batch []*gcJob) {
	db, err := s.h.acquire()
	if err != nil {
		for _, b := range batch {
			b.err = err
		}
		s.noteCommit(err)
		return
	}
	defer s.h.release()
	audits := s.takeAudit()
	s.observed = s.observed[:0]
	err = s.guardedUpdate(db, func(tx *bolt.Tx) error {
		if err := appendAudit(tx, audits...); err != nil {
			return err
		}
		for _, b := range batch {
			if b.err = b.run(tx, s.path); b.err != nil {
				return errBatchRetry
			}
		}
		return nil
	})
	if !errors.Is(err, errBatchRetry) {
		s.noteCommit(err)
	}
	switch {
	case err == nil:
		s.observe()
		return
	case !errors.Is(err, errBatchRetry):
		for _, b := range batch {
			b.err = err
		}
		s.restoreAudit(audits)
		return
	case len(batch) == 1:
		s.restoreAudit(audits)
		return // b.err holds fn's own error
	}
	for _, b := range batch {
		var carried []AuditEntry
		carried, audits = audits, nil
		s.observed = s.observed[:0]
		fnFailed := false
		b.err = s.guardedUpdate(db, func(tx *bolt.Tx) error {
			if err := appendAudit(tx, carried...); err != nil {
				return err
			}
			err := b.run(tx, s.path)
			fnFailed = err != nil && !errors.Is(err, ErrDamaged)
			return err
		})
		if !fnFailed { // fn's own error (a refusal) is not a failed commit
			s.noteCommit(b.err)
		}
		if b.err != nil {
			audits = carried
		} else {
			s.observe()
		}
	}
	s.restoreAudit(audits)
}

// guardedUpdate runs db.Update under guard: a fault or a bbolt panic on a
// damaged page becomes ErrDamaged and the file is checked again at its
// next open.
func (s *BoltStore) guardedUpdate(db *bolt.DB, fn func(*bolt.Tx) error) error {
	err := guard(s.path, func() error { return db.Update(fn) })
	if errors.Is(err, ErrDamaged) {
		s.h.damaged()
	}
	return err
}

// appendObserved appends entries written by a transition; Options.Observe
// sees them once their transaction has committed. The caller holds tx,
// inside commit.
func (s *BoltStore) appendObserved(tx *bolt.Tx, entries ...AuditEntry) error {
	if err := appendAudit(tx, entries...); err != nil {
		return err
	}
	if s.opts.Observe != nil {
		s.observed = append(s.observed, entries...)
	}
	return nil
}

// observe hands the entries of a committed transaction to Options.Observe.
func (s *BoltStore) observe() {
	if s.opts.Observe != nil {
		for _, e := range s.observed {
			s.opts.Observe(e)
		}
	}
	s.observed = s.observed[:0]
}

// appendAudit adds entries to the hash chain and to the per-key index;
// the caller holds tx.
func appendAudit(tx *bolt.Tx, entries ...AuditEntry) error {
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
func auditIndexed(tx *bolt.Tx) uint64 {
	if v := tx.Bucket(bucketMeta).Get(keyAuditIndexed); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

// indexAudit adds the entries after the index's watermark, up to through,
// to the per-key index and moves the watermark; the caller holds tx.
func indexAudit(tx *bolt.Tx, through uint64) error {
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

func be64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func recordKey(tenant, key string) []byte { return []byte(tenant + "\x00" + key) }

func timeKey(t time.Time, tenant, key string) []byte {
	return append(be64(uint64(t.UnixNano())), recordKey(tenant, key)...)
}

func getRecord(tx *bolt.Tx, tenant, key string) (*Record, error) {
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

func putRecord(tx *bolt.Tx, r *Record) error {
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
func (s *BoltStore) Execute(ctx context.Context, c Claim, apply ApplyFunc) (Decision, error) {
	return s.claim(ctx, c, apply)
}

// Claim implements Store.
func (s *BoltStore) Claim(ctx context.Context, c Claim) (Decision, error) {
	return s.claim(ctx, c, nil)
}

func (s *BoltStore) claim(ctx context.Context, c Claim, apply ApplyFunc) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	// Fast path: an existing record that only needs an answer is read with
	// a read-only transaction (no fsync); its audit entry is buffered.
	var d Decision
	var answered bool
	err := s.view(func(tx *bolt.Tx) error {
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
	err = s.update(func(tx *bolt.Tx) error {
		var err error
		d, err = s.claimLocked(tx, c, apply)
		return err
	})
	return d, err
}

func (s *BoltStore) answer(rec *Record, kind DecisionKind) Decision {
	if kind == DecisionExpired {
		rec = tombstone(rec)
	}
	return Decision{Kind: kind, Record: rec}
}

func (s *BoltStore) callEntry(c Claim, d Decision) AuditEntry {
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
func (s *BoltStore) claimLocked(tx *bolt.Tx, c Claim, apply ApplyFunc) (Decision, error) {
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
			if err := s.saveNew(tx, c.Actor, rec, "held: "+rec.Approval.Rule, now, c.policyOf); err != nil {
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
		if err := s.saveTransition(tx, c.Actor, rec, before, "claimed", now, c.policyOf); err != nil {
			return Decision{}, err
		}
		return Decision{Kind: DecisionClaimed, Record: rec}, nil
	}
	out, err := apply(&boltTx{tx: tx, now: now}, rec)
	if err != nil {
		return Decision{}, err
	}
	claimed := transitionEntry(now, c.Actor, rec, before, "claimed")
	c.policyOf(&claimed)
	if err := s.appendObserved(tx, claimed); err != nil {
		return Decision{}, err
	}
	s.finish(rec, out, now)
	if err := s.saveTransition(tx, c.Actor, rec, StateInProgress, "executed", now, c.policyOf, withCall(out.Call)); err != nil {
		return Decision{}, err
	}
	return Decision{Kind: DecisionExecuted, Record: rec}, nil
}

// holdSuspect creates an awaiting_approval record when c's fingerprint
// matches a recent operation of the tenant under another key.
func (s *BoltStore) holdSuspect(tx *bolt.Tx, c Claim, now time.Time) (Decision, bool, error) {
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
	if err := s.saveNew(tx, c.Actor, rec, "suspected_duplicate of "+fe.Key, now, c.policyOf); err != nil {
		return Decision{}, false, err
	}
	return Decision{Kind: DecisionSuspectedDuplicate, Record: rec, Earlier: earlier}, true, nil
}

// heldRecord builds the awaiting_approval record of c. A non-empty
// earlierKey marks a suspected duplicate of that key.
func (s *BoltStore) heldRecord(c Claim, now time.Time, earlierKey string) *Record {
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
func (s *BoltStore) saveNew(tx *bolt.Tx, a Actor, rec *Record, why string, now time.Time, more ...func(*AuditEntry)) error {
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
func (s *BoltStore) finish(rec *Record, out Outcome, now time.Time) {
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
func (s *BoltStore) saveTransition(tx *bolt.Tx, a Actor, rec *Record, before State, why string, now time.Time, more ...func(*AuditEntry)) error {
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
func indexOpen(tx *bolt.Tx, rec *Record) error {
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
func (s *BoltStore) OpenRecords(ctx context.Context, st State, after string, limit int) ([]*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	var out []*Record
	err := s.view(func(tx *bolt.Tx) error {
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
func (s *BoltStore) ExpireLeases(ctx context.Context) (int, error) {
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
		err := s.update(func(tx *bolt.Tx) error {
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
			if why != "lease_expired" {
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
func (s *BoltStore) Settle(ctx context.Context, r SettleRequest) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rec *Record
	err := s.update(func(tx *bolt.Tx) error {
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
		if prev, why := s.opts.expireTransition(rec, now, high); why == "lease_expired" {
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
				if err := r.Outcome.Also(&boltTx{tx: tx, now: now}); err != nil {
					return err
				}
			}
		}
		return s.saveTransition(tx, r.Actor, rec, before, r.Why, now, withCall(r.Outcome.Call))
	})
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// Decide implements Store.
func (s *BoltStore) Decide(ctx context.Context, r DecideRequest, apply ApplyFunc) (Decision, error) {
	if err := ctx.Err(); err != nil {
		return Decision{}, err
	}
	var d Decision
	err := s.update(func(tx *bolt.Tx) error {
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

func (s *BoltStore) decideLocked(tx *bolt.Tx, r DecideRequest, apply ApplyFunc) (Decision, error) {
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
	if prev, why := s.opts.expireTransition(rec, now, high); why == "approval_expired" {
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
		if err := s.saveTransition(tx, r.Approver, rec, StateAwaitingApproval, "rejected by "+r.Approver.Principal, now); err != nil {
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
		if err := s.saveTransition(tx, r.Approver, rec, StateAwaitingApproval, "approved by "+r.Approver.Principal, now); err != nil {
			return Decision{}, err
		}
		return Decision{Kind: DecisionClaimed, Record: rec}, nil
	}
	out, err := apply(&boltTx{tx: tx, now: now}, rec)
	if err != nil {
		return Decision{}, err
	}
	if err := s.appendObserved(tx, transitionEntry(now, r.Approver, rec, StateAwaitingApproval, "approved by "+r.Approver.Principal)); err != nil {
		return Decision{}, err
	}
	s.finish(rec, out, now)
	if err := s.saveTransition(tx, r.Approver, rec, StateInProgress, "executed after approval", now, withCall(out.Call)); err != nil {
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
func (s *BoltStore) PendingApprovals(ctx context.Context, tenant, after string, limit int) ([]*Record, error) {
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
	err := s.view(func(tx *bolt.Tx) error {
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
func (s *BoltStore) ApprovalRecord(ctx context.Context, tenant, approvalID string) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rec *Record
	err := s.view(func(tx *bolt.Tx) error {
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
func (s *BoltStore) Complete(ctx context.Context, a Actor, key string, gen uint64, out Outcome) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rec *Record
	err := s.update(func(tx *bolt.Tx) error {
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
			if err := out.Also(&boltTx{tx: tx, now: now}); err != nil {
				return err
			}
		}
		return s.saveTransition(tx, a, rec, StateInProgress, "completed", now, withCall(out.Call))
	})
	if err != nil {
		return nil, err
	}
	return rec, nil
}

// RenewLease implements Store.
func (s *BoltStore) RenewLease(ctx context.Context, tenant, key string, gen uint64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
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
func (s *BoltStore) Get(ctx context.Context, tenant, key string) (*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var rec *Record
	err := s.view(func(tx *bolt.Tx) error {
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

func (s *BoltStore) present(rec *Record) *Record {
	now := s.opts.Now()
	s.opts.expireTransition(rec, now, s.highWater())
	if s.opts.expired(rec, now) {
		return tombstone(rec)
	}
	return rec
}

// List implements Store.
func (s *BoltStore) List(ctx context.Context, f Filter) ([]*Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if f.Limit <= 0 {
		f.Limit = 100
	}
	var out []*Record
	err := s.view(func(tx *bolt.Tx) error {
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
func (s *BoltStore) IssueKey(ctx context.Context, tenant, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error {
		now := s.opts.Now()
		if err := tx.Bucket(bucketIssued).Put(recordKey(tenant, key), be64(uint64(now.UnixNano()))); err != nil {
			return err
		}
		return tx.Bucket(bucketExpiry).Put(dueKey(now.Add(s.opts.Retention), dueDeleteIssued, tenant, key), []byte{dueDeleteIssued})
	})
}

// View implements Store.
func (s *BoltStore) View(ctx context.Context, fn func(Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.view(func(tx *bolt.Tx) error { return fn(&boltTx{tx: tx, now: s.opts.Now()}) })
}

// Update implements Store.
func (s *BoltStore) Update(ctx context.Context, fn func(Tx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.update(func(tx *bolt.Tx) error { return fn(&boltTx{tx: tx, now: s.opts.Now()}) })
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
func (s *BoltStore) Sweep(ctx context.Context) (compacted, deleted int, err error) {
	for {
		if err := ctx.Err(); err != nil {
			return compacted, deleted, err
		}
		var c, d int
		var more bool
		err := s.update(func(tx *bolt.Tx) error {
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
						Decision: "tombstone deleted after retention; the key is free", Detail: "incarnation " + rec.Incarnation})
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

func (s *BoltStore) deleteRecordLocked(tx *bolt.Tx, rec *Record) error {
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
func (s *BoltStore) AuditLog(ctx context.Context, after uint64, limit int) ([]AuditEntry, error) {
	if err := s.flushAudit(); err != nil {
		return nil, err
	}
	var out []AuditEntry
	err := s.view(func(tx *bolt.Tx) error {
		if after == math.MaxUint64 {
			return nil // nothing follows; after+1 would wrap to the start
		}
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
func (s *BoltStore) AuditTail(ctx context.Context, n int) ([]AuditEntry, error) {
	if err := s.flushAudit(); err != nil {
		return nil, err
	}
	var out []AuditEntry
	err := s.view(func(tx *bolt.Tx) error {
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
func (s *BoltStore) AuditForKey(ctx context.Context, tenant, key string, limit int) ([]AuditEntry, int, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	if err := s.flushAudit(); err != nil {
		return nil, 0, err
	}
	var out []AuditEntry
	total := 0
	err := s.view(func(tx *bolt.Tx) error {
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
func (s *BoltStore) VerifyAudit(ctx context.Context) (int, error) {
	n := 0
	prev := ""
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketAudit).ForEach(func(k, v []byte) error {
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
			return nil
		})
	})
	return n, err
}

// boltTx adapts a bbolt transaction to Tx.
type boltTx struct {
	tx  *bolt.Tx
	now time.Time
}

func (t *boltTx) Now() time.Time { return t.now }

func (t *boltTx) bucket(collection string, create bool) (*bolt.Bucket, error) {
	data := t.tx.Bucket(bucketData)
	if b := data.Bucket([]byte(collection)); b != nil || !create {
		return b, nil
	}
	return data.CreateBucket([]byte(collection))
}

func (t *boltTx) Get(collection, key string) ([]byte, error) {
	b, err := t.bucket(collection, false)
	if b == nil || err != nil {
		return nil, err
	}
	return b.Get([]byte(key)), nil
}

func (t *boltTx) Put(collection, key string, value []byte) error {
	b, err := t.bucket(collection, true)
	if err != nil {
		return err
	}
	return b.Put([]byte(key), value)
}

func (t *boltTx) Delete(collection, key string) error {
	b, err := t.bucket(collection, false)
	if b == nil || err != nil {
		return err
	}
	return b.Delete([]byte(key))
}

func (t *boltTx) Scan(collection, prefix string, reverse bool, fn func(key string, value []byte) (bool, error)) error {
	b, err := t.bucket(collection, false)
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
func seekLast(c *bolt.Cursor, p []byte) ([]byte, []byte) {
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

func (s *BoltStore) highWater() time.Time {
	s.clock.mu.Lock()
	defer s.clock.mu.Unlock()
	return s.clock.high
}

func getTime(b *bolt.Bucket, k []byte) time.Time {
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
func (s *BoltStore) ledgerTime(tx *bolt.Tx) (now, high, trusted time.Time, err error) {
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
