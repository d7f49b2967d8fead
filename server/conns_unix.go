//go:build unix

package server

import (
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// pendingInput reports whether c has received bytes nobody has read yet.
// It peeks without blocking and without taking c's read lock, which a
// Read waiting on c holds.
func pendingInput(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	pending := false
	rc.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		pending = err == nil && n > 0
	})
	return pending
}

// fileLimit is how many files the process may open (RLIMIT_NOFILE).
func fileLimit() int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<20 {
		return 1 << 20
	}
	return int(rl.Cur)
}
