package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

// httpServer starts `idemgate serve --http` on a free port and returns its
// base URL once /healthz answers.
func httpServer(t *testing.T, db, tokens string, extra ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return httpServerAt(t, addr, db, tokens, extra...)
}

// httpServerAt is httpServer on a given address (a test that must name
// the server's URL in its configuration before it starts).
func httpServerAt(t *testing.T, addr, db, tokens string, extra ...string) string {
	t.Helper()
	base, _ := httpServerProcess(t, addr, db, tokens, extra...)
	return base
}

// httpServerProcess starts `idemgate serve --http` on addr and returns its
// base URL, once /healthz answers, and its process id. The server is
// stopped (SIGINT) when the test ends; its stderr is logged if the test
// failed.
func httpServerProcess(t *testing.T, addr, db, tokens string, extra ...string) (base string, pid int) {
	t.Helper()
	args := append([]string{"serve", "--http", addr, "--db", db, "--tokens", tokens, "--log-level", "warn"}, extra...)
	stopOwnerAtEnd(t, args)
	cmd := exec.Command(idemgate, args...)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("the HTTP server did not stop on SIGINT within 30 s")
		}
		if t.Failed() {
			t.Logf("server stderr:\n%s", stderr.String())
		}
	})
	base = "http://" + addr
	for deadline := time.Now().Add(10 * time.Second); ; {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return base, cmd.Process.Pid
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthz did not answer 200 within 10 s: %v\n%s", err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// httpSession connects an mcp-go Streamable HTTP client with a bearer
// token; the session's helpers (call, mustSucceed, …) work as over stdio.
func httpSession(t *testing.T, base, token string) *session {
	t.Helper()
	s, err := tryHTTPSession(t, base, token)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// tryHTTPSession is httpSession, returning its error.
func tryHTTPSession(t *testing.T, base, token string) (*session, error) {
	tr, err := transport.NewStreamableHTTP(base+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
	if err != nil {
		return nil, err
	}
	c := client.NewClient(tr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	req := mcp.InitializeRequest{}
	req.Params.ClientInfo = mcp.Implementation{Name: "e2e-http", Version: "1"}
	if _, err := c.Initialize(ctx, req); err != nil {
		c.Close()
		return nil, fmt.Errorf("initialize over HTTP: %w", err)
	}
	s := &session{t: t, flavor: mcpGoModern, mc: c}
	t.Cleanup(s.Close)
	return s, nil
}

func addToken(t *testing.T, file, principal, tenant, role string) string {
	t.Helper()
	r := runCLI(t, 10*time.Second, "tokens", "add", "--tokens", file, "--principal", principal, "--tenant", tenant, "--role", role)
	if r.Code != 0 {
		t.Fatalf("tokens add: exit %d: %s", r.Code, r.Stderr)
	}
	return strings.TrimSpace(r.Stdout)
}

// TestHTTPTransport: the Streamable HTTP transport authenticates every
// request by bearer token (401 with WWW-Authenticate otherwise), each
// token acts for its own principal, tenant and role, the idempotency
// guarantees are the same as over stdio, and /healthz and /metrics answer.
func TestHTTPTransport(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	boss := addToken(t, tokens, "boss", "acme", "approver")
	base := httpServer(t, filepath.Join(dir, "ledger.db"), tokens)

	t.Run("no token", func(t *testing.T) {
		for _, auth := range []string{"", "Bearer ", "Bearer igt_not-a-real-token", "Basic YWxpY2U6eA=="} {
			req, _ := http.NewRequest("POST", base+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
			req.Header.Set("Content-Type", "application/json")
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 401 || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("Authorization %q: status %d, WWW-Authenticate %q; want 401 with a Bearer challenge", auth, resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
			}
		}
	})

	a := httpSession(t, base, alice)
	key := newKey()
	args := orderArgs(key, "cust-http", coffee, nil)
	first := a.mustSucceed(t, "create_order", args)
	again := a.mustSucceed(t, "create_order", args)
	if !again.Replayed || again.orderID() != first.orderID() || string(again.Result) != string(first.Result) {
		t.Errorf("replay over HTTP: %s, want the first result %s replayed", again, first.Result)
	}
	if names := toolNamesOf(t, a); slices.Contains(names, "decide_approval") {
		t.Errorf("an agent's token sees approver tools: %v", names)
	}

	// A token added while the server runs works without a restart.
	eve := addToken(t, tokens, "eve", "other", "agent")
	e := httpSession(t, base, eve)
	e.mustFail(t, "get_operation_status", map[string]any{"operation_key": key}, "not_found")

	b := httpSession(t, base, boss)
	if names := toolNamesOf(t, b); !slices.Contains(names, "decide_approval") {
		t.Errorf("an approver's token does not see approver tools: %v", names)
	}
	held := a.mustFail(t, "cancel_order", map[string]any{"operation_key": newKey(), "order_id": first.orderID(), "expected_version": 1, "reason": "asked"}, "approval_required")
	done := b.mustSucceed(t, "decide_approval", map[string]any{"approval_id": held.Approval.ApprovalID, "decision": "approve"})
	if done.Status != "succeeded" {
		t.Errorf("approval over HTTP: %s", done)
	}

	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	metrics := map[string]string{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if name, value, ok := strings.Cut(sc.Text(), " "); ok && !strings.HasPrefix(name, "#") {
			metrics[name] = value
		}
	}
	for name, want := range map[string]string{
		"idemgate_replays_served_total":   "1",
		"idemgate_operations_total":       "2",
		"idemgate_executions_total":       "2",
		"idemgate_unknown_outcomes_total": "0",
		`idemgate_tool_calls_total{code="",status="succeeded",tool="create_order"}`: "2",
	} {
		if got := metrics[name]; got != want {
			t.Errorf("/metrics %s = %q, want %s", name, got, want)
		}
	}
	if t.Failed() {
		t.Logf("metrics: %v", fmt.Sprint(len(metrics)))
	}
}
