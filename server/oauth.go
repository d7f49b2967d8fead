package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	jose "github.com/go-jose/go-jose/v4"

	"idemgate/approvals"
)

// idemgate as an OAuth 2.1 resource server (the MCP authorization
// specification): it publishes Protected Resource Metadata (RFC 9728),
// answers 401 with a WWW-Authenticate challenge naming it, and accepts
// access tokens its authorization server issued for it: JWTs checked
// against the issuer's keys (JWKS), or opaque tokens checked by token
// introspection (RFC 7662). What a token's claims mean to idemgate
// (principal, tenant, role, on-behalf-of, client) is OAuthConfig's
// mapping. docs/oauth.md is the operator's side of it.
//
// The libraries: go-oidc discovers the issuer's metadata and keeps its
// JWKS (cached, fetched again when a token names a key it has not seen),
// go-jose parses the JWS with only the allowed algorithms. Only the
// checks of the claims, the mapping and the metadata document (five
// fields of RFC 9728; the MCP Go SDK's oauthex type of it would bring the
// SDK and two JSON modules into the binary, so the tests read it with
// that type instead) are written here.

// Scopes that make roles, unless OAuthConfig names others.
const (
	DefaultAgentScope    = "idemgate:agent"
	DefaultApproverScope = "idemgate:approver"
)

// DefaultClockSkew is how far a token's exp and nbf may be off the
// server's clock.
const DefaultClockSkew = 30 * time.Second

// maxClockSkew bounds OAuthConfig.ClockSkew.
const maxClockSkew = 5 * time.Minute

// keysMaxAge is how long a fetched JWKS is trusted without being fetched
// again: a key the issuer removed is refused at the latest this long
// after its removal (at once when a token names a key not in the cache,
// which fetches the set again).
const keysMaxAge = 5 * time.Minute

// discoveryRetry is how long a failed discovery of the issuer's metadata
// is remembered before it is tried again.
const discoveryRetry = 10 * time.Second

// maxOAuthToken bounds an access token's length.
const maxOAuthToken = 8192

// DefaultAlgorithms are the JWS algorithms accepted unless OAuthConfig
// names others: asymmetric ones only (never none or a shared secret).
var DefaultAlgorithms = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// OAuthConfig is the [auth] section of the configuration: the
// authorization server whose access tokens idemgate accepts over HTTP,
// and how their claims map to an identity.
type OAuthConfig struct {
	// Resource is this server's canonical URI (RFC 8707), the URL
	// clients connect to, e.g. https://idemgate.example.com/mcp; its
	// metadata is served at /.well-known/oauth-protected-resource and
	// at that path followed by the resource's path.
	Resource string `toml:"resource"`
	// Issuer is the authorization server's issuer identifier; its
	// metadata is read from Issuer/.well-known/openid-configuration.
	Issuer string `toml:"issuer"`
	// Audience is what a token's aud must contain; default Resource.
	// Set it only for a provider that cannot issue tokens for a URI
	// (one that names APIs by an identifier of its own).
	Audience string `toml:"audience"`
	// JWKSURL overrides the jwks_uri of the issuer's metadata.
	JWKSURL string `toml:"jwks_url"`
	// Algorithms are the accepted JWS algorithms; default
	// DefaultAlgorithms.
	Algorithms []string `toml:"algorithms"`
	// ClockSkew is how far exp and nbf may be off; default
	// DefaultClockSkew, at most 5m.
	ClockSkew approvals.Duration `toml:"clock_skew"`
	// Introspection, when set, checks tokens that are not JWTs (opaque)
	// at the issuer's introspection endpoint (RFC 7662), authenticated
	// as IntrospectionClientID with IntrospectionClientSecret.
	Introspection             bool   `toml:"introspection"`
	IntrospectionURL          string `toml:"introspection_url"`
	IntrospectionClientID     string `toml:"introspection_client_id"`
	IntrospectionClientSecret string `toml:"introspection_client_secret"`

	// AgentScope and ApproverScope are the scopes that make a token's
	// role (approver when it has both).
	AgentScope    string `toml:"agent_scope"`
	ApproverScope string `toml:"approver_scope"`
	// PrincipalClaim names the claim of the principal; default sub.
	PrincipalClaim string `toml:"principal_claim"`
	// TenantClaim names the claim of the tenant; Tenant is a fixed one
	// (exactly one of them is set). Tenants, when set, are the only
	// tenants whose tokens are accepted.
	TenantClaim string   `toml:"tenant_claim"`
	Tenant      string   `toml:"tenant"`
	Tenants     []string `toml:"tenants"`
	// OnBehalfOfClaim names the claim of the user the agent acts for
	// (a dotted path reads inside an object: act.sub); optional.
	OnBehalfOfClaim string `toml:"on_behalf_of_claim"`
	// ClientClaim names the claim of the client the token was issued to;
	// default azp, else client_id.
	ClientClaim string `toml:"client_claim"`

	// ConsoleClientID, when set, signs approvers in to the console
	// through the issuer (OpenID Connect, authorization code with PKCE) as
	// this client; ConsoleClientSecret is its secret (empty for a public
	// client). ConsoleRedirectURL is the redirect URI registered for it;
	// default: [console] public_url's origin, else Resource's, followed by
	// /ui/signin/callback.
	ConsoleClientID     string `toml:"console_client_id"`
	ConsoleClientSecret string `toml:"console_client_secret"`
	ConsoleRedirectURL  string `toml:"console_redirect_url"`
}

// ConsoleRedirect is the console's redirect URI: ConsoleRedirectURL, or
// the origin of publicURL (else of Resource) with /ui/signin/callback.
func (c OAuthConfig) ConsoleRedirect(publicURL string) string {
	if c.ConsoleRedirectURL != "" {
		return c.ConsoleRedirectURL
	}
	base := c.Resource
	if publicURL != "" {
		base = publicURL
	}
	u, err := url.Parse(base)
	if err != nil {
		return ""
	}
	return u.Scheme + "://" + u.Host + "/ui/signin/callback"
}

// Enabled reports whether c configures an authorization server.
func (c OAuthConfig) Enabled() bool { return c.Issuer != "" || c.Resource != "" }

// check fills c's defaults and refuses what cannot work, naming the key.
func (c *OAuthConfig) check() error {
	if c.Resource == "" || c.Issuer == "" {
		return errors.New("[auth] needs both resource (this server's URL, e.g. https://idemgate.example.com/mcp) and issuer (the authorization server's issuer URL)")
	}
	for _, u := range []struct{ key, v string }{{"resource", c.Resource}, {"issuer", c.Issuer}, {"jwks_url", c.JWKSURL}, {"introspection_url", c.IntrospectionURL}} {
		if u.v == "" {
			continue
		}
		p, err := url.Parse(u.v)
		if err != nil || (p.Scheme != "https" && p.Scheme != "http") || p.Host == "" || p.Fragment != "" {
			return fmt.Errorf("[auth] %s %q: must be an absolute http(s) URL without a fragment", u.key, u.v)
		}
		if u.key == "resource" && p.RawQuery != "" {
			return fmt.Errorf("[auth] resource %q: a canonical URI has no query (RFC 8707)", u.v)
		}
	}
	if c.Audience == "" {
		c.Audience = c.Resource
	}
	if len(c.Algorithms) == 0 {
		c.Algorithms = DefaultAlgorithms
	}
	for _, a := range c.Algorithms {
		if !slices.Contains(DefaultAlgorithms, a) {
			return fmt.Errorf("[auth] algorithms: %q is not accepted (asymmetric ones only: %s)", a, strings.Join(DefaultAlgorithms, ", "))
		}
	}
	switch {
	case c.ClockSkew.Duration == 0:
		c.ClockSkew.Duration = DefaultClockSkew
	case c.ClockSkew.Duration < 0 || c.ClockSkew.Duration > maxClockSkew:
		return fmt.Errorf("[auth] clock_skew %s: must be between 0s and %s", c.ClockSkew.Duration, maxClockSkew)
	}
	if c.AgentScope == "" {
		c.AgentScope = DefaultAgentScope
	}
	if c.ApproverScope == "" {
		c.ApproverScope = DefaultApproverScope
	}
	if c.AgentScope == c.ApproverScope {
		return errors.New("[auth] agent_scope and approver_scope must differ")
	}
	if c.PrincipalClaim == "" {
		c.PrincipalClaim = "sub"
	}
	if (c.TenantClaim == "") == (c.Tenant == "") {
		return errors.New("[auth] needs exactly one of tenant_claim (the claim that names the tenant) and tenant (one tenant for every token)")
	}
	if c.Tenant != "" && !namePattern.MatchString(c.Tenant) {
		return fmt.Errorf("[auth] tenant %q: must be 1-64 characters of letters, digits and _.@:- starting with a letter or digit", c.Tenant)
	}
	for _, t := range c.Tenants {
		if !namePattern.MatchString(t) {
			return fmt.Errorf("[auth] tenants: %q must be 1-64 characters of letters, digits and _.@:- starting with a letter or digit", t)
		}
	}
	if c.Introspection && (c.IntrospectionClientID == "" || c.IntrospectionClientSecret == "") {
		return errors.New("[auth] introspection needs introspection_client_id and introspection_client_secret (the credentials idemgate presents to the introspection endpoint)")
	}
	return nil
}

// MetadataPaths are the paths this server's Protected Resource Metadata
// is served at: the root form and the form with the resource's path
// (RFC 9728 §3.1).
func (c OAuthConfig) MetadataPaths() []string {
	paths := []string{"/.well-known/oauth-protected-resource"}
	if u, err := url.Parse(c.Resource); err == nil && strings.Trim(u.Path, "/") != "" {
		paths = append(paths, "/.well-known/oauth-protected-resource"+strings.TrimSuffix(u.Path, "/"))
	}
	return paths
}

// MetadataURL is the URL of the metadata that a 401 names: the
// resource's origin, the well-known path, then the resource's path.
func (c OAuthConfig) MetadataURL() string {
	u, err := url.Parse(c.Resource)
	if err != nil {
		return ""
	}
	paths := c.MetadataPaths()
	return u.Scheme + "://" + u.Host + paths[len(paths)-1]
}

// Refusal reasons: the reason label of idemgate_oauth_refusals_total,
// and the reason of the refusal's log line.
const (
	RefusedMalformed         = "malformed"          // not a JWT (and no introspection), or unreadable claims
	RefusedAlgorithm         = "algorithm"          // signed with an algorithm not accepted
	RefusedUnknownIssuer     = "unknown_issuer"     // iss is not the configured issuer
	RefusedSignature         = "bad_signature"      // no key of the issuer's JWKS verifies it
	RefusedWrongAudience     = "wrong_audience"     // aud does not name this server
	RefusedExpired           = "expired"            // exp passed
	RefusedNotYetValid       = "not_yet_valid"      // nbf ahead
	RefusedInactive          = "inactive"           // introspection says inactive
	RefusedScope             = "insufficient_scope" // neither the agent nor the approver scope
	RefusedTenant            = "tenant"             // no tenant, or one not served here
	RefusedClaims            = "claims"             // principal or on-behalf-of unusable
	RefusedIssuerUnreachable = "issuer_unreachable" // metadata, JWKS or introspection unreachable
)

var refusalReasons = []string{RefusedMalformed, RefusedAlgorithm, RefusedUnknownIssuer, RefusedSignature, RefusedWrongAudience,
	RefusedExpired, RefusedNotYetValid, RefusedInactive, RefusedScope, RefusedTenant, RefusedClaims, RefusedIssuerUnreachable}

// TokenRefusal is why an access token was refused: Reason (one of the
// Refused* constants), the HTTP status, and Message for the person or
// model reading the answer.
type TokenRefusal struct {
	Reason  string
	Status  int
	Message string
	// Scope is the scope that would have been enough (insufficient_scope).
	Scope string
	// Subject and Client name the token's holder when its signature was
	// good (for the log line).
	Subject, Client string
}

func (r *TokenRefusal) Error() string { return r.Reason + ": " + r.Message }

// forged reports whether the refusal is of a token that may be a guess
// or a forgery (counted by the AuthGuard against its source), rather than
// a genuine token that is expired or not for this server.
func (r *TokenRefusal) forged() bool {
	switch r.Reason {
	case RefusedMalformed, RefusedAlgorithm, RefusedSignature, RefusedUnknownIssuer, RefusedInactive:
		return true
	}
	return false
}

func refused(reason string, status int, format string, args ...any) *TokenRefusal {
	return &TokenRefusal{Reason: reason, Status: status, Message: fmt.Sprintf(format, args...)}
}

// OAuth checks access tokens of the configured authorization server.
// Safe for concurrent use.
type OAuth struct {
	cfg    OAuthConfig
	client *http.Client
	now    func() time.Time

	mu         sync.Mutex
	discovered bool      // the issuer's metadata was read
	failedAt   time.Time // the last failed discovery
	failErr    error
	jwksURL    string
	introspect string
	keys       *oidc.RemoteKeySet
	keysAt     time.Time
}

// NewOAuth checks cfg (filling its defaults) and returns its token
// checker. client fetches the issuer's metadata, keys and introspection
// (nil: a client with a 10 s timeout). Nothing is fetched until the first
// token, or Discover.
func NewOAuth(cfg OAuthConfig, client *http.Client) (*OAuth, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if client == nil {
		client = &http.Client{Timeout: 10 * time.Second}
	}
	return &OAuth{cfg: cfg, client: client, now: time.Now}, nil
}

// Config is the checked configuration, defaults filled.
func (o *OAuth) Config() OAuthConfig { return o.cfg }

// ResourceMetadata is a Protected Resource Metadata document (RFC 9728
// §2), the members idemgate publishes.
type ResourceMetadata struct {
	Resource               string   `json:"resource"`
	AuthorizationServers   []string `json:"authorization_servers"`
	ScopesSupported        []string `json:"scopes_supported"`
	BearerMethodsSupported []string `json:"bearer_methods_supported"`
	ResourceName           string   `json:"resource_name"`
}

// Metadata is this server's Protected Resource Metadata (RFC 9728).
func (o *OAuth) Metadata() *ResourceMetadata {
	return &ResourceMetadata{
		Resource:               o.cfg.Resource,
		AuthorizationServers:   []string{o.cfg.Issuer},
		ScopesSupported:        []string{o.cfg.AgentScope, o.cfg.ApproverScope},
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "idemgate",
	}
}

// Discover reads the issuer's metadata (OpenID Connect discovery) for its
// jwks_uri and introspection_endpoint, unless both are configured. A
// failure is remembered for discoveryRetry.
func (o *OAuth) Discover(ctx context.Context) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.discoverLocked(ctx)
}

func (o *OAuth) discoverLocked(ctx context.Context) error {
	if o.discovered {
		return nil
	}
	if o.failErr != nil && o.now().Sub(o.failedAt) < discoveryRetry {
		return o.failErr
	}
	o.jwksURL, o.introspect = o.cfg.JWKSURL, o.cfg.IntrospectionURL
	if o.jwksURL == "" || (o.cfg.Introspection && o.introspect == "") {
		p, err := oidc.NewProvider(oidc.ClientContext(ctx, o.client), o.cfg.Issuer)
		if err != nil {
			o.failedAt, o.failErr = o.now(), fmt.Errorf("the issuer's metadata (%s/.well-known/openid-configuration): %w", strings.TrimSuffix(o.cfg.Issuer, "/"), err)
			return o.failErr
		}
		var meta struct {
			JWKS          string `json:"jwks_uri"`
			Introspection string `json:"introspection_endpoint"`
		}
		if err := p.Claims(&meta); err != nil {
			o.failedAt, o.failErr = o.now(), fmt.Errorf("the issuer's metadata: %w", err)
			return o.failErr
		}
		if o.jwksURL == "" {
			o.jwksURL = meta.JWKS
		}
		if o.introspect == "" {
			o.introspect = meta.Introspection
		}
		if o.cfg.Introspection && o.introspect == "" {
			o.failedAt, o.failErr = o.now(), errors.New("the issuer's metadata names no introspection_endpoint: set [auth] introspection_url")
			return o.failErr
		}
	}
	o.discovered, o.failErr = true, nil
	return nil
}

// keySet is the issuer's JWKS, a new cache once the last is keysMaxAge
// old.
func (o *OAuth) keySet(ctx context.Context) (*oidc.RemoteKeySet, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if err := o.discoverLocked(ctx); err != nil {
		return nil, err
	}
	if o.jwksURL == "" {
		return nil, errors.New("the issuer's metadata names no jwks_uri: set [auth] jwks_url")
	}
	if o.keys == nil || o.now().Sub(o.keysAt) >= keysMaxAge {
		// The key set fetches with the client of the context it is made
		// with, for as long as it lives.
		o.keys, o.keysAt = oidc.NewRemoteKeySet(oidc.ClientContext(context.Background(), o.client), o.jwksURL), o.now()
	}
	return o.keys, nil
}

// claims are the standard claims of an access token (RFC 9068, RFC 7662).
type claims struct {
	Issuer    string       `json:"iss"`
	Audience  audience     `json:"aud"`
	Expiry    *json.Number `json:"exp"`
	NotBefore *json.Number `json:"nbf"`
	Active    *bool        `json:"active"` // introspection only
}

// audience is aud: one string or an array of them.
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*a = audience{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return errors.New("aud: neither a string nor an array of strings")
	}
	*a = many
	return nil
}

// Verify checks an access token and maps its claims to an identity.
// Every refusal is a *TokenRefusal.
func (o *OAuth) Verify(ctx context.Context, token string) (Identity, error) {
	if len(token) > maxOAuthToken {
		return Identity{}, refused(RefusedMalformed, http.StatusUnauthorized, "the access token is longer than %d bytes", maxOAuthToken)
	}
	var payload []byte
	if strings.Count(token, ".") == 2 {
		p, err := o.verifyJWT(ctx, token)
		if err != nil {
			return Identity{}, err
		}
		payload = p
	} else if o.cfg.Introspection {
		p, err := o.introspectToken(ctx, token)
		if err != nil {
			return Identity{}, err
		}
		payload = p
	} else {
		return Identity{}, refused(RefusedMalformed, http.StatusUnauthorized, "the bearer token is neither a token of the tokens file nor a JWT access token of %s", o.cfg.Issuer)
	}
	return o.mapClaims(payload)
}

// verifyJWT checks the JWS of token (algorithm, then signature against
// the issuer's keys) and returns its payload. The issuer is read before
// the signature is checked only to say whose token it is: a token of
// another issuer is refused as such, never fetched keys for.
func (o *OAuth) verifyJWT(ctx context.Context, token string) ([]byte, error) {
	algs := make([]jose.SignatureAlgorithm, len(o.cfg.Algorithms))
	for i, a := range o.cfg.Algorithms {
		algs[i] = jose.SignatureAlgorithm(a)
	}
	jws, err := jose.ParseSigned(token, algs)
	if err != nil {
		if alg := (*jose.ErrUnexpectedSignatureAlgorithm)(nil); errors.As(err, &alg) {
			return nil, refused(RefusedAlgorithm, http.StatusUnauthorized, "the access token is signed with %s, an algorithm this server does not accept (accepted: %s)", clipText(string(alg.Got), 20), strings.Join(o.cfg.Algorithms, ", "))
		}
		return nil, refused(RefusedMalformed, http.StatusUnauthorized, "the access token is not a well-formed JWT: %v", err)
	}
	var c claims
	if err := json.Unmarshal(jws.UnsafePayloadWithoutVerification(), &c); err != nil {
		return nil, refused(RefusedMalformed, http.StatusUnauthorized, "the access token's claims are unreadable: %v", err)
	}
	if c.Issuer != o.cfg.Issuer {
		return nil, refused(RefusedUnknownIssuer, http.StatusUnauthorized, "the access token was issued by %q; this server accepts tokens of %s only", clipText(c.Issuer, 200), o.cfg.Issuer)
	}
	keys, err := o.keySet(ctx)
	if err != nil {
		return nil, refused(RefusedIssuerUnreachable, http.StatusServiceUnavailable, "the access token cannot be checked now: %v", err)
	}
	payload, err := keys.VerifySignature(ctx, token)
	if err != nil {
		if strings.HasPrefix(err.Error(), "fetching keys") {
			return nil, refused(RefusedIssuerUnreachable, http.StatusServiceUnavailable, "the access token cannot be checked now: the issuer's keys (%s): %v", o.jwksURL, err)
		}
		return nil, refused(RefusedSignature, http.StatusUnauthorized, "the access token's signature is not one of %s's current keys (signed with a key it no longer publishes, or not by it)", o.cfg.Issuer)
	}
	return payload, nil
}

// maxIntrospectionAnswer bounds an introspection response.
const maxIntrospectionAnswer = 1 << 20

// introspectToken asks the issuer's introspection endpoint (RFC 7662)
// about an opaque token and returns its answer, refusing an inactive one.
func (o *OAuth) introspectToken(ctx context.Context, token string) ([]byte, error) {
	o.mu.Lock()
	err := o.discoverLocked(ctx)
	endpoint := o.introspect
	o.mu.Unlock()
	if err != nil {
		return nil, refused(RefusedIssuerUnreachable, http.StatusServiceUnavailable, "the access token cannot be checked now: %v", err)
	}
	form := url.Values{"token": {token}, "token_type_hint": {"access_token"}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form.Encode()))
	if err != nil {
		return nil, refused(RefusedIssuerUnreachable, http.StatusServiceUnavailable, "the access token cannot be checked now: %v", err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Accept", "application/json")
	req.SetBasicAuth(url.QueryEscape(o.cfg.IntrospectionClientID), url.QueryEscape(o.cfg.IntrospectionClientSecret))
	resp, err := o.client.Do(req)
	if err != nil {
		return nil, refused(RefusedIssuerUnreachable, http.StatusServiceUnavailable, "the access token cannot be checked now: introspection at %s: %v", endpoint, err)
	}
	defer resp.Body.Close()
	var body json.RawMessage
	if err := json.NewDecoder(http.MaxBytesReader(nil, resp.Body, maxIntrospectionAnswer)).Decode(&body); err != nil || resp.StatusCode != http.StatusOK {
		return nil, refused(RefusedIssuerUnreachable, http.StatusServiceUnavailable, "the access token cannot be checked now: introspection at %s answered %s", endpoint, resp.Status)
	}
	var c claims
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, refused(RefusedMalformed, http.StatusUnauthorized, "the introspection answer is unreadable: %v", err)
	}
	if c.Active == nil || !*c.Active {
		return nil, refused(RefusedInactive, http.StatusUnauthorized, "the access token is not active (the issuer's introspection says so: expired, revoked or never issued)")
	}
	if c.Issuer != "" && c.Issuer != o.cfg.Issuer {
		return nil, refused(RefusedUnknownIssuer, http.StatusUnauthorized, "the access token was issued by %q; this server accepts tokens of %s only", clipText(c.Issuer, 200), o.cfg.Issuer)
	}
	return body, nil
}

// mapClaims checks the claims of a token whose signature (or
// introspection) was good — audience, exp, nbf, scopes, tenant — and maps
// them to an identity.
func (o *OAuth) mapClaims(payload []byte) (Identity, error) {
	var c claims
	var all map[string]any
	if err := json.Unmarshal(payload, &c); err != nil {
		return Identity{}, refused(RefusedMalformed, http.StatusUnauthorized, "the access token's claims are unreadable: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(payload)))
	dec.UseNumber()
	if err := dec.Decode(&all); err != nil {
		return Identity{}, refused(RefusedMalformed, http.StatusUnauthorized, "the access token's claims are unreadable: %v", err)
	}
	sub, _ := claimString(all, "sub")
	client, _ := claimString(all, o.clientClaim(all))
	who := func(r *TokenRefusal) *TokenRefusal {
		r.Subject, r.Client = clipText(sub, 128), clipText(client, 128)
		return r
	}
	if !slices.Contains(c.Audience, o.cfg.Audience) {
		return Identity{}, who(refused(RefusedWrongAudience, http.StatusUnauthorized, "the access token is for %s, not for this server (%s): ask the authorization server for a token with resource=%s",
			clipText(strings.Join(c.Audience, ", "), 300), o.cfg.Audience, o.cfg.Resource))
	}
	now := o.now()
	skew := o.cfg.ClockSkew.Duration
	if c.Expiry == nil {
		return Identity{}, who(refused(RefusedMalformed, http.StatusUnauthorized, "the access token has no expiry (exp)"))
	}
	if exp, err := unixTime(*c.Expiry); err != nil {
		return Identity{}, who(refused(RefusedMalformed, http.StatusUnauthorized, "the access token's exp is not a time: %v", err))
	} else if now.After(exp.Add(skew)) {
		return Identity{}, who(refused(RefusedExpired, http.StatusUnauthorized, "the access token expired at %s: get a new one (refresh it, or sign in again)", exp.UTC().Format(time.RFC3339)))
	}
	if c.NotBefore != nil {
		if nbf, err := unixTime(*c.NotBefore); err != nil {
			return Identity{}, who(refused(RefusedMalformed, http.StatusUnauthorized, "the access token's nbf is not a time: %v", err))
		} else if now.Add(skew).Before(nbf) {
			return Identity{}, who(refused(RefusedNotYetValid, http.StatusUnauthorized, "the access token is not valid before %s (is this server's clock right?)", nbf.UTC().Format(time.RFC3339)))
		}
	}
	scopes := tokenScopes(all)
	var role string
	switch {
	case slices.Contains(scopes, o.cfg.ApproverScope):
		role = "approver"
	case slices.Contains(scopes, o.cfg.AgentScope):
		role = "agent"
	default:
		r := who(refused(RefusedScope, http.StatusForbidden, "the access token has neither scope %s (an agent's) nor %s (an approver's): ask for the scope %s", o.cfg.AgentScope, o.cfg.ApproverScope, o.cfg.AgentScope))
		r.Scope = o.cfg.AgentScope
		return Identity{}, r
	}
	id := Identity{Role: role, Client: clipText(client, maxStated), Issuer: o.cfg.Issuer}
	principal, ok := claimString(all, o.cfg.PrincipalClaim)
	if !ok || !namePattern.MatchString(principal) {
		return Identity{}, who(refused(RefusedClaims, http.StatusForbidden, "the access token's %s claim %q cannot be a principal (1-64 characters of letters, digits and _.@:- starting with a letter or digit): set [auth] principal_claim to a claim that can", o.cfg.PrincipalClaim, clipText(principal, 100)))
	}
	id.Principal = principal
	id.Tenant = o.cfg.Tenant
	if o.cfg.TenantClaim != "" {
		t, ok := claimString(all, o.cfg.TenantClaim)
		if !ok || !namePattern.MatchString(t) {
			return Identity{}, who(refused(RefusedTenant, http.StatusForbidden, "the access token's %s claim names no usable tenant (%q): the authorization server must add it", o.cfg.TenantClaim, clipText(t, 100)))
		}
		id.Tenant = t
	}
	if len(o.cfg.Tenants) > 0 && !slices.Contains(o.cfg.Tenants, id.Tenant) {
		return Identity{}, who(refused(RefusedTenant, http.StatusForbidden, "the access token is of tenant %s, which this server does not serve (it serves %s)", id.Tenant, strings.Join(o.cfg.Tenants, ", ")))
	}
	if o.cfg.OnBehalfOfClaim != "" {
		if v, ok := claimString(all, o.cfg.OnBehalfOfClaim); ok {
			id.OnBehalfOf = v
		}
	}
	if err := id.Validate(); err != nil {
		return Identity{}, who(refused(RefusedClaims, http.StatusForbidden, "the access token's claims make no usable identity: %v", err))
	}
	return id, nil
}

// clientClaim is the claim naming the client: the configured one, else
// azp when present, else client_id.
func (o *OAuth) clientClaim(all map[string]any) string {
	if o.cfg.ClientClaim != "" {
		return o.cfg.ClientClaim
	}
	if _, ok := claimString(all, "azp"); ok {
		return "azp"
	}
	return "client_id"
}

// claimString is the claim at path (dots step into objects) as text: a
// string, or a number in decimal.
func claimString(all map[string]any, path string) (string, bool) {
	var v any = all
	for _, part := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return "", false
		}
		if v, ok = m[part]; !ok {
			return "", false
		}
	}
	switch s := v.(type) {
	case string:
		return s, s != ""
	case json.Number:
		return s.String(), true
	}
	return "", false
}

// tokenScopes are the token's scopes: scope (space-separated, RFC 9068
// and 7662) or scp (an array or a string, as some providers send).
func tokenScopes(all map[string]any) []string {
	var out []string
	for _, name := range []string{"scope", "scp"} {
		switch v := all[name].(type) {
		case string:
			out = append(out, strings.Fields(v)...)
		case []any:
			for _, s := range v {
				if s, ok := s.(string); ok {
					out = append(out, s)
				}
			}
		}
	}
	return out
}

// unixTime reads a NumericDate.
func unixTime(n json.Number) (time.Time, error) {
	f, err := strconv.ParseFloat(n.String(), 64)
	if err != nil {
		return time.Time{}, err
	}
	return time.Unix(0, 0).Add(time.Duration(f * float64(time.Second))), nil
}

// identityHash stands for an OAuth identity where a static token's hash
// would: sessions belong to it, so a refreshed token keeps its sessions.
func identityHash(id Identity) string {
	sum := sha256.Sum256([]byte("oauth\x00" + id.Issuer + "\x00" + id.Principal + "\x00" + id.Client + "\x00" + id.Tenant + "\x00" + id.Role))
	return hex.EncodeToString(sum[:])
}

// challenge is the WWW-Authenticate value of a 401 or 403 under OAuth.
func (o *OAuth) challenge(r *TokenRefusal) string {
	v := `Bearer resource_metadata="` + o.cfg.MetadataURL() + `"`
	if r == nil {
		return v
	}
	switch r.Reason {
	case RefusedScope:
		v += `, error="insufficient_scope", scope="` + r.Scope + `"`
	case RefusedIssuerUnreachable, RefusedTenant, RefusedClaims:
	default:
		v += `, error="invalid_token"`
	}
	return v + `, error_description="` + strings.NewReplacer(`"`, `'`, `\`, `/`).Replace(clipText(r.Message, 300)) + `"`
}

// metadataHandler serves the Protected Resource Metadata.
func (o *OAuth) metadataHandler() http.Handler {
	body, _ := json.Marshal(o.Metadata())
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "max-age=300")
		// Browser-based clients read it from another origin.
		w.Header().Set("Access-Control-Allow-Origin", "*")
		w.Write(body)
	})
}

// logRefusal logs one refused token: its own line for each reason.
func logRefusal(logger *slog.Logger, r *http.Request, ref *TokenRefusal) {
	logger.Warn("access token refused: "+ref.Reason, "reason", ref.Reason, "status", ref.Status, "source", sourceOf(r),
		"sub", ref.Subject, "client", ref.Client, "message", ref.Message)
}
