package server

import (
	"container/list"
	"context"
	"net"
	"sync"
	"time"
)

// Bounds on connections that have not yet carried an authenticated
// request. Without them, a few hundred connections that open and send
// nothing (or a body that never ends) hold every file descriptor the
// process may open, and no client — nor /healthz — gets in.
const (
	// DefaultMaxUnauthenticatedConns is how many such connections are
	// kept at once; one more closes the oldest of them.
	DefaultMaxUnauthenticatedConns = 64
	// DefaultUnauthenticatedConnTimeout is how long a connection may stay
	// open before its first authenticated request.
	DefaultUnauthenticatedConnTimeout = 10 * time.Second
)

// guardListener tracks accepted connections until one of their requests
// authenticates (markAuthenticated): at most max such connections are
// open at once (a new one closes the oldest), and each is closed timeout
// after it was accepted unless it authenticated by then.
type guardListener struct {
	net.Listener
	max     int
	timeout time.Duration

	mu      sync.Mutex
	pending *list.List // of *guardConn, oldest first
}

func newGuardListener(ln net.Listener, max int, timeout time.Duration) *guardListener {
	if max <= 0 {
		max = DefaultMaxUnauthenticatedConns
	}
	if timeout <= 0 {
		timeout = DefaultUnauthenticatedConnTimeout
	}
	return &guardListener{Listener: ln, max: max, timeout: timeout, pending: list.New()}
}

// guardConn is one accepted connection.
type guardConn struct {
	net.Conn
	l     *guardListener
	elem  *list.Element // in l.pending while unauthenticated; guarded by l.mu
	timer *time.Timer
	once  sync.Once
}

func (l *guardListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	gc := &guardConn{Conn: c, l: l}
	var evict *guardConn
	l.mu.Lock()
	gc.elem = l.pending.PushBack(gc)
	if l.pending.Len() > l.max {
		front := l.pending.Front()
		evict = front.Value.(*guardConn)
		l.pending.Remove(front)
		evict.elem = nil
	}
	l.mu.Unlock()
	gc.timer = time.AfterFunc(l.timeout, func() {
		l.mu.Lock()
		pending := gc.elem != nil
		l.mu.Unlock()
		if pending {
			gc.Close()
		}
	})
	if evict != nil {
		evict.Close()
	}
	return gc, nil
}

// authenticated takes c out of the unauthenticated set, for good.
func (c *guardConn) authenticated() {
	c.l.mu.Lock()
	if c.elem != nil {
		c.l.pending.Remove(c.elem)
		c.elem = nil
	}
	c.l.mu.Unlock()
	c.timer.Stop()
}

func (c *guardConn) Close() error {
	var err error
	c.once.Do(func() {
		c.authenticated() // leaves the set
		err = c.Conn.Close()
	})
	return err
}

// Unauthenticated reports how many connections have not authenticated.
func (l *guardListener) Unauthenticated() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending.Len()
}

type connKey struct{}

// withConn is http.Server.ConnContext: it lets handlers reach the
// connection to mark it authenticated.
func withConn(ctx context.Context, c net.Conn) context.Context {
	if gc, ok := c.(*guardConn); ok {
		return context.WithValue(ctx, connKey{}, gc)
	}
	return ctx
}

// markAuthenticated records that the request's connection carried a valid
// token; a no-op outside ServeHTTP.
func markAuthenticated(ctx context.Context) {
	if gc, ok := ctx.Value(connKey{}).(*guardConn); ok {
		gc.authenticated()
	}
}
