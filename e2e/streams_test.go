package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// rpcMessage is one JSON-RPC message as a test reads it off a stream.
type rpcMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		ProgressToken any     `json:"progressToken"`
		Progress      float64 `json:"progress"`
		RequestID     any     `json:"requestId"`
	} `json:"params"`
	Result json.RawMessage `json:"result"`
	Error  json.RawMessage `json:"error"`
	raw    string
}

func (m rpcMessage) isAnswer() bool      { return m.Method == "" && len(m.ID) > 0 }
func (m rpcMessage) String() string      { return clip(m.raw, 300) }
func (m rpcMessage) answers(id int) bool { return m.isAnswer() && string(m.ID) == fmt.Sprint(id) }

// liveStream is one HTTP response of the MCP endpoint read as it arrives:
// a JSON body (one message) or server-sent events (one message each).
type liveStream struct {
	done chan struct{} // closed when the response has ended

	mu     sync.Mutex
	status int
	ctype  string
	msgs   []rpcMessage
	err    error
	ended  time.Time
}

// openStream sends one request to base/mcp (POST with body, or GET when
// body is "") on a 2025-11-25 session sid, headers hdr added, and reads
// its response in the background until it ends or ctx is done.
func openStream(ctx context.Context, base, token, sid, body string, hdr ...string) *liveStream {
	ls := &liveStream{done: make(chan struct{})}
	go func() {
		defer close(ls.done)
		err := ls.read(ctx, base, token, sid, body, hdr)
		ls.mu.Lock()
		defer ls.mu.Unlock()
		ls.ended = time.Now()
		if err != nil && ctx.Err() == nil {
			ls.err = err
		}
	}()
	return ls
}

func (ls *liveStream) read(ctx context.Context, base, token, sid, body string, hdr []string) error {
	method, accept := http.MethodPost, "application/json, text/event-stream"
	var rd io.Reader
	if body == "" {
		method, accept = http.MethodGet, "text/event-stream"
	} else {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, base+"/mcp", rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Accept", accept)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
		req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	ls.mu.Lock()
	ls.status, ls.ctype = resp.StatusCode, resp.Header.Get("Content-Type")
	ls.mu.Unlock()
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return err
		}
		if b = bytes.TrimSpace(b); len(b) > 0 && resp.Header.Get("Content-Type") == "application/json" {
			return ls.add(b)
		}
		return nil
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data:"); ok {
			if err := ls.add([]byte(strings.TrimSpace(data))); err != nil {
				return err
			}
		}
	}
	return sc.Err()
}

func (ls *liveStream) add(b []byte) error {
	m := rpcMessage{raw: string(b)}
	if err := json.Unmarshal(b, &m); err != nil {
		return fmt.Errorf("a message that is not JSON-RPC: %q: %w", b, err)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	ls.msgs = append(ls.msgs, m)
	return nil
}

func (ls *liveStream) messages() []rpcMessage {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return append([]rpcMessage(nil), ls.msgs...)
}

func (ls *liveStream) headers() (int, string) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.status, ls.ctype
}

// progressOf counts the progress notifications in msgs per token.
func progressOf(msgs []rpcMessage) map[any]int {
	n := map[any]int{}
	for _, m := range msgs {
		if m.Method == "notifications/progress" {
			n[m.Params.ProgressToken]++
		}
	}
	return n
}

// callBody is a tools/call of tool with args and, unless token is "", a
// progress token; meta adds members to its _meta.
func callBody(id int, tool string, args any, token string, meta ...string) string {
	a, _ := json.Marshal(args)
	m := meta
	if token != "" {
		m = append(m, `"progressToken":"`+token+`"`)
	}
	return fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":%q,"arguments":%s,"_meta":{%s}}}`,
		id, tool, a, strings.Join(m, ","))
}

// checkOwnStream checks what the stream of call id (progress token token)
// carried: only its own progress, each notification once (progress
// strictly increasing), at least min of them, then its answer, last.
func checkOwnStream(t *testing.T, ls *liveStream, id int, token string, min int) {
	t.Helper()
	if err := ls.err; err != nil {
		t.Errorf("call %d: reading its stream: %v", id, err)
	}
	var progress []float64
	answered := false
	for _, m := range ls.messages() {
		switch {
		case answered:
			t.Errorf("call %d: a message after its answer: %s", id, m)
		case m.Method == "notifications/progress" && m.Params.ProgressToken == token:
			progress = append(progress, m.Params.Progress)
		case m.Method != "":
			t.Errorf("call %d: its stream carried another request's notification: %s", id, m)
		case m.answers(id):
			answered = true
		default:
			t.Errorf("call %d: its stream carried an answer to another request: %s", id, m)
		}
	}
	if !answered {
		t.Errorf("call %d: no answer on its stream (messages: %v)", id, ls.messages())
	}
	if len(progress) < min {
		t.Errorf("call %d: %d progress notifications for %q on its own stream, want at least %d (all: %v)", id, len(progress), token, min, progressOf(ls.messages()))
	}
	for i := 1; i < len(progress); i++ {
		if progress[i] <= progress[i-1] {
			t.Errorf("call %d: progress %v: a notification arrived twice or out of order", id, progress)
			break
		}
	}
}

// TestProgressOnItsOwnStreamHTTP: over Streamable HTTP (2025-11-25, one
// session), two duplicates wait for operations another executor holds
// while the session's GET stream is open. Each call's progress
// notifications arrive on its own POST stream only, each once, ahead of
// its answer; the GET stream and the other call's stream carry none of
// them. Then a third waiting duplicate is cancelled (notifications/
// cancelled): its stream ends promptly without an answer, and the session
// keeps serving.
func TestProgressOnItsOwnStreamHTTP(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	tokens := filepath.Join(dir, "tokens.json")
	token := addToken(t, tokens, "alice", "default", "agent")
	argsA := orderArgs(newKey(), "cust-stream-a", coffee, nil)
	argsB := orderArgs(newKey(), "cust-stream-b", coffee, nil)
	startClaimer(t, db, "create_order", argsA)
	startClaimer(t, db, "create_order", argsB)
	const wait = 2 * time.Second // one progress notification every 250 ms: 8 per wait
	base := httpServer(t, db, tokens, "--wait", wait.String())
	sid := initialize(t, base, token, "e2e-streams")
	if resp, body := post(t, base, token, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != http.StatusAccepted {
		t.Fatalf("notifications/initialized: %d %s", resp.StatusCode, body)
	}
	ctx := testContext(t)

	getCtx, closeGet := context.WithCancel(ctx)
	defer closeGet()
	get := openStream(getCtx, base, token, sid, "")
	if !eventually(5*time.Second, func() bool { st, _ := get.headers(); return st != 0 }) {
		t.Fatalf("the GET stream did not open")
	}
	if st, ct := get.headers(); st != http.StatusOK || !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("GET stream: %d %q", st, ct)
	}

	a := openStream(ctx, base, token, sid, callBody(11, "create_order", argsA, "tok-a"))
	b := openStream(ctx, base, token, sid, callBody(12, "create_order", argsB, "tok-b"))
	<-a.done
	<-b.done
	time.Sleep(300 * time.Millisecond) // anything late on the GET stream
	closeGet()
	<-get.done

	checkOwnStream(t, a, 11, "tok-a", 5)
	checkOwnStream(t, b, 12, "tok-b", 5)
	if n := progressOf(get.messages()); len(n) > 0 {
		t.Errorf("the GET stream carried calls' progress notifications: %v", n)
	}

	// A waiting duplicate the client cancels: no answer, the stream ends.
	c := openStream(ctx, base, token, sid, callBody(13, "create_order", argsA, "tok-c"))
	if !eventually(5*time.Second, func() bool { return progressOf(c.messages())["tok-c"] > 0 }) {
		t.Fatalf("call 13: no progress before the cancellation (messages %v)", c.messages())
	}
	time.Sleep(300 * time.Millisecond)
	resp, body := post(t, base, token, sid, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":13,"reason":"the user gave up"}}`)
	cancelled := time.Now()
	if resp.StatusCode != http.StatusAccepted {
		t.Errorf("notifications/cancelled: %d %s", resp.StatusCode, body)
	}
	select {
	case <-c.done:
	case <-time.After(2 * wait):
		t.Fatalf("call 13: its stream was still open %v after the cancellation", 2*wait)
	}
	if took := c.ended.Sub(cancelled); took > time.Second {
		t.Errorf("call 13: its stream ended %v after the cancellation, want promptly", took)
	}
	for _, m := range c.messages() {
		if m.isAnswer() {
			t.Errorf("call 13 was cancelled, yet answered: %s", m)
		}
	}
	if st, ct := c.headers(); st != http.StatusOK || !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("call 13: %d %q, want 200 text/event-stream", st, ct)
	}

	// The session keeps serving.
	status := map[string]any{"operation_key": argsA["operation_key"]}
	resp, body = post(t, base, token, sid, callBody(14, "get_operation_status", status, ""))
	if resp.StatusCode != http.StatusOK || !strings.Contains(body, `"id":14`) || !strings.Contains(body, `in_progress`) {
		t.Errorf("get_operation_status after the cancellation: %d %.400s", resp.StatusCode, body)
	}
}

// TestCancelledAcrossClientsModernHTTP: protocol 2026-07-28 has no
// sessions, and over HTTP a client cancels by closing its request's
// stream. A notifications/cancelled POSTed by another client (another
// token) naming the same request id must not cut a waiting call short:
// the call still waits for its whole --wait and is answered.
func TestCancelledAcrossClientsModernHTTP(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "default", "agent")
	mallory := addToken(t, tokens, "mallory", "other", "agent")
	args := orderArgs(newKey(), "cust-cross-cancel", coffee, nil)
	startClaimer(t, db, "create_order", args)
	const wait = 1500 * time.Millisecond
	base := httpServer(t, db, tokens, "--wait", wait.String())
	ctx := testContext(t)
	meta := `"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}`
	modern := func(method, name string) []string {
		h := []string{"Mcp-Protocol-Version", "2026-07-28", "Mcp-Method", method}
		if name != "" {
			h = append(h, "Mcp-Name", name)
		}
		return h
	}

	began := time.Now()
	call := openStream(ctx, base, alice, "", callBody(7, "create_order", args, "", meta), modern("tools/call", "create_order")...)
	time.Sleep(300 * time.Millisecond)
	resp, body := post(t, base, mallory, "", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7,"_meta":{`+meta+`}}}`, modern("notifications/cancelled", "")...)
	if resp.StatusCode != http.StatusAccepted {
		t.Errorf("another client's notifications/cancelled: %d %s", resp.StatusCode, body)
	}
	<-call.done
	if took := call.ended.Sub(began); took < wait-100*time.Millisecond {
		t.Errorf("alice's call ended after %v, before its --wait of %v: another client's notification cut it short", took, wait)
	}
	answered := false
	for _, m := range call.messages() {
		if m.answers(7) && strings.Contains(m.raw, "operation_in_progress") {
			answered = true
		}
	}
	if !answered {
		t.Errorf("alice's call: want its in_progress answer, got %v (err %v)", call.messages(), call.err)
	}
}

// TestCancelledCallUnansweredStdio: over stdio, a waiting duplicate the
// client cancels (notifications/cancelled) sends no more progress and no
// answer, and the server keeps serving the next call; its progress came
// on stdout as it was sent.
func TestCancelledCallUnansweredStdio(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	args := orderArgs(newKey(), "cust-cancel-stdio", coffee, nil)
	startClaimer(t, db, "create_order", args)
	const wait = 2 * time.Second
	cmd := exec.Command(idemgate, "serve", "--db", db, "--log-level", "warn", "--wait", wait.String())
	stopOwnerAtEnd(t, cmd.Args[1:])
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	t.Cleanup(func() {
		stdin.Close()
		if err := <-exited; err != nil {
			t.Errorf("idemgate serve: %v", err)
		}
		if t.Failed() {
			t.Logf("server stderr:\n%s", stderr)
		}
	})
	lines := make(chan rpcMessage, 100)
	go func() {
		defer func() { exited <- cmd.Wait() }()
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			m := rpcMessage{raw: sc.Text()}
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				t.Errorf("stdout line that is not JSON-RPC: %q", sc.Text())
				continue
			}
			lines <- m
		}
	}()
	send := func(msg string) {
		t.Helper()
		if _, err := io.WriteString(stdin, msg+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	var seen []rpcMessage
	// next reads messages until one satisfies cond, or timeout passes.
	next := func(timeout time.Duration, cond func(rpcMessage) bool) bool {
		t.Helper()
		deadline := time.After(timeout)
		for {
			select {
			case m, ok := <-lines:
				if !ok {
					return false
				}
				seen = append(seen, m)
				if cond(m) {
					return true
				}
			case <-deadline:
				return false
			}
		}
	}

	send(initBody("e2e-stdio-cancel"))
	if !next(10*time.Second, func(m rpcMessage) bool { return m.answers(1) }) {
		t.Fatalf("no answer to initialize: %v", seen)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	send(callBody(2, "create_order", args, "tok-s"))
	if !next(5*time.Second, func(m rpcMessage) bool { return m.Method == "notifications/progress" }) {
		t.Fatalf("no progress from the waiting duplicate: %v", seen)
	}
	time.Sleep(300 * time.Millisecond)
	send(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":2,"reason":"the user gave up"}}`)
	cancelledAt := len(seen)
	send(callBody(3, "get_operation_status", map[string]any{"operation_key": args["operation_key"]}, ""))
	if !next(5*time.Second, func(m rpcMessage) bool { return m.answers(3) }) {
		t.Fatalf("the call after the cancellation was not answered: %v", seen)
	}
	if m := seen[len(seen)-1]; !strings.Contains(m.raw, "in_progress") {
		t.Errorf("get_operation_status after the cancellation: %s", m)
	}
	// Past the cancelled call's --wait: its answer would have come by now.
	next(wait, func(rpcMessage) bool { return false })
	// The end of input ends the server at once: nothing is in flight, the
	// cancelled call included (its shutdown grace is --wait + 15 s).
	stdin.Close()
	ended := time.Now()
	select {
	case err := <-exited:
		exited <- err
		if took := time.Since(ended); took > 3*time.Second {
			t.Errorf("the server took %v to exit after its input ended, want promptly", took)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("the server was still running 10 s after its input ended: it waited for the cancelled call's answer")
		cmd.Process.Kill()
	}
	for i, m := range seen {
		if m.answers(2) {
			t.Errorf("the cancelled call was answered: %s", m)
		}
		// One notification may have been on its way as the cancellation
		// was read.
		if i > cancelledAt+1 && m.Method == "notifications/progress" {
			t.Errorf("progress after the cancellation: %s", m)
		}
	}
}
