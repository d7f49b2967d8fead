package server

import (
	"container/list"
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// The HTTP transport's real capacity is the process's limit on open files
// (RLIMIT_NOFILE; Go raises the soft limit to the hard one at start): every
// connection holds one from accept to close, and a request that calls the
// order API one more while it does. The transport leaves reservedFiles to
// the rest of the process (the ledger, the outbox, PostgreSQL, background
// deliveries) and shares the others:
//
//   - up to the capacity, connections are served;
//   - an eighth more are accepted only to be answered: each request on
//     them gets 503 with Retry-After (GET /healthz excepted: a liveness
//     probe must not fail because clients are many);
//   - beyond that nothing is accepted: new connections wait in the
//     kernel's listen queue until a connection closes.
//
// A connection is never closed while a request of it is unanswered, nor
// before its first request was read, unless it is idle: it has sent
// nothing (since it was accepted, or since its last answer on a kept-alive
// connection) or nothing for idleGrace, and holds no request being read.
// When the server is at its capacity, idle connections are closed, oldest
// first, to make room for new ones; so a flood of connections that send
// nothing, or a header a byte at a time, cannot lock real clients out, and
// clients that keep connections alive between calls do not hold the room
// of others, while a burst of clients that send their requests is served
// or answered, never dropped. Any connection that has not sent a whole
// request header within http.Server.ReadHeaderTimeout is closed by
// net/http.
const (
	reservedFiles = 64
	// idleGrace is how long a connection may stay silent before it counts
	// as idle: a client sends its request as soon as it has connected,
	// but under load it may be scheduled late.
	idleGrace = time.Second
	// idleScan bounds the silent connections one search for an idle one
	// looks at (each a system call): connections that send a header a
	// byte at a time stay silent but not idle, and must not make every
	// accept cost a look at each of them. net/http closes them at
	// ReadHeaderTimeout.
	idleScan = 64
)

// retryAfterSeconds is the Retry-After of a 503 for lack of capacity:
// most requests take milliseconds, so room is made quickly.
const retryAfterSeconds = "1"

// connLimits returns how many connections are served (capacity) and how
// many may be open at all (maxOpen) by a process that may open files
// files and needs perConn of them for each connection served (one for a
// 503 answer).
func connLimits(files, perConn int) (capacity, maxOpen int) {
	usable := files - reservedFiles
	capacity = max(usable*8/(8*perConn+1), 1) // an eighth of it answers 503
	return capacity, capacity + max(usable-capacity*perConn, 1)
}

// guardListener accepts connections within the limits above; see there.
// Accept blocks while maxOpen connections are open and none of them is
// idle.
type guardListener struct {
	net.Listener
	capacity, maxOpen int
	logger            *slog.Logger
	now               func() time.Time

	freed     chan struct{} // a connection closed (buffered 1)
	done      chan struct{} // the listener closed
	closeOnce sync.Once

	mu       sync.Mutex
	open     int
	silent   *list.List // of *guardConn without a request being read, by silentSince
	warnedAt time.Time  // when the last over-capacity warning was logged
}

// newGuardListener serves at most capacity connections of ln and answers
// 503 on up to maxOpen-capacity more.
func newGuardListener(ln net.Listener, capacity, maxOpen int, logger *slog.Logger) *guardListener {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &guardListener{Listener: ln, capacity: capacity, maxOpen: maxOpen, logger: logger, now: time.Now,
		freed: make(chan struct{}, 1), done: make(chan struct{}), silent: list.New()}
}

// guardConn is one accepted connection.
type guardConn struct {
	net.Conn
	l            *guardListener
	silentSince  time.Time     // accepted, or answered last; guarded by l.mu
	lastRead     atomic.Int64  // unix nanoseconds of the last read that returned bytes
	elem         *list.Element // in l.silent while no request is read; guarded by l.mu
	overCapacity bool          // accepted beyond the capacity: answer 503
	closed       bool          // guarded by l.mu
	once         sync.Once
}

// Accept waits for room (closing idle connections when there is none),
// then accepts a connection.
func (l *guardListener) Accept() (net.Conn, error) {
	if err := l.waitForRoom(); err != nil {
		return nil, err
	}
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	gc := &guardConn{Conn: c, l: l, silentSince: l.now()}
	l.mu.Lock()
	l.open++
	gc.elem = l.silent.PushBack(gc)
	var evicted []*guardConn
	for l.open-len(evicted) > l.capacity {
		idle := l.oldestIdleLocked(evicted)
		if idle == nil {
			break
		}
		evicted = append(evicted, idle)
	}
	gc.overCapacity = l.open-len(evicted) > l.capacity
	warn := gc.overCapacity && l.now().Sub(l.warnedAt) > time.Minute
	if warn {
		l.warnedAt = l.now()
	}
	l.mu.Unlock()
	for _, idle := range evicted {
		idle.Close()
	}
	if warn {
		l.logger.Warn("HTTP connections at capacity: new connections get 503 with Retry-After (the capacity follows the limit on open files, ulimit -n)",
			"capacity", l.capacity)
	}
	return gc, nil
}

// waitForRoom returns once fewer than maxOpen connections are open, closing
// the oldest idle one while there is no room; net.ErrClosed once the
// listener is closed.
func (l *guardListener) waitForRoom() error {
	for {
		l.mu.Lock()
		room := l.open < l.maxOpen
		var idle *guardConn
		if !room {
			idle = l.oldestIdleLocked(nil)
		}
		l.mu.Unlock()
		if room {
			return nil
		}
		if idle != nil {
			idle.Close()
			continue
		}
		// Wait for a close, or for a silent connection to become idle.
		t := time.NewTimer(idleGrace / 4)
		select {
		case <-l.freed:
		case <-t.C:
		case <-l.done:
			t.Stop()
			return net.ErrClosed
		}
		t.Stop()
	}
}

// oldestIdleLocked returns the oldest idle connection not in skip, or nil.
// A silent connection is not idle while bytes it sent wait unread in the
// kernel, or within idleGrace of its accept, its last answer or its last
// read.
func (l *guardListener) oldestIdleLocked(skip []*guardConn) *guardConn {
	now := l.now()
	scanned := 0
next:
	for e := l.silent.Front(); e != nil && scanned < idleScan; e = e.Next() {
		scanned++
		gc := e.Value.(*guardConn)
		if now.Sub(gc.silentSince) < idleGrace {
			return nil // and so are all after it
		}
		for _, s := range skip {
			if s == gc {
				continue next
			}
		}
		if now.Sub(time.Unix(0, gc.lastRead.Load())) < idleGrace || pendingInput(gc.Conn) {
			continue
		}
		return gc
	}
	return nil
}

func (l *guardListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

func (c *guardConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.lastRead.Store(c.l.now().UnixNano())
	}
	return n, err
}

// requestRead takes c out of the silent connections: a request of it was
// read and will be answered. It reports whether c was accepted beyond the
// capacity.
func (c *guardConn) requestRead() (overCapacity bool) {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if c.elem != nil {
		c.l.silent.Remove(c.elem)
		c.elem = nil
	}
	return c.overCapacity
}

// trackIdle is http.Server.ConnState: a kept-alive connection waiting
// for its next request is silent again.
func trackIdle(c net.Conn, state http.ConnState) {
	gc, ok := c.(*guardConn)
	if !ok || state != http.StateIdle {
		return
	}
	l := gc.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if gc.elem == nil && !gc.closed {
		gc.silentSince = l.now()
		gc.elem = l.silent.PushBack(gc)
	}
}

func (c *guardConn) Close() error {
	var err error
	c.once.Do(func() {
		c.l.mu.Lock()
		if c.elem != nil {
			c.l.silent.Remove(c.elem)
			c.elem = nil
		}
		c.closed = true
		c.l.open--
		c.l.mu.Unlock()
		select {
		case c.l.freed <- struct{}{}:
		default:
		}
		err = c.Conn.Close()
	})
	return err
}

// Open reports how many connections are open.
func (l *guardListener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open
}

// guard makes srv enforce l's limits on the connections it serves from l:
// it sets srv's ConnContext and ConnState and puts admit before its
// handler.
func (l *guardListener) guard(srv *http.Server) {
	srv.Handler = admit(srv.Handler)
	srv.ConnContext = withConn
	srv.ConnState = trackIdle
}

type connKey struct{}

// withConn is http.Server.ConnContext: it lets admit reach the connection.
func withConn(ctx context.Context, c net.Conn) context.Context {
	if gc, ok := c.(*guardConn); ok {
		return context.WithValue(ctx, connKey{}, gc)
	}
	return ctx
}

// admit is the first handler of every request of a guardListener's
// connection: it marks the connection's request read, and answers 503
// with Retry-After, closing the connection, when the connection was
// accepted beyond the capacity (GET /healthz excepted).
func admit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gc, ok := r.Context().Value(connKey{}).(*guardConn)
		if ok && gc.requestRead() && !(r.Method == http.MethodGet && r.URL.Path == "/healthz") {
			w.Header().Set("Retry-After", retryAfterSeconds)
			refuse(w, r, http.StatusServiceUnavailable, "the server is at its connection capacity; retry in "+retryAfterSeconds+" s")
			return
		}
		next.ServeHTTP(w, r)
	})
}
