// Package oidctest is a real OpenID provider for tests: zitadel/oidc's op
// package (discovery, JWKS, authorization code with PKCE, client
// credentials, token introspection) over an in-memory storage, listening
// on a loopback port. It really issues and signs tokens; tests choose a
// client's audience, scopes and token type, the claims of its users, the
// lifetime of the next tokens, and rotate the signing key.
//
// Sign-in needs no person: the provider's login page approves the
// current user (SetUser) at once and redirects back, so a client that
// follows redirects (a test's HTTP client, the TypeScript SDK's fetch,
// Chromium) gets its code.
package oidctest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/zitadel/oidc/v3/pkg/oidc"
	"github.com/zitadel/oidc/v3/pkg/op"
)

// Client is a client registered with the provider.
type Client struct {
	ID string
	// Secret, when set, makes a confidential client (client_secret_basic,
	// and the client credentials grant); empty: a public client (PKCE).
	Secret       string
	RedirectURIs []string
	// Audience is the aud of the access tokens issued to the client
	// (empty: its own ID, as the provider does by default).
	Audience []string
	// Opaque makes its access tokens opaque (checked by introspection)
	// rather than JWTs.
	Opaque bool
	// Claims are added to the access tokens it gets by client credentials
	// (e.g. a tenant claim).
	Claims map[string]any
	// Scopes, when set, are the only scopes beyond OpenID Connect's that
	// it is granted in an authorization request (others are dropped, as a
	// provider grants a user only the scopes they are entitled to).
	Scopes []string
}

// Provider is a running OpenID provider.
type Provider struct {
	// Issuer is its issuer URL (http://127.0.0.1:port).
	Issuer string
	srv    *http.Server
	op     *op.Provider
	st     *storage
}

// Start starts a provider on a loopback port; Close stops it.
func Start() (*Provider, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	issuer := "http://" + ln.Addr().String()
	st, err := newStorage(issuer)
	if err != nil {
		ln.Close()
		return nil, err
	}
	var key [32]byte
	rand.Read(key[:])
	p, err := op.NewOpenIDProvider(issuer, &op.Config{CryptoKey: key, CodeMethodS256: true, SupportedScopes: []string{"openid", "profile", "email", "idemgate:agent", "idemgate:approver"}},
		st, op.WithAllowInsecure(), op.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		ln.Close()
		return nil, err
	}
	prov := &Provider{Issuer: issuer, op: p, st: st}
	mux := http.NewServeMux()
	mux.HandleFunc("/login", prov.login)
	mux.Handle("/", p)
	prov.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go prov.srv.Serve(ln)
	return prov, nil
}

// Close stops the provider.
func (p *Provider) Close() error { return p.srv.Close() }

// AddClient registers c (replacing one of the same ID).
func (p *Provider) AddClient(c Client) {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	p.st.clients[c.ID] = &client{Client: c, issuer: p.Issuer}
}

// SetUser makes subject, with claims in its tokens (e.g. a tenant), the
// user every sign-in approves from now on.
func (p *Provider) SetUser(subject string, claims map[string]any) {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	p.st.user, p.st.userClaims = subject, claims
}

// SetTokenTTL sets how long the access tokens issued from now on live;
// a negative one issues tokens that have already expired.
func (p *Provider) SetTokenTTL(d time.Duration) {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	p.st.ttl = d
}

// RotateKey makes a new signing key the one tokens are signed with from
// now on; the JWKS lists it beside the old ones until RemoveOldKeys.
func (p *Provider) RotateKey() error {
	k, err := newKey()
	if err != nil {
		return err
	}
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	p.st.keys = append(p.st.keys, k)
	return nil
}

// RemoveOldKeys drops every key but the current one from the JWKS.
func (p *Provider) RemoveOldKeys() {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	p.st.keys = p.st.keys[len(p.st.keys)-1:]
}

// SignWithOldKey makes tokens be signed with the first key again while
// the JWKS lists only what it lists (after RemoveOldKeys, a key the
// provider removed): what a stolen retired key would sign. false undoes
// it.
func (p *Provider) SignWithOldKey(old bool) {
	p.st.mu.Lock()
	defer p.st.mu.Unlock()
	p.st.signOld = old
}

// ClientCredentials gets an access token for a confidential client by
// the client credentials grant, with scopes.
func (p *Provider) ClientCredentials(ctx context.Context, clientID, secret string, scopes ...string) (string, error) {
	form := url.Values{"grant_type": {"client_credentials"}, "scope": {strings.Join(scopes, " ")}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.Issuer+"/oauth/token", strings.NewReader(form.Encode()))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.SetBasicAuth(url.QueryEscape(clientID), url.QueryEscape(secret))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var body struct {
		AccessToken string `json:"access_token"`
		Error       string `json:"error"`
		Description string `json:"error_description"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return "", fmt.Errorf("token endpoint: %s: %w", resp.Status, err)
	}
	if body.AccessToken == "" {
		return "", fmt.Errorf("token endpoint: %s: %s %s", resp.Status, body.Error, body.Description)
	}
	return body.AccessToken, nil
}

// key is one RSA signing key.
type key struct {
	id  string
	rsa *rsa.PrivateKey
}

func newKey() (*key, error) {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	var id [8]byte
	rand.Read(id[:])
	return &key{id: fmt.Sprintf("%x", id), rsa: k}, nil
}

func (k *key) SignatureAlgorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k *key) Key() any                                    { return k.rsa }
func (k *key) ID() string                                  { return k.id }

// publicKey is a key as the JWKS lists it.
type publicKey struct{ *key }

func (k publicKey) Algorithm() jose.SignatureAlgorithm { return jose.RS256 }
func (k publicKey) Use() string                        { return "sig" }
func (k publicKey) Key() any                           { return &k.rsa.PublicKey }

// login approves the auth request of ?authRequestID= for the current
// user and sends the browser back to the provider's callback.
func (p *Provider) login(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("authRequestID")
	p.st.mu.Lock()
	ar, ok := p.st.requests[id]
	if ok {
		ar.subject, ar.done, ar.authTime = p.st.user, true, time.Now()
	}
	p.st.mu.Unlock()
	if !ok {
		http.Error(w, "unknown auth request", http.StatusBadRequest)
		return
	}
	http.Redirect(w, r, op.AuthCallbackURL(p.op)(r.Context(), id), http.StatusFound)
}

// storage is the provider's in-memory op.Storage.
type storage struct {
	issuer string

	mu         sync.Mutex
	clients    map[string]*client
	requests   map[string]*authRequest
	codes      map[string]string // code → request id
	tokens     map[string]*token
	keys       []*key
	first      *key
	signOld    bool
	user       string
	userClaims map[string]any
	ttl        time.Duration
}

func newStorage(issuer string) (*storage, error) {
	k, err := newKey()
	if err != nil {
		return nil, err
	}
	return &storage{issuer: issuer, clients: map[string]*client{}, requests: map[string]*authRequest{}, codes: map[string]string{},
		tokens: map[string]*token{}, keys: []*key{k}, first: k, user: "alice", ttl: 5 * time.Minute}, nil
}

// token is an issued access token.
type token struct {
	id, clientID, subject string
	audience, scopes      []string
	expiry                time.Time
	claims                map[string]any
}

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return fmt.Sprintf("%x", b)
}

func (s *storage) CreateAuthRequest(ctx context.Context, req *oidc.AuthRequest, userID string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[req.ClientID]
	if !ok {
		return nil, errors.New("unknown client")
	}
	ar := &authRequest{id: newID(), req: *req, audience: c.audience()}
	s.requests[ar.id] = ar
	return ar, nil
}

func (s *storage) AuthRequestByID(ctx context.Context, id string) (op.AuthRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ar, ok := s.requests[id]
	if !ok {
		return nil, errors.New("auth request not found")
	}
	return ar, nil
}

func (s *storage) AuthRequestByCode(ctx context.Context, code string) (op.AuthRequest, error) {
	s.mu.Lock()
	id, ok := s.codes[code]
	s.mu.Unlock()
	if !ok {
		return nil, errors.New("code invalid or used")
	}
	return s.AuthRequestByID(ctx, id)
}

func (s *storage) SaveAuthCode(ctx context.Context, id, code string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.codes[code] = id
	return nil
}

func (s *storage) DeleteAuthRequest(ctx context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.requests, id)
	for code, rid := range s.codes {
		if rid == id {
			delete(s.codes, code)
		}
	}
	return nil
}

func (s *storage) CreateAccessToken(ctx context.Context, req op.TokenRequest) (string, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t := &token{id: newID(), subject: req.GetSubject(), audience: req.GetAudience(), scopes: req.GetScopes(), expiry: time.Now().Add(s.ttl)}
	switch r := req.(type) {
	case *authRequest:
		t.clientID = r.req.ClientID
		t.claims = s.userClaims
	case *ccRequest:
		t.clientID = r.clientID
		t.claims = s.clients[r.clientID].Claims
	}
	s.tokens[t.id] = t
	return t.id, t.expiry, nil
}

func (s *storage) CreateAccessAndRefreshTokens(ctx context.Context, req op.TokenRequest, current string) (string, string, time.Time, error) {
	return "", "", time.Time{}, errors.New("refresh tokens are not supported by this test provider")
}

func (s *storage) TokenRequestByRefreshToken(ctx context.Context, refreshToken string) (op.RefreshTokenRequest, error) {
	return nil, errors.New("refresh tokens are not supported by this test provider")
}

func (s *storage) TerminateSession(ctx context.Context, userID, clientID string) error { return nil }

func (s *storage) RevokeToken(ctx context.Context, tokenOrID, userID, clientID string) *oidc.Error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tokens, tokenOrID)
	return nil
}

func (s *storage) GetRefreshTokenInfo(ctx context.Context, clientID, token string) (string, string, error) {
	return "", "", op.ErrInvalidRefreshToken
}

func (s *storage) SigningKey(ctx context.Context) (op.SigningKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.signOld {
		return s.first, nil
	}
	return s.keys[len(s.keys)-1], nil
}

func (s *storage) SignatureAlgorithms(context.Context) ([]jose.SignatureAlgorithm, error) {
	return []jose.SignatureAlgorithm{jose.RS256}, nil
}

func (s *storage) KeySet(ctx context.Context) ([]op.Key, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]op.Key, len(s.keys))
	for i, k := range s.keys {
		out[i] = publicKey{k}
	}
	return out, nil
}

func (s *storage) GetClientByClientID(ctx context.Context, id string) (op.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[id]
	if !ok {
		return nil, errors.New("unknown client")
	}
	return c, nil
}

func (s *storage) AuthorizeClientIDSecret(ctx context.Context, id, secret string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[id]
	if !ok || c.Secret == "" || c.Secret != secret {
		return errors.New("wrong client or secret")
	}
	return nil
}

func (s *storage) SetUserinfoFromScopes(ctx context.Context, ui *oidc.UserInfo, userID, clientID string, scopes []string) error {
	return nil
}

func (s *storage) SetUserinfoFromRequest(ctx context.Context, ui *oidc.UserInfo, req op.IDTokenRequest, scopes []string) error {
	ui.Subject = req.GetSubject()
	if slices.Contains(scopes, oidc.ScopeEmail) {
		ui.Email, ui.EmailVerified = req.GetSubject()+"@example.com", true
	}
	return nil
}

func (s *storage) SetUserinfoFromToken(ctx context.Context, ui *oidc.UserInfo, tokenID, subject, origin string) error {
	ui.Subject = subject
	return nil
}

func (s *storage) SetIntrospectionFromToken(ctx context.Context, in *oidc.IntrospectionResponse, tokenID, subject, clientID string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tokens[tokenID]
	if !ok || time.Now().After(t.expiry) {
		return errors.New("token is invalid or expired")
	}
	in.Subject, in.ClientID, in.Scope, in.Audience, in.Issuer = t.subject, t.clientID, t.scopes, t.audience, s.issuer
	in.Expiration = oidc.FromTime(t.expiry)
	in.Claims = map[string]any{}
	for k, v := range t.claims {
		in.Claims[k] = v
	}
	return nil
}

func (s *storage) GetPrivateClaimsFromScopes(ctx context.Context, userID, clientID string, scopes []string) (map[string]any, error) {
	return nil, nil
}

// GetPrivateClaimsFromRequest puts the scopes and the user's (or the
// client's) claims in its JWT access tokens.
func (s *storage) GetPrivateClaimsFromRequest(ctx context.Context, req op.TokenRequest, scopes []string) (map[string]any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	base := s.userClaims
	if r, ok := req.(*ccRequest); ok {
		base = s.clients[r.clientID].Claims
	}
	// op leaves scope out of JWT access tokens; RFC 9068 has it.
	claims := map[string]any{"scope": strings.Join(scopes, " ")}
	for k, v := range base {
		claims[k] = v
	}
	return claims, nil
}

func (s *storage) GetKeyByIDAndClientID(ctx context.Context, keyID, clientID string) (*jose.JSONWebKey, error) {
	return nil, errors.New("no JWT profile keys")
}

func (s *storage) ValidateJWTProfileScopes(ctx context.Context, userID string, scopes []string) ([]string, error) {
	return scopes, nil
}

func (s *storage) Health(ctx context.Context) error { return nil }

func (s *storage) ClientCredentials(ctx context.Context, id, secret string) (op.Client, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[id]
	if !ok || c.Secret == "" || c.Secret != secret {
		return nil, errors.New("wrong client or secret")
	}
	return c, nil
}

func (s *storage) ClientCredentialsTokenRequest(ctx context.Context, id string, scopes []string) (op.TokenRequest, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.clients[id]
	if !ok {
		return nil, errors.New("unknown client")
	}
	return &ccRequest{clientID: id, audience: c.audience(), scopes: scopes}, nil
}

// ccRequest is a client credentials token request: the client is its
// own subject.
type ccRequest struct {
	clientID         string
	audience, scopes []string
}

func (r *ccRequest) GetSubject() string    { return r.clientID }
func (r *ccRequest) GetAudience() []string { return r.audience }
func (r *ccRequest) GetScopes() []string   { return r.scopes }

// authRequest is an authorization request, done once the login page
// approved it.
type authRequest struct {
	id       string
	req      oidc.AuthRequest
	audience []string
	subject  string
	done     bool
	authTime time.Time
}

func (a *authRequest) GetID() string         { return a.id }
func (a *authRequest) GetACR() string        { return "" }
func (a *authRequest) GetAMR() []string      { return []string{"pwd"} }
func (a *authRequest) GetAudience() []string { return a.audience }
func (a *authRequest) GetAuthTime() time.Time {
	return a.authTime
}
func (a *authRequest) GetClientID() string { return a.req.ClientID }
func (a *authRequest) GetCodeChallenge() *oidc.CodeChallenge {
	if a.req.CodeChallenge == "" {
		return nil
	}
	return &oidc.CodeChallenge{Challenge: a.req.CodeChallenge, Method: a.req.CodeChallengeMethod}
}
func (a *authRequest) GetNonce() string                   { return a.req.Nonce }
func (a *authRequest) GetRedirectURI() string             { return a.req.RedirectURI }
func (a *authRequest) GetResponseType() oidc.ResponseType { return a.req.ResponseType }
func (a *authRequest) GetResponseMode() oidc.ResponseMode { return a.req.ResponseMode }
func (a *authRequest) GetScopes() []string                { return a.req.Scopes }
func (a *authRequest) GetState() string                   { return a.req.State }
func (a *authRequest) GetSubject() string                 { return a.subject }
func (a *authRequest) Done() bool                         { return a.done }

// client is a registered client as op sees it.
type client struct {
	Client
	issuer string
}

func (c *client) audience() []string {
	if len(c.Audience) > 0 {
		return c.Audience
	}
	return []string{c.ID}
}

func (c *client) GetID() string                    { return c.ID }
func (c *client) RedirectURIs() []string           { return c.Client.RedirectURIs }
func (c *client) PostLogoutRedirectURIs() []string { return nil }
func (c *client) ApplicationType() op.ApplicationType {
	if c.Secret == "" {
		return op.ApplicationTypeNative
	}
	return op.ApplicationTypeWeb
}
func (c *client) AuthMethod() oidc.AuthMethod {
	if c.Secret == "" {
		return oidc.AuthMethodNone
	}
	return oidc.AuthMethodBasic
}
func (c *client) ResponseTypes() []oidc.ResponseType {
	return []oidc.ResponseType{oidc.ResponseTypeCode}
}
func (c *client) GrantTypes() []oidc.GrantType {
	g := []oidc.GrantType{oidc.GrantTypeCode}
	if c.Secret != "" {
		g = append(g, oidc.GrantTypeClientCredentials)
	}
	return g
}
func (c *client) LoginURL(id string) string {
	return c.issuer + "/login?authRequestID=" + url.QueryEscape(id)
}
func (c *client) AccessTokenType() op.AccessTokenType {
	if c.Opaque {
		return op.AccessTokenTypeBearer
	}
	return op.AccessTokenTypeJWT
}
func (c *client) IDTokenLifetime() time.Duration { return 5 * time.Minute }
func (c *client) DevMode() bool                  { return true }
func (c *client) RestrictAdditionalIdTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) RestrictAdditionalAccessTokenScopes() func([]string) []string {
	return func(s []string) []string { return s }
}
func (c *client) IsScopeAllowed(scope string) bool {
	return c.Scopes == nil || slices.Contains(c.Scopes, scope)
}
func (c *client) IDTokenUserinfoClaimsAssertion() bool { return false }
func (c *client) ClockSkew() time.Duration             { return 0 }

// S256 is the PKCE challenge of a verifier (for tests that do the
// authorization code flow by hand).
func S256(verifier string) string {
	sum := sha256.Sum256([]byte(verifier))
	return base64.RawURLEncoding.EncodeToString(sum[:])
}
