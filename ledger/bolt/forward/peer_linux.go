package forward

import (
	"net"
	"os"
	"syscall"
)

// SameUser reports whether the process at the other end of c runs as this
// process's user (SO_PEERCRED); the writer checks every forwarder, and a
// forwarder its writer. Connections that are not unix sockets
// (tests over pipes) pass.
func SameUser(c net.Conn) bool {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return true
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return false
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return false
	}
	return int(cred.Uid) == os.Getuid()
}
