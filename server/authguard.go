package server

import (
	"container/list"
	"log/slog"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Kinds of failed authentication, the kind label of
// idemgate_auth_failures_total and idemgate_auth_paused_total.
const (
	AuthBearer       = "bearer"        // a wrong bearer token on /mcp
	AuthConsoleLogin = "console_login" // a wrong token or login link at the console
)

// Defaults of an AuthGuard.
const (
	// DefaultAuthFailureLimit is how many failed authentications one
	// source may make within AuthFailureWindow before it is paused.
	DefaultAuthFailureLimit = 20
	// AuthFailureWindow is the window failures are counted in, and how
	// long a source is paused once it reaches the limit.
	AuthFailureWindow = time.Minute
	// authLogEvery is how often one source's failures are logged: the
	// first at once, the others in one line per interval with a count of
	// those left out.
	authLogEvery = time.Minute
	// maxAuthSources bounds the sources remembered: one more forgets the
	// one whose last failure is oldest (about 200 bytes each).
	maxAuthSources = 10000
)

// AuthGuard watches failed authentication by source — wrong bearer
// tokens on /mcp and wrong console logins alike, since both guess at the
// same tokens — and:
//   - logs them to the logger (Warn), at most one line per source per
//     minute, each line with the count of failures it stands for;
//   - counts them in Metrics (idemgate_auth_failures_total{kind});
//   - pauses a source that fails Limit times within AuthFailureWindow:
//     for the next AuthFailureWindow every request of it that needs
//     authentication is refused (429 with Retry-After) before its
//     credential is checked, so guessing goes no faster than Limit per
//     two windows. Other sources are not slowed.
//
// A source is the connection's remote address (http.Request.RemoteAddr:
// X-Forwarded-For is not trusted), an IPv6 one by its /64 — what one
// host is usually given. Behind a reverse proxy every client is the
// proxy's address: one client that keeps failing pauses them all, so
// raise or turn off the limit there (Limit 0: failures are logged and
// counted, never paused) and limit at the proxy.
//
// At most maxAuthSources sources are remembered (the least recently
// failing forgotten first), so many sources cannot grow it without
// bound; a source is forgotten as soon as its window and pause are over.
// Safe for concurrent use; a nil *AuthGuard watches nothing.
type AuthGuard struct {
	limit   int
	logger  *slog.Logger
	metrics *Metrics
	now     func() time.Time

	mu      sync.Mutex
	sources map[string]*list.Element // of *authSource
	recent  *list.List               // most recently failing first
}

// authSource is what is remembered of one source.
type authSource struct {
	key         string
	windowStart time.Time
	failures    int       // in the window from windowStart
	pausedUntil time.Time // zero when not paused
	loggedAt    time.Time // the last line logged
	unlogged    int       // failures since that line
	kind        string    // of the last failure
	reason      string    // of the last failure
}

// NewAuthGuard returns a guard pausing a source after limit failures in
// AuthFailureWindow (0: never pausing); logger and metrics may be nil.
func NewAuthGuard(limit int, logger *slog.Logger, metrics *Metrics) *AuthGuard {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &AuthGuard{limit: limit, logger: logger, metrics: metrics, now: time.Now,
		sources: map[string]*list.Element{}, recent: list.New()}
}

// sourceOf is the source of r: its connection's remote IP address, an
// IPv6 one as its /64.
func sourceOf(r *http.Request) string {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	a := ap.Addr().Unmap().WithZone("")
	if a.Is6() {
		p, _ := a.Prefix(64)
		return p.String()
	}
	return a.String()
}

// Paused reports how long r's source stays paused (0: it is not), and
// counts a paused request of kind.
func (g *AuthGuard) Paused(r *http.Request, kind string) time.Duration {
	if g == nil || g.limit <= 0 {
		return 0
	}
	key := sourceOf(r)
	now := g.now()
	g.mu.Lock()
	var left time.Duration
	if e, ok := g.sources[key]; ok {
		left = e.Value.(*authSource).pausedUntil.Sub(now)
	}
	g.mu.Unlock()
	if left <= 0 {
		return 0
	}
	g.metrics.authPaused(kind)
	return left
}

// Failed records a failed authentication of kind from r's source; reason
// says what was wrong, for the log.
func (g *AuthGuard) Failed(r *http.Request, kind, reason string) {
	if g == nil {
		return
	}
	g.metrics.authFailed(kind)
	key := sourceOf(r)
	now := g.now()
	g.mu.Lock()
	s, forgotten := g.sourceLocked(key, now)
	if now.Sub(s.windowStart) >= AuthFailureWindow {
		s.windowStart, s.failures = now, 0
	}
	s.failures++
	s.unlogged++
	s.kind, s.reason = kind, reason
	failures, unlogged := s.failures, s.unlogged
	logNow := s.loggedAt.IsZero() || now.Sub(s.loggedAt) >= authLogEvery
	if logNow {
		s.loggedAt, s.unlogged = now, 0
	}
	pause := g.limit > 0 && failures >= g.limit && !now.Before(s.pausedUntil)
	if pause {
		s.pausedUntil = now.Add(AuthFailureWindow)
	}
	g.mu.Unlock()
	for _, f := range forgotten {
		g.logger.Warn("authentication failed", "kind", f.kind, "source", f.key, "reason", f.reason, "failures", f.unlogged, "forgotten", true)
	}
	if logNow {
		g.logger.Warn("authentication failed", "kind", kind, "source", key, "reason", reason,
			"failures", unlogged, "failures_in_window", failures)
	}
	if pause {
		g.logger.Warn("authentication: source paused", "source", key, "failures_in_window", failures,
			"window", AuthFailureWindow, "pause", AuthFailureWindow)
	}
}

// sourceLocked returns the entry of key, made most recent. Before it
// makes a new one it forgets the least recently failing sources whose
// window, pause and log interval are over, and the least recent one
// beyond maxAuthSources; it returns those forgotten with failures not
// yet logged, for the caller to log. The caller holds g.mu.
func (g *AuthGuard) sourceLocked(key string, now time.Time) (s *authSource, forgotten []*authSource) {
	if e, ok := g.sources[key]; ok {
		g.recent.MoveToFront(e)
		return e.Value.(*authSource), nil
	}
	forget := func(e *list.Element) {
		f := e.Value.(*authSource)
		g.recent.Remove(e)
		delete(g.sources, f.key)
		if f.unlogged > 0 {
			forgotten = append(forgotten, f)
		}
	}
	for back := g.recent.Back(); back != nil; back = g.recent.Back() {
		f := back.Value.(*authSource)
		if now.Sub(f.windowStart) < AuthFailureWindow || now.Before(f.pausedUntil) || now.Sub(f.loggedAt) < authLogEvery {
			break
		}
		forget(back)
	}
	if g.recent.Len() >= maxAuthSources {
		forget(g.recent.Back())
	}
	s = &authSource{key: key, windowStart: now}
	g.sources[key] = g.recent.PushFront(s)
	return s, forgotten
}

// sourcesRemembered is how many sources g remembers.
func (g *AuthGuard) sourcesRemembered() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.sources)
}

// For is g for failures of one kind, as the console takes it
// (console.LoginGuard).
func (g *AuthGuard) For(kind string) KindGuard { return KindGuard{g, kind} }

// KindGuard is an AuthGuard for one kind of failure.
type KindGuard struct {
	g    *AuthGuard
	kind string
}

// Paused is AuthGuard.Paused for the guard's kind.
func (k KindGuard) Paused(r *http.Request) time.Duration { return k.g.Paused(r, k.kind) }

// Failed is AuthGuard.Failed for the guard's kind.
func (k KindGuard) Failed(r *http.Request, reason string) { k.g.Failed(r, k.kind, reason) }

// retryAfter is a pause as the seconds of a Retry-After header, rounded
// up: a client that waits that long is let in.
func retryAfter(d time.Duration) int {
	return int((d + time.Second - 1) / time.Second)
}
