package bolt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/bolt/forward"
)

// shared is the ledger.Backend of a writable open: one writer per file.
//
// The process that holds the writer lock (flock on <db>.writer) opens
// the file as before (backend, handle) and serves it on a unix socket
// (forward.Serve); every other writable open forwards its transactions
// there (forward.Client) and never opens the file. So the file is not
// closed and reopened to hand it from process to process, and every
// process's claims share the writer's group commit. Read-only opens do
// not take part: they take the file's turn lock as before, and the
// writer's handle yields the file to them.
//
// When the writer is lost (killed, or closed), a forwarder's transaction
// fails; the forwarder then takes the writer lock itself or finds the
// process that did (failover) and runs the transaction again — or, when
// the writer was lost after the commit was sent, first reads back the
// transaction's marker there and runs it again only when it did not
// commit (forward.Committed).
type shared struct {
	path     string
	rolePath string
	deep     int64    // open's deepLimit
	role     *os.File // the writer lock; held (LOCK_EX) while local != nil

	mu        sync.Mutex
	mayCreate bool // the first open may create the ledger; no later one does
	local     *backend
	srv       *forward.Server
	sock      string
	client    *forward.Client
	closed    bool

	// For tests and logs: writers lost, and outcomes read back.
	failovers, readBacks atomic.Int64
	// afterCurrent, when set (by a test, before any call), runs in
	// current just before it returns the client to use, so a test can
	// run a failover exactly between current and the call on the client.
	afterCurrent func(client *forward.Client)
}

// failoverWait bounds how long a forwarder waits for a new writer (its
// own or another process's) before a transaction fails.
const failoverWait = 30 * time.Second

var (
	_ ledger.Backend        = (*shared)(nil)
	_ ledger.HealthReporter = (*shared)(nil)
)

// openShared opens path for writing: as its writer when no process is,
// else as a forwarder to the writer.
func openShared(path string, mayCreate bool, deep int64) (*shared, error) {
	if !mayCreate {
		if _, err := os.Stat(path); err != nil {
			return nil, noLedgerError(path)
		}
	}
	role, err := os.OpenFile(path+".writer", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("ledger: writer lock beside %s: %w", path, err)
	}
	s := &shared{path: path, rolePath: path + ".writer", deep: deep, role: role, mayCreate: mayCreate}
	s.mu.Lock()
	became, err := s.tryWriterLocked()
	s.mu.Unlock()
	if err != nil {
		role.Close()
		return nil, err
	}
	if !became {
		s.client = forward.NewClient(s.dial)
		// One transaction now, so an unreachable writer fails here, not at
		// the first tool call.
		if err := s.View(context.Background(), func(ledger.BTx) error { return nil }); err != nil {
			s.Close()
			return nil, err
		}
	}
	return s, nil
}

// tryWriterLocked makes this process the writer if no process is: it
// takes the writer lock without waiting, opens the file and serves it.
// It reports whether this process is now the writer. s.mu is held.
func (s *shared) tryWriterLocked() (bool, error) {
	if err := flock(s.role, syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return false, nil
		}
		return false, fmt.Errorf("ledger: writer lock beside %s: %w", s.path, err)
	}
	be, err := openBackend(s.path, openReadWrite, s.mayCreate, s.deep)
	if err != nil {
		flock(s.role, syscall.LOCK_UN)
		return false, err
	}
	s.mayCreate = false
	sock, ln, err := listenPrivate(s.path)
	if err == nil {
		err = s.role.Truncate(0)
	}
	if err == nil {
		_, err = s.role.WriteAt([]byte(sock), 0)
	}
	if err != nil {
		if ln != nil {
			ln.Close()
			os.Remove(sock)
		}
		be.Close()
		flock(s.role, syscall.LOCK_UN)
		return false, fmt.Errorf("ledger: serve %s to other processes: %w", s.path, err)
	}
	s.local, s.sock, s.srv = be, sock, forward.Serve(ln, be)
	return true, nil
}

// maxSocketPath bounds a unix socket's path (sun_path is 108 bytes on
// Linux, 104 on macOS and the BSDs, with its terminating NUL), leaving
// room for the temporary name it is bound under.
const maxSocketPath = 103 - len(".new")

// socketPath is where the writer of path listens: <db>.sock beside the
// ledger, or, when that path is too long for a unix socket, a name hashed
// from the ledger's absolute path in $XDG_RUNTIME_DIR (else a private
// directory in the system's temporary directory). Forwarders do not
// compute it: the writer writes it in its writer lock file.
func socketPath(path string) (string, error) {
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	if p := path + ".sock"; len(p) <= maxSocketPath {
		return p, nil
	}
	sum := sha256.Sum256([]byte(path))
	name := "idemgate-" + hex.EncodeToString(sum[:12]) + ".sock"
	dir := os.Getenv("XDG_RUNTIME_DIR")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), fmt.Sprintf("idemgate-%d", os.Getuid()))
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", err
		}
		fi, err := os.Lstat(dir)
		if err != nil || !fi.IsDir() || fi.Mode().Perm() != 0o700 {
			return "", fmt.Errorf("%s is not a private directory (mode 0700)", dir)
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
			return "", fmt.Errorf("%s belongs to another user", dir)
		}
	}
	p := filepath.Join(dir, name)
	if len(p) > maxSocketPath {
		return "", fmt.Errorf("no socket path of at most %d bytes for %s", maxSocketPath, path)
	}
	return p, nil
}

// listenPrivate listens on path's socket with mode 0600: it binds a
// temporary name, sets the mode, and renames it into place (replacing
// the socket of a writer that died), so the socket is never reachable
// with a wider mode.
func listenPrivate(path string) (string, net.Listener, error) {
	sock, err := socketPath(path)
	if err != nil {
		return "", nil, err
	}
	tmp := sock + ".new"
	os.Remove(tmp)
	ln, err := net.Listen("unix", tmp)
	if err != nil {
		return "", nil, err
	}
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(tmp, 0o600); err != nil {
		ln.Close()
		os.Remove(tmp)
		return "", nil, err
	}
	if err := os.Rename(tmp, sock); err != nil {
		ln.Close()
		os.Remove(tmp)
		return "", nil, err
	}
	return sock, ln, nil
}

// ErrOtherUser is returned when the ledger is served by a process of
// another user: a writer serves only processes of its own user, so this
// one can neither forward to it nor take the file while it runs.
var ErrOtherUser = errors.New("the ledger is served by another user's process")

// otherUserError names who serves the ledger and what to do; pid is 0
// when it is not known.
func otherUserError(path string, uid int, pid int32) error {
	owner := fmt.Sprintf("uid %d", uid)
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		owner = u.Username
	}
	who, stop := "a process of user "+owner, "that process"
	if pid > 0 {
		who, stop = fmt.Sprintf("process %d of user %s", pid, owner), fmt.Sprintf("process %d", pid)
	}
	me := fmt.Sprintf("uid %d", os.Getuid())
	if u, err := user.Current(); err == nil {
		me = u.Username
	}
	return fmt.Errorf("ledger: %s: %w: %s holds it and this process runs as user %s; all processes of one ledger must run as one user: run idemgate as %s, or stop %s first", path, ErrOtherUser, who, me, owner, stop)
}

// dial connects to the writer named in the writer lock file. A writer of
// another user is ErrOtherUser: known from the peer's credentials, or,
// when the socket's mode refuses this process, from the socket's owner.
func (s *shared) dial() (net.Conn, error) {
	b, err := os.ReadFile(s.rolePath)
	if err != nil {
		return nil, err
	}
	sock := strings.TrimSpace(string(b))
	if sock == "" {
		return nil, errors.New("no writer has written its socket yet")
	}
	c, err := net.DialTimeout("unix", sock, time.Second)
	if err != nil {
		if fi, serr := os.Stat(sock); serr == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
				return nil, otherUserError(s.path, int(st.Uid), 0)
			}
		}
		return nil, err
	}
	if uid, pid, ok := forward.Peer(c); ok && uid != os.Getuid() {
		c.Close()
		return nil, otherUserError(s.path, uid, pid)
	}
	return c, nil
}

// current returns the writer's backend when this process is the writer,
// else the client to the writer.
func (s *shared) current() (*backend, *forward.Client, error) {
	s.mu.Lock()
	local, client, closed := s.local, s.client, s.closed
	s.mu.Unlock()
	if closed {
		return nil, nil, ledger.ErrClosed
	}
	if s.afterCurrent != nil {
		s.afterCurrent(client)
	}
	return local, client, nil
}

// replaced reports whether c is no longer how this process reaches the
// writer while the ledger is open: a failover (another goroutine's)
// replaced and closed it. A transaction c refused with ledger.ErrClosed
// was never begun (a Client refuses only transactions begun after its
// Close), so it runs again on what replaced c.
func (s *shared) replaced(c *forward.Client) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.closed && s.client != c
}

// failover replaces lost, the client whose writer was lost: this process
// becomes the writer, or connects to the process that did. It returns at
// once when another goroutine already replaced lost.
func (s *shared) failover(lost *forward.Client) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client == lost && !s.closed {
		s.failovers.Add(1)
	}
	deadline := time.Now().Add(failoverWait)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		if s.closed {
			return ledger.ErrClosed
		}
		if s.client != lost {
			return nil
		}
		became, err := s.tryWriterLocked()
		if err != nil {
			return err
		}
		if became {
			lost.Close()
			s.client = nil
			return nil
		}
		c, err := s.dial()
		if err == nil {
			c.Close()
			lost.Close() // its idle connections lead to the lost writer
			s.client = forward.NewClient(s.dial)
			return nil
		}
		if errors.Is(err, ErrOtherUser) {
			return err // waiting will not make it serve this process
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ledger: %s: the writer lock is held but no process serves the ledger: %w", s.path, forward.ErrWriterLost)
		}
		s.mu.Unlock()
		time.Sleep(wait)
		s.mu.Lock()
	}
}

// Update implements ledger.Backend. A forwarded Update whose writer is
// lost runs again on the next writer; when it was lost after the commit
// was sent, the next writer is asked first whether it committed, so it
// is never committed twice.
func (s *shared) Update(ctx context.Context, fn func(ledger.BTx) error) error {
	var unknown []byte // the marker of a transaction whose outcome is unknown
	for {
		local, client, err := s.current()
		if err != nil {
			if unknown != nil {
				return fmt.Errorf("%w (%v)", forward.ErrOutcomeUnknown, err)
			}
			return err
		}
		if unknown != nil {
			s.readBacks.Add(1)
			var found bool
			if local != nil {
				// This process is the writer now: the lost one has ended.
				err = local.Update(ctx, func(tx ledger.BTx) error {
					found = forward.Committed(tx, unknown)
					return nil
				})
			} else {
				found, err = client.ReadBack(ctx, unknown)
			}
			switch {
			case errors.Is(err, forward.ErrWriterLost):
				if ferr := s.failover(client); ferr != nil {
					return fmt.Errorf("%w (%v)", forward.ErrOutcomeUnknown, ferr)
				}
				continue
			case errors.Is(err, ledger.ErrClosed) && s.replaced(client):
				continue // asked nothing: ask what replaced the client
			case err != nil:
				return fmt.Errorf("%w (%v)", forward.ErrOutcomeUnknown, err)
			case found:
				return nil
			}
			unknown = nil // certainly not committed: run it again
		}
		if local != nil {
			return local.Update(ctx, fn)
		}
		marker := forward.NewMarker()
		err = client.Update(ctx, marker, fn)
		switch {
		case errors.Is(err, forward.ErrOutcomeUnknown):
			unknown = marker
		case errors.Is(err, forward.ErrWriterLost):
		case errors.Is(err, ledger.ErrClosed) && s.replaced(client):
			continue // never begun: run it on what replaced the client
		default:
			return err
		}
		if ferr := s.failover(client); ferr != nil {
			if unknown != nil {
				return fmt.Errorf("%w (%v)", forward.ErrOutcomeUnknown, ferr)
			}
			return ferr
		}
	}
}

// View implements ledger.Backend; a view whose writer is lost runs again
// on the next.
func (s *shared) View(ctx context.Context, fn func(ledger.BTx) error) error {
	for {
		local, client, err := s.current()
		if err != nil {
			return err
		}
		if local != nil {
			return local.View(ctx, fn)
		}
		err = client.View(ctx, fn)
		if errors.Is(err, ledger.ErrClosed) && s.replaced(client) {
			continue // never begun: run it on what replaced the client
		}
		if !errors.Is(err, forward.ErrWriterLost) {
			return err
		}
		if ferr := s.failover(client); ferr != nil {
			return ferr
		}
	}
}

// ReadOnly implements ledger.Backend.
func (s *shared) ReadOnly() bool { return false }

// Health implements ledger.HealthReporter: the file's health as the
// writer sees it, which is where every process's commits are made. A
// forwarder asks its writer (so it reports the writer's failed commits
// and free space, not its own); when the writer runs an older build that
// cannot tell, it reports whether the writer answers a read.
func (s *shared) Health(ctx context.Context) ledger.Health {
	for {
		local, client, err := s.current()
		if err == nil && local != nil {
			return local.Health(ctx)
		}
		var h ledger.Health
		if err == nil {
			h, err = client.Health(ctx)
		}
		switch {
		case err == nil:
			return h
		case errors.Is(err, forward.ErrNoHealth):
			err = s.View(ctx, func(ledger.BTx) error { return nil })
			if err == nil {
				return ledger.Health{OK: true}
			}
		case errors.Is(err, ledger.ErrClosed) && s.replaced(client):
			continue // asked nothing: ask what replaced the client
		case errors.Is(err, forward.ErrWriterLost):
			if err = s.failover(client); err == nil {
				continue
			}
		}
		return ledger.Health{Problem: "the ledger cannot be read: " + strings.ReplaceAll(err.Error(), s.path, "the ledger file")}
	}
}

// Close implements ledger.Backend. A writer stops serving (forwarders
// then fail over), closes the file once its transactions have ended, and
// only then gives up the writer lock.
func (s *shared) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	local, srv, client, sock := s.local, s.srv, s.client, s.sock
	s.mu.Unlock()
	var errs []error
	if srv != nil {
		errs = append(errs, srv.Close())
		os.Remove(sock)
	}
	if client != nil {
		errs = append(errs, client.Close())
	}
	if local != nil {
		errs = append(errs, local.Close())
	}
	errs = append(errs, s.role.Close())
	return errors.Join(errs...)
}
