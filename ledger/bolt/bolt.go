// Package bolt is the ledger's bbolt backend: one file, opened by one
// process at a time. It keeps the ledger's collections as bbolt buckets
// (see schema.go), commits concurrent writers' transactions together
// (group commit: one fsync for many claims), and refuses a file another
// process has open (ErrLocked), as well as empty, foreign and damaged
// files, with one actionable line. The rules are in package ledger; this
// package stores bytes.
//
// bbolt's own lock (flock on the ledger file) is the only lock: exclusive
// for a writable open, shared for a read-only one, held from open to
// Close. Processes that serve one ledger together do so through one
// process that owns the file (package owner), at the level of tool calls.
package bolt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	bbolt "go.etcd.io/bbolt"
	bolterr "go.etcd.io/bbolt/errors"

	"idemgate/ledger"
)

// File is a ledger kept in one bbolt file: the ledger's rules
// (ledger.Ledger, which implements ledger.Store) over this package's
// backend. Write transactions from concurrent goroutines are committed
// together; reads never write, so a replay costs no fsync.
type File struct {
	*ledger.Ledger
	be *backend
}

// backend implements ledger.Backend on a bbolt file held open from open
// to Close.
type backend struct {
	db       *bbolt.DB
	path     string
	file     os.FileInfo // the file opened, to see it removed or replaced (see commit)
	readOnly bool
	deep     int64 // open's deepLimit: damaged checks a file this small in full

	mu     sync.Mutex
	cond   *sync.Cond
	active int   // transactions running (Close waits for them)
	closed bool  // after Close, every transaction is ErrClosed
	broken error // a damage found in full after a transaction met it: every transaction fails with it

	healthMu   sync.Mutex
	lastCommit commitResult // the newest commit's outcome (see Health)
	lastOK     time.Time    // when a commit last succeeded
	failed     commitResult // the newest failed commit that no commit as large has followed (zero: none)
	probeAt    time.Time    // when Health last probed, and its outcome
	probeErr   error

	gcMu      sync.Mutex
	gcQueue   []*gcJob // waiting to be committed, in order
	bgQueue   []*gcJob // background functions waiting, each to be committed alone
	gcRunning bool

	statsMu sync.Mutex
	stats   CommitStats
}

// CommitStats counts this process's commits of a ledger file: the
// read-write transactions committed, the transaction functions they
// committed (Functions/Commits is the group commit's batch size), the
// pages they wrote (bbolt's write count: one per page or run of overflow
// pages, the freelist and the meta page included) and the time their
// writes took (bbolt's write time: the pages written, fdatasync, the meta
// page written, fdatasync again). Tests pin the pages a create costs with
// it.
//
// BehindBackground counts the transaction functions that waited for a
// background transaction (the retention sweep's, see update) to commit,
// and BehindBackgroundMax is the longest of those waits: from when the
// function was queued, or the background transaction began if that was
// later, to the background transaction's end. It is the wait a claim
// owes to a sweep, per transaction (a claim and its completion are two).
type CommitStats struct {
	Commits    int64
	Functions  int64
	PageWrites int64
	WriteTime  time.Duration

	BehindBackground    int64
	BehindBackgroundMax time.Duration
}

// CommitStats returns what f's commits wrote so far.
func (f *File) CommitStats() CommitStats { return f.be.commitStats() }

func (s *backend) commitStats() CommitStats {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	return s.stats
}

var (
	_ ledger.Backend        = (*backend)(nil)
	_ ledger.HealthReporter = (*backend)(nil)
)

// maxBatch bounds the claims committed in one transaction.
const maxBatch = 256

// ErrLocked is returned by Open, OpenExisting, OpenReadOnly and Compact
// when another process has the ledger file open (for writing; or at all,
// for a writable open) for longer than the open waits (see Wait).
var ErrLocked = errors.New("the ledger file is open in another process")

// DefaultWait is how long an open waits for a file another process has
// open, unless told otherwise (Wait): long enough for a process that is
// closing the file, short enough for a command at the terminal.
const DefaultWait = time.Second

// An OpenOption changes how Open, OpenExisting and OpenReadOnly open the
// file.
type OpenOption func(*openOptions)

type openOptions struct{ wait time.Duration }

// Wait bounds how long the open waits while another process has the
// file open, before it returns ErrLocked (default DefaultWait). A
// process that takes over a ledger from one that may still be finishing
// its calls (a new owner after the old one) waits longer: 30 s, say.
func Wait(d time.Duration) OpenOption { return func(o *openOptions) { o.wait = d } }

// Open opens the ledger file at path for reading and writing, creating
// a new ledger only where no file exists (the parent directory must
// exist). It refuses an empty file (ErrEmptyFile), a file that is not an
// idemgate ledger (ErrNotLedger), a damaged one (ErrDamaged) and one that
// another process has open (ErrLocked), each with one line naming the
// file and what to do. The file stays open, and locked against every
// other process, until Close.
func Open(path string, opts ledger.Options, o ...OpenOption) (*File, error) {
	return open(path, opts, openReadWrite, true, deepCheckLimit, o...)
}

// OpenExisting is Open for an existing ledger only: where no file
// exists it returns ErrNoLedger and creates nothing (the commands that
// change a ledger but should never start one: approvals, resolve, outbox).
func OpenExisting(path string, opts ledger.Options, o ...OpenOption) (*File, error) {
	return open(path, opts, openReadWrite, false, deepCheckLimit, o...)
}

// OpenReadOnly opens an existing ledger for reading only: the file is
// opened O_RDONLY and never written (it may be read-only, in a read-only
// directory). Every write returns ErrReadOnly; audit entries of calls are
// dropped. Read-only opens share the file with each other, not with a
// writable one (ErrLocked).
func OpenReadOnly(path string, opts ledger.Options, o ...OpenOption) (*File, error) {
	return open(path, opts, openReadOnly, false, deepCheckLimit, o...)
}

// Init creates a new, empty ledger at path. It never touches an
// existing file: where one exists (even an empty one) it returns ErrExists.
func Init(path string) error {
	if _, err := os.Lstat(path); err == nil {
		return &fileError{kind: ErrExists, path: path, todo: "idemgate init never overwrites a file; remove it first if it should be replaced"}
	}
	if err := createLedger(path); err != nil {
		return err
	}
	s, err := Open(path, ledger.Options{})
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

// open opens the store. It runs the full page check (deepCheck) when the
// file is at most deepLimit bytes (0: never); the exported openers pass
// deepCheckLimit, and tests a limit of their own.
func open(path string, opts ledger.Options, mode openMode, mayCreate bool, deepLimit int64, o ...OpenOption) (*File, error) {
	be, err := openBackend(path, mode, mayCreate, deepLimit, o...)
	if err != nil {
		return nil, err
	}
	return &File{Ledger: ledger.New(be, opts), be: be}, nil
}

// openBackend opens the file as a ledger.Backend (open puts the ledger on
// it); deepLimit is open's.
func openBackend(path string, mode openMode, mayCreate bool, deepLimit int64, o ...OpenOption) (*backend, error) {
	oo := openOptions{wait: DefaultWait}
	for _, f := range o {
		f(&oo)
	}
	readOnly := mode == openReadOnly
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		if !mayCreate {
			return nil, noLedgerError(path)
		}
		if err := createLedger(path); err != nil && !errors.Is(err, ErrExists) {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	db, fi, err := openDB(path, readOnly, oo.wait, lockedTodo)
	if err != nil {
		return nil, err
	}
	if err := openSchema(path, db, readOnly, deepLimit); err != nil {
		db.Close()
		return nil, err
	}
	be := &backend{db: db, path: path, file: fi, readOnly: readOnly, deep: deepLimit}
	be.cond = sync.NewCond(&be.mu)
	return be, nil
}

// lockedTodo is what to do about a ledger another process has open.
const lockedTodo = "one process at a time opens a ledger file: stop the other process (an idemgate serve --own-ledger, an idemgate compact, or the ledger's owner, idemgate __owner), or run the command through the owner"

// lockedError is ErrLocked naming path, how long the open waited and
// what to do (todo).
func lockedError(path string, wait time.Duration, todo string) error {
	return &fileError{kind: ErrLocked, path: path, detail: "waited " + wait.String(), todo: todo}
}

// lockPoll is how often a waiting open tries the lock again.
const lockPoll = 10 * time.Millisecond

// lockFile opens the existing file at path and locks it, shared for a
// read-only open and exclusive otherwise, waiting up to wait (then
// ErrLocked, with todo). The lock is bbolt's own: bbolt locks the same
// descriptor again when it opens the file, which does not wait. When the
// name was given to a new file while this waited (compact swaps one in),
// the new file is opened and locked instead.
func lockFile(path string, readOnly bool, wait time.Duration, todo string) (*os.File, error) {
	flag, how := os.O_RDWR, syscall.LOCK_EX
	if readOnly {
		flag, how = os.O_RDONLY, syscall.LOCK_SH
	}
	deadline := time.Now().Add(wait)
	for {
		f, err := os.OpenFile(path, flag, 0)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, noLedgerError(path)
		}
		if err != nil {
			return nil, err
		}
		for {
			err = flock(f, how|syscall.LOCK_NB)
			if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
				break
			}
			time.Sleep(lockPoll)
		}
		if err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, lockedError(path, wait, todo)
			}
			return nil, fmt.Errorf("ledger: lock %s: %w", path, err)
		}
		held, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		if now, err := os.Stat(path); err == nil && os.SameFile(held, now) {
			return f, nil
		}
		f.Close()
	}
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// openDB opens the existing ledger file at path with bbolt, once it holds
// the file's lock (lockFile, with wait and todo), and after checking the
// file before bbolt maps it (precheck). It returns the file's identity
// too (os.SameFile), and turns bbolt's refusals of a file into
// ErrNotLedger and ErrDamaged.
//
// The freelist stays synced (no NoFreelistSync): that would save one page
// of a commit's thirty-odd, but every open of a file written so then
// rebuilds the freelist by reading every page of the file (170 ms
// measured for a ledger of 100 000 creates, 600 MB; proportionally more
// at a million).
func openDB(path string, readOnly bool, wait time.Duration, todo string) (*bbolt.DB, os.FileInfo, error) {
	var (
		file *os.File
		fi   os.FileInfo
	)
	opts := &bbolt.Options{Timeout: time.Second, ReadOnly: readOnly, PreLoadFreelist: true,
		OpenFile: func(name string, _ int, _ os.FileMode) (*os.File, error) {
			f, err := lockFile(name, readOnly, wait, todo)
			if err != nil {
				return nil, err
			}
			if err := precheck(name); err != nil {
				f.Close()
				return nil, err
			}
			if fi, err = f.Stat(); err != nil {
				f.Close()
				return nil, err
			}
			file = f
			return f, nil
		}}
	var db *bbolt.DB
	err := guard(path, func() error {
		var err error
		db, err = bbolt.Open(path, 0o600, opts)
		return err
	})
	if err == nil {
		return db, fi, nil
	}
	if db == nil && file != nil {
		file.Close() // bbolt panicked half-way: release the lock
	}
	var fe *fileError
	switch {
	case errors.As(err, &fe):
		return nil, nil, err
	case errors.Is(err, bolterr.ErrInvalid) || errors.Is(err, bolterr.ErrVersionMismatch):
		return nil, nil, notLedgerError(path, err.Error())
	case errors.Is(err, bolterr.ErrChecksum):
		return nil, nil, damagedError(path, err.Error())
	}
	return nil, nil, fmt.Errorf("ledger: open %s: %w", path, err)
}

// deepCheckLimit bounds the file size for which the first open in a
// process runs the full page check (deepCheck); bigger files get only the
// cheap checks at open, and "idemgate check" on demand. Damage in a page
// the cheap checks do not read is then found by the transaction that
// reads it: see guard for what that transaction and the others get.
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
	db, err := bbolt.Open(name, 0o600, &bbolt.Options{Timeout: time.Second})
	if err != nil {
		return fmt.Errorf("ledger: create %s: %w", path, err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
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
// ledger (no meta/magic, or buckets idemgate does not use) and a file of
// another schema version, and checks that the file's pages are sound:
// cheaply at every open (precheck ran before), and in full (deepCheck)
// when the file is at most deepLimit bytes (the first open of a file
// passes deepCheckLimit, later ones 0). Then the one migration step: a
// writable open adds the buckets of this build that the file lacks, and
// indexes audit entries past the per-key index's watermark
// (ledger.Upgrade), in one transaction.
func openSchema(path string, db *bbolt.DB, readOnly bool, deepLimit int64) error {
	var (
		version   []byte
		magic     []byte
		missing   []string
		foreign   []string
		unindexed bool
	)
	err := guard(path, func() error {
		return db.View(func(tx *bbolt.Tx) error {
			if b := tx.Bucket(bucketMeta); b != nil {
				version = bytes.Clone(b.Get(keySchemaVersion))
				magic = bytes.Clone(b.Get(keyMagic))
			}
			for _, name := range allBuckets {
				if tx.Bucket(name) == nil {
					missing = append(missing, string(name))
				}
			}
			unindexed = ledger.AuditUnindexed(btx{tx})
			return tx.ForEach(func(name []byte, _ *bbolt.Bucket) error {
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
	case len(foreign) > 0:
		return notLedgerError(path, "a bbolt file with buckets idemgate does not use: "+strings.Join(foreign, ", "))
	case magic == nil:
		return notLedgerError(path, "a bbolt file without idemgate's identity")
	case string(magic) != ledgerMagic:
		return notLedgerError(path, fmt.Sprintf("its meta bucket holds magic %q", oneLine(string(magic), 40)))
	}
	if v, err := strconv.Atoi(string(version)); err != nil || v > boltSchemaVersion || v < 1 {
		return fmt.Errorf("%w: %s has %q, this build reads version %d: run a newer idemgate", ledger.ErrSchemaVersion, path, oneLine(string(version), 40), boltSchemaVersion)
	} else if v < boltSchemaVersion {
		return fmt.Errorf("%w: %s has version %d, written by a development build before the format was reset; this build reads version %d only: create a new ledger with \"idemgate init --db NEWPATH\"", ledger.ErrSchemaVersion, path, v, boltSchemaVersion)
	}
	if deepLimit > 0 {
		fi, err := os.Stat(path)
		if err != nil {
			return err
		}
		if fi.Size() <= deepLimit {
			if problems := deepCheck(path, db, 1); len(problems) > 0 {
				return problems[0]
			}
		}
	}
	if len(missing) == 0 && !unindexed {
		return nil
	}
	if readOnly {
		// Readers cope without the per-key audit index's newest entries
		// (AuditForKey then scans the log).
		if len(missing) == 0 {
			return nil
		}
		return fmt.Errorf("ledger %s lacks the buckets %s (written by an older idemgate): open it once with idemgate serve to add them", path, strings.Join(missing, ", "))
	}
	return guard(path, func() error {
		return db.Update(func(tx *bbolt.Tx) error {
			for _, name := range allBuckets {
				if _, err := tx.CreateBucketIfNotExists(name); err != nil {
					return err
				}
			}
			return ledger.Upgrade(btx{tx})
		})
	})
}

// acquire returns the database for one transaction, or why there is
// none (ErrClosed, a damage found in full); the caller calls release
// once the transaction has ended.
func (s *backend) acquire() (*bbolt.DB, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, ledger.ErrClosed
	case s.broken != nil:
		return nil, s.broken
	}
	s.active++
	return s.db, nil
}

func (s *backend) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.active--; s.active == 0 {
		s.cond.Broadcast() // wakes Close
	}
}

// damaged runs after a transaction met a damaged page (ErrDamaged): a
// file within open's deepLimit is then checked in full, as an open is,
// and when that finds the damage every later transaction fails with it;
// a bigger file is served as before, each transaction that reaches the
// page failing alike.
func (s *backend) damaged() {
	fi, err := os.Stat(s.path)
	if err != nil || fi.Size() > s.deep {
		return
	}
	found := precheck(s.path)
	if found == nil {
		if problems := deepCheck(s.path, s.db, 1); len(problems) > 0 {
			found = problems[0]
		}
	}
	if found != nil {
		s.mu.Lock()
		s.broken = found
		s.mu.Unlock()
	}
}

func (s *backend) view(fn func(*bbolt.Tx) error) error {
	db, err := s.acquire()
	if err != nil {
		return err
	}
	defer s.release()
	err = guard(s.path, func() error { return db.View(fn) })
	if errors.Is(err, ErrDamaged) {
		s.damaged()
	}
	return err
}

type gcJob struct {
	queued   time.Time
	fn       func(*bbolt.Tx) error
	err      error
	panicked any
	wake     chan bool // false: done; true: lead the next batch
}

// run calls j.fn, turning a panic into an error so the batch is rolled
// back and the lead is handed over; update re-panics in j's caller. A
// panic raised by bbolt on a damaged page (or a fault on the mapped file)
// is not re-raised: it is the error ErrDamaged.
func (j *gcJob) run(tx *bbolt.Tx, path string) (err error) {
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
//
// A background fn (the retention sweep's, see ledger.Background) is
// committed alone, and leads only when no other caller waits: a claim
// shares no batch with it and waits for at most the one background
// transaction in progress. When callers waited for it, its Update returns
// only after as long again as it took, so background work takes at most
// half of the writer while claims are made.
func (s *backend) update(fn func(*bbolt.Tx) error, background bool) error {
	if s.readOnly {
		return ErrReadOnly
	}
	j := &gcJob{queued: time.Now(), fn: fn, wake: make(chan bool, 1)}
	s.gcMu.Lock()
	if background {
		s.bgQueue = append(s.bgQueue, j)
	} else {
		s.gcQueue = append(s.gcQueue, j)
	}
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
	// j leads: it is the first of its queue.
	var batch []*gcJob
	if background {
		batch = []*gcJob{j}
		s.bgQueue = append([]*gcJob(nil), s.bgQueue[1:]...)
	} else {
		n := min(len(s.gcQueue), maxBatch)
		batch = s.gcQueue[:n:n]
		s.gcQueue = append([]*gcJob(nil), s.gcQueue[n:]...)
	}
	s.gcMu.Unlock()

	led := time.Now()
	s.commit(batch)

	for _, b := range batch[1:] { // batch[0] is j
		b.wake <- false
	}
	s.gcMu.Lock()
	waited := len(s.gcQueue) > 0
	if background && waited {
		s.noteBehind(led)
	}
	switch {
	case len(s.gcQueue) > 0:
		s.gcQueue[0].wake <- true
	case len(s.bgQueue) > 0:
		s.bgQueue[0].wake <- true
	default:
		s.gcRunning = false
	}
	s.gcMu.Unlock()
	if background && waited {
		// Others waited for this commit: the next background one waits
		// as long, so that a claim's next transaction (its completion)
		// rarely meets one too, and the disk is the claims' half the time.
		time.Sleep(time.Since(led))
	}
	if j.panicked != nil {
		panic(j.panicked)
	}
	return j.err
}

// noteBehind counts, in CommitStats, the functions queued now, which
// waited for the background transaction that began at began and has just
// ended. The caller holds gcMu.
func (s *backend) noteBehind(began time.Time) {
	now := time.Now()
	var longest time.Duration
	for _, w := range s.gcQueue {
		longest = max(longest, min(now.Sub(w.queued), now.Sub(began)))
	}
	s.statsMu.Lock()
	s.stats.BehindBackground += int64(len(s.gcQueue))
	s.stats.BehindBackgroundMax = max(s.stats.BehindBackgroundMax, longest)
	s.statsMu.Unlock()
}

func (s *backend) commit(batch []*gcJob) {
	db, err := s.acquire()
	if err == nil {
		if err = s.stillThere(); err != nil {
			s.release()
		}
	}
	if err != nil {
		for _, b := range batch {
			b.err = err
		}
		s.noteCommit(err, 0)
		return
	}
	defer s.release()
	alloc, err := s.guardedUpdate(db, len(batch), func(tx *bbolt.Tx) error {
		for _, b := range batch {
			if b.err = b.run(tx, s.path); b.err != nil {
				return errBatchRetry
			}
		}
		return nil
	})
	if !errors.Is(err, errBatchRetry) {
		s.noteCommit(err, alloc)
	}
	switch {
	case err == nil:
		return
	case errors.Is(err, ErrDamaged) && len(batch) > 1:
		// The commit itself met a damaged page (a rebalance reads the
		// siblings of the nodes the batch changed): which member led it
		// there is not known, so each runs alone, and only the one whose
		// writes reach the page fails.
	case !errors.Is(err, errBatchRetry):
		for _, b := range batch {
			b.err = err
		}
		return
	case len(batch) == 1:
		return // b.err holds fn's own error
	}
	for _, b := range batch {
		fnFailed := false
		alloc, b.err = s.guardedUpdate(db, 1, func(tx *bbolt.Tx) error {
			err := b.run(tx, s.path)
			fnFailed = err != nil && !errors.Is(err, ErrDamaged)
			return err
		})
		if !fnFailed { // fn's own error (a refusal) is not a failed commit
			s.noteCommit(b.err, alloc)
		}
	}
}

// guardedUpdate runs db.Update under guard: a fault or a bbolt panic on a
// damaged page becomes ErrDamaged and the file is checked again at its
// next open. funcs is the number of transaction functions fn runs (see
// CommitStats). It returns the bytes of the pages the transaction
// allocated, also when its commit failed (Health compares them).
func (s *backend) guardedUpdate(db *bbolt.DB, funcs int, fn func(*bbolt.Tx) error) (int64, error) {
	var last *bbolt.Tx
	err := guard(s.path, func() error {
		return db.Update(func(tx *bbolt.Tx) error {
			last = tx
			tx.OnCommit(func() {
				st := tx.Stats()
				s.statsMu.Lock()
				s.stats.Commits++
				s.stats.Functions += int64(funcs)
				s.stats.PageWrites += st.GetWrite()
				s.stats.WriteTime += st.GetWriteTime()
				s.statsMu.Unlock()
			})
			return fn(tx)
		})
	})
	if errors.Is(err, ErrDamaged) {
		s.damaged()
	}
	var alloc int64
	if last != nil {
		// A failed commit's stats are kept too: they count the pages it
		// could not write.
		st := last.Stats()
		alloc = st.GetPageAlloc()
	}
	return alloc, err
}

// Update implements ledger.Backend: fn runs in a read-write transaction
// committed together with the functions of concurrent callers (see
// update), so fn may be run twice; a background fn is committed alone,
// after the others waiting.
func (s *backend) Update(ctx context.Context, fn func(ledger.BTx) error) error {
	return s.update(func(tx *bbolt.Tx) error { return fn(btx{tx}) }, ledger.IsBackground(ctx))
}

// View implements ledger.Backend.
func (s *backend) View(ctx context.Context, fn func(ledger.BTx) error) error {
	return s.view(func(tx *bbolt.Tx) error { return fn(btx{tx}) })
}

// ReadOnly implements ledger.Backend.
func (s *backend) ReadOnly() bool { return s.readOnly }

// Close implements ledger.Backend: it waits for the running
// transactions and closes the file, which gives up its lock.
func (s *backend) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	for s.active > 0 {
		s.cond.Wait()
	}
	return s.db.Close()
}

// stillThere returns ErrNoLedger when the ledger's name no longer names
// the file this process has open (it was removed or replaced): a commit
// there would be lost with the process, so none is made.
func (s *backend) stillThere() error {
	if now, err := os.Stat(s.path); err == nil && os.SameFile(s.file, now) {
		return nil
	}
	return &fileError{kind: ErrNoLedger, path: s.path, detail: "removed or replaced while this process had it open",
		todo: "stop this process; restore the ledger from a backup if it was removed by mistake"}
}

// btx adapts a bbolt transaction to ledger.BTx.
type btx struct{ tx *bbolt.Tx }

func (t btx) Bucket(name []byte) ledger.Bucket {
	b := t.tx.Bucket(name)
	if b == nil {
		return nil
	}
	if slices.Contains(appendBuckets, string(name)) {
		b.FillPercent = appendFillPercent
	}
	return bucket{b}
}

// Data keeps the downstream collections as buckets nested in "data".
func (t btx) Data(name string, create bool) (ledger.Bucket, error) {
	data := t.tx.Bucket(bucketData)
	b := data.Bucket([]byte(name))
	if b == nil {
		if !create {
			return nil, nil
		}
		var err error
		if b, err = data.CreateBucket([]byte(name)); err != nil {
			return nil, err
		}
	}
	if slices.Contains(appendData, name) {
		b.FillPercent = appendFillPercent
	}
	return bucket{b}, nil
}

// bucket adapts a bbolt bucket to ledger.Bucket.
type bucket struct{ b *bbolt.Bucket }

func (b bucket) Get(key []byte) []byte       { return b.b.Get(key) }
func (b bucket) Put(key, value []byte) error { return b.b.Put(key, value) }
func (b bucket) Delete(key []byte) error     { return b.b.Delete(key) }
func (b bucket) Cursor() ledger.Cursor       { return b.b.Cursor() }
