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
	if _, ok := c.(*net.UnixConn); !ok {
		return true
	}
	uid, _, ok := Peer(c)
	return ok && uid == os.Getuid()
}

// Peer returns the user id and process id of the process at the other end
// of c (SO_PEERCRED); ok is false when c is not a unix socket or the
// platform does not tell.
func Peer(c net.Conn) (uid int, pid int32, ok bool) {
	uc, isUnix := c.(*net.UnixConn)
	if !isUnix {
		return 0, 0, false
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || cerr != nil {
		return 0, 0, false
	}
	return int(cred.Uid), cred.Pid, true
}
