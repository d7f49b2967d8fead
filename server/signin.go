package server

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"sync"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"
)

// SignIn signs people in to the console through the authorization server
// of [auth] (OpenID Connect, authorization code with PKCE S256): go-oidc
// discovers the provider and checks the ID token (signature, issuer,
// audience = the console's client, expiry, and the nonce), x/oauth2 runs
// the flow, and the access token it yields is checked and mapped exactly
// as one presented at /mcp (OAuth.Verify): its audience must be this
// server, and the approver scope makes the approver. Safe for concurrent
// use.
type SignIn struct {
	o                             *OAuth
	clientID, secret, redirectURL string

	mu       sync.Mutex
	provider *oidc.Provider
}

// NewSignIn returns the console's sign-in for the client clientID (secret
// "" for a public client, which PKCE alone protects), whose redirect URI
// at the provider is redirectURL (the console's /ui/signin/callback).
func (o *OAuth) NewSignIn(clientID, secret, redirectURL string) (*SignIn, error) {
	u, err := url.Parse(redirectURL)
	if clientID == "" || err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("console sign-in: needs a client id and an absolute http(s) redirect URL, got %q and %q", clientID, redirectURL)
	}
	return &SignIn{o: o, clientID: clientID, secret: secret, redirectURL: redirectURL}, nil
}

// Name is the provider's host, for the login page's button.
func (s *SignIn) Name() string {
	if u, err := url.Parse(s.o.cfg.Issuer); err == nil {
		return u.Host
	}
	return s.o.cfg.Issuer
}

// RedirectURL is the redirect URI the provider must have registered for
// the console's client.
func (s *SignIn) RedirectURL() string { return s.redirectURL }

func (s *SignIn) ctx(ctx context.Context) context.Context {
	return oidc.ClientContext(context.WithValue(ctx, oauth2.HTTPClient, s.o.client), s.o.client)
}

// config discovers the provider (once it answers) and returns the flow's
// configuration.
func (s *SignIn) config(ctx context.Context) (*oidc.Provider, *oauth2.Config, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.provider == nil {
		p, err := oidc.NewProvider(s.ctx(ctx), s.o.cfg.Issuer)
		if err != nil {
			return nil, nil, fmt.Errorf("the provider's metadata cannot be read: %w", err)
		}
		s.provider = p
	}
	return s.provider, &oauth2.Config{ClientID: s.clientID, ClientSecret: s.secret, RedirectURL: s.redirectURL,
		Endpoint: s.provider.Endpoint(), Scopes: []string{oidc.ScopeOpenID, s.o.cfg.ApproverScope}}, nil
}

// AuthCodeURL is the authorization request: state, nonce, the S256
// challenge of verifier, and resource = this server (RFC 8707).
func (s *SignIn) AuthCodeURL(ctx context.Context, state, nonce, verifier string) (string, error) {
	_, cfg, err := s.config(ctx)
	if err != nil {
		return "", err
	}
	return cfg.AuthCodeURL(state, oidc.Nonce(nonce), oauth2.S256ChallengeOption(verifier), oauth2.SetAuthURLParam("resource", s.o.cfg.Resource)), nil
}

// Exchange redeems code, checks the ID token and its nonce, and maps the
// access token to an identity as /mcp would; the error says why not.
func (s *SignIn) Exchange(ctx context.Context, code, verifier, nonce string) (Identity, error) {
	p, cfg, err := s.config(ctx)
	if err != nil {
		return Identity{}, err
	}
	tok, err := cfg.Exchange(s.ctx(ctx), code, oauth2.VerifierOption(verifier), oauth2.SetAuthURLParam("resource", s.o.cfg.Resource))
	if err != nil {
		return Identity{}, fmt.Errorf("the provider did not redeem the code: %w", err)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return Identity{}, errors.New("the provider sent no ID token")
	}
	idt, err := p.Verifier(&oidc.Config{ClientID: s.clientID, SupportedSigningAlgs: s.o.cfg.Algorithms}).Verify(s.ctx(ctx), raw)
	if err != nil {
		return Identity{}, fmt.Errorf("the ID token is not valid: %w", err)
	}
	if idt.Nonce != nonce {
		return Identity{}, errors.New("the ID token is not of this sign-in (nonce)")
	}
	id, err := s.o.Verify(ctx, tok.AccessToken)
	if err != nil {
		var r *TokenRefusal
		if errors.As(err, &r) && r.Reason == RefusedScope {
			return Identity{}, fmt.Errorf("%s signed in without the approver's scope (%s): ask your identity provider's administrator for it", r.Subject, s.o.cfg.ApproverScope)
		}
		if errors.As(err, &r) {
			return Identity{}, fmt.Errorf("the access token was refused (%s): %s", r.Reason, r.Message)
		}
		return Identity{}, err
	}
	return id, nil
}
