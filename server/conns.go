package server

import (
	"container/list"
	"context"
	"fmt"
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
//   - up to the capacity, connections are served: each holds a slot from
//     its first request (or its accept) to its close;
//   - about an eighth more are accepted, and their requests wait up to
//     slotWait for a slot; one that gets none is answered 503 with
//     Retry-After (GET /healthz is answered without a slot: a liveness
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
	// slotWait is how long a request beyond the capacity waits for a
	// slot before it is answered 503: as long as the Retry-After it would
	// get, since most requests take milliseconds.
	slotWait = time.Second
)

// connLimits returns how many connections are served (capacity) and how
// many may be open at all (maxOpen) by a process that may open files
// files and needs perConn of them for each connection served (one for a
// 503 answer).
func connLimits(files, perConn int) (capacity, maxOpen int) {
	usable := files - reservedFiles
	capacity = max(usable*8/(8*perConn+1), 1) // the rest: connections waiting for a slot
	return capacity, capacity + max(usable-capacity*perConn, 1)
}

// guardListener accepts connections within the limits above; see there.
// Accept blocks while maxOpen connections are open and none of them is
// idle.
type guardListener struct {
	net.Listener
	capacity, maxOpen int
	logger            *slog.Logger
	metrics           *Metrics // counts the 503s; nil counts nothing
	now               func() time.Time

	done      chan struct{} // the listener closed
	closeOnce sync.Once

	mu       sync.Mutex
	open     int           // connections accepted and not closed
	served   int           // of them, those holding a slot
	changed  chan struct{} // closed, and replaced, when a connection closes
	silent   *list.List    // of *guardConn without a request being read, by silentSince
	warnedAt time.Time     // when the last over-capacity warning was logged
}

// newGuardListener serves at most capacity connections of ln at once and
// keeps up to maxOpen-capacity more waiting for a slot.
func newGuardListener(ln net.Listener, capacity, maxOpen int, logger *slog.Logger) *guardListener {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &guardListener{Listener: ln, capacity: capacity, maxOpen: maxOpen, logger: logger, now: time.Now,
		done: make(chan struct{}), changed: make(chan struct{}), silent: list.New()}
}

// guardConn is one accepted connection.
type guardConn struct {
	net.Conn
	l           *guardListener
	lastRead    atomic.Int64  // unix nanoseconds of the last read that returned bytes
	silentSince time.Time     // accepted, or answered last; guarded by l.mu
	elem        *list.Element // in l.silent while no request is read; guarded by l.mu
	served      bool          // holds a slot; guarded by l.mu
	closed      bool          // guarded by l.mu
	once        sync.Once
}

// Accept waits for room (closing idle connections when there is none),
// then accepts a connection, with a slot when one is free or can be made
// free by closing idle connections.
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
	for l.served >= l.capacity {
		idle := l.oldestIdleLocked()
		if idle == nil {
			break
		}
		idle.releaseLocked()
		evicted = append(evicted, idle)
	}
	gc.takeSlotLocked()
	l.mu.Unlock()
	for _, idle := range evicted {
		idle.Close()
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
			if idle = l.oldestIdleLocked(); idle != nil {
				idle.releaseLocked()
			}
		}
		changed := l.changed
		l.mu.Unlock()
		if idle != nil {
			idle.Close()
			continue
		}
		if room {
			return nil
		}
		// Wait for a close, or for a silent connection to become idle.
		t := time.NewTimer(idleGrace / 4)
		select {
		case <-changed:
		case <-t.C:
		case <-l.done:
			t.Stop()
			return net.ErrClosed
		}
		t.Stop()
	}
}

// oldestIdleLocked returns the oldest idle connection, or nil. A silent
// connection is not idle while bytes it sent wait unread in the kernel,
// or within idleGrace of its accept, its last answer or its last read.
func (l *guardListener) oldestIdleLocked() *guardConn {
	now := l.now()
	scanned := 0
	for e := l.silent.Front(); e != nil && scanned < idleScan; e = e.Next() {
		scanned++
		gc := e.Value.(*guardConn)
		if now.Sub(gc.silentSince) < idleGrace {
			return nil // and so are all after it
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

// takeSlotLocked gives c a slot if it has none and one is free.
func (c *guardConn) takeSlotLocked() {
	if !c.served && !c.closed && c.l.served < c.l.capacity {
		c.l.served++
		c.served = true
	}
}

// waitForSlot takes c out of the silent connections — a request of it
// was read and will be answered — and reports whether it holds a slot,
// waiting up to slotWait (or until ctx is done) for one, and closing idle
// connections to make one.
func (c *guardConn) waitForSlot(ctx context.Context) bool {
	l := c.l
	t := time.NewTimer(slotWait)
	defer t.Stop()
	for {
		l.mu.Lock()
		if c.elem != nil {
			l.silent.Remove(c.elem)
			c.elem = nil
		}
		c.takeSlotLocked()
		var idle *guardConn
		if !c.served {
			if idle = l.oldestIdleLocked(); idle != nil {
				idle.releaseLocked()
			}
		}
		served, changed := c.served, l.changed
		l.mu.Unlock()
		if served {
			return true
		}
		if idle != nil {
			idle.Close()
			continue
		}
		tick := time.NewTimer(idleGrace / 4) // a silent connection may become idle
		select {
		case <-changed:
		case <-tick.C:
		case <-t.C:
			tick.Stop()
			l.warnFull()
			return false
		case <-ctx.Done():
			tick.Stop()
			return false
		}
		tick.Stop()
	}
}

// warnFull logs, at most once a minute, that requests get 503.
func (l *guardListener) warnFull() {
	l.mu.Lock()
	warn := l.now().Sub(l.warnedAt) > time.Minute
	if warn {
		l.warnedAt = l.now()
	}
	l.mu.Unlock()
	if warn {
		l.logger.Warn("HTTP connections at capacity: requests get 503 with Retry-After (the capacity follows the limit on open files, ulimit -n)",
			"capacity", l.capacity)
	}
}

// silence takes c out of the silent connections without a slot: a request
// that needs none (GET /healthz) was read.
func (c *guardConn) silence() {
	c.l.mu.Lock()
	defer c.l.mu.Unlock()
	if c.elem != nil {
		c.l.silent.Remove(c.elem)
		c.elem = nil
	}
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

// releaseLocked gives back c's place among the open connections and its
// slot, once; c must then be closed.
func (c *guardConn) releaseLocked() {
	l := c.l
	if c.closed {
		return
	}
	c.closed = true
	if c.elem != nil {
		l.silent.Remove(c.elem)
		c.elem = nil
	}
	l.open--
	if c.served {
		l.served--
		c.served = false
	}
	close(l.changed)
	l.changed = make(chan struct{})
}

func (c *guardConn) Close() error {
	var err error
	c.once.Do(func() {
		c.l.mu.Lock()
		c.releaseLocked()
		c.l.mu.Unlock()
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
// connection: the request is served once its connection holds a slot;
// one that gets none within slotWait is answered 503 with Retry-After,
// and its connection closed. GET /healthz needs no slot.
func admit(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if gc, ok := r.Context().Value(connKey{}).(*guardConn); ok {
			if r.Method == http.MethodGet && r.URL.Path == "/healthz" {
				gc.silence()
			} else if !gc.waitForSlot(r.Context()) {
				gc.l.metrics.busyRefused(BusyConnections)
				refuseForNow(w, r, http.StatusServiceUnavailable, slotWait,
					fmt.Sprintf("the server is at its connection capacity; retry in %d s", retryAfter(slotWait)))
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}
