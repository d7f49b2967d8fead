// Package console is the web console for the people around the agents
// (DESIGN §10): approvers log in with their bearer token, see their
// tenant's pending approvals with the exact change, and approve or reject
// them with a comment; they list and settle operations, requeue dead
// letters (audited), and read the Overview — the numbers of `idemgate
// stats` over time and the audit chain's status. It is server-rendered (html/template, embed), loads
// nothing from elsewhere, and decides only through the service's typed
// approvals API (tools.Service.Decide), the same path as decide_approval
// over MCP and `idemgate approvals approve`.
//
// Guarantees:
//   - every page but the login page needs a session; a session is made
//     only from a valid token of the tokens file, a one-time login link,
//     or a sign-in through Config.SignIn's OpenID provider (whose state
//     must be the one this browser started, its code redeemed with this
//     browser's PKCE verifier, its ID token bearing this browser's nonce)
//     and carried by an HttpOnly, SameSite=Strict cookie (Secure over TLS,
//     or when Config.PublicURL is https);
//     it ends at logout, after its lifetime, or as soon as its token is
//     removed from the tokens file;
//   - a failed login (a wrong token, a used or expired login link) is told
//     to Config.Guard, and a source it has paused gets 429 with
//     Retry-After before its login is checked (a login link is then not
//     spent);
//   - only the approver role sees anything: other roles get 403;
//   - every read and decision is bound to the session's tenant;
//   - every state-changing request (POST) from another origin is refused
//     with 403 (net/http.CrossOriginProtection) before it is read;
//   - with Config.CheckHost, a request reaching a loopback listener with a
//     Host that is not a loopback name (nor Config.PublicURL's host) is
//     refused (DNS rebinding).
package console

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"idemgate/ledger"
	"idemgate/tools"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Prefix is where the console is served.
const Prefix = "/ui"

// CookieName is the session cookie's name.
const CookieName = "idemgate_console"

// DefaultSessionTTL is how long a console session lasts.
const DefaultSessionTTL = 8 * time.Hour

// RoleApprover is the only role the console serves.
const RoleApprover = "approver"

// Identity is who a token or a session acts for.
type Identity struct {
	Principal string
	Tenant    string
	Role      string
}

// Config configures Handler.
type Config struct {
	// Service decides approvals (required).
	Service *tools.Service
	// Store is the ledger the service uses, read for the history view and
	// a suspected duplicate's earlier operation (required).
	Store ledger.Store
	// Lookup returns the identity of a bearer token, false for an unknown
	// one; nil: only one-time login links log in.
	Lookup func(token string) (Identity, bool)
	// SignIn, when set, offers sign-in through an OpenID provider beside
	// the token (the authorization code flow with PKCE; see SignIn).
	SignIn SignIn
	// SessionTTL is a session's lifetime (DefaultSessionTTL when zero).
	SessionTTL time.Duration
	// Secure marks the cookie Secure (set it when served over TLS; a
	// request that arrived over TLS gets it anyway).
	Secure bool
	// PublicURL is the console's address as people open it (--public-url,
	// approvals.CheckPublicURL), "" when not configured. When it is
	// https the cookie is Secure even on requests that arrive over plain
	// HTTP (TLS ends at a proxy in front), and its host passes CheckHost.
	PublicURL string
	// CheckHost refuses requests whose Host is not a loopback name (nor
	// PublicURL's host) when they arrive on a loopback address (the
	// standalone console; under serve --http the transport checks it
	// already).
	CheckHost bool
	// Guard, when set, is told of every failed login (a wrong token, a
	// used or expired login link) and pauses their source: its logins are
	// refused (429) before they are checked. nil: nothing is watched.
	Guard LoginGuard
	// AfterDecide, when set, runs after each decision (the standalone
	// console delivers the messages an approved operation queued).
	AfterDecide func(ctx context.Context)
	// TraceURL, when set, links each audit entry of an operation's
	// history that names a trace to the team's trace viewer: the URL with
	// {trace_id} and {span_id} replaced by the entry's (hex).
	TraceURL string
	Logger   *slog.Logger
	// Now is the clock (time.Now when nil); tests move it.
	Now func() time.Time
}

// LoginGuard logs, counts and slows failed logins by source
// (server.AuthGuard.For(server.AuthConsoleLogin)).
type LoginGuard interface {
	// Paused is how long r's source must wait before its logins are
	// checked again; 0 when they are checked now.
	Paused(r *http.Request) time.Duration
	// Failed records a failed login from r's source; reason says what was
	// wrong.
	Failed(r *http.Request, reason string)
}

// Console is the console's handler and its sessions. Safe for concurrent
// use.
type Console struct {
	cfg   Config
	pages map[string]*template.Template
	mux   *http.ServeMux
	h     http.Handler

	mu       sync.Mutex
	sessions map[string]*session // by sha256 of the cookie value
	once     map[string]onceLink // by sha256 of the code

	overview overviewState
	// publicHost is PublicURL's host[:port], "" without one.
	publicHost string
	// deadScan bounds the messages the dead-letter list reads (deadScan;
	// tests lower it).
	deadScan int
}

type session struct {
	id      Identity
	token   string // re-checked on every request; "" for a one-time link
	expires time.Time
}

type onceLink struct {
	id      Identity
	expires time.Time
}

// New returns the console for cfg; mount it at Prefix (it answers only
// paths under it).
func New(cfg Config) *Console {
	if cfg.Service == nil || cfg.Store == nil {
		panic("console.New: Config.Service and Config.Store are required")
	}
	if cfg.SessionTTL <= 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	var publicHost string
	if cfg.PublicURL != "" {
		u, err := url.Parse(cfg.PublicURL)
		if err != nil || u.Host == "" {
			panic("console.New: Config.PublicURL is not an absolute URL: " + cfg.PublicURL)
		}
		cfg.Secure = cfg.Secure || strings.EqualFold(u.Scheme, "https")
		publicHost = u.Host
	}
	c := &Console{cfg: cfg, mux: http.NewServeMux(), sessions: map[string]*session{}, once: map[string]onceLink{}, publicHost: publicHost, deadScan: deadScan}
	c.pages = parsePages()
	static, _ := fs.Sub(staticFS, "static")
	c.mux.Handle("GET "+Prefix+"/static/", http.StripPrefix(Prefix+"/static/", cacheStatic(http.FileServerFS(static))))
	c.mux.HandleFunc("GET "+Prefix+"/login", c.loginPage)
	c.mux.HandleFunc("POST "+Prefix+"/login", c.login)
	c.mux.HandleFunc("POST "+Prefix+"/logout", c.logout)
	if cfg.SignIn != nil {
		c.mux.HandleFunc("GET "+Prefix+"/signin", c.signInStart)
		c.mux.HandleFunc("GET "+Prefix+"/signin/callback", c.signInCallback)
	}
	c.mux.HandleFunc("GET "+Prefix+"/{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Prefix+"/approvals", http.StatusSeeOther)
	})
	c.mux.HandleFunc("GET "+Prefix, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Prefix+"/approvals", http.StatusSeeOther)
	})
	c.mux.Handle("GET "+Prefix+"/approvals", c.approver(c.approvalsPage))
	c.mux.Handle("GET "+Prefix+"/approvals/{id}", c.approver(c.approvalPage))
	c.mux.Handle("POST "+Prefix+"/approvals/{id}/decide", c.approver(c.decide))
	c.mux.Handle("GET "+Prefix+"/history", c.approver(c.historyPage))
	c.mux.Handle("GET "+Prefix+"/operations", c.approver(c.operationsPage))
	c.mux.Handle("GET "+Prefix+"/operations/{key}", c.approver(c.operationPage))
	c.mux.Handle("POST "+Prefix+"/operations/{key}/settle", c.approver(c.settle))
	c.mux.Handle("GET "+Prefix+"/attention", c.approver(c.attentionPage))
	c.mux.Handle("POST "+Prefix+"/messages/{id}/requeue", c.approver(c.requeue))
	c.mux.Handle("GET "+Prefix+"/overview", c.approver(c.overviewPage))
	c.mux.Handle("POST "+Prefix+"/overview/verify", c.approver(c.verify))
	c.mux.HandleFunc(Prefix+"/", func(w http.ResponseWriter, r *http.Request) {
		c.errorPage(w, r, nil, http.StatusNotFound, "There is no such page in the console.")
	})
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.cfg.Logger.Warn("console: cross-origin request refused", "method", r.Method, "path", r.URL.Path, "origin", r.Header.Get("Origin"), "sec_fetch_site", r.Header.Get("Sec-Fetch-Site"))
		c.errorPage(w, r, nil, http.StatusForbidden, "This request came from another site and was refused: decisions can only be made from the console's own pages.")
	}))
	c.h = cop.Handler(c.mux)
	return c
}

// ServeHTTP implements http.Handler.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if c.cfg.CheckHost && !c.hostOK(r) {
		http.Error(w, "Host "+clip(r.Host)+" is not allowed on a loopback address (DNS rebinding protection): open the console at localhost or 127.0.0.1", http.StatusForbidden)
		return
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin") // no-referrer would make a browser send "Origin: null" on our own form posts
	h.Set("X-Frame-Options", "DENY")
	c.h.ServeHTTP(w, r)
}

// LoginLink returns a path (under Prefix) that logs in as id once: the
// first request that opens it gets a session, later ones the login page.
// It is valid for ttl.
func (c *Console) LoginLink(id Identity, ttl time.Duration) string {
	code := randomToken()
	c.mu.Lock()
	c.once[hash(code)] = onceLink{id: id, expires: c.cfg.Now().Add(ttl)}
	c.mu.Unlock()
	return Prefix + "/login?once=" + code
}

// hostOK reports whether r may be served: not on a loopback listener, or
// with a loopback Host, or with the public URL's host (a proxy in front
// that passes the Host people used).
func (c *Console) hostOK(r *http.Request) bool {
	local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if !ok || local == nil || !isLoopback(local.String()) {
		return true
	}
	return isLoopback(r.Host) || (c.publicHost != "" && strings.EqualFold(r.Host, c.publicHost))
}

// isLoopback reports whether hostport names a loopback host.
func isLoopback(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func clip(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}

func cacheStatic(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}

func randomToken() string {
	b := make([]byte, 32)
	rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

func hash(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// ---------------------------------------------------------------------------
// Sessions

type identityKey struct{}

// current returns the session of r, or false when it has none, it ended
// or its token was removed.
func (c *Console) current(r *http.Request) (Identity, bool) {
	ck, err := r.Cookie(CookieName)
	if err != nil || ck.Value == "" || len(ck.Value) > 200 {
		return Identity{}, false
	}
	k := hash(ck.Value)
	now := c.cfg.Now()
	c.mu.Lock()
	s, ok := c.sessions[k]
	if ok && !now.Before(s.expires) {
		delete(c.sessions, k)
		ok = false
	}
	c.mu.Unlock()
	if !ok {
		return Identity{}, false
	}
	if s.token != "" {
		id, found := Identity{}, false
		if c.cfg.Lookup != nil {
			id, found = c.cfg.Lookup(s.token)
		}
		if !found || id != s.id {
			c.mu.Lock()
			delete(c.sessions, k)
			c.mu.Unlock()
			return Identity{}, false
		}
	}
	return s.id, true
}

// startSession makes a session for id and sets its cookie.
func (c *Console) startSession(w http.ResponseWriter, r *http.Request, id Identity, token string) {
	value := randomToken()
	now := c.cfg.Now()
	c.mu.Lock()
	for k, s := range c.sessions { // drop ended sessions as new ones start
		if !now.Before(s.expires) {
			delete(c.sessions, k)
		}
	}
	c.sessions[hash(value)] = &session{id: id, token: token, expires: now.Add(c.cfg.SessionTTL)}
	c.mu.Unlock()
	http.SetCookie(w, &http.Cookie{
		Name: CookieName, Value: value, Path: Prefix, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: c.cfg.Secure || r.TLS != nil,
		MaxAge: int(c.cfg.SessionTTL / time.Second),
	})
}

// approver lets through requests of a live session of an approver; no
// session: to the login page; another role: 403.
func (c *Console) approver(next func(http.ResponseWriter, *http.Request, Identity)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := c.current(r)
		if !ok {
			if r.Method == http.MethodGet {
				http.Redirect(w, r, Prefix+"/login?expired=1", http.StatusSeeOther)
				return
			}
			c.errorPage(w, r, nil, http.StatusUnauthorized, "Your session has ended; log in again. Nothing was changed.")
			return
		}
		if id.Role != RoleApprover {
			c.errorPage(w, r, &id, http.StatusForbidden, "The console is for approvers: this token has the role "+id.Role+". Ask for a token of role approver (idemgate tokens add --role approver).")
			return
		}
		next(w, r, id)
	})
}

// paused answers 429 with the login page when r's source is paused
// (Config.Guard), and reports whether it did.
func (c *Console) paused(w http.ResponseWriter, r *http.Request) bool {
	if c.cfg.Guard == nil {
		return false
	}
	wait := c.cfg.Guard.Paused(r)
	if wait <= 0 {
		return false
	}
	secs := int((wait + time.Second - 1) / time.Second)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	c.render(w, r, http.StatusTooManyRequests, "login", page{Title: "Log in",
		Error: fmt.Sprintf("Too many failed logins from your address: try again in %d s. Nothing was checked.", secs)})
	return true
}

// loginFailed tells Config.Guard of a failed login.
func (c *Console) loginFailed(r *http.Request, reason string) {
	if c.cfg.Guard != nil {
		c.cfg.Guard.Failed(r, reason)
	}
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if code := r.URL.Query().Get("once"); code != "" {
		if c.paused(w, r) {
			return // the link is not spent
		}
		k := hash(code)
		c.mu.Lock()
		link, ok := c.once[k]
		delete(c.once, k)
		c.mu.Unlock()
		if ok && c.cfg.Now().Before(link.expires) {
			c.startSession(w, r, link.id, "")
			http.Redirect(w, r, Prefix+"/approvals", http.StatusSeeOther)
			return
		}
		c.loginFailed(r, "login link used, expired or unknown")
		c.render(w, r, http.StatusUnauthorized, "login", page{Title: "Log in", Error: "This login link was already used or has expired: log in with a token."})
		return
	}
	p := page{Title: "Log in"}
	if r.URL.Query().Get("expired") != "" {
		p.Notice = "Log in to continue (no session, or it has ended)."
	}
	c.render(w, r, http.StatusOK, "login", p)
}

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if c.paused(w, r) {
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	token := strings.TrimSpace(r.PostFormValue("token"))
	var id Identity
	found := false
	if token != "" && len(token) <= 512 && c.cfg.Lookup != nil {
		id, found = c.cfg.Lookup(token)
	}
	if !found {
		c.loginFailed(r, "unknown token")
		c.render(w, r, http.StatusUnauthorized, "login", page{Title: "Log in", Error: "That token is not valid. Use a token made with: idemgate tokens add --role approver."})
		return
	}
	if id.Role != RoleApprover {
		c.errorPage(w, r, nil, http.StatusForbidden, "The console is for approvers: this token has the role "+id.Role+". Ask for a token of role approver (idemgate tokens add --role approver).")
		return
	}
	c.startSession(w, r, id, token)
	c.cfg.Logger.Info("console: login", "principal", id.Principal, "tenant", id.Tenant)
	http.Redirect(w, r, Prefix+"/approvals", http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(CookieName); err == nil {
		c.mu.Lock()
		delete(c.sessions, hash(ck.Value))
		c.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: CookieName, Value: "", Path: Prefix, MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: c.cfg.Secure || r.TLS != nil})
	c.render(w, r, http.StatusOK, "login", page{Title: "Log in", Notice: "You are logged out."})
}
