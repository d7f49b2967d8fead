package pgtest

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// CutMode says where a CutProxy cuts a connection that sends COMMIT.
type CutMode int

const (
	// CutAfter forwards COMMIT, waits for the server's answer to it (the
	// transaction has ended: committed, unless the commit itself failed),
	// drops that answer and closes both sides: the client never learns
	// that its transaction committed.
	CutAfter CutMode = iota + 1
	// CutBefore closes both sides instead of forwarding COMMIT: the
	// server rolls the transaction back when it sees the connection gone.
	CutBefore
)

func (m CutMode) String() string {
	switch m {
	case CutAfter:
		return "after the server got COMMIT"
	case CutBefore:
		return "before the server got COMMIT"
	}
	return fmt.Sprintf("CutMode(%d)", int(m))
}

// CutProxy is a TCP proxy in front of one PostgreSQL database that, when
// armed, drops the connection of a transaction as it sends COMMIT — the
// fault the ledger must answer by reading the outcome back, never by
// guessing. It follows each connection's messages (the protocol's
// framing: a length-prefixed startup message, then typed messages), so it
// can pick the COMMIT of the transaction it was armed for: the first
// COMMIT, on any connection, of a transaction (the messages since that
// connection's last BEGIN) that carried every byte string Arm was given.
// The clients must not ask for TLS (sslmode=disable, as Cluster.URL says).
// Its methods are safe for concurrent use.
type CutProxy struct {
	*proxy
	mu    sync.Mutex
	armed *cutSpec // nil: forward everything
	cuts  int
}

// cutSpec is what Arm asked for.
type cutSpec struct {
	mode  CutMode
	match [][]byte
}

// NewCutProxy starts a proxy in front of the database at url (a URL of a
// Cluster, such as NewDatabase returns) on a free loopback port; URL is
// the database's URL through it. Every connection is closed, and the
// proxy stopped, when the test ends (register it before the clients that
// use it, so that they are stopped first).
func NewCutProxy(t testing.TB, url string) *CutProxy {
	t.Helper()
	p := &CutProxy{}
	p.proxy = newProxy(t, "NewCutProxy", url)
	p.start(p.serve)
	return p
}

// Arm makes the proxy cut the next COMMIT, in mode, of a transaction
// whose messages (queries and their parameters, since BEGIN) contain
// every one of match; with no match, the next COMMIT of any transaction.
// It replaces an earlier Arm that has not cut yet. Once it has cut, the
// proxy forwards everything again until armed again.
func (p *CutProxy) Arm(mode CutMode, match ...string) {
	spec := &cutSpec{mode: mode}
	for _, m := range match {
		spec.match = append(spec.match, []byte(m))
	}
	p.mu.Lock()
	p.armed = spec
	p.mu.Unlock()
}

// Disarm cancels an Arm that has not cut yet.
func (p *CutProxy) Disarm() {
	p.mu.Lock()
	p.armed = nil
	p.mu.Unlock()
}

// Armed reports whether an Arm is still waiting for its COMMIT.
func (p *CutProxy) Armed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.armed != nil
}

// Cuts is how many connections the proxy has cut.
func (p *CutProxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// take reports whether the COMMIT of a transaction that sent tx is the one
// to cut, and how; it disarms the proxy when it is.
func (p *CutProxy) take(tx []byte) (CutMode, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed == nil {
		return 0, false
	}
	for _, m := range p.armed.match {
		if !bytes.Contains(tx, m) {
			return 0, false
		}
	}
	mode := p.armed.mode
	p.armed = nil
	return mode, true
}

// maxTxBytes bounds what the proxy keeps of one transaction's messages to
// match Arm's strings against (a long transaction is matched on its
// beginning).
const maxTxBytes = 4 << 20

// serve proxies one client connection until either side closes it or the
// proxy cuts it. It returns once both of its directions have stopped.
func (p *CutProxy) serve(client net.Conn) {
	server, ok := p.dial()
	if !ok {
		return
	}
	defer p.untrack(server)
	// mute drops the server's answers once the COMMIT to cut is sent;
	// answered is closed when the server's answer to it has come.
	var mute atomic.Bool
	answered := make(chan struct{})
	backDone := make(chan struct{})
	go func() {
		defer close(backDone)
		defer client.Close()
		p.pipeBackend(server, client, &mute, answered)
	}()
	defer func() { server.Close(); <-backDone }()

	r := bufio.NewReaderSize(client, 64<<10)
	w := bufio.NewWriterSize(server, 64<<10)
	if _, raw, err := readMessage(r, false); err != nil { // the startup message
		return
	} else if _, err := w.Write(raw); err != nil || w.Flush() != nil {
		return
	}
	var tx []byte // the current transaction's messages
	inTx := false
	// cut counts a cut connection; cutAtSync, set when a pipelined COMMIT
	// (a batch's Bind of "commit") is to be cut after the server got it,
	// ends the connection once the batch's Sync is forwarded and answered.
	cut := func() {
		p.mu.Lock()
		p.cuts++
		p.mu.Unlock()
	}
	cutAtSync := false
	// The connection's prepared statements' queries (lower case), by
	// name: a BEGIN may also come as the Bind of one (pgx's batches).
	stmts := map[string][]byte{}
	for {
		typ, raw, err := readMessage(r, true)
		if err != nil {
			w.Flush()
			return
		}
		switch typ {
		case 'P': // Parse: name, query, …
			if f := bytes.SplitN(raw[5:], []byte{0}, 3); len(f) == 3 {
				stmts[string(f[0])] = bytes.ToLower(bytes.TrimSpace(f[1]))
			}
		case 'B': // Bind: portal, statement, …
			f := bytes.SplitN(raw[5:], []byte{0}, 3)
			if len(f) < 3 {
				break
			}
			switch q := stmts[string(f[1])]; {
			case bytes.HasPrefix(q, []byte("begin")):
				tx, inTx = tx[:0], true
			case bytes.Equal(q, []byte("commit")) && inTx && !cutAtSync:
				// A COMMIT pipelined after the transaction's last
				// statements: cut before it reaches the server, or
				// after the server has answered the whole batch.
				if mode, ok := p.take(tx); ok {
					if mode == CutBefore {
						cut()
						return // the deferred closes cut both sides
					}
					mute.Store(true)
					cutAtSync = true
				} else {
					inTx = false
				}
			}
		case 'S': // Sync: the end of a batch
			if cutAtSync {
				if _, err := w.Write(raw); err == nil && w.Flush() == nil {
					select { // a bound for a server that never answers
					case <-answered:
					case <-time.After(time.Minute):
					}
				}
				cut()
				return
			}
		}
		if typ == 'Q' {
			q := bytes.ToLower(bytes.TrimRight(raw[5:], "\x00"))
			switch {
			case bytes.HasPrefix(q, []byte("begin")):
				tx, inTx = tx[:0], true
			case bytes.Equal(q, []byte("commit")):
				if !inTx {
					break
				}
				if mode, ok := p.take(tx); ok {
					if mode == CutAfter {
						mute.Store(true)
						if _, err := w.Write(raw); err == nil && w.Flush() == nil {
							select { // a bound for a server that never answers
							case <-answered:
							case <-time.After(time.Minute):
							}
						}
					}
					cut()
					return // the deferred closes cut both sides
				}
				inTx = false
			case bytes.Equal(q, []byte("rollback")):
				inTx = false
			}
		}
		if inTx && len(tx)+len(raw) <= maxTxBytes {
			tx = append(tx, raw...)
		}
		if _, err := w.Write(raw); err != nil {
			return
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

// pipeBackend forwards the server's messages to the client until either
// fails; once mute is set it drops them, and closes answered at the
// first ReadyForQuery (the answer to the COMMIT that was cut).
func (p *CutProxy) pipeBackend(server, client net.Conn, mute *atomic.Bool, answered chan struct{}) {
	r := bufio.NewReaderSize(server, 64<<10)
	w := bufio.NewWriterSize(client, 64<<10)
	for {
		typ, raw, err := readMessage(r, true)
		if err != nil {
			w.Flush()
			return
		}
		if mute.Load() {
			if typ == 'Z' {
				close(answered)
				return
			}
			continue
		}
		if _, err := w.Write(raw); err != nil {
			return
		}
		if r.Buffered() == 0 {
			if err := w.Flush(); err != nil {
				return
			}
		}
	}
}

var errFrame = errors.New("pgtest: a message of the PostgreSQL protocol with an impossible length")

// readMessage reads one protocol message, returning it whole (type byte,
// if typed, and length included).
func readMessage(r *bufio.Reader, typed bool) (typ byte, raw []byte, err error) {
	n := 4
	if typed {
		n = 5
	}
	hdr := make([]byte, n)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return 0, nil, err
	}
	l := binary.BigEndian.Uint32(hdr[n-4:])
	if l < 4 || l > 1<<30 {
		return 0, nil, errFrame
	}
	raw = make([]byte, n+int(l)-4)
	copy(raw, hdr)
	if _, err := io.ReadFull(r, raw[n:]); err != nil {
		return 0, nil, err
	}
	if typed {
		typ = hdr[0]
	}
	return typ, raw, nil
}
