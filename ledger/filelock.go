//go:build unix

package ledger

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
// is waiting.
type fileLock struct {
	lock *os.File
	wait *os.File
}

func openFileLock(dbPath string) (*fileLock, error) {
	l, err := os.OpenFile(dbPath+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	w, err := os.OpenFile(dbPath+".wait", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		l.Close()
		return nil, err
	}
	return &fileLock{lock: l, wait: w}, nil
}

// acquire blocks until this process holds the turn.
func (f *fileLock) acquire() error {
	if err := flock(f.wait, syscall.LOCK_SH); err != nil {
		return err
	}
	err := flock(f.lock, syscall.LOCK_EX)
	if uerr := flock(f.wait, syscall.LOCK_UN); err == nil {
		err = uerr
	}
	return err
}

// release gives the turn up.
func (f *fileLock) release() error { return flock(f.lock, syscall.LOCK_UN) }

// othersWaiting reports whether another process waits for the turn.
func (f *fileLock) othersWaiting() bool {
	err := flock(f.wait, syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true
	}
	if err == nil {
		flock(f.wait, syscall.LOCK_UN)
	}
	return false
}

func (f *fileLock) close() error {
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
