package server

import (
	"bufio"
	"io"
	"net"
	"net/http"
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

// TestGuardListener, with a capacity of 2 and at most 3 connections: a
// request beyond the capacity gets 503 with Retry-After; at the maximum a
// new connection waits, and a silent connection is closed to make room
// for it once it is idle; the requests served are answered; a kept-alive
// connection idle between requests makes room for a new one.
func TestGuardListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := inner.Addr().String()
	gl := newGuardListener(inner, 2, 3, nil)
	release := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			<-release
		}
	})}
	gl.guard(srv)
	go srv.Serve(gl)
	defer srv.Close()

	send := func(path string) (net.Conn, <-chan *http.Response) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		answer := make(chan *http.Response, 1)
		go func() {
			io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Logf("%s: %v", path, err)
				resp = nil
			}
			answer <- resp
		}()
		return c, answer
	}
	status := func(name string, answer <-chan *http.Response) *http.Response {
		t.Helper()
		select {
		case resp := <-answer:
			if resp == nil {
				t.Fatalf("%s: no HTTP answer", name)
			}
			return resp
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no answer within 5 s", name)
		}
		return nil
	}

	keep1, held1 := send("/hold")
	keep2, held2 := send("/hold")
	for gl.Open() < 2 {
		time.Sleep(10 * time.Millisecond)
	}
	_, over := send("/x")
	if resp := status("a request beyond the capacity", over); resp.StatusCode != 503 || resp.Header.Get("Retry-After") != retryAfterSeconds {
		t.Errorf("a request beyond the capacity: %d, Retry-After %q; want 503, %s", resp.StatusCode, resp.Header.Get("Retry-After"), retryAfterSeconds)
	}
	for gl.Open() > 2 { // the refused connection is closed
		time.Sleep(10 * time.Millisecond)
	}

	// A silent connection takes the last place; the next one waits.
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	for gl.Open() < 3 {
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	_, queued := send("/x")
	if resp := status("a request queued behind a silent connection", queued); resp.StatusCode != 503 {
		t.Errorf("a request queued behind a silent connection: %d, want 503 (still beyond the capacity)", resp.StatusCode)
	}
	if took := time.Since(start); took < idleGrace/2 {
		t.Errorf("the queued request was answered after %s: the silent connection was closed before it was idle", took)
	}
	if !closedSoon(silent, time.Second) {
		t.Errorf("the idle connection was not closed to make room")
	}

	close(release)
	for name, answer := range map[string]<-chan *http.Response{"first held": held1, "second held": held2} {
		if resp := status(name, answer); resp.StatusCode != 200 {
			t.Errorf("%s request: %d, want 200", name, resp.StatusCode)
		}
	}
	// Both kept alive hold the capacity; once idle, the older makes room.
	time.Sleep(idleGrace + 200*time.Millisecond)
	_, later := send("/x")
	if resp := status("a request beside two idle kept-alive connections", later); resp.StatusCode != 200 {
		t.Errorf("a request beside two idle kept-alive connections: %d, want 200", resp.StatusCode)
	}
	if !closedSoon(keep1, time.Second) && !closedSoon(keep2, time.Second) {
		t.Errorf("no idle kept-alive connection was closed to make room")
	}
}

// TestPendingInput: bytes received and not read yet are seen without
// being consumed.
func TestPendingInput(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if pendingInput(server) {
		t.Errorf("pending input before the client sent anything")
	}
	io.WriteString(client, "GET")
	deadline := time.Now().Add(2 * time.Second)
	for !pendingInput(server) {
		if time.Now().After(deadline) {
			t.Fatal("the client's bytes were never seen as pending")
		}
		time.Sleep(5 * time.Millisecond)
	}
	b := make([]byte, 8)
	n, err := server.Read(b)
	if err != nil || string(b[:n]) != "GET" {
		t.Fatalf("read after the peek: %q %v, want GET", b[:n], err)
	}
	if pendingInput(server) {
		t.Errorf("pending input after it was read")
	}
}

// TestConnLimits: the connections served, and those answered 503, fit in
// the open files left to them.
func TestConnLimits(t *testing.T) {
	for _, tc := range []struct{ files, perConn, capacity, maxOpen int }{
		{256, 1, 170, 192},
		{256, 2, 90, 102},
		{1 << 20, 1, 932010, 1048512},
		{10, 1, 1, 2}, // too few files for any: one at a time
	} {
		capacity, maxOpen := connLimits(tc.files, tc.perConn)
		if capacity != tc.capacity || maxOpen != tc.maxOpen {
			t.Errorf("connLimits(%d, %d) = %d, %d; want %d, %d", tc.files, tc.perConn, capacity, maxOpen, tc.capacity, tc.maxOpen)
		}
	}
}
