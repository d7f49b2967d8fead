package bolt

import (
	"errors"
	"fmt"
	"idemgate/ledger"
	"io/fs"
	"os"
	"sync"
	"time"

	bbolt "go.etcd.io/bbolt"
	bolterr "go.etcd.io/bbolt/errors"
)

// handle shares one bbolt file between processes. The file is open only
// while this process holds the turn (see fileLock); transactions borrow the
// open *bbolt.DB with acquire and give it back with release. When another
// process waits, no new transaction starts here, the running ones finish,
// and the file is closed and handed over. An idle file is closed after
// idleClose. A single process therefore pays one open per burst of work, and
// several processes alternate transaction by transaction under contention.
type handle struct {
	path      string
	lock      *fileLock
	idleClose time.Duration
	poll      time.Duration // how often the holder probes for a waiter without a doorbell
	bellPoll  time.Duration // and with one (for a waiter that does not ring)
	readOnly  bool          // bbolt ReadOnly: the file is opened O_RDONLY and never written
	// mayCreate: the first open may create a new ledger where no file
	// exists. Later opens never do: a ledger deleted under a running
	// process must not come back empty.
	mayCreate bool
	// onOpen runs once per open, before any transaction; first is true for
	// the first open of this handle, and again after a damage was seen.
	onOpen func(db *bbolt.DB, first bool) error

	opened  bool // an open has succeeded (guarded by mu)
	checked bool // onOpen ran with first=true and passed (guarded by mu)

	mu       sync.Mutex
	cond     *sync.Cond
	db       *bbolt.DB
	opening  bool
	yielding bool // another process waits: start nothing new, close when idle
	belled   bool // the open file's watch has a doorbell: release need not probe
	wakes    int  // passes of the watches so far: each one's first, then one per wake-up (tests count them)
	active   int
	lastUse  time.Time
	closed   bool
	pollDone chan struct{}
}

func newHandle(path string, readOnly, mayCreate bool, onOpen func(*bbolt.DB, bool) error) (*handle, error) {
	l, err := openFileLock(path, readOnly)
	if err != nil {
		return nil, fmt.Errorf("ledger: lock file beside %s: %w", path, err)
	}
	h := &handle{path: path, lock: l, idleClose: 50 * time.Millisecond, poll: time.Millisecond, bellPoll: 20 * time.Millisecond, onOpen: onOpen, readOnly: readOnly, mayCreate: mayCreate}
	h.cond = sync.NewCond(&h.mu)
	return h, nil
}

// acquire returns the open database for one transaction; the caller must
// call release exactly once afterwards.
func (h *handle) acquire() (*bbolt.DB, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		if h.closed {
			return nil, ledger.ErrClosed
		}
		if h.db != nil && !h.yielding {
			h.active++
			return h.db, nil
		}
		if h.db == nil && !h.opening {
			break
		}
		h.cond.Wait()
	}
	h.opening = true
	h.mu.Unlock()
	db, err := h.open()
	h.mu.Lock()
	h.opening = false
	h.cond.Broadcast()
	if err != nil {
		return nil, err
	}
	if h.closed { // Close ran while we were opening.
		db.Close()
		h.lock.release()
		return nil, ledger.ErrClosed
	}
	h.db = db
	h.active = 1
	h.pollDone = make(chan struct{})
	go h.watch(db, h.pollDone)
	return db, nil
}

func (h *handle) open() (*bbolt.DB, error) {
	if err := h.lock.acquire(h.readOnly); err != nil {
		return nil, fmt.Errorf("ledger: lock %s: %w", h.path, err)
	}
	db, err := h.openLocked()
	if err != nil {
		h.lock.release()
		var fe *fileError
		if !errors.As(err, &fe) {
			err = fmt.Errorf("ledger: open %s: %w", h.path, err)
		}
		return nil, err
	}
	return db, nil
}

// openLocked opens the file while this process holds the turn: it creates
// a new ledger where none exists (first open only, when allowed), checks
// the file before bbolt maps it (precheck), opens it, and runs onOpen.
func (h *handle) openLocked() (*bbolt.DB, error) {
	h.mu.Lock()
	first, create := !h.checked, h.mayCreate && !h.opened
	h.mu.Unlock()
	if _, err := os.Stat(h.path); errors.Is(err, fs.ErrNotExist) {
		if !create {
			return nil, noLedgerError(h.path)
		}
		if err := createLedger(h.path); err != nil && !errors.Is(err, ErrExists) {
			return nil, err
		}
	} else if err != nil {
		return nil, err
	}
	if err := precheck(h.path); err != nil {
		return nil, err
	}
	var file *os.File
	// Our own lock already serialises processes, so bbolt's flock never
	// waits; the timeout only guards against a foreign process holding the
	// file (an old idemgate, a bbolt tool).
	//
	// The freelist stays synced (no NoFreelistSync): that would save one
	// page of a commit's thirty-odd, but every open of a file written so
	// then rebuilds the freelist by reading every page of the file (170 ms
	// measured for a ledger of 100 000 creates, 600 MB; proportionally more
	// at a million), and processes sharing a file reopen it at each
	// hand-over.
	opts := &bbolt.Options{Timeout: 10 * time.Second, ReadOnly: h.readOnly, PreLoadFreelist: true,
		OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
			flag &^= os.O_CREATE // precheck saw the file; never create one here
			f, err := os.OpenFile(name, flag, perm)
			file = f
			return f, err
		}}
	var db *bbolt.DB
	err := guard(h.path, func() error {
		var err error
		db, err = bbolt.Open(h.path, 0o600, opts)
		return err
	})
	if err != nil {
		if db == nil && file != nil {
			file.Close() // bbolt panicked half-way: release its flock
		}
		if errors.Is(err, bolterr.ErrInvalid) || errors.Is(err, bolterr.ErrVersionMismatch) {
			return nil, notLedgerError(h.path, err.Error())
		}
		if errors.Is(err, bolterr.ErrChecksum) {
			return nil, damagedError(h.path, err.Error())
		}
		return nil, err
	}
	if h.onOpen != nil {
		if err := h.onOpen(db, first); err != nil {
			db.Close()
			return nil, err
		}
	}
	h.mu.Lock()
	h.opened, h.checked = true, true
	h.mu.Unlock()
	return db, nil
}

// damaged makes the next open check the whole file again (onOpen with
// first=true), and closes the file as soon as no transaction uses it, so
// a process that saw a damaged page stops using its mapping.
func (h *handle) damaged() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checked = false
	if h.db != nil {
		h.yielding = true
		if h.active == 0 {
			h.closeLocked()
		}
	}
}

// release gives back the database borrowed by acquire.
func (h *handle) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.active--
	h.lastUse = time.Now()
	if !h.yielding && !h.belled && h.lock.othersWaiting() {
		h.yielding = true
	}
	if h.active == 0 {
		if h.yielding {
			h.closeLocked()
		}
		h.cond.Broadcast() // wakes close()
	}
}

// watch runs while db is open and closes it when another process waits or
// the file has been idle for idleClose. It exits when db is closed. With
// a doorbell it probes for a waiter when rung (and every bellPoll),
// without one every poll.
func (h *handle) watch(db *bbolt.DB, done chan struct{}) {
	bell := h.lock.doorbell()
	var rang <-chan struct{}
	every := h.poll
	if bell != nil {
		defer bell.close()
		rang, every = bell.rang, h.bellPoll
		h.mu.Lock()
		if h.db == db {
			h.belled = true
		}
		h.mu.Unlock()
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for first := true; ; first = false {
		if !first { // the first pass probes at once: a waiter may have rung before the bell was up
			select {
			case <-done:
				return
			case _, ok := <-rang:
				if !ok { // the watch failed: poll
					rang = nil
					h.mu.Lock()
					if h.db == db {
						h.belled = false
					}
					h.mu.Unlock()
					t.Reset(h.poll)
				}
			case <-t.C:
			}
		}
		h.mu.Lock()
		if h.db != db {
			h.mu.Unlock()
			return
		}
		h.wakes++
		if !h.yielding && h.lock.othersWaiting() {
			h.yielding = true
		}
		if h.active == 0 && (h.yielding || time.Since(h.lastUse) >= h.idleClose) {
			h.closeLocked()
		}
		h.mu.Unlock()
	}
}

// closeLocked closes the file and hands the turn over; h.mu is held
// and no transaction is active.
func (h *handle) closeLocked() {
	if h.db == nil {
		return
	}
	if err := h.db.Close(); err != nil {
		// Nothing is lost: every committed transaction is already synced.
		_ = err
	}
	h.db = nil
	h.yielding, h.belled = false, false
	close(h.pollDone)
	h.lock.release()
	h.cond.Broadcast()
}

// close waits for running transactions, closes the file and the lock files.
func (h *handle) close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil
	}
	h.closed = true
	for h.active > 0 || h.opening {
		h.cond.Wait()
	}
	h.closeLocked()
	return errors.Join(h.lock.close())
}
