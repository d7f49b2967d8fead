package e2e

import (
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// malformedMessages are messages that are not JSON-RPC requests idemgate
// can serve, each with the JSON-RPC error code it is answered with and
// the id of the answer (nil: null).
var malformedMessages = []struct {
	name, line string
	code       int
	id         any
}{
	{"params a string", `{"jsonrpc":"2.0","id":4,"method":"tools/list","params":"x"}`, -32602, float64(4)},
	{"params an array", `{"jsonrpc":"2.0","id":4,"method":"tools/list","params":[1]}`, -32602, float64(4)},
	{"ping params a string", `{"jsonrpc":"2.0","id":4,"method":"ping","params":"x"}`, -32602, float64(4)},
	{"tools/call params a string", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":"x"}`, -32602, float64(4)},
	{"initialize params a string", `{"jsonrpc":"2.0","id":4,"method":"initialize","params":"x"}`, -32602, float64(4)},
	{"cursor a number", `{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"cursor":5}}`, -32602, float64(4)},
	{"_meta a string", `{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"_meta":"x"}}`, -32602, float64(4)},
	{"unknown method, params an array", `{"jsonrpc":"2.0","id":4,"method":"nope","params":[1]}`, -32601, float64(4)},
	{"notification params a string", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":"x"}`, -32602, nil},
	{"id null", `{"jsonrpc":"2.0","id":null,"method":"tools/list"}`, -32600, nil},
	{"id fractional", `{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}`, -32600, nil},
	{"top-level string", `"hello"`, -32600, nil},
	{"top-level number", `42`, -32600, nil},
	{"batch", `[{"jsonrpc":"2.0","id":4,"method":"ping"}]`, -32600, nil},
	{"jsonrpc a number", `{"jsonrpc":2,"id":4,"method":"ping"}`, -32600, float64(4)},
	{"no method, no result", `{"jsonrpc":"2.0","id":4}`, -32600, float64(4)},
	{"not JSON", `{"jsonrpc":"2.0","id":4,`, -32700, nil},
}

// TestMalformedMessagesKeepTheSession: each malformed message gets the
// same JSON-RPC error over stdio and over HTTP (JSON-RPC 2.0: -32700 only
// for text that is not JSON, -32600 for JSON that is not a request —
// with id null when the id is at fault —, -32602 for params a served
// method cannot read, -32601 for an unknown method), an HTTP client gets
// it as a 400 with that body and never a 404 (which tells an MCP client
// its session is gone), and the session — stdio's and HTTP's — keeps
// serving after every one.
func TestMalformedMessagesKeepTheSession(t *testing.T) {
	r := startRawStdio(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	p := startHTTP(t, filepath.Join(dir, "ledger.db"), tokens, 0)
	sid := initialize(t, p.base, alice, "malformed")
	if resp, body := post(t, p.base, alice, sid, `{"jsonrpc":"2.0","method":"notifications/initialized"}`); resp.StatusCode != 202 {
		t.Fatalf("notifications/initialized: %d %s", resp.StatusCode, body)
	}
	for _, tt := range malformedMessages {
		t.Run(tt.name, func(t *testing.T) {
			r.t = t
			r.send(tt.line)
			stdio := r.next()
			code, stdioMsg := rpcError(t, stdio, tt.id)
			if code != tt.code {
				t.Errorf("stdio: %s, want code %d", clipAnswer(stdio), tt.code)
			}

			resp, body := post(t, p.base, alice, sid, tt.line)
			var answer map[string]any
			if err := json.Unmarshal([]byte(body), &answer); err != nil {
				t.Fatalf("HTTP: %d %q, want a JSON-RPC error", resp.StatusCode, body)
			}
			code, httpMsg := rpcError(t, answer, tt.id)
			if code != tt.code || httpMsg != stdioMsg {
				t.Errorf("HTTP: %d %s\nstdio: %s", resp.StatusCode, body, clipAnswer(stdio))
			}
			wantStatus := 400
			if tt.code == -32601 {
				wantStatus = 200 // answered by mcp-go, which read the request
			}
			if resp.StatusCode != wantStatus {
				t.Errorf("HTTP status %d, want %d", resp.StatusCode, wantStatus)
			}

			// Both sessions still serve.
			r.send(`{"jsonrpc":"2.0","id":"after","method":"tools/list"}`)
			if m := r.next(); m["id"] != "after" || m["result"] == nil {
				t.Errorf("stdio after it: %s", clipAnswer(m))
			}
			resp, body = post(t, p.base, alice, sid, `{"jsonrpc":"2.0","id":"after","method":"tools/list"}`)
			if resp.StatusCode != 200 || !strings.Contains(body, `"id":"after"`) || !strings.Contains(body, `"tools":[`) {
				t.Errorf("HTTP session after it: %d %.300s", resp.StatusCode, body)
			}
		})
	}
}

// TestMCPEndpointMethodNotAllowed: a method /mcp does not serve is
// answered 405 with an Allow header naming the ones it does (RFC 9110)
// in the request's protocol era, with or without a token, and the
// session is untouched.
func TestMCPEndpointMethodNotAllowed(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	p := startHTTP(t, filepath.Join(dir, "ledger.db"), tokens, 0)
	sid := initialize(t, p.base, alice, "methods")
	for _, method := range []string{"OPTIONS", "PUT", "PATCH", "HEAD", "TRACE"} {
		for _, tc := range []struct {
			name, token, version, allow string
		}{
			{"session", alice, "2025-11-25", "GET, POST, DELETE"},
			{"no token", "", "", "GET, POST, DELETE"},
			{"2026-07-28", alice, "2026-07-28", "POST"}, // no sessions, no GET stream
		} {
			req, _ := http.NewRequest(method, p.base+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"ping"}`))
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			if tc.version == "2025-11-25" {
				req.Header.Set("Mcp-Session-Id", sid)
			}
			if tc.version != "" {
				req.Header.Set("Mcp-Protocol-Version", tc.version)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 405 || resp.Header.Get("Allow") != tc.allow {
				t.Errorf("%s /mcp (%s): %d, Allow %q; want 405, Allow %q", method, tc.name, resp.StatusCode, resp.Header.Get("Allow"), tc.allow)
			}
		}
	}
	if resp, body := post(t, p.base, alice, sid, `{"jsonrpc":"2.0","id":2,"method":"ping"}`); resp.StatusCode != 200 || !strings.Contains(body, `"result":{}`) {
		t.Errorf("ping on the session after: %d %s", resp.StatusCode, body)
	}
}
