//go:build unix

package owner

import (
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

func ownedByMe(fi fs.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Getuid()
}

// lockExclusive takes the flock of f without waiting; an error when
// another process holds it.
func lockExclusive(f *os.File) error {
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
}

// listenPrivate listens on a unix socket at path that only this user may
// connect to: created under a umask that leaves it mode 0600.
func listenPrivate(path string) (*net.UnixListener, error) {
	old := syscall.Umask(0o177)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	syscall.Umask(old)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// peer returns the user and process ids of the process at the other end of
// c (SO_PEERCRED on Linux; elsewhere ok is false).
func peer(c *net.UnixConn) (uid int, pid int, ok bool) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, 0, false
	}
	var (
		u, p int
		got  bool
	)
	if err := raw.Control(func(fd uintptr) { u, p, got = peerCred(int(fd)) }); err != nil {
		return 0, 0, false
	}
	return u, p, got
}

// checkPeer refuses a connection whose other end is another user's; what
// is the other end, in words.
func checkPeer(c *net.UnixConn, what string) error {
	uid, pid, ok := peer(c)
	if !ok || uid == os.Getuid() {
		return nil
	}
	return otherUser(what, uid, pid)
}

// checkOwner refuses a socket file of another user (whose mode kept this
// process from connecting).
func checkOwner(fi fs.FileInfo, what string) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || int(st.Uid) == os.Getuid() {
		return nil
	}
	return otherUser(what, int(st.Uid), 0)
}

// otherUser says that what is a process (pid, 0 when not known) of user
// uid, not this process's, and what to do.
func otherUser(what string, uid, pid int) error {
	who, stop := "a process of user "+userName(uid), "that process"
	if pid > 0 {
		who, stop = fmt.Sprintf("process %d of user %s", pid, userName(uid)), fmt.Sprintf("process %d", pid)
	}
	return fmt.Errorf("%s is another user's: %s, and this process runs as user %s; all processes of one ledger must run as one user: run idemgate as %s, or stop %s first", what, who, userName(os.Getuid()), userName(uid), stop)
}

func userName(uid int) string {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		return u.Username
	}
	return fmt.Sprintf("uid %d", uid)
}

// detached is how an owner is started: in a session of its own, so it
// survives the process group of the client that started it.
func detached() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// CheckFileUser refuses a file of another user (what says which file, in
// words): a ledger another user's process holds, for one.
func CheckFileUser(path, what string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return nil
	}
	return checkOwner(fi, what)
}
