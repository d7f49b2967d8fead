//go:build unix

package bolt

import (
	"errors"
	"os"
	"syscall"
)

// fileLock is the cross-process lock that serialises opens of one bbolt
// file. bbolt locks the whole file while it is open, so processes take
// turns: a process holds the file only while it has work and hands it over
// as soon as another process waits.
//
// Two flock(2) locks make that possible. "lock" is the turn itself, taken
// with a blocking LOCK_EX, so the kernel queues waiters (bbolt's own open
// polls every 50 ms, which starves unlucky processes). "wait" is the
// doorbell: a process holds it shared while it waits for its turn, and the
// holder probes it with a non-blocking exclusive lock to learn that someone
// is waiting. Once it holds "wait" shared, a waiter also opens the wait
// file, which the holder watches where the platform allows (doorbell):
// the holder then probes only when rung, and otherwise now and then, for
// a waiter that does not ring (an older idemgate).
//
// A reader (a read-only open) takes the turn shared, so readers do not
// wait for each other, and yields to a waiting writer like any holder.
// A reader creates no file: it opens the lock files read-only if they
// exist (a read-only directory works), and otherwise goes without: bbolt's
// own shared flock on the ledger file still keeps writers out while it
// reads.
type fileLock struct {
	lock     *os.File // nil: no lock files (read-only directory)
	wait     *os.File
	waitPath string
}

func openFileLock(dbPath string, readOnly bool) (*fileLock, error) {
	l, err := openLockFile(dbPath+".lock", readOnly)
	if err != nil || l == nil {
		return &fileLock{}, err
	}
	w, err := openLockFile(dbPath+".wait", readOnly)
	if err != nil || w == nil {
		l.Close()
		return &fileLock{}, err
	}
	return &fileLock{lock: l, wait: w, waitPath: dbPath + ".wait"}, nil
}

// openLockFile opens (creating) one lock file for a writer. A reader
// creates nothing: it opens an existing lock file read-only (flock needs no
// write access) or returns nil.
func openLockFile(name string, readOnly bool) (*os.File, error) {
	if !readOnly {
		return os.OpenFile(name, os.O_CREATE|os.O_RDWR, 0o600)
	}
	if f, err := os.Open(name); err == nil {
		return f, nil
	}
	return nil, nil
}

// acquire blocks until this process holds the turn: exclusive for a
// writer, shared for a reader.
func (f *fileLock) acquire(shared bool) error {
	if f.lock == nil {
		return nil
	}
	if err := flock(f.wait, syscall.LOCK_SH); err != nil {
		return err
	}
	if r, err := os.Open(f.waitPath); err == nil { // the doorbell
		r.Close()
	}
	how := syscall.LOCK_EX
	if shared {
		how = syscall.LOCK_SH
	}
	err := flock(f.lock, how)
	if uerr := flock(f.wait, syscall.LOCK_UN); err == nil {
		err = uerr
	}
	return err
}

// release gives the turn up.
func (f *fileLock) release() error {
	if f.lock == nil {
		return nil
	}
	return flock(f.lock, syscall.LOCK_UN)
}

// othersWaiting reports whether another process waits for the turn.
func (f *fileLock) othersWaiting() bool {
	if f.lock == nil {
		return false
	}
	err := flock(f.wait, syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true
	}
	if err == nil {
		flock(f.wait, syscall.LOCK_UN)
	}
	return false
}

// doorbell returns a doorbell that rings when another process may have
// started waiting (nil: none here; poll othersWaiting instead).
func (f *fileLock) doorbell() *doorbell {
	if f.lock == nil {
		return nil
	}
	return newDoorbell(f.waitPath)
}

func (f *fileLock) close() error {
	if f.lock == nil {
		return nil
	}
	return errors.Join(f.lock.Close(), f.wait.Close())
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}
