package ledger

import (
	"errors"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
)

// handle shares one bbolt file between processes. The file is open only
// while this process holds the turn (see fileLock); transactions borrow the
// open *bolt.DB with acquire and give it back with release. When another
// process waits, no new transaction starts here, the running ones finish,
// and the file is closed and handed over. An idle file is closed after
// idleClose. A single process therefore pays one open per burst of work, and
// several processes alternate transaction by transaction under contention.
type handle struct {
	path      string
	lock      *fileLock
	idleClose time.Duration
	poll      time.Duration
	onOpen    func(*bolt.DB) error // runs once per open, before any transaction

	mu       sync.Mutex
	cond     *sync.Cond
	db       *bolt.DB
	opening  bool
	yielding bool // another process waits: start nothing new, close when idle
	active   int
	lastUse  time.Time
	closed   bool
	pollDone chan struct{}
}

func newHandle(path string, onOpen func(*bolt.DB) error) (*handle, error) {
	l, err := openFileLock(path)
	if err != nil {
		return nil, fmt.Errorf("ledger: lock file beside %s: %w", path, err)
	}
	h := &handle{path: path, lock: l, idleClose: 50 * time.Millisecond, poll: time.Millisecond, onOpen: onOpen}
	h.cond = sync.NewCond(&h.mu)
	return h, nil
}

// acquire returns the open database for one transaction; the caller must
// call release exactly once afterwards.
func (h *handle) acquire() (*bolt.DB, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for {
		if h.closed {
			return nil, ErrClosed
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
		return nil, ErrClosed
	}
	h.db = db
	h.active = 1
	h.pollDone = make(chan struct{})
	go h.watch(db, h.pollDone)
	return db, nil
}

func (h *handle) open() (*bolt.DB, error) {
	if err := h.lock.acquire(); err != nil {
		return nil, fmt.Errorf("ledger: lock %s: %w", h.path, err)
	}
	// Our own lock already serialises processes, so bbolt's flock never
	// waits; the timeout only guards against a foreign process holding the
	// file (an old idemgate, a bbolt tool).
	db, err := bolt.Open(h.path, 0o600, &bolt.Options{Timeout: 10 * time.Second})
	if err == nil && h.onOpen != nil {
		if err = h.onOpen(db); err != nil {
			db.Close()
		}
	}
	if err != nil {
		h.lock.release()
		return nil, fmt.Errorf("ledger: open %s: %w", h.path, err)
	}
	return db, nil
}

// release gives back the database borrowed by acquire.
func (h *handle) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.active--
	h.lastUse = time.Now()
	if !h.yielding && h.lock.othersWaiting() {
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
// the file has been idle for idleClose. It exits when db is closed.
func (h *handle) watch(db *bolt.DB, done chan struct{}) {
	t := time.NewTicker(h.poll)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		h.mu.Lock()
		if h.db != db {
			h.mu.Unlock()
			return
		}
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
	h.yielding = false
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
