package owner

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// waitFor bounds the wait of a test for something that should happen at
// once.
const waitFor = 3 * time.Second

// fakeOwner listens at a place in a temporary directory, welcomes every
// hello and hands each connection to the test, which speaks for the owner.
type fakeOwner struct {
	place Place
	conns chan *ownerConn
	// hangUp: the owner closes each connection right after its welcome.
	hangUp atomic.Bool
}

func newFakeOwner(t *testing.T) *fakeOwner {
	t.Helper()
	dir := t.TempDir()
	p := Place{Ledger: filepath.Join(dir, "l.db"), Socket: filepath.Join(dir, "o.sock"), Log: filepath.Join(dir, "o.log")}
	ln, err := Listen(p)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeOwner{place: p, conns: make(chan *ownerConn, 8)}
	var (
		mu    sync.Mutex
		conns []*ownerConn
	)
	accepted := make(chan struct{})
	go func() { // ends when the listener closes
		defer close(accepted)
		for {
			c, err := ln.Accept(func(err error) { t.Errorf("refused: %v", err) })
			if err != nil {
				return
			}
			oc := &ownerConn{c: c, r: bufio.NewReader(c)}
			mu.Lock()
			conns = append(conns, oc)
			mu.Unlock()
			if err := Receive(c, oc.r, &oc.hello); err != nil {
				t.Errorf("fake owner: hello: %v", err)
				c.Close()
				continue
			}
			if err := Send(c, Welcome{OK: true, PID: 4242, Build: oc.hello.Build}); err != nil {
				t.Errorf("fake owner: welcome: %v", err)
			}
			if f.hangUp.Load() {
				c.Close()
				continue
			}
			f.conns <- oc
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-accepted
		mu.Lock()
		defer mu.Unlock()
		for _, oc := range conns {
			oc.c.Close()
		}
	})
	return f
}

// connect is a PipeConfig.Connect to the fake owner: it never starts one.
func (f *fakeOwner) connect() (*Conn, error) {
	return Connect(f.place, Hello{}, func() error { return errors.New("the test starts no owner") })
}

// accept returns the next connection the fake owner welcomed.
func (f *fakeOwner) accept(t *testing.T) *ownerConn {
	t.Helper()
	select {
	case oc := <-f.conns:
		return oc
	case <-time.After(waitFor):
		t.Fatal("no connection reached the owner")
		return nil
	}
}

// noConn checks that no new connection reached the owner.
func (f *fakeOwner) noConn(t *testing.T) {
	t.Helper()
	select {
	case <-f.conns:
		t.Fatal("a connection reached the owner")
	default:
	}
}

// ownerConn is one connection of the fake owner past its welcome. Until
// serve is called nothing reads it: an owner stopped (SIGSTOP) as it is.
type ownerConn struct {
	c     *net.UnixConn
	r     *bufio.Reader
	hello Hello
	lines chan []byte // what the pipe wrote, but pings, once served
	pings chan []byte
}

// serve reads the connection: pings are answered as an owner answers
// them, every other line goes to the test through next.
func (oc *ownerConn) serve() {
	oc.lines = make(chan []byte, 64)
	oc.pings = make(chan []byte, 64)
	go func() { // ends with the connection
		defer close(oc.lines)
		for {
			line, err := oc.r.ReadBytes('\n')
			if len(line) > 0 {
				var m struct {
					ID     json.RawMessage `json:"id"`
					Method string          `json:"method"`
				}
				if json.Unmarshal(line, &m) == nil && m.Method == "ping" {
					oc.pings <- line
					oc.c.Write([]byte(`{"jsonrpc":"2.0","id":` + string(m.ID) + `,"result":{}}` + "\n"))
					continue
				}
				oc.lines <- line
			}
			if err != nil {
				return
			}
		}
	}()
}

// next returns the next line the pipe passed to the owner.
func (oc *ownerConn) next(t *testing.T) []byte {
	t.Helper()
	select {
	case line, ok := <-oc.lines:
		if !ok {
			t.Fatal("the connection to the owner ended")
		}
		return line
	case <-time.After(waitFor):
		t.Fatal("no line reached the owner")
		return nil
	}
}

// expect checks that the next line the owner reads is want, byte for byte.
func (oc *ownerConn) expect(t *testing.T, want string) {
	t.Helper()
	if got := oc.next(t); string(got) != want {
		t.Fatalf("the owner read %q, want %q", got, want)
	}
}

// ended checks that the pipe wrote nothing more and closed the connection.
func (oc *ownerConn) ended(t *testing.T) {
	t.Helper()
	select {
	case line, ok := <-oc.lines:
		if ok {
			t.Errorf("the owner read %q", line)
		}
	case <-time.After(waitFor):
		t.Error("the pipe did not close its connection to the owner")
	}
}

func (oc *ownerConn) send(t *testing.T, line string) {
	t.Helper()
	if _, err := oc.c.Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
}

// client is the MCP client's end of a running Pipe.
type client struct {
	in    *io.PipeWriter
	out   chan []byte   // each line the pipe wrote to the client
	logs  chan string   // the message of each record the pipe logged
	done  chan struct{} // closed when Pipe has returned
	ended time.Time     // when Pipe returned
}

// lineWriter passes each Write (the pipe writes a line at a time) on.
type lineWriter chan []byte

func (w lineWriter) Write(b []byte) (int, error) {
	w <- bytes.Clone(b)
	return len(b), nil
}

// logHandler passes the message of each record on, without waiting.
type logHandler chan string

func (h logHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h logHandler) Handle(_ context.Context, r slog.Record) error {
	select {
	case h <- r.Message:
	default:
	}
	return nil
}
func (h logHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h logHandler) WithGroup(string) slog.Handler      { return h }

// startPipe runs Pipe on first with cfg's Connect and Grace; the test's
// end closes the client's input and waits for Pipe to return.
func startPipe(t *testing.T, first *Conn, cfg PipeConfig) *client {
	t.Helper()
	r, w := io.Pipe()
	cl := &client{in: w, out: make(chan []byte, 64), logs: make(chan string, 64), done: make(chan struct{})}
	cfg.In, cfg.Out, cfg.Logger = r, lineWriter(cl.out), slog.New(logHandler(cl.logs))
	go func() {
		defer close(cl.done)
		if err := Pipe(context.Background(), first, cfg); err != nil {
			t.Errorf("Pipe: %v", err)
		}
		cl.ended = time.Now()
	}()
	t.Cleanup(func() {
		w.Close()
		select {
		case <-cl.done:
		case <-time.After(cfg.Grace + waitFor):
			t.Error("Pipe did not return")
		}
	})
	return cl
}

func (cl *client) send(t *testing.T, line string) {
	t.Helper()
	if _, err := cl.in.Write([]byte(line)); err != nil {
		t.Fatal(err)
	}
}

// next returns the next line the client reads, waiting up to d.
func (cl *client) nextWithin(t *testing.T, d time.Duration) []byte {
	t.Helper()
	select {
	case line := <-cl.out:
		return line
	case <-time.After(d):
		t.Fatalf("the client read nothing within %s", d)
		return nil
	}
}

func (cl *client) next(t *testing.T) []byte { t.Helper(); return cl.nextWithin(t, waitFor) }

// expect checks that the next line the client reads is want, byte for byte.
func (cl *client) expect(t *testing.T, want string) {
	t.Helper()
	if got := cl.next(t); string(got) != want {
		t.Fatalf("the client read %q, want %q", got, want)
	}
}

// nothing checks that the client reads nothing for d.
func (cl *client) nothing(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case line := <-cl.out:
		t.Fatalf("the client read %q", line)
	case <-time.After(d):
	}
}

// logged waits for a record whose message starts with prefix.
func (cl *client) logged(t *testing.T, prefix string) {
	t.Helper()
	deadline := time.After(waitFor)
	for {
		select {
		case msg := <-cl.logs:
			if strings.HasPrefix(msg, prefix) {
				return
			}
		case <-deadline:
			t.Fatalf("the pipe did not log %q", prefix)
		}
	}
}

// end closes the client's input and returns how long Pipe took to return.
func (cl *client) end(t *testing.T, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	cl.in.Close()
	select {
	case <-cl.done:
		return cl.ended.Sub(start)
	case <-time.After(within):
		t.Fatalf("Pipe did not return within %s of the end of its input", within)
		return 0
	}
}

// toolError checks that line answers request id with the tool result of
// an internal error (isError, the envelope with status unknown) for the
// operation key (none when key is ""), and returns its message.
func toolError(t *testing.T, line []byte, id, key string) string {
	t.Helper()
	var a struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Result  struct {
			Content []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			} `json:"content"`
			StructuredContent json.RawMessage `json:"structuredContent"`
			IsError           bool            `json:"isError"`
		} `json:"result"`
	}
	strict(t, line, &a)
	if a.JSONRPC != "2.0" || string(a.ID) != id || !a.Result.IsError {
		t.Fatalf("answer %s: want jsonrpc 2.0, id %s, isError true", line, id)
	}
	var env struct {
		Status       string  `json:"status"`
		Replayed     *bool   `json:"replayed"`
		NextAction   string  `json:"next_action"`
		OperationKey *string `json:"operation_key"`
		Error        struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	strict(t, a.Result.StructuredContent, &env)
	if env.Status != "unknown" || env.Replayed == nil || *env.Replayed || env.NextAction != "wait_and_poll_status" || env.Error.Code != "internal" {
		t.Fatalf("envelope %s: want status unknown, replayed false, next_action wait_and_poll_status, error.code internal", a.Result.StructuredContent)
	}
	switch {
	case key == "" && env.OperationKey != nil:
		t.Fatalf("envelope %s has an operation_key; the call had none", a.Result.StructuredContent)
	case key != "" && (env.OperationKey == nil || *env.OperationKey != key):
		t.Fatalf("envelope %s: want operation_key %q", a.Result.StructuredContent, key)
	}
	if len(a.Result.Content) != 1 || a.Result.Content[0].Type != "text" || a.Result.Content[0].Text != string(a.Result.StructuredContent) {
		t.Fatalf("content %+v: want one text, the envelope %s", a.Result.Content, a.Result.StructuredContent)
	}
	if env.Error.Message == "" {
		t.Fatal("the envelope's error has no message")
	}
	return env.Error.Message
}

// rpcError checks that line answers request id with JSON-RPC error -32603
// and returns its message.
func rpcError(t *testing.T, line []byte, id string) string {
	t.Helper()
	var a struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	strict(t, line, &a)
	if a.JSONRPC != "2.0" || string(a.ID) != id || a.Error.Code != -32603 || a.Error.Message == "" {
		t.Fatalf("answer %s: want jsonrpc 2.0, id %s, error -32603 with a message", line, id)
	}
	return a.Error.Message
}

// strict decodes b into v, refusing members v does not name.
func strict(t *testing.T, b []byte, v any) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
}

// answerID returns the id of an answer line.
func answerID(t *testing.T, line []byte) string {
	t.Helper()
	var m struct {
		ID json.RawMessage `json:"id"`
	}
	if err := json.Unmarshal(line, &m); err != nil {
		t.Fatalf("%s: %v", line, err)
	}
	return string(m.ID)
}
