package server

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// testHandler serves a bare MCP server through NewHTTPHandler with a
// token for alice; it returns the server's URL, the token, and the number
// of sessions mcp-go holds registered.
func testHandler(t *testing.T, cfg SessionConfig) (string, string, *atomic.Int64) {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	token, err := AddToken(tokens, alice, "")
	if err != nil {
		t.Fatal(err)
	}
	tk, err := LoadTokens(tokens)
	if err != nil {
		t.Fatal(err)
	}
	var live atomic.Int64
	hooks := &mcpserver.Hooks{}
	hooks.AddOnRegisterSession(func(context.Context, mcpserver.ClientSession) { live.Add(1) })
	hooks.AddOnUnregisterSession(func(context.Context, mcpserver.ClientSession) { live.Add(-1) })
	s := mcpserver.NewMCPServer("t", "1", mcpserver.WithHooks(hooks), mcpserver.WithToolCapabilities(false))
	sessions := NewSessions(mustOpenPath(t, filepath.Join(dir, "l.db")), cfg, nil, nil)
	srv := httptest.NewServer(nil)
	srv.Config.Handler = NewHTTPHandler(s, HTTPConfig{Addr: srv.Listener.Addr().String(), Tokens: tk, Sessions: sessions})
	t.Cleanup(srv.Close)
	return srv.URL, token, &live
}

func do(t *testing.T, method, url, token, sid, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if sid != "" {
		req.Header.Set("Mcp-Session-Id", sid)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

const initialize = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

// TestHTTPSessionMemoryBounded: sessions a token opens and never closes
// are held in mcp-go's memory only up to the per-token cap; a DELETE
// releases one at once.
func TestHTTPSessionMemoryBounded(t *testing.T) {
	url, token, live := testHandler(t, SessionConfig{MaxPerToken: 5})
	var sid string
	for i := 0; i < 200; i++ {
		resp, body := do(t, "POST", url+"/mcp", token, "", initialize)
		if sid = resp.Header.Get("Mcp-Session-Id"); resp.StatusCode != 200 || sid == "" {
			t.Fatalf("initialize %d: %d %s", i, resp.StatusCode, body)
		}
	}
	if n := live.Load(); n > 5 {
		t.Errorf("after 200 sessions with a cap of 5, mcp-go holds %d", n)
	}
	if resp, _ := do(t, "DELETE", url+"/mcp", token, sid, ""); resp.StatusCode != 200 {
		t.Fatalf("DELETE: %d", resp.StatusCode)
	}
	if n := live.Load(); n > 4 {
		t.Errorf("after a DELETE, mcp-go holds %d, want 4", n)
	}
	if resp, _ := do(t, "POST", url+"/mcp", token, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); resp.StatusCode != 404 {
		t.Errorf("a deleted session: %d, want 404", resp.StatusCode)
	}
}

// TestHTTPRefusalsCloseTheConnection: 401, 403, 400 and 404 answers are
// sent without reading the body and close the connection.
func TestHTTPRefusalsCloseTheConnection(t *testing.T) {
	url, token, _ := testHandler(t, SessionConfig{})
	for _, tc := range []struct {
		name   string
		token  string
		sid    string
		origin string
		want   int
	}{
		{"no token", "", "", "", 401},
		{"evil origin", token, "", "http://evil.example", 403},
		{"no session", token, "", "", 400},
		{"unknown session", token, "igs_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "", 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A body that never ends: only the headers can be judged.
			pr, pw := io.Pipe()
			defer pw.Close()
			req, _ := http.NewRequest("POST", url+"/mcp", pr)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			if tc.sid != "" {
				req.Header.Set("Mcp-Session-Id", tc.sid)
			}
			if tc.origin != "" {
				req.Header.Set("Origin", tc.origin)
			}
			go io.WriteString(pw, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if tc.want == 400 || tc.want == 404 {
				// These are judged after the body: send it whole.
				req, _ = http.NewRequestWithContext(ctx, "POST", url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`))
				req.Header = req.Header.Clone()
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Mcp-Protocol-Version", "2025-11-25")
				req.Header.Set("Authorization", "Bearer "+tc.token)
				if tc.sid != "" {
					req.Header.Set("Mcp-Session-Id", tc.sid)
				}
			} else {
				req = req.WithContext(ctx)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want || !resp.Close {
				t.Errorf("status %d, close %v; want %d and the connection closed", resp.StatusCode, resp.Close, tc.want)
			}
		})
	}
}

// TestHTTPSessionRulesGetDelete: GET and DELETE follow the same session
// rules as POST (400 without an id, 404 for an unknown one), and a
// 2026-07-28 request needs no session at all.
func TestHTTPSessionRulesGetDelete(t *testing.T) {
	url, token, _ := testHandler(t, SessionConfig{})
	for _, tc := range []struct {
		method, sid string
		want        int
	}{
		{"GET", "", 400},
		{"GET", "igs_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", 404},
		{"DELETE", "", 400},
		{"DELETE", "igs_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", 404},
		{"POST", "not-even-well-formed", 404},
	} {
		resp, body := do(t, tc.method, url+"/mcp", token, tc.sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
		if resp.StatusCode != tc.want {
			t.Errorf("%s with session %q: %d %q, want %d", tc.method, tc.sid, resp.StatusCode, body, tc.want)
		}
	}
	req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/list")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Mcp-Session-Id") != "" {
		t.Errorf("2026-07-28 without a session: %d, session %q; want 200 and none", resp.StatusCode, resp.Header.Get("Mcp-Session-Id"))
	}
}

// TestHTTPRefusedInitializeLeavesNoSession: an initialize mcp-go answers
// with an error gets no Mcp-Session-Id, records no session and so cannot
// evict a live session of its token; a good one still does all three.
func TestHTTPRefusedInitializeLeavesNoSession(t *testing.T) {
	url, token, live := testHandler(t, SessionConfig{MaxPerToken: 2})
	var good []string
	for range 2 {
		resp, body := do(t, "POST", url+"/mcp", token, "", initialize)
		if resp.StatusCode != 200 || resp.Header.Get("Mcp-Session-Id") == "" {
			t.Fatalf("initialize: %d %s", resp.StatusCode, body)
		}
		good = append(good, resp.Header.Get("Mcp-Session-Id"))
	}
	// Both refused before mcp-go reads them (-32602): the first's params
	// are of the wrong types throughout, the second's capabilities only.
	bads := []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":5,"capabilities":[],"clientInfo":"x"}}`,
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":"none","clientInfo":{"name":"t","version":"1"}}}`,
	}
	for i := range 10 {
		bad := bads[i%2]
		resp, body := do(t, "POST", url+"/mcp", token, "", bad)
		if !strings.Contains(body, `"error"`) {
			t.Fatalf("bad initialize %d: %d %s, want a JSON-RPC error", i, resp.StatusCode, body)
		}
		if sid := resp.Header.Get("Mcp-Session-Id"); sid != "" {
			t.Fatalf("bad initialize %d returned session %q", i, sid)
		}
	}
	for _, sid := range good {
		if resp, body := do(t, "POST", url+"/mcp", token, sid, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); resp.StatusCode != 200 {
			t.Errorf("live session %s after refused initializes: %d %s, want 200 (not evicted)", sid, resp.StatusCode, body)
		}
	}
	if n := live.Load(); n != 2 {
		t.Errorf("mcp-go holds %d sessions, want the 2 live ones", n)
	}
}

// TestHTTPTwoOriginHeaders: a request with two Origin headers is refused,
// even when the first is allowed.
func TestHTTPTwoOriginHeaders(t *testing.T) {
	url, token, _ := testHandler(t, SessionConfig{})
	req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(initialize))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Add("Origin", url)
	req.Header.Add("Origin", "http://evil.example")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Mcp-Session-Id") != "" {
		t.Fatalf("two Origin headers: %d (session %q), want 403", resp.StatusCode, resp.Header.Get("Mcp-Session-Id"))
	}
}

// TestMetaVersionAsMCPMeta: the gate reads a request's protocol version
// from _meta exactly as mcp.Meta does, and fails to where it fails.
func TestMetaVersionAsMCPMeta(t *testing.T) {
	for _, meta := range []string{`null`, `{}`, `{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}`,
		`{"io.modelcontextprotocol/protocolVersion":"2025-06-18","progressToken":1,"x":{"y":[1]}}`,
		`{"io.modelcontextprotocol/protocolVersion":7}`, `{"io.modelcontextprotocol/protocolVersion":null}`,
		`{"IO.MODELCONTEXTPROTOCOL/PROTOCOLVERSION":"2026-07-28"}`, `"2026-07-28"`, `[]`, `1`} {
		body := `{"method":"tools/call","params":{"_meta":` + meta + `}}`
		var got gateEnvelope
		gotErr := json.Unmarshal([]byte(body), &got)
		var want struct {
			Params struct {
				Meta *mcp.Meta `json:"_meta"`
			} `json:"params"`
		}
		wantErr := json.Unmarshal([]byte(body), &want)
		if (gotErr != nil) != (wantErr != nil) {
			t.Errorf("%s: error %v, mcp.Meta's %v", meta, gotErr, wantErr)
			continue
		}
		if wantErr == nil && string(got.Params.Meta) != want.Params.Meta.ProtocolVersion() {
			t.Errorf("%s: version %q, mcp.Meta's %q", meta, got.Params.Meta, want.Params.Meta.ProtocolVersion())
		}
	}
}
