package server

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Origins is the set of browser origins allowed to call the HTTP
// transport. The MCP specification requires a Streamable HTTP server to
// validate the Origin header of every request (DNS rebinding): a request
// without Origin (every non-browser client) passes, a request whose Origin
// is in the set passes, any other is refused with 403.
type Origins struct {
	allowed map[string]bool
}

// DefaultOrigins are the server's own origins for listen address addr:
// http://HOST:PORT, and for a loopback or unspecified host (127.0.0.1,
// ::1, 0.0.0.0, "") also http://localhost:PORT, http://127.0.0.1:PORT and
// http://[::1]:PORT.
func DefaultOrigins(addr string) []string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	var out []string
	if host != "" {
		out = append(out, "http://"+net.JoinHostPort(host, port))
	}
	ip, perr := netip.ParseAddr(host)
	if host == "" || strings.EqualFold(host, "localhost") || (perr == nil && (ip.IsLoopback() || ip.IsUnspecified())) {
		out = append(out, "http://localhost:"+port, "http://127.0.0.1:"+port, "http://[::1]:"+port)
	}
	return out
}

// OriginOf is the origin (scheme://host[:port]) of an absolute http or
// https URL, which may have a path: the origin a browser sends for pages
// under it. Anything else is an error.
func OriginOf(rawURL string) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("%q is not an absolute http(s) URL", rawURL)
	}
	n, ok := normalizeOrigin(u.Scheme + "://" + u.Host)
	if !ok {
		return "", fmt.Errorf("%q has no valid origin", rawURL)
	}
	return n, nil
}

// ParseOrigins builds the allowed set from origins of the form
// scheme://host[:port] (no path, no wildcard). An origin that is not of
// that form is an error naming it.
func ParseOrigins(origins []string) (*Origins, error) {
	o := &Origins{allowed: map[string]bool{}}
	for _, s := range origins {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		n, ok := normalizeOrigin(s)
		if !ok {
			return nil, fmt.Errorf("allowed origin %q: want scheme://host[:port], e.g. https://app.example.com (no path, no wildcard)", s)
		}
		o.allowed[n] = true
	}
	return o, nil
}

// normalizeOrigin lower-cases scheme and host and drops a default port, so
// that equal origins compare equal.
func normalizeOrigin(s string) (string, bool) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" ||
		u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return "", false
	}
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
		port = ""
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	return scheme + "://" + host, true
}

// Allowed reports whether a request with this Origin header may be served:
// true when it is absent or in the set.
func (o *Origins) Allowed(origin string) bool {
	if origin == "" {
		return true
	}
	n, ok := normalizeOrigin(origin)
	return ok && o != nil && o.allowed[n]
}

// checkOrigin refuses, with 403 and a body that says what to do, a request
// whose Origin is not allowed, and — on a loopback connection — one whose
// Host is not a loopback name (a page on a rebound DNS name reaches a local
// server with its own name in Host). It reports whether it refused.
func checkOrigin(w http.ResponseWriter, r *http.Request, origins *Origins) bool {
	if vals := r.Header.Values("Origin"); len(vals) > 1 {
		// No browser sends two; a proxy that reads one may not read the
		// one we would.
		refuse(w, r, http.StatusForbidden, "more than one Origin header: send at most one")
		return true
	}
	if origin := r.Header.Get("Origin"); !origins.Allowed(origin) {
		refuse(w, r, http.StatusForbidden, fmt.Sprintf("Origin %q is not allowed: start the server with --allowed-origins %s to let pages of that origin call it", clipHeader(origin), clipHeader(origin)))
		return true
	}
	if local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && local != nil {
		if isLoopback(local.String()) && !isLoopback(r.Host) && !origins.hostAllowed(r.Host) {
			refuse(w, r, http.StatusForbidden, fmt.Sprintf("Host %q is not allowed on a loopback address (DNS rebinding protection): use localhost or 127.0.0.1, or list the origin in --allowed-origins", clipHeader(r.Host)))
			return true
		}
	}
	return false
}

// hostAllowed reports whether host (a Host header) is the host of an
// allowed origin, so that a reverse proxy on the same machine can forward
// its public name to a loopback listener.
func (o *Origins) hostAllowed(host string) bool {
	if o == nil {
		return false
	}
	host = strings.ToLower(host)
	for origin := range o.allowed {
		_, h, _ := strings.Cut(origin, "://")
		if h == host {
			return true
		}
	}
	return false
}

// isLoopback reports whether addr (host or host:port) names a loopback
// interface.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = strings.Trim(addr, "[]")
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// clipHeader bounds a header value echoed in an error message.
func clipHeader(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}

// refuseForNow is refuse for a refusal that passes: Retry-After tells
// the client to try again after wait (rounded up to whole seconds).
func refuseForNow(w http.ResponseWriter, r *http.Request, status int, wait time.Duration, msg string) {
	w.Header().Set("Retry-After", strconv.Itoa(retryAfter(wait)))
	refuse(w, r, status, msg)
}

// refuse answers a request that will not be served with status and msg,
// and closes the connection without reading the rest of the body: net/http
// would otherwise drain an unread body before answering, and a body that
// never ends would hold the connection (and the answer) forever.
func refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	w.Header().Set("Connection", "close")
	if r.ContentLength != 0 {
		// Anything already buffered is discarded; whatever is still on its
		// way is not waited for.
		_ = http.NewResponseController(w).SetReadDeadline(aLongTimeAgo)
	}
	http.Error(w, msg, status)
}
