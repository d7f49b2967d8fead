package owner

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

// ErrNoOwner is Dial's error when no owner listens.
var ErrNoOwner = errors.New("no owner listens")

// Listener is an owner's socket.
type Listener struct {
	*net.UnixListener
}

// Listen listens on p's socket (mode 0600), replacing one a dead owner
// left. The caller must hold p's ledger open: bbolt's exclusive lock on
// the file makes it the ledger's only owner, and only the holder of that
// lock removes or creates the socket. Close stops listening and removes
// the socket; the caller closes the ledger after it, so that a process
// that opens the ledger next finds no socket of the old owner's.
func Listen(p Place) (*Listener, error) {
	if err := os.Remove(p.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("owner socket: %w", err)
	}
	ln, err := listenPrivate(p.Socket)
	if err != nil {
		return nil, fmt.Errorf("owner socket: %w", err)
	}
	return &Listener{UnixListener: ln}, nil
}

// Stop ends the owner of p's ledger, if one runs, with SIGTERM (it
// answers the calls in flight first), and waits up to timeout until it
// has let the ledger go: the file is unlocked (or, when p names no
// ledger, the owner no longer answers).
func Stop(p Place, timeout time.Duration) error {
	pid, ok := PID(p)
	if !ok {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return nil // already gone
	}
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		if p.Ledger != "" && unlocked(p.Ledger) || p.Ledger == "" && !answers(p) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the owner (pid %d) of ledger %s still holds it %s after SIGTERM", pid, p.Ledger, timeout)
		}
	}
}

// unlocked reports whether no process holds the file at path locked
// (flock; taking the lock and at once giving it back).
func unlocked(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return true
	}
	defer f.Close() // gives a lock taken back
	return lockExclusive(f) == nil
}

// answers reports whether an owner answers on p's socket.
func answers(p Place) bool {
	c, err := Dial(p, time.Second)
	if err == nil {
		c.Close()
	}
	return err == nil
}

// Accept waits for the next client; a client of another user is refused
// (closed) and reported through refused, and Accept goes on.
func (l *Listener) Accept(refused func(error)) (*net.UnixConn, error) {
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			return nil, err
		}
		if err := checkPeer(c, "the process that connected"); err != nil {
			refused(err)
			c.Close()
			continue
		}
		return c, nil
	}
}

// PID returns the process id of the owner of p's ledger, when one listens
// and the platform tells (SO_PEERCRED).
func PID(p Place) (int, bool) {
	c, err := Dial(p, time.Second)
	if err != nil {
		return 0, false
	}
	defer c.Close()
	_, pid, ok := peer(c)
	return pid, ok
}

// Dial connects to the owner of p's ledger within timeout. ErrNoOwner
// when none listens (no socket, or a socket a dead owner left); an owner
// of another user is an error that says so.
func Dial(p Place, timeout time.Duration) (*net.UnixConn, error) {
	c, err := net.DialTimeout("unix", p.Socket, timeout)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return nil, ErrNoOwner
		}
		if errors.Is(err, os.ErrPermission) {
			// The socket's mode keeps this user out: whose is it?
			if fi, serr := os.Stat(p.Socket); serr == nil {
				if uerr := checkOwner(fi, "the process that owns ledger "+p.Ledger); uerr != nil {
					return nil, uerr
				}
			}
		}
		return nil, fmt.Errorf("owner socket %s: %w", p.Socket, err)
	}
	uc := c.(*net.UnixConn)
	if err := checkPeer(uc, "the process that owns ledger "+p.Ledger); err != nil {
		uc.Close()
		return nil, err
	}
	return uc, nil
}
