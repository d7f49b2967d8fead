package e2e

// Authentication over HTTP as a client and as an attacker meet it: the
// bearer scheme's name in any case, failed tokens and console logins
// logged (rate-limited), counted and slowed per source.

import (
	"net/http"
	"path/filepath"
	"testing"
)

// TestHTTPBearerSchemeCaseInsensitive: "bearer", "BEARER" and "Bearer"
// all name the Bearer scheme (RFC 7235 §2.1: the scheme is
// case-insensitive); another scheme still gets 401 with WWW-Authenticate.
func TestHTTPBearerSchemeCaseInsensitive(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	tok := addToken(t, tokens, "alice", "acme", "agent")
	p := startHTTP(t, filepath.Join(dir, "ledger.db"), tokens, 0)
	for _, scheme := range []string{"bearer", "BEARER", "Bearer", "bEaReR"} {
		resp, body := post(t, p.base, "", "", initBody("case-"+scheme), "Authorization", scheme+" "+tok)
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Mcp-Session-Id") == "" {
			t.Errorf("Authorization: %s <token>: status %d, want 200 and a session\n%s", scheme, resp.StatusCode, body)
		}
	}
	resp, body := post(t, p.base, "", "", initBody("basic"), "Authorization", "Basic "+tok)
	if resp.StatusCode != http.StatusUnauthorized || resp.Header.Get("WWW-Authenticate") == "" {
		t.Errorf("Authorization: Basic: status %d, WWW-Authenticate %q; want 401 with a challenge\n%s", resp.StatusCode, resp.Header.Get("WWW-Authenticate"), body)
	}
}
