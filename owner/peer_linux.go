package owner

import "syscall"

func peerCred(fd int) (uid, pid int, ok bool) {
	cred, err := syscall.GetsockoptUcred(fd, syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	if err != nil {
		return 0, 0, false
	}
	return int(cred.Uid), int(cred.Pid), true
}
