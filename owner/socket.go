package owner

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"time"
)

// ErrOwned is Listen's error when another process owns the ledger.
var ErrOwned = errors.New("another process owns this ledger")

// ErrNoOwner is Dial's error when no owner listens.
var ErrNoOwner = errors.New("no owner listens")

// leaveTimeout bounds the wait of a new owner for one that is leaving.
const leaveTimeout = 30 * time.Second

// Listener is an owner's socket, with the lock that makes it the only one.
type Listener struct {
	*net.UnixListener
	lock *os.File
}

// Listen makes this process the owner of p's ledger: it takes p's lock,
// removes a socket a dead owner left, and listens (mode 0600). When
// another process holds the lock and answers on the socket, the error is
// ErrOwned; an owner that no longer answers (it is leaving) is waited for,
// up to leaveTimeout.
func Listen(p Place) (*Listener, error) {
	lock, err := os.OpenFile(p.Lock, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("owner lock: %w", err)
	}
	deadline := time.Now().Add(leaveTimeout)
	for {
		err := lockExclusive(lock)
		if err == nil {
			break
		}
		if !errors.Is(err, ErrOwned) {
			lock.Close()
			return nil, fmt.Errorf("owner lock %s: %w", p.Lock, err)
		}
		if c, derr := Dial(p, time.Second); derr == nil || time.Now().After(deadline) {
			if c != nil {
				c.Close()
			}
			lock.Close()
			return nil, ErrOwned
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Only the lock's holder removes or creates the socket.
	if err := os.Remove(p.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
		lock.Close()
		return nil, fmt.Errorf("owner socket: %w", err)
	}
	ln, err := listenPrivate(p.Socket)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("owner socket: %w", err)
	}
	return &Listener{UnixListener: ln, lock: lock}, nil
}

// StopAccepting stops listening and removes the socket; the lock stays
// held until Close, so that no other owner opens the ledger while this
// one still closes it.
func (l *Listener) StopAccepting() error { return l.UnixListener.Close() }

// Close stops listening, removes the socket and gives the lock up, in
// that order: a process that takes the lock next finds no socket of ours.
func (l *Listener) Close() error {
	err := l.UnixListener.Close()
	l.lock.Close()
	return err
}

// Stop ends the owner of p's ledger, if one runs, with SIGTERM (it
// answers the calls in flight first), and waits up to timeout until it
// has let the ledger go (its lock is free).
func Stop(p Place, timeout time.Duration) error {
	pid, ok := PID(p)
	if !ok {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return nil // already gone
	}
	for deadline := time.Now().Add(timeout); ; time.Sleep(20 * time.Millisecond) {
		if lockFree(p.Lock) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the owner (pid %d) of ledger %s still holds it %s after SIGTERM", pid, p.Ledger, timeout)
		}
	}
}

// lockFree reports whether no process holds the lock at path (taking and
// at once giving it back).
func lockFree(path string) bool {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return true
	}
	defer f.Close() // gives a lock taken back
	return lockExclusive(f) == nil
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
