package e2e

// Authentication over HTTP as a client and as an attacker meet it: the
// bearer scheme's name in any case, failed tokens and console logins
// logged (rate-limited), counted and slowed per source.

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
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

// clientFrom is an HTTP client whose connections come from the loopback
// address ip (127.0.0.2: another source than the default 127.0.0.1) and
// which does not follow redirects.
func clientFrom(ip string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{
		Transport:     &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		Timeout:       10 * time.Second,
	}
}

// mcpInit posts an initialize to base/mcp from c with the Authorization
// header auth and returns the status, the Retry-After header and the body.
func mcpInit(t *testing.T, c *http.Client, base, auth string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest("POST", base+"/mcp", strings.NewReader(initBody("auth-probe")))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", auth)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
}

// consoleLogin posts the console's login form from c with token.
func consoleLogin(t *testing.T, c *http.Client, base, token string) (int, string, string) {
	t.Helper()
	resp, err := c.PostForm(base+"/ui/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
}

// TestHTTPAuthFailuresLoggedCountedPaused: wrong bearer tokens and wrong
// console logins from one source address are logged (one line for the
// source, not one per attempt), counted on /metrics by kind, and once the
// source has failed --auth-failure-limit times in a minute its requests
// are refused with 429 and Retry-After before any credential is checked
// — its bearer tokens and its console logins alike, a valid token too.
// A client at another address is not slowed: its valid token is served
// and its one wrong login gets 401. Before: every attempt got 401 at full
// speed, with nothing logged or counted.
func TestHTTPAuthFailuresLoggedCountedPaused(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	boss := addToken(t, tokens, "boss", "acme", "approver")
	const limit = 5
	p := startHTTP(t, filepath.Join(dir, "ledger.db"), tokens, 0, "--auth-failure-limit", strconv.Itoa(limit))
	attacker, other := clientFrom("127.0.0.2"), clientFrom("127.0.0.1")

	// Five failures from 127.0.0.2, of both kinds, each refused with 401.
	for i := range 3 {
		if st, _, body := mcpInit(t, attacker, p.base, fmt.Sprintf("Bearer igt_wrong%d", i)); st != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: status %d, want 401\n%s", i+1, st, body)
		}
	}
	for i := range 2 {
		if st, _, body := consoleLogin(t, attacker, p.base, fmt.Sprintf("igt_wrong-login%d", i)); st != http.StatusUnauthorized {
			t.Fatalf("wrong console login %d: status %d, want 401\n%s", i+1, st, body)
		}
	}
	// The source is paused: everything it sends is refused unchecked.
	const more = 45
	start := time.Now()
	for i := range more {
		st, ra, body := mcpInit(t, attacker, p.base, fmt.Sprintf("Bearer igt_wrong-more%d", i))
		if n, err := strconv.Atoi(ra); st != http.StatusTooManyRequests || err != nil || n < 1 || n > 60 {
			t.Fatalf("wrong token %d after %d failures: status %d, Retry-After %q; want 429 and 1-60 s\n%s", i+1, limit, st, ra, body)
		}
	}
	t.Logf("%d wrong tokens after the pause began: all 429, in %s", more, time.Since(start).Round(time.Millisecond))
	if st, ra, _ := mcpInit(t, attacker, p.base, "Bearer "+alice); st != http.StatusTooManyRequests || ra == "" {
		t.Errorf("a valid token from the paused source: status %d, Retry-After %q; want 429 (not checked while paused)", st, ra)
	}
	if st, ra, body := consoleLogin(t, attacker, p.base, boss); st != http.StatusTooManyRequests || ra == "" || !strings.Contains(body, "Too many failed logins") {
		t.Errorf("a console login from the paused source: status %d, Retry-After %q; want 429 saying why\n%s", st, ra, body)
	}

	// Another address is not slowed.
	if st, _, body := mcpInit(t, other, p.base, "Bearer "+alice); st != http.StatusOK {
		t.Errorf("a valid token from 127.0.0.1: status %d, want 200\n%s", st, body)
	}
	if st, _, _ := consoleLogin(t, other, p.base, "igt_typo"); st != http.StatusUnauthorized {
		t.Errorf("one wrong console login from 127.0.0.1: status %d, want 401", st)
	}
	if st, _, _ := consoleLogin(t, other, p.base, boss); st != http.StatusSeeOther {
		t.Errorf("boss's console login from 127.0.0.1: status %d, want 303 (logged in)", st)
	}

	for name, want := range map[string]float64{
		`idemgate_auth_failures_total{kind="bearer"}`:        3,
		`idemgate_auth_failures_total{kind="console_login"}`: 3,
		`idemgate_auth_paused_total{kind="bearer"}`:          more + 1,
		`idemgate_auth_paused_total{kind="console_login"}`:   1,
	} {
		if got := scrape(t, p.base, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}

	// The log: one line for the attacker's failures (the rest within the
	// minute are counted into its next line), one when it was paused, one
	// for the other address's typo; nothing per refused request.
	logs := p.stderr.String()
	for re, want := range map[string]int{
		`level=WARN msg="authentication failed" kind=bearer source=127\.0\.0\.2 .*failures=1 failures_in_window=1`: 1,
		`msg="authentication failed" .*source=127\.0\.0\.2`:                                                        1,
		`msg="authentication: source paused" source=127\.0\.0\.2 failures_in_window=5`:                             1,
		`msg="authentication failed" kind=console_login source=127\.0\.0\.1 `:                                      1,
	} {
		if got := len(regexp.MustCompile(re).FindAllString(logs, -1)); got != want {
			t.Errorf("log lines matching %s: %d, want %d\n%s", re, got, want, logs)
		}
	}
}
