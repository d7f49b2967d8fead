package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"idemgate/approvals"
	"idemgate/internal/oidctest"
)

const testResource = "https://idemgate.example.com/mcp"

// startProvider starts a real OpenID provider with a confidential client
// "svc" (tokens for testResource, tenant acme), "elsewhere" (tokens for
// another resource), "globex" (tenant globex) and "opaque" (opaque
// tokens, tenant acme), and an OAuth checker of its tokens.
func startProvider(t *testing.T, mod func(*OAuthConfig)) (*oidctest.Provider, *OAuth) {
	t.Helper()
	p, err := oidctest.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	acme := map[string]any{"tenant": "acme"}
	p.AddClient(oidctest.Client{ID: "svc", Secret: "s3cret", Audience: []string{testResource}, Claims: acme})
	p.AddClient(oidctest.Client{ID: "elsewhere", Secret: "s3cret", Audience: []string{"https://other.example.com/mcp"}, Claims: acme})
	p.AddClient(oidctest.Client{ID: "globex", Secret: "s3cret", Audience: []string{testResource}, Claims: map[string]any{"tenant": "globex"}})
	p.AddClient(oidctest.Client{ID: "opaque", Secret: "s3cret", Audience: []string{testResource}, Claims: acme, Opaque: true})
	p.AddClient(oidctest.Client{ID: "idemgate", Secret: "introspect"})
	cfg := OAuthConfig{Resource: testResource, Issuer: p.Issuer, TenantClaim: "tenant", Tenants: []string{"acme"}}
	if mod != nil {
		mod(&cfg)
	}
	o, err := NewOAuth(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p, o
}

func ccToken(t *testing.T, p *oidctest.Provider, client string, scopes ...string) string {
	t.Helper()
	tok, err := p.ClientCredentials(context.Background(), client, "s3cret", scopes...)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// refusal asserts that err is a refusal for reason with status.
func refusal(t *testing.T, err error, reason string, status int, words string) {
	t.Helper()
	var r *TokenRefusal
	if !errors.As(err, &r) {
		t.Fatalf("want refusal %s, got %v", reason, err)
	}
	if r.Reason != reason || r.Status != status || !strings.Contains(r.Message, words) {
		t.Fatalf("want %s (%d) saying %q, got %s (%d): %s", reason, status, words, r.Reason, r.Status, r.Message)
	}
}

func TestOAuthProviderTokens(t *testing.T) {
	p, o := startProvider(t, nil)
	ctx := context.Background()

	id, err := o.Verify(ctx, ccToken(t, p, "svc", "idemgate:agent"))
	if err != nil {
		t.Fatal(err)
	}
	want := Identity{Principal: "svc", Tenant: "acme", Role: "agent", Client: "svc", Issuer: p.Issuer}
	if id != want {
		t.Fatalf("identity %+v, want %+v", id, want)
	}
	if id, err = o.Verify(ctx, ccToken(t, p, "svc", "idemgate:agent", "idemgate:approver")); err != nil || id.Role != "approver" {
		t.Fatalf("approver scope: %+v %v", id, err)
	}

	_, err = o.Verify(ctx, ccToken(t, p, "elsewhere", "idemgate:agent"))
	refusal(t, err, RefusedWrongAudience, 401, "not for this server")

	_, err = o.Verify(ctx, ccToken(t, p, "svc", "openid"))
	refusal(t, err, RefusedScope, 403, "ask for the scope idemgate:agent")

	_, err = o.Verify(ctx, ccToken(t, p, "globex", "idemgate:agent"))
	refusal(t, err, RefusedTenant, 403, "tenant globex, which this server does not serve")

	p.SetTokenTTL(-time.Minute)
	_, err = o.Verify(ctx, ccToken(t, p, "svc", "idemgate:agent"))
	refusal(t, err, RefusedExpired, 401, "expired at")
	p.SetTokenTTL(5 * time.Minute)

	// Another provider's token, though well signed by it.
	other, _ := startProvider(t, nil)
	_, err = o.Verify(ctx, ccToken(t, other, "svc", "idemgate:agent"))
	refusal(t, err, RefusedUnknownIssuer, 401, "this server accepts tokens of "+p.Issuer+" only")

	// A symmetric algorithm is never accepted, whatever the key.
	signer, _ := jose.NewSigner(jose.SigningKey{Algorithm: jose.HS256, Key: []byte("0123456789abcdef0123456789abcdef")}, nil)
	forged, _ := jwt.Signed(signer).Claims(map[string]any{"iss": p.Issuer, "aud": testResource, "sub": "svc", "tenant": "acme",
		"scope": "idemgate:approver", "exp": time.Now().Add(time.Hour).Unix()}).Serialize()
	_, err = o.Verify(ctx, forged)
	refusal(t, err, RefusedAlgorithm, 401, "algorithm")

	// A token signed by a key the provider never published.
	tok := ccToken(t, p, "svc", "idemgate:agent")
	parts := strings.Split(tok, ".")
	_, err = o.Verify(ctx, parts[0]+"."+parts[1]+"."+strings.Split(ccToken(t, other, "svc", "idemgate:agent"), ".")[2])
	refusal(t, err, RefusedSignature, 401, "signature")

	_, err = o.Verify(ctx, "not-a-jwt")
	refusal(t, err, RefusedMalformed, 401, "neither a token of the tokens file nor a JWT")
}

// TestOAuthKeyRotation: a token of a new key is accepted at once (the
// unknown key id fetches the JWKS again); once the provider removed the
// old key, a token it signs is refused when the cached keys are renewed.
func TestOAuthKeyRotation(t *testing.T) {
	p, o := startProvider(t, nil)
	ctx := context.Background()
	now := time.Now()
	o.now = func() time.Time { return now }
	p.SetTokenTTL(time.Hour)
	if _, err := o.Verify(ctx, ccToken(t, p, "svc", "idemgate:agent")); err != nil {
		t.Fatal(err)
	}
	if err := p.RotateKey(); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Verify(ctx, ccToken(t, p, "svc", "idemgate:agent")); err != nil {
		t.Fatalf("token of the new key: %v", err)
	}
	p.RemoveOldKeys()
	p.SignWithOldKey(true)
	old := ccToken(t, p, "svc", "idemgate:agent")
	p.SignWithOldKey(false)
	now = now.Add(keysMaxAge)
	_, err := o.Verify(ctx, old)
	refusal(t, err, RefusedSignature, 401, "no longer publishes")
	if _, err := o.Verify(ctx, ccToken(t, p, "svc", "idemgate:agent")); err != nil {
		t.Fatalf("token of the current key: %v", err)
	}
}

func TestOAuthIntrospection(t *testing.T) {
	p, o := startProvider(t, func(c *OAuthConfig) {
		c.Introspection, c.IntrospectionClientID, c.IntrospectionClientSecret = true, "idemgate", "introspect"
	})
	ctx := context.Background()
	tok := ccToken(t, p, "opaque", "idemgate:agent")
	if strings.Count(tok, ".") == 2 {
		t.Fatalf("the provider issued a JWT, not an opaque token: %s", tok)
	}
	id, err := o.Verify(ctx, tok)
	if err != nil {
		t.Fatal(err)
	}
	if want := (Identity{Principal: "opaque", Tenant: "acme", Role: "agent", Client: "opaque", Issuer: p.Issuer}); id != want {
		t.Fatalf("identity %+v, want %+v", id, want)
	}
	_, err = o.Verify(ctx, tok+"x")
	refusal(t, err, RefusedInactive, 401, "not active")
}

// TestOAuthHTTP: the metadata at both paths, the 401 challenge that names
// it, each refusal's status, challenge and message, and the counts.
func TestOAuthHTTP(t *testing.T) {
	p, o := startProvider(t, nil)
	metrics := NewMetrics()
	var got Identity
	h := http.NewServeMux()
	h.Handle("/mcp", requireToken(nil, o, NewAuthGuard(0, nil, metrics), metrics, slog.New(slog.DiscardHandler), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ = r.Context().Value(identityKey{}).(Identity)
		io.WriteString(w, "ok")
	})))
	for _, path := range o.Config().MetadataPaths() {
		h.Handle("GET "+path, o.metadataHandler())
	}
	srv := httptest.NewServer(h)
	defer srv.Close()

	for _, path := range []string{"/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		var meta oauthex.ProtectedResourceMetadata
		json.NewDecoder(resp.Body).Decode(&meta)
		resp.Body.Close()
		if meta.Resource != testResource || len(meta.AuthorizationServers) != 1 || meta.AuthorizationServers[0] != p.Issuer ||
			strings.Join(meta.ScopesSupported, " ") != "idemgate:agent idemgate:approver" {
			t.Fatalf("%s: %+v", path, meta)
		}
	}
	call := func(tok string) (*http.Response, string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/mcp", strings.NewReader("{}"))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	resp, body := call("")
	chal := resp.Header.Get("WWW-Authenticate")
	if resp.StatusCode != 401 || chal != `Bearer resource_metadata="https://idemgate.example.com/.well-known/oauth-protected-resource/mcp"` {
		t.Fatalf("no token: %d %q %s", resp.StatusCode, chal, body)
	}
	cs, err := oauthex.ParseWWWAuthenticate([]string{chal})
	if err != nil || len(cs) != 1 || cs[0].Params["resource_metadata"] != o.Config().MetadataURL() {
		t.Fatalf("challenge %q: %+v %v", chal, cs, err)
	}

	resp, body = call(ccToken(t, p, "elsewhere", "idemgate:agent"))
	if chal := resp.Header.Get("WWW-Authenticate"); resp.StatusCode != 401 || !strings.Contains(chal, `error="invalid_token"`) || !strings.Contains(body, "resource="+testResource) {
		t.Fatalf("wrong audience: %d %q %s", resp.StatusCode, chal, body)
	}
	resp, body = call(ccToken(t, p, "svc", "openid"))
	if chal := resp.Header.Get("WWW-Authenticate"); resp.StatusCode != 403 || !strings.Contains(chal, `error="insufficient_scope", scope="idemgate:agent"`) {
		t.Fatalf("no scope: %d %q %s", resp.StatusCode, chal, body)
	}
	resp, body = call(ccToken(t, p, "svc", "idemgate:agent"))
	if resp.StatusCode != 200 || got.Principal != "svc" || got.Client != "svc" {
		t.Fatalf("good token: %d %s %+v", resp.StatusCode, body, got)
	}
	if n := testutil.ToFloat64(metrics.oauthRefusals.WithLabelValues(RefusedWrongAudience)); n != 1 {
		t.Fatalf("wrong_audience counted %v times", n)
	}
	if n := testutil.ToFloat64(metrics.oauthRefusals.WithLabelValues(RefusedScope)); n != 1 {
		t.Fatalf("insufficient_scope counted %v times", n)
	}
}

func TestOAuthConfigRefusals(t *testing.T) {
	for _, c := range []struct {
		cfg  OAuthConfig
		want string
	}{
		{OAuthConfig{Issuer: "https://id.example.com"}, "needs both resource"},
		{OAuthConfig{Resource: "idemgate/mcp", Issuer: "https://id.example.com", Tenant: "acme"}, "absolute http(s) URL"},
		{OAuthConfig{Resource: testResource, Issuer: "https://id.example.com"}, "exactly one of tenant_claim"},
		{OAuthConfig{Resource: testResource, Issuer: "https://id.example.com", Tenant: "acme", Algorithms: []string{"HS256"}}, "asymmetric ones only"},
		{OAuthConfig{Resource: testResource, Issuer: "https://id.example.com", Tenant: "acme", ClockSkew: approvals.Duration{Duration: time.Hour}}, "clock_skew"},
		{OAuthConfig{Resource: testResource, Issuer: "https://id.example.com", Tenant: "acme", Introspection: true}, "introspection_client_id"},
	} {
		if _, err := NewOAuth(c.cfg, nil); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.cfg, err, c.want)
		}
	}
}

// TestOAuthClaimsMapping: principal_claim, on_behalf_of_claim (a dotted
// path into an object) and a fixed tenant; a principal claim that cannot
// be a principal is refused naming the key to change.
func TestOAuthClaimsMapping(t *testing.T) {
	p, o := startProvider(t, func(c *OAuthConfig) {
		c.TenantClaim, c.Tenant, c.Tenants = "", "acme", nil
		c.PrincipalClaim, c.OnBehalfOfClaim = "agent_name", "act.sub"
	})
	p.AddClient(oidctest.Client{ID: "delegated", Secret: "s3cret", Audience: []string{testResource},
		Claims: map[string]any{"agent_name": "desk-agent", "act": map[string]any{"sub": "alice@acme.example"}}})
	p.AddClient(oidctest.Client{ID: "spaced", Secret: "s3cret", Audience: []string{testResource},
		Claims: map[string]any{"agent_name": "desk agent"}})
	ctx := context.Background()
	id, err := o.Verify(ctx, ccToken(t, p, "delegated", "idemgate:agent"))
	if err != nil {
		t.Fatal(err)
	}
	want := Identity{Principal: "desk-agent", Tenant: "acme", Role: "agent", OnBehalfOf: "alice@acme.example", Client: "delegated", Issuer: p.Issuer}
	if id != want {
		t.Fatalf("identity %+v, want %+v", id, want)
	}
	_, err = o.Verify(ctx, ccToken(t, p, "spaced", "idemgate:agent"))
	refusal(t, err, RefusedClaims, 403, "set [auth] principal_claim")
}

// TestOAuthOperatorAtHealthz: /healthz shows its details to an access
// token with the approver's scope, as to a tokens-file approver's token;
// not to an agent's, another audience's, a forged one or none. A forged
// token counts against its source, as at /mcp.
func TestOAuthOperatorAtHealthz(t *testing.T) {
	p, o := startProvider(t, nil)
	metrics := NewMetrics()
	guard := NewAuthGuard(DefaultAuthFailureLimit, nil, metrics)
	req := func(tok string) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/healthz", nil)
		if tok != "" {
			r.Header.Set("Authorization", "Bearer "+tok)
		}
		return r
	}
	approver := ccToken(t, p, "svc", "idemgate:approver")
	for _, c := range []struct {
		name string
		tok  string
		want bool
	}{
		{"approver scope", approver, true},
		{"agent scope", ccToken(t, p, "svc", "idemgate:agent"), false},
		{"another audience", ccToken(t, p, "elsewhere", "idemgate:approver"), false},
		{"forged", approver[:len(approver)-4] + "AAAA", false},
		{"none", "", false},
	} {
		if got := isOperator(nil, o, guard, req(c.tok)); got != c.want {
			t.Errorf("%s: operator = %v, want %v", c.name, got, c.want)
		}
	}
	if isOperator(nil, nil, guard, req(approver)) {
		t.Error("an access token was taken without [auth]")
	}
	if n := testutil.ToFloat64(metrics.authFailures.WithLabelValues(AuthBearer)); n != 1 {
		t.Errorf("failed authentications counted: %v, want 1 (the forged token)", n)
	}
}
