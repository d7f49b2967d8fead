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
// request beyond the capacity waits for a slot — served when one frees
// within slotWait, 503 with Retry-After otherwise; at the maximum a new
// connection waits, and a silent connection is closed to make room for it
// once it is idle; a kept-alive connection idle between requests makes
// room for a new one.
func TestGuardListener(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := inner.Addr().String()
	gl := newGuardListener(inner, 2, 3, nil)
	release := map[string]chan struct{}{"/hold1": make(chan struct{}), "/hold2": make(chan struct{})}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ch, ok := release[r.URL.Path]; ok {
			<-ch
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
	answer := func(name string, answer <-chan *http.Response) (*http.Response, time.Duration) {
		t.Helper()
		start := time.Now()
		select {
		case resp := <-answer:
			if resp == nil {
				t.Fatalf("%s: no HTTP answer", name)
			}
			return resp, time.Since(start)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no answer within 5 s", name)
		}
		return nil, 0
	}
	waitOpen := func(n int) {
		for gl.Open() != n {
			time.Sleep(10 * time.Millisecond)
		}
	}

	keep1, held1 := send("/hold1")
	_, held2 := send("/hold2")
	waitOpen(2)
	_, over := send("/x")
	resp, took := answer("a request beyond the capacity", over)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || took < slotWait*9/10 {
		t.Errorf("a request beyond the capacity: %d after %s, Retry-After %q; want 503 after %s, %s", resp.StatusCode, took, resp.Header.Get("Retry-After"), slotWait, "1")
	}
	waitOpen(2) // the refused connection is closed

	// A slot freed while a request waits goes to it.
	_, waiting := send("/x")
	waitOpen(3)
	time.Sleep(slotWait / 4)
	close(release["/hold1"])
	if resp, _ := answer("first held", held1); resp.StatusCode != 200 {
		t.Errorf("first held request: %d, want 200", resp.StatusCode)
	}
	keep1.Close()
	if resp, _ := answer("a request waiting while a slot frees", waiting); resp.StatusCode != 200 {
		t.Errorf("a request waiting while a slot frees: %d, want 200", resp.StatusCode)
	}

	// A silent connection takes the last place; the next one waits.
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	waitOpen(3)
	_, queued := send("/x")
	if resp, took := answer("a request queued behind a silent connection", queued); resp.StatusCode != 200 || took < idleGrace/2 {
		t.Errorf("a request queued behind a silent connection: %d after %s, want 200 once the silent one is idle (%s)", resp.StatusCode, took, idleGrace)
	}
	if !closedSoon(silent, time.Second) {
		t.Errorf("the idle connection was not closed to make room")
	}

	// Two kept-alive connections (the last two) hold the capacity; once
	// idle, the older makes room.
	close(release["/hold2"])
	if resp, _ := answer("second held", held2); resp.StatusCode != 200 {
		t.Errorf("second held request: %d, want 200", resp.StatusCode)
	}
	time.Sleep(idleGrace + 200*time.Millisecond)
	_, later := send("/x")
	if resp, took := answer("a request beside two idle kept-alive connections", later); resp.StatusCode != 200 || took > slotWait/2 {
		t.Errorf("a request beside two idle kept-alive connections: %d after %s, want 200 at once", resp.StatusCode, took)
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
