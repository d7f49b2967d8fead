package bolt

import (
	"os"
	"syscall"
)

// doorbell tells the process holding the turn that another process
// started waiting for it, without polling: it watches the wait file
// with inotify, and a waiter opens that file once it holds the wait lock
// (fileLock.acquire). Each event is only a hint: the holder then probes
// the wait lock (othersWaiting). nil where it cannot be made.
type doorbell struct {
	f    *os.File
	rang chan struct{} // a value after each event; closed when the bell is closed
}

// newDoorbell watches path (the wait file); nil when inotify is not
// available.
func newDoorbell(path string) *doorbell {
	fd, err := syscall.InotifyInit1(syscall.IN_NONBLOCK | syscall.IN_CLOEXEC)
	if err != nil {
		return nil
	}
	if _, err := syscall.InotifyAddWatch(fd, path, syscall.IN_OPEN); err != nil {
		syscall.Close(fd)
		return nil
	}
	// A non-blocking descriptor joins Go's poller: Read parks the
	// goroutine, and Close wakes it.
	b := &doorbell{f: os.NewFile(uintptr(fd), path+" (inotify)"), rang: make(chan struct{}, 1)}
	go b.listen()
	return b
}

func (b *doorbell) listen() {
	defer close(b.rang)
	buf := make([]byte, 4096)
	for {
		if _, err := b.f.Read(buf); err != nil {
			return
		}
		select {
		case b.rang <- struct{}{}:
		default: // a ring is already pending
		}
	}
}

func (b *doorbell) close() { b.f.Close() }
