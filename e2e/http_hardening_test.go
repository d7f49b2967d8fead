package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// httpProc is one `idemgate serve --http` process.
type httpProc struct {
	base   string
	cmd    *exec.Cmd
	stderr *syncBuffer
	exited chan struct{}
	err    error
}

// startHTTP starts `idemgate serve --http` on a free port with extra
// flags; with nofile > 0 the process may open at most that many files.
func startHTTP(t *testing.T, db, tokens string, nofile int, extra ...string) *httpProc {
	t.Helper()
	return startHTTPEnv(t, nil, db, tokens, nofile, extra...)
}

// startHTTPEnv is startHTTP with env added to the server's environment.
func startHTTPEnv(t *testing.T, env []string, db, tokens string, nofile int, extra ...string) *httpProc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	args := append([]string{"serve", "--http", addr, "--db", db, "--tokens", tokens, "--log-level", "warn"}, extra...)
	stopOwnerAtEnd(t, args)
	var cmd *exec.Cmd
	if nofile > 0 {
		cmd = exec.Command("sh", append([]string{"-c", `ulimit -n "$0" && exec "$@"`, strconv.Itoa(nofile), idemgate}, args...)...)
	} else {
		cmd = exec.Command(idemgate, args...)
	}
	cmd.Env = append(os.Environ(), env...)
	p := &httpProc{base: "http://" + addr, cmd: cmd, stderr: &syncBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Errorf("the HTTP server did not stop on SIGINT within 30 s")
		}
		if t.Failed() {
			t.Logf("server %s stderr:\n%s", addr, p.stderr.String())
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := http.Get(p.base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return p
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz did not answer 200 within 10 s: %v\n%s", err, p.stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// post sends one JSON-RPC message to base/mcp with the given token,
// session id and extra headers ("" leaves a header out).
func post(t *testing.T, base, token, sid, body string, hdr ...string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest("POST", base+"/mcp", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
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
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

func initBody(name string) string {
	return `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"` + name + `","version":"7.1"}}}`
}

const toolsListBody = `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`

// initialize starts a 2025-11-25 session on base and returns its id.
func initialize(t *testing.T, base, token, name string) string {
	t.Helper()
	resp, body := post(t, base, token, "", initBody(name))
	sid := resp.Header.Get("Mcp-Session-Id")
	if resp.StatusCode != 200 || sid == "" {
		t.Fatalf("initialize: %d %q, session %q", resp.StatusCode, body, sid)
	}
	return sid
}

// scrape reads one metric (name with labels, as printed) from base.
func scrape(t *testing.T, base, name string) float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if n, v, ok := strings.Cut(sc.Text(), " "); ok && n == name {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// TestHTTPOrigin: a request whose Origin is neither absent, the server's
// own, nor listed in --allowed-origins is refused with 403 (MCP
// Streamable HTTP: DNS rebinding protection), with or without a valid
// token; so is a loopback request whose Host is not a loopback name.
func TestHTTPOrigin(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	p := startHTTP(t, filepath.Join(dir, "ledger.db"), tokens, 0, "--allowed-origins", "https://app.example.com, http://tools.example:8443")
	port := p.base[strings.LastIndex(p.base, ":")+1:]
	modern := []string{"Mcp-Protocol-Version", "2026-07-28", "Mcp-Method", "tools/list"}
	pingBody := `{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`

	for _, tc := range []struct {
		origin string
		want   int
	}{
		{"", 200},
		{"http://127.0.0.1:" + port, 200},
		{"http://localhost:" + port, 200},
		{"https://app.example.com", 200},
		{"HTTPS://APP.example.com:443", 200},
		{"http://tools.example:8443", 200},
		{"http://evil.example", 403},
		{"https://app.example.com.evil.example", 403},
		{"http://127.0.0.1:1", 403},
		{"null", 403},
	} {
		hdr := append([]string{}, modern...)
		if tc.origin != "" {
			hdr = append(hdr, "Origin", tc.origin)
		}
		resp, body := post(t, p.base, alice, "", pingBody, hdr...)
		if resp.StatusCode != tc.want {
			t.Errorf("Origin %q: status %d %q, want %d", tc.origin, resp.StatusCode, body, tc.want)
		}
		if tc.want == 403 && !strings.Contains(body, "--allowed-origins") {
			t.Errorf("Origin %q: 403 body %q does not say how to allow it", tc.origin, body)
		}
	}
	// Without a token the Origin is refused first; /healthz too.
	resp, _ := post(t, p.base, "", "", pingBody, "Origin", "http://evil.example")
	if resp.StatusCode != 403 {
		t.Errorf("evil Origin without a token: %d, want 403", resp.StatusCode)
	}
	req, _ := http.NewRequest("GET", p.base+"/healthz", nil)
	req.Header.Set("Origin", "http://evil.example")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 403 {
		t.Errorf("/healthz with an evil Origin: %v %v, want 403", resp, err)
	}
	// DNS rebinding: a page on evil.example rebound to 127.0.0.1 sends its
	// own name as Host (and as Origin, which is not allowed either).
	req, _ = http.NewRequest("POST", p.base+"/mcp", strings.NewReader(pingBody))
	req.Host = "evil.example:" + port
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+alice)
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/list")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 403 {
		t.Errorf("Host evil.example on loopback: %v %v, want 403", resp, err)
	}
	// A reverse proxy on the same machine forwarding an allowed origin's
	// public name.
	req, _ = http.NewRequest("POST", p.base+"/mcp", strings.NewReader(pingBody))
	req.Host = "tools.example:8443"
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+alice)
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/list")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 200 {
		t.Errorf("Host of an allowed origin on loopback: %v %v, want 200", resp, err)
	}
}

// TestHTTPConsolePublicURL: under `serve --http` with a console public
// URL, the console served behind a proxy at that URL works: its pages'
// posts carry the public origin, which the transport's Origin check
// allows, and the proxy passes the public host, which the loopback Host
// check allows — a login from there gets its session. Another origin is
// still refused, and so is another host.
func TestHTTPConsolePublicURL(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	boss := addToken(t, tokens, "boss", "acme", "approver")
	p := startHTTP(t, filepath.Join(dir, "ledger.db"), tokens, 0, "--public-url", "https://gate.example.com")
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	send := func(method, host, origin string, form url.Values) (*http.Response, string) {
		t.Helper()
		var body io.Reader
		if form != nil {
			body = strings.NewReader(form.Encode())
		}
		req, err := http.NewRequest(method, p.base+"/ui/login", body)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		if form != nil {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if origin != "" {
			req.Header.Set("Origin", origin)
			req.Header.Set("Sec-Fetch-Site", "same-origin")
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	if resp, body := send("GET", "gate.example.com", "", nil); resp.StatusCode != http.StatusOK {
		t.Errorf("the login page through the public host: status %d, want 200\n%s", resp.StatusCode, body)
	}
	resp, body := send("POST", "gate.example.com", "https://gate.example.com", url.Values{"token": {boss}})
	var session *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "idemgate_console" {
			session = c
		}
	}
	if resp.StatusCode != http.StatusSeeOther || session == nil || !session.Secure {
		t.Errorf("a login posted from the public URL's page: status %d, cookies %v; want 303 and a Secure session\n%s", resp.StatusCode, resp.Cookies(), body)
	}
	for _, c := range []struct{ host, origin string }{
		{"gate.example.com", "https://evil.example"},
		{"gate.example.com", "http://gate.example.com"}, // not the public URL's scheme
		{"evil.example", "https://gate.example.com"},
	} {
		if resp, body := send("POST", c.host, c.origin, url.Values{"token": {boss}}); resp.StatusCode != http.StatusForbidden {
			t.Errorf("a login with Host %s, Origin %s: status %d, want 403\n%s", c.host, c.origin, resp.StatusCode, body)
		}
	}
}

// TestHTTPSessionsAcrossProcesses: two server processes on one ledger
// behind a round-robin balancer serve one 2025-11-25 session without
// affinity; every call is audited with the client's name and version
// whichever process ran it; after DELETE on one, both answer 404; a
// missing session id is 400, an unknown one or another token's 404.
func TestHTTPSessionsAcrossProcesses(t *testing.T) {
	dir := t.TempDir()
	db := newLedger(t) // a file, or with IDEMGATE_E2E_DB=postgres a database
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	mallory := addToken(t, tokens, "mallory", "acme", "agent")
	outbox := filepath.Join(dir, "outbox")
	a := startHTTP(t, db, tokens, 0, "--outbox-dir", outbox)
	b := startHTTP(t, db, tokens, 0, "--outbox-dir", outbox)

	var turn atomic.Int64
	targets := []*url.URL{}
	for _, p := range []*httpProc{a, b} {
		u, _ := url.Parse(p.base)
		targets = append(targets, u)
	}
	lb := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(targets[turn.Add(1)%2]) },
		FlushInterval: -1,
	})
	defer lb.Close()

	tr, err := transport.NewStreamableHTTP(lb.URL+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + alice}))
	if err != nil {
		t.Fatal(err)
	}
	c := client.NewClient(tr)
	ctx := testContext(t)
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.ProtocolVersion20251125
	init.Params.ClientInfo = mcp.Implementation{Name: "lb-client", Version: "7.1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatalf("initialize through the balancer: %v", err)
	}
	sid := tr.GetSessionId()
	if sid == "" {
		t.Fatal("no session id after a 2025-11-25 initialize")
	}
	s := &session{t: t, flavor: mcpGoLegacy, mc: c}
	for i := 0; i < 4; i++ {
		s.mustSucceed(t, "create_order", orderArgs(newKey(), fmt.Sprintf("cust-lb-%d", i), coffee, nil))
	}

	// Every entry of a call, on either process, is audited with the session's client.
	r := runCLI(t, 20*time.Second, "audit", "export", "--db", db)
	if r.Code != 0 {
		t.Fatalf("audit export: %d %s", r.Code, r.Stderr)
	}
	calls := 0
	for _, line := range strings.Split(strings.TrimSpace(r.Stdout), "\n") {
		var e struct {
			Event string `json:"event"`
			Tool  string `json:"tool"`
			Actor struct {
				Principal     string `json:"principal"`
				ClientName    string `json:"client_name"`
				ClientVersion string `json:"client_version"`
			} `json:"actor"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		if e.Tool != "create_order" {
			continue
		}
		calls++
		if e.Actor.ClientName != "lb-client" || e.Actor.ClientVersion != "7.1" || e.Actor.Principal != "alice" {
			t.Errorf("audit entry of a call: actor %+v, want alice with client lb-client 7.1", e.Actor)
		}
	}
	if calls < 4 {
		t.Errorf("audit has %d create_order entries, want at least 4", calls)
	}

	// The same session straight at each process works; the rules hold.
	for _, p := range []*httpProc{a, b} {
		if resp, body := post(t, p.base, alice, sid, toolsListBody); resp.StatusCode != 200 {
			t.Errorf("%s tools/list in the session: %d %s", p.base, resp.StatusCode, body)
		}
		if resp, body := post(t, p.base, alice, "", toolsListBody, "Mcp-Protocol-Version", "2025-11-25"); resp.StatusCode != 400 || !strings.Contains(body, "Mcp-Session-Id") {
			t.Errorf("%s without a session id: %d %q, want 400 naming Mcp-Session-Id", p.base, resp.StatusCode, body)
		}
		if resp, _ := post(t, p.base, alice, "igs_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", toolsListBody); resp.StatusCode != 404 {
			t.Errorf("%s never-issued session id: %d, want 404", p.base, resp.StatusCode)
		}
		if resp, _ := post(t, p.base, mallory, sid, toolsListBody); resp.StatusCode != 404 {
			t.Errorf("%s another token's session: %d, want 404", p.base, resp.StatusCode)
		}
	}

	// The official go-sdk client, in both eras, through the balancer.
	for _, version := range []string{"2025-11-25", "2026-07-28"} {
		sc := sdk.NewClient(&sdk.Implementation{Name: "gosdk-lb", Version: "3"}, nil)
		cs, err := sc.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: lb.URL + "/mcp",
			HTTPClient: &http.Client{Transport: bearer{token: alice}}}, &sdk.ClientSessionOptions{ProtocolVersion: version})
		if err != nil {
			t.Fatalf("go-sdk %s through the balancer: %v", version, err)
		}
		gs := &session{t: t, flavor: goSDKLegacy, gs: cs}
		for i := 0; i < 3; i++ {
			gs.mustSucceed(t, "create_order", orderArgs(newKey(), fmt.Sprintf("cust-gosdk-%s-%d", version, i), coffee, nil))
		}
		if err := cs.Close(); err != nil {
			t.Errorf("go-sdk %s close: %v", version, err)
		}
	}

	// DELETE on A ends it everywhere.
	req, _ := http.NewRequest("DELETE", a.base+"/mcp", nil)
	req.Header.Set("Authorization", "Bearer "+alice)
	req.Header.Set("Mcp-Session-Id", sid)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("DELETE: %v %v", resp, err)
	}
	resp.Body.Close()
	for _, p := range []*httpProc{b, a} {
		if resp, body := post(t, p.base, alice, sid, toolsListBody); resp.StatusCode != 404 {
			t.Errorf("%s after DELETE: %d %q, want 404", p.base, resp.StatusCode, body)
		}
	}
	c.Close()
}

// TestHTTPSessionsBounded: sessions nobody closes are bounded per token
// (the least recently used is evicted) in the ledger and in the memory of
// the process, and end after the idle timeout.
func TestHTTPSessionsBounded(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	bob := addToken(t, tokens, "bob", "acme", "agent")
	p := startHTTP(t, filepath.Join(dir, "ledger.db"), tokens, 0, "--max-sessions-per-token", "5", "--session-idle-timeout", "3s")

	var ids []string
	for i := 0; i < 60; i++ {
		ids = append(ids, initialize(t, p.base, alice, "leaky"))
	}
	bobs := initialize(t, p.base, bob, "other")
	if n := scrape(t, p.base, "idemgate_http_sessions"); n != 6 {
		t.Errorf("live sessions after 60 of alice and 1 of bob with a cap of 5: %v, want 6", n)
	}
	if n := scrape(t, p.base, "idemgate_http_sessions_in_memory"); n > 6 {
		t.Errorf("sessions in memory: %v, want at most 6", n)
	}
	if resp, _ := post(t, p.base, alice, ids[0], toolsListBody); resp.StatusCode != 404 {
		t.Errorf("the evicted first session: %d, want 404", resp.StatusCode)
	}
	if resp, body := post(t, p.base, alice, ids[len(ids)-1], toolsListBody); resp.StatusCode != 200 {
		t.Errorf("the newest session: %d %s", resp.StatusCode, body)
	}
	if resp, _ := post(t, p.base, bob, bobs, toolsListBody); resp.StatusCode != 200 {
		t.Errorf("bob's session was evicted by alice's: %d", resp.StatusCode)
	}
	// Idle: after the timeout every session is gone, from the ledger and
	// from memory.
	if !eventually(15*time.Second, func() bool {
		return scrape(t, p.base, "idemgate_http_sessions") == 0 && scrape(t, p.base, "idemgate_http_sessions_in_memory") == 0
	}) {
		t.Errorf("after the idle timeout: %v live, %v in memory, want 0 and 0",
			scrape(t, p.base, "idemgate_http_sessions"), scrape(t, p.base, "idemgate_http_sessions_in_memory"))
	}
	if resp, _ := post(t, p.base, alice, ids[len(ids)-1], toolsListBody); resp.StatusCode != 404 {
		t.Errorf("an idle session after the timeout: %d, want 404", resp.StatusCode)
	}
}

// TestHTTPBatchRefused: a JSON-RPC batch gets a JSON-RPC error saying
// batches are not supported, in both protocol eras.
func TestHTTPBatchRefused(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	p := startHTTP(t, filepath.Join(dir, "ledger.db"), tokens, 0)
	sid := initialize(t, p.base, alice, "batcher")
	batch := `  [{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":2,"method":"tools/list"}]`
	for _, tc := range []struct {
		name string
		sid  string
		hdr  []string
	}{
		{"2025-11-25", sid, nil},
		{"2026-07-28", "", []string{"Mcp-Protocol-Version", "2026-07-28"}},
	} {
		resp, body := post(t, p.base, alice, tc.sid, batch, tc.hdr...)
		var msg struct {
			Error struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(body), &msg); err != nil || resp.StatusCode != 400 || msg.Error.Code != -32600 ||
			!strings.Contains(msg.Error.Message, "batches") || !strings.Contains(msg.Error.Message, "not supported") {
			t.Errorf("%s batch: %d %s, want 400 with JSON-RPC error -32600 saying batches are not supported", tc.name, resp.StatusCode, body)
		}
	}
}

// TestHTTPSlowBodies: a request body that never finishes is cut off after
// --http-body-timeout (408) with a token and answered 401 at once without
// one; 350 connections holding unfinished requests (or nothing) without a
// token, in a process limited to 256 files, lock out neither a valid client nor
// /healthz, and a burst of valid clients meanwhile is answered (200 or 503).
func TestHTTPSlowBodies(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	p := startHTTP(t, filepath.Join(dir, "ledger.db"), tokens, 256, "--http-body-timeout", "1s")
	addr := strings.TrimPrefix(p.base, "http://")

	// partial opens a connection and sends headers announcing a body of
	// 1000 bytes, then 10 of them.
	partial := func(auth string) net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n%s\r\n{\"jsonrpc\"", addr, auth)
		return c
	}
	// answer reads the status line and how long it took; the server must
	// also close the connection.
	answer := func(c net.Conn, within time.Duration) (int, time.Duration) {
		start := time.Now()
		c.SetReadDeadline(start.Add(within))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return 0, time.Since(start)
		}
		io.Copy(io.Discard, resp.Body)
		took := time.Since(start)
		if _, err := c.Read(make([]byte, 1)); err != io.EOF {
			t.Errorf("the connection was not closed after status %d: %v", resp.StatusCode, err)
		}
		return resp.StatusCode, took
	}

	c := partial("Authorization: Bearer " + alice + "\r\n")
	if code, took := answer(c, 10*time.Second); code != 408 || took > 5*time.Second {
		t.Errorf("unfinished body with a token: %d after %s, want 408 after about 1 s", code, took)
	}
	c.Close()
	c = partial("")
	if code, took := answer(c, 10*time.Second); code != 401 || took > 2*time.Second {
		t.Errorf("unfinished body without a token: %d after %s, want 401 at once", code, took)
	}
	c.Close()

	// 350 connections: 50 hold an unfinished body, 300 sent nothing.
	var held []net.Conn
	for i := 0; i < 350; i++ {
		var c net.Conn
		if i%7 == 0 {
			c = partial("")
		} else {
			var err error
			if c, err = net.Dial("tcp", addr); err != nil {
				t.Fatalf("connection %d: %v", i, err)
			}
		}
		held = append(held, c)
	}
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(p.base + "/healthz")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("/healthz with 350 connections held: %v %v", resp, err)
	}
	resp.Body.Close()
	s := httpSession(t, p.base, alice)
	s.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-slow", coffee, nil))
	// A burst of valid clients during the flood is answered, every one.
	statuses, noAnswer := burstAnswers(t, addr, alice, 200)
	t.Logf("200 initialize at once during the flood: %v", statuses)
	if statuses[0] > 0 || statuses[200] == 0 {
		t.Errorf("200 initialize at once during the flood: statuses %v (0: no HTTP answer, e.g. %v), want only 200 and 503, some 200", statuses, noAnswer)
	}
}

// TestHTTPShutdownAnswersInFlight: SIGTERM while calls wait on a slow
// order API (slower than the old fixed 10 s grace, within its timeout):
// every client gets its answer, and the process exits 0.
func TestHTTPShutdownAnswersInFlight(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	api := newFakeAPI(t)
	const n = 6
	var holds []*hold
	for i := 0; i < n; i++ {
		holds = append(holds, api.InjectHold(fault{Kind: HoldBeforeCommit, Match: matchCreate, CommitAnyway: true}))
	}
	p := startHTTP(t, filepath.Join(dir, "ledger.db"), tokens, 0, "--orders-api", api.URL(), "--orders-api-timeout", "20s",
		"--http-body-timeout", "1s") // a call lasts longer than reading its body may
	answers := make(chan envelope, n)
	for i := 0; i < n; i++ {
		s := httpSession(t, p.base, alice)
		go func() {
			e, err := s.call(context.Background(), "create_order", orderArgs(newKey(), fmt.Sprintf("cust-term-%d", i), coffee, nil))
			if err != nil {
				e = envelope{Status: "transport error: " + err.Error()}
			}
			answers <- e
		}()
	}
	for _, h := range holds {
		h.Wait(t, 10*time.Second)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(11 * time.Second) // past the old grace
	for _, h := range holds {
		h.Release()
	}
	for i := 0; i < n; i++ {
		select {
		case e := <-answers:
			if e.Status != "succeeded" {
				t.Errorf("answer %d: %s, want succeeded", i, e)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d of %d calls were answered", i, n)
		}
	}
	select {
	case <-p.exited:
		if p.err != nil {
			t.Errorf("exit: %v\n%s", p.err, p.stderr.String())
		}
	case <-time.After(20 * time.Second):
		t.Errorf("the server did not exit after answering")
	}
}

// TestStdioShutdownAnswersInFlight: SIGTERM to a stdio server while one
// call waits on the order API and three more wait for a worker: it stops
// reading, and every call already read gets its answer (the queued ones
// run) before the process exits, with status 0.
func TestStdioShutdownAnswersInFlight(t *testing.T) {
	api := newFakeAPI(t)
	const n = 4
	h := api.InjectHold(fault{Kind: HoldBeforeCommit, Match: matchCreate, CommitAnyway: true})
	s := startAPIServer(t, mcpGoLegacy, api, serverConfig{DB: filepath.Join(t.TempDir(), "ledger.db")}, "--orders-api-timeout", "20s", "--workers", "1")
	answers := make(chan envelope, n)
	for i := 0; i < n; i++ {
		go func() {
			e, err := s.call(context.Background(), "create_order", orderArgs(newKey(), fmt.Sprintf("cust-stdio-term-%d", i), coffee, nil))
			if err != nil {
				e = envelope{Status: "transport error: " + err.Error()}
			}
			answers <- e
		}()
	}
	h.Wait(t, 10*time.Second)
	time.Sleep(500 * time.Millisecond) // the other calls are read and queued
	s.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(time.Second)
	h.Release()
	for i := 0; i < n; i++ {
		select {
		case e := <-answers:
			if e.Status != "succeeded" {
				t.Errorf("answer %d: %s, want succeeded", i, e)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("only %d of %d calls were answered", i, n)
		}
	}
	if code := stdioExitCode(t, s, 20*time.Second); code != 0 {
		t.Errorf("exit status %d after SIGTERM, want 0\n%s", code, s.stderr.String())
	}
}

// bearer adds a bearer token to every request.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// burstAnswers sends n initialize requests with token at once, each from
// its own goroutine on its own new TCP connection (raw, so that a
// connection closed without an answer is seen as it is, not retried by a
// client library). It returns how many got each status; 0 counts the
// connections that got no HTTP answer, with one of their errors. A 503
// without a Retry-After of whole seconds is an error of t.
func burstAnswers(t *testing.T, addr, token string, n int) (statuses map[int]int, noAnswer error) {
	t.Helper()
	req := initBody("burst")
	req = fmt.Sprintf("POST /mcp HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n%s", addr, token, len(req), req)
	type answer struct {
		status     int
		retryAfter string
		err        error
	}
	answers := make(chan answer, n)
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		go func() {
			<-start
			c, err := net.DialTimeout("tcp", addr, time.Minute)
			if err != nil {
				answers <- answer{err: fmt.Errorf("dial: %w", err)}
				return
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(time.Minute))
			if _, err := io.WriteString(c, req); err != nil {
				answers <- answer{err: fmt.Errorf("write: %w", err)}
				return
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				answers <- answer{err: fmt.Errorf("read: %w", err)}
				return
			}
			io.Copy(io.Discard, resp.Body)
			answers <- answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
		}()
	}
	close(start)
	statuses = map[int]int{}
	for i := 0; i < n; i++ {
		a := <-answers
		statuses[a.status]++
		if a.err != nil {
			noAnswer = a.err
		}
		if a.status == http.StatusServiceUnavailable {
			if s, err := strconv.Atoi(a.retryAfter); err != nil || s < 1 {
				t.Errorf("503 with Retry-After %q, want a number of seconds", a.retryAfter)
			}
		}
	}
	return statuses, noAnswer
}

// TestHTTPBurstAnswered: a burst of valid clients, each opening a
// connection and sending initialize at once, is served: 300 and 1 000 of
// them all get 200 from a process that may open 4 096 files (room for
// 3 584 connections). In a process limited to 256 files, 1 000 of them
// all get an HTTP answer, never a connection closed without one: 200, or
// while 200 valid requests whose bodies are still arriving hold every
// place for 3 s, 503 with Retry-After.
func TestHTTPBurstAnswered(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	p := startHTTP(t, filepath.Join(dir, "ledger.db"), tokens, 4096)
	addr := strings.TrimPrefix(p.base, "http://")
	for _, n := range []int{300, 1000} {
		statuses, noAnswer := burstAnswers(t, addr, alice, n)
		t.Logf("%d at once: %v", n, statuses)
		if statuses[200] != n {
			t.Errorf("%d initialize at once: statuses %v (0: no HTTP answer, e.g. %v), want %d × 200", n, statuses, noAnswer, n)
		}
	}

	limited := startHTTP(t, filepath.Join(dir, "limited.db"), tokens, 256, "--http-body-timeout", "3s")
	addr = strings.TrimPrefix(limited.base, "http://")
	statuses, noAnswer := burstAnswers(t, addr, alice, 1000)
	t.Logf("1000 at once, 256 files: %v", statuses)
	if statuses[0] > 0 || statuses[200]+statuses[503] != 1000 {
		t.Errorf("1000 initialize at once, 256 files: statuses %v (0: no HTTP answer, e.g. %v), want only 200 and 503", statuses, noAnswer)
	}
	if statuses[200] == 0 {
		t.Errorf("1000 initialize at once, 256 files: none served")
	}
	refused := statuses[503]

	// Every place held by a valid request that is slow to send its body.
	var slow []net.Conn
	defer func() {
		for _, c := range slow {
			c.Close()
		}
	}()
	for i := 0; i < 200; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("slow request %d: %v", i, err)
		}
		fmt.Fprintf(c, "POST /mcp HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{", addr, alice)
		slow = append(slow, c)
	}
	statuses, noAnswer = burstAnswers(t, addr, alice, 1000)
	t.Logf("1000 at once, 256 files, every place held for 3 s: %v", statuses)
	if statuses[0] > 0 || statuses[200]+statuses[503] != 1000 || statuses[503] == 0 {
		t.Errorf("1000 initialize at once, 256 files, every place held for 3 s: statuses %v (0: no HTTP answer, e.g. %v), want 200 and 503, some 503", statuses, noAnswer)
	}
	refused += statuses[503]
	// Of the slow requests, those beyond the capacity were refused too
	// (the others get 408 once their body is 3 s late).
	deadline := time.Now().Add(10 * time.Second)
	for _, c := range slow {
		c.SetReadDeadline(deadline)
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			t.Fatalf("a slow request got no HTTP answer: %v", err)
		}
		if strings.Contains(line, " 503 ") {
			refused++
		}
		c.Close()
	}
	slow = nil
	// Every 503 is counted for the operator, by why.
	if got := scrape(t, limited.base, `idemgate_http_busy_refused_total{reason="connections"}`); got != float64(refused) {
		t.Errorf("idemgate_http_busy_refused_total{reason=\"connections\"} = %v, want %d (the 503s answered)", got, refused)
	}
}
