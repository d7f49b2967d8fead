package server

import (
	"context"
	"net"
	"testing"
	"time"
)

// closedSoon reports whether the server side closed c within d.
func closedSoon(c net.Conn, d time.Duration) bool {
	c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	ne, ok := err.(net.Error)
	return err != nil && !(ok && ne.Timeout())
}

// TestGuardListener: at most max unauthenticated connections stay open (a
// new one closes the oldest); one that does not authenticate in time is
// closed; an authenticated one is left alone.
func TestGuardListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gl := newGuardListener(inner, 2, 300*time.Millisecond)
	defer gl.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := gl.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	dial := func() (client, server net.Conn) {
		c, err := net.Dial("tcp", inner.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c, <-accepted
	}
	c1, _ := dial()
	c2, s2 := dial()
	markAuthenticated(withConn(context.Background(), s2))
	c3, _ := dial()
	c4, _ := dial() // third unauthenticated: closes c1, the oldest
	if !closedSoon(c1, time.Second) {
		t.Errorf("the oldest unauthenticated connection was not closed")
	}
	if n := gl.Unauthenticated(); n != 2 {
		t.Errorf("%d unauthenticated connections, want 2", n)
	}
	// After the timeout the unauthenticated ones are closed, the
	// authenticated one is not.
	time.Sleep(400 * time.Millisecond)
	if !closedSoon(c3, time.Second) || !closedSoon(c4, time.Second) {
		t.Errorf("unauthenticated connections outlived the timeout")
	}
	if closedSoon(c2, 100*time.Millisecond) {
		t.Errorf("an authenticated connection was closed")
	}
	c2.Close()
}
