package console

import (
	"context"
	"net/http"
	"strings"
	"time"
)

// Signing approvers in through the team's OpenID provider (OpenID
// Connect, authorization code with PKCE), beside the token login. The
// browser keeps the flow's state, nonce and PKCE verifier in a cookie;
// SignIn talks to the provider and maps
// what it vouches for to an Identity (server.ConsoleSignIn does, with the
// same [auth] mapping as the MCP endpoint: the approver scope makes the
// approver).

// SignIn is an OpenID provider the console signs people in through.
type SignIn interface {
	// Name is the provider's name on the login page's button.
	Name() string
	// AuthCodeURL is where the browser is sent to sign in: an
	// authorization request with state, nonce and the S256 challenge of
	// verifier.
	AuthCodeURL(ctx context.Context, state, nonce, verifier string) (string, error)
	// Exchange redeems code with verifier, checks the ID token's nonce and
	// maps the tokens to an identity; an error says why it cannot, in
	// words for the person signing in.
	Exchange(ctx context.Context, code, verifier, nonce string) (Identity, error)
}

// A sign-in under way is kept by the browser alone: its state, nonce and
// PKCE verifier in an HttpOnly cookie for signInTTL, so that no number of
// sign-ins started elsewhere can crowd it out of the server's memory. A
// page of another site cannot set that cookie, so a code it makes the
// browser bring back cannot be redeemed with it (login CSRF).
const (
	signInTTL    = 10 * time.Minute
	signInCookie = "idemgate_console_signin"
)

// signInStart sends the browser to the provider.
func (c *Console) signInStart(w http.ResponseWriter, r *http.Request) {
	if c.paused(w, r) {
		return
	}
	state, nonce, verifier := randomToken(), randomToken(), randomToken()
	u, err := c.cfg.SignIn.AuthCodeURL(r.Context(), state, nonce, verifier)
	if err != nil {
		c.cfg.Logger.Warn("console: sign-in cannot start", "err", err)
		c.render(w, r, http.StatusServiceUnavailable, "login", page{Title: "Log in", Error: "Sign-in with " + c.cfg.SignIn.Name() + " is unavailable now: " + err.Error()})
		return
	}
	// Lax: the provider's redirect back is a cross-site navigation, which
	// a Strict cookie would not come back with.
	http.SetCookie(w, &http.Cookie{Name: signInCookie, Value: state + "." + nonce + "." + verifier, Path: Prefix + "/signin", HttpOnly: true,
		SameSite: http.SameSiteLaxMode, Secure: c.cfg.Secure || r.TLS != nil, MaxAge: int(signInTTL / time.Second)})
	http.Redirect(w, r, u, http.StatusSeeOther)
}

// signInCallback finishes a sign-in: the state must be the one this
// browser started, the code is redeemed, and an approver gets a session.
func (c *Console) signInCallback(w http.ResponseWriter, r *http.Request) {
	if c.paused(w, r) {
		return
	}
	q := r.URL.Query()
	http.SetCookie(w, &http.Cookie{Name: signInCookie, Value: "", Path: Prefix + "/signin", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteLaxMode, Secure: c.cfg.Secure || r.TLS != nil})
	fail := func(status int, reason, msg string) {
		c.loginFailed(r, "sign-in: "+reason)
		c.render(w, r, status, "login", page{Title: "Log in", Error: msg})
	}
	if e := q.Get("error"); e != "" {
		fail(http.StatusUnauthorized, "the provider refused: "+clip(e), c.cfg.SignIn.Name()+" did not sign you in ("+clip(e)+" "+clip(q.Get("error_description"))+"). Nothing was changed.")
		return
	}
	state := q.Get("state")
	ck, err := r.Cookie(signInCookie)
	var flow []string
	if err == nil && len(ck.Value) <= 200 {
		flow = strings.Split(ck.Value, ".")
	}
	if state == "" || len(flow) != 3 || flow[0] != state {
		fail(http.StatusBadRequest, "state missing or not this browser's", "This sign-in was not started in this browser (or it took over 10 minutes): sign in again.")
		return
	}
	nonce, verifier := flow[1], flow[2]
	code := q.Get("code")
	if code == "" || len(code) > 4096 {
		fail(http.StatusBadRequest, "no code", "The provider sent no authorization code back: sign in again.")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
	defer cancel()
	id, err := c.cfg.SignIn.Exchange(ctx, code, verifier, nonce)
	if err != nil {
		c.cfg.Logger.Warn("console: sign-in refused", "err", err)
		fail(http.StatusForbidden, err.Error(), "Sign-in with "+c.cfg.SignIn.Name()+" was refused: "+err.Error())
		return
	}
	if id.Role != RoleApprover {
		c.cfg.Logger.Warn("console: sign-in refused: not an approver", "principal", id.Principal, "tenant", id.Tenant, "role", id.Role)
		c.errorPage(w, r, nil, http.StatusForbidden, "The console is for approvers: "+id.Principal+" signed in without the approver's scope (an agent's identity). Ask your identity provider's administrator for it.")
		return
	}
	c.startSession(w, r, id, "")
	c.cfg.Logger.Info("console: sign-in", "principal", id.Principal, "tenant", id.Tenant, "provider", c.cfg.SignIn.Name())
	// The session cookie is SameSite=Strict, and this page was reached
	// from the provider's site: a redirect would arrive without it. The
	// page moves on by itself, from this site.
	c.render(w, r, http.StatusOK, "signedin", page{Title: "Signed in", Who: &id})
}

// loginData is p for the login page, with the sign-in button when one is
// configured.
func (c *Console) loginData(p page) page {
	if c.cfg.SignIn != nil {
		p.SignIn = c.cfg.SignIn.Name()
	}
	return p
}
