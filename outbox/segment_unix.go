//go:build unix

package outbox

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// lockPath takes an exclusive flock(2) of the file at path (created if
// needed), waiting for it; unlock releases it. The lock belongs to this
// open file, so two sinks in one process exclude each other as two
// processes do, and it is released if the process dies.
func lockPath(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("outbox segments lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, &os.PathError{Op: "flock", Path: path, Err: err}
	}
	return func() { f.Close() }, nil // closing the file releases the lock
}
