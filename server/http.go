package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// HTTPConfig configures the Streamable HTTP transport.
type HTTPConfig struct {
	Addr   string  // listen address, e.g. 127.0.0.1:8080
	Tokens *Tokens // bearer tokens → identities
	// OAuth, when set, also accepts the access tokens of an OAuth
	// authorization server and serves the Protected Resource Metadata
	// (MetadataPaths) that names it.
	OAuth *OAuth
	// Guard logs, counts and slows failed bearer tokens by source; nil:
	// NewAuthGuard(DefaultAuthFailureLimit, Logger, Metrics). Give the
	// console the same one (Guard.For(AuthConsoleLogin)), so that
	// guesses at both count together.
	Guard   *AuthGuard
	Metrics *Metrics // served at /metrics; nil: no /metrics
	Logger  *slog.Logger
	// Ready reports whether the server can serve (the ledger opens); it
	// backs /healthz.
	Ready func(ctx context.Context) error
	// Origins are the browser origins allowed to call the server; nil:
	// DefaultOrigins(Addr).
	Origins *Origins
	// Sessions keeps the sessions of protocol eras that have them, in the
	// ledger; required (NewHTTPHandler panics without it).
	Sessions *Sessions
	// BodyTimeout bounds the time to receive one request body
	// (DefaultBodyTimeout when zero).
	BodyTimeout time.Duration
	// Health, when set, backs /healthz instead of Ready: ok false answers
	// 503. /healthz needs no token, so its JSON body is public, which
	// names nothing of the deployment, unless the request carries an
	// operator's token (see isOperator): then it is details, which the log
	// gets too.
	Health func(ctx context.Context) (ok bool, details, public any)
	// UI, when set, is the web console, served at /ui and below (behind
	// the same Origin and Host checks; it authenticates by itself).
	UI http.Handler
	// Screen, when set, refuses a tool call's wide arguments before they
	// are decoded (screenArguments): set it to the tool service's Screen.
	Screen Screener
}

// DefaultBodyTimeout is how long a client may take to send one request
// body.
const DefaultBodyTimeout = 30 * time.Second

// maxBody bounds one HTTP request body, like MaxMessageBytes on stdio.
const maxBody = MaxMessageBytes

// aLongTimeAgo is a read deadline that has passed: reads fail at once.
var aLongTimeAgo = time.Unix(1, 0)

// HTTPHandler is the HTTP transport's handler: /mcp (Streamable HTTP,
// bearer token required), /healthz and /metrics, behind the Origin check.
type HTTPHandler struct {
	mux     *http.ServeMux
	origins *Origins
	streams *streamSet
}

// NewHTTPHandler returns the HTTP handler: /mcp (Streamable HTTP, bearer
// token required: 401 with WWW-Authenticate otherwise, 429 with
// Retry-After while cfg.Guard pauses the request's source), /healthz and
// /metrics. Every request is refused with 403 when its Origin is present
// and not allowed (cfg.Origins), or, on a loopback connection, when its
// Host is not a loopback name.
func NewHTTPHandler(s *mcpserver.MCPServer, cfg HTTPConfig) *HTTPHandler {
	if cfg.Sessions == nil {
		panic("server.NewHTTPHandler: HTTPConfig.Sessions is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Origins == nil {
		cfg.Origins, _ = ParseOrigins(DefaultOrigins(cfg.Addr))
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	h := &HTTPHandler{mux: http.NewServeMux(), origins: cfg.Origins, streams: newStreamSet()}
	awaitListenAcks(s)
	mcpHandler := mcpserver.NewStreamableHTTPServer(s,
		mcpserver.WithEndpointPath("/mcp"),
		mcpserver.WithStreamableHTTPLogger(cfg.Logger),
		mcpserver.WithSessionIdManagerResolver(sessionIDs{cfg.Sessions}),
		// checkOrigin guards Host on loopback itself, for every path, and
		// also admits the hosts of allowed origins (a local reverse proxy).
		mcpserver.WithDisableLocalhostProtection(true),
		// The identity and the session's client were put on the request's
		// context by requireToken and the session gate.
		mcpserver.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
			ctx = withHTTPSlot(ctx, r.Header) // for the request's span, when traced
			if id, ok := r.Context().Value(identityKey{}).(Identity); ok {
				ctx = WithIdentity(ctx, id)
			}
			if name, version, ok := sessionClientOf(r.Context()); ok {
				ctx = withSessionClient(ctx, name, version)
			}
			return ctx
		}),
	)
	sessions := cfg.Sessions
	sessions.free = func(id string) {
		h.streams.closeSession(id)
		// mcp-go releases a session's memory on DELETE; ours is marked
		// local, so it ends nothing in the ledger.
		ctx := context.WithValue(context.Background(), sessionStateKey{}, &sessionState{local: true})
		req, err := http.NewRequestWithContext(ctx, http.MethodDelete, "/mcp", nil)
		if err != nil {
			return
		}
		req.Header.Set(mcpserver.HeaderKeySessionID, id)
		mcpHandler.ServeHTTP(discardResponse{h: http.Header{}}, req)
	}
	cfg.Metrics.watchSessionMemory(sessions.Local)
	var mcpH http.Handler = mcpHandler
	mcpH = &sessionGate{sessions: sessions, bodyTimeout: cfg.BodyTimeout, streams: h.streams, logger: cfg.Logger, screen: cfg.Screen, metrics: cfg.Metrics, next: mcpH}
	if cfg.Guard == nil {
		cfg.Guard = NewAuthGuard(DefaultAuthFailureLimit, cfg.Logger, cfg.Metrics)
	}
	h.mux.Handle("/mcp", allowMCPMethods(requireToken(cfg.Tokens, cfg.OAuth, cfg.Guard, cfg.Metrics, cfg.Logger, mcpH)))
	if cfg.OAuth != nil {
		for _, p := range cfg.OAuth.Config().MetadataPaths() {
			h.mux.Handle("GET "+p, cfg.OAuth.metadataHandler())
		}
	}
	h.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		if cfg.Health != nil {
			ok, details, public := cfg.Health(ctx)
			body := public
			if isOperator(cfg.Tokens, cfg.OAuth, cfg.Guard, r) {
				body = details
			}
			// The body is this moment's and depends on the token.
			w.Header().Set("Cache-Control", "no-store")
			if !ok {
				cfg.Logger.Warn("health check", "details", details)
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			json.NewEncoder(w).Encode(body)
			return
		}
		if cfg.Ready != nil {
			if err := cfg.Ready(ctx); err != nil {
				cfg.Logger.Warn("health check", "err", err)
				w.WriteHeader(http.StatusServiceUnavailable)
				json.NewEncoder(w).Encode(map[string]string{"status": "unavailable", "error": err.Error()})
				return
			}
		}
		json.NewEncoder(w).Encode(map[string]string{"status": "ok"})
	})
	if cfg.Metrics != nil {
		h.mux.Handle("GET /metrics", cfg.Metrics.Handler())
	}
	if cfg.UI != nil {
		h.mux.Handle("/ui", cfg.UI)
		h.mux.Handle("/ui/", cfg.UI)
	}
	return h
}

// isOperator reports whether r carries the valid bearer token of an
// approver, the role of the people who run the server (an agent's token
// is a model's): one of the tokens file or, with [auth], an access token
// with the approver's scope. An absent or invalid token is no error
// here: it is simply not an operator's. An access token is checked only
// while guard lets r's source authenticate, and one that fails as forged
// counts against the source there, as at /mcp.
func isOperator(tokens *Tokens, oauth *OAuth, guard *AuthGuard, r *http.Request) bool {
	token, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok || token == "" {
		return false
	}
	if tokens != nil && len(token) <= 512 {
		if id, found, _ := tokens.Lookup(token); found {
			return id.Role == "approver"
		}
	}
	if oauth == nil || guard.Paused(r, AuthBearer) > 0 {
		return false
	}
	id, err := oauth.Verify(r.Context(), token)
	var ref *TokenRefusal
	if errors.As(err, &ref) && ref.forged() {
		guard.Failed(r, AuthBearer, "access token refused at /healthz: "+ref.Reason)
	}
	return err == nil && id.Role == "approver"
}

// ServeHTTP implements http.Handler.
func (h *HTTPHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if checkOrigin(w, r, h.origins) {
		return
	}
	if r.URL.Path != "/mcp" {
		// Requests off /mcp (health checks, metrics, the console) do not
		// keep their connection: a kept-alive connection holds its slot
		// of the HTTP capacity (conns.go) until it is closed.
		w.Header().Set("Connection", "close")
	}
	h.mux.ServeHTTP(w, r)
}

// closeStreams ends every GET event stream: they carry no call in flight,
// and a graceful shutdown would otherwise wait for them for its whole
// grace.
func (h *HTTPHandler) closeStreams() { h.streams.closeAll() }

// allowMCPMethods answers a method /mcp does not serve 405 with an Allow
// header listing the ones it does (RFC 9110, 15.5.6): GET, POST and
// DELETE (Streamable HTTP: an event stream, a message, the end of a
// session), or POST alone for a request of protocol 2026-07-28, which
// has no sessions and no GET stream (mcp-go answers those two 405 with
// Allow: POST itself). It runs before the token is checked: which
// methods an endpoint serves is no secret, and a client that sends
// OPTIONS or PUT learns what to send instead of a 404, which an MCP
// client takes for an ended session. HEAD is refused too: GET on /mcp
// opens an event stream, which has no headers to describe ahead of it.
func allowMCPMethods(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodGet, http.MethodPost, http.MethodDelete:
			next.ServeHTTP(w, r)
			return
		}
		allow := "GET, POST, DELETE"
		if mcp.IsModernProtocol(r.Header.Get(mcp.HeaderProtocolVersion)) {
			allow = "POST"
		}
		w.Header().Set("Allow", allow)
		refuse(w, r, http.StatusMethodNotAllowed, "method "+clipHeader(r.Method)+" is not served on /mcp; it serves "+allow+" (MCP Streamable HTTP)")
	})
}

type tokenHashKey struct{}

// requireToken lets through only requests with a valid bearer token,
// carrying its identity; others get 401 with WWW-Authenticate (RFC 6750),
// decided on the headers alone: the body of a refused request is never
// read, and its connection is closed. A wrong credential is a failure
// for guard (a request without one is not: clients ask without a token
// to learn how to authenticate), and a source guard has paused gets 429
// with Retry-After before its token is checked.
//
// With oauth (nil: static tokens only), a token not in the tokens file is
// checked as an OAuth access token: the challenge names the Protected
// Resource Metadata, and each refusal says why (TokenRefusal), is logged
// on its own line and counted by reason; only those that may be guesses
// (malformed, bad signature, unknown issuer, inactive) count for guard.
func requireToken(tokens *Tokens, oauth *OAuth, guard *AuthGuard, metrics *Metrics, logger *slog.Logger, next http.Handler) http.Handler {
	challenge := `Bearer realm="idemgate"`
	if oauth != nil {
		challenge = oauth.challenge(nil)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if wait := guard.Paused(r, AuthBearer); wait > 0 {
			refuseForNow(w, r, http.StatusTooManyRequests, wait, fmt.Sprintf("too many failed authentications from this address: try again in %d s", retryAfter(wait)))
			return
		}
		header := r.Header.Get("Authorization")
		token, ok := bearerToken(header)
		limit := 512
		if oauth != nil {
			limit = maxOAuthToken
		}
		if !ok || token == "" || len(token) > limit {
			if header != "" {
				guard.Failed(r, AuthBearer, fmt.Sprintf("not a usable bearer token (another scheme, empty or over %d bytes)", limit))
			}
			w.Header().Set("WWW-Authenticate", challenge)
			how := "see idemgate tokens add"
			if oauth != nil {
				how = "a token of idemgate tokens add, or an OAuth access token of " + oauth.cfg.Issuer + " for " + oauth.cfg.Resource + "; the authorization server is named at " + oauth.cfg.MetadataURL()
			}
			refuse(w, r, http.StatusUnauthorized, "a bearer token is required (Authorization: Bearer <token>; "+how+")")
			return
		}
		var (
			id        Identity
			found     bool
			err       error
			tokenHash string
		)
		if tokens != nil && len(token) <= 512 {
			id, found, err = tokens.Lookup(token)
			if err != nil {
				logger.Warn("tokens file", "err", err)
			}
			sum := sha256.Sum256([]byte(token))
			tokenHash = hex.EncodeToString(sum[:])
		}
		if !found && oauth != nil {
			var vErr error
			id, vErr = oauth.Verify(r.Context(), token)
			var ref *TokenRefusal
			if errors.As(vErr, &ref) {
				metrics.oauthRefused(ref.Reason)
				logRefusal(logger, r, ref)
				if ref.forged() {
					guard.Failed(r, AuthBearer, "access token refused: "+ref.Reason)
				}
				w.Header().Set("WWW-Authenticate", oauth.challenge(ref))
				refuse(w, r, ref.Status, ref.Message)
				return
			}
			found, tokenHash = true, identityHash(id)
		}
		if !found {
			guard.Failed(r, AuthBearer, "unknown token")
			w.Header().Set("WWW-Authenticate", `Bearer realm="idemgate", error="invalid_token"`)
			refuse(w, r, http.StatusUnauthorized, "the bearer token is not valid")
			return
		}
		ctx := context.WithValue(WithIdentity(r.Context(), id), tokenHashKey{}, tokenHash)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// bearerToken is the token of an Authorization header of the Bearer
// scheme; ok is false for an absent header or another scheme. The
// scheme's name is case-insensitive (RFC 7235 §2.1): "bearer" and
// "BEARER" are Bearer.
func bearerToken(header string) (token string, ok bool) {
	scheme, rest, _ := strings.Cut(header, " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(rest), true
}

// sessionGate reads a POST body (bounded in size and time, and a large
// one by the message budget), refuses what is not one JSON-RPC request,
// notification or response mcp-go can read (examine: 400 with a JSON-RPC
// error, whatever the session), screens a tool call's wide arguments,
// answers a tool call on its own stream (postStream), and enforces
// sessions for the protocol eras that have them (before 2026-07-28):
// initialize creates one in the ledger; any other request needs
// Mcp-Session-Id (400 without) naming a live session of the same token
// (404 otherwise). Requests of the stateless era pass without sessions.
type sessionGate struct {
	sessions    *Sessions
	bodyTimeout time.Duration
	streams     *streamSet
	logger      *slog.Logger
	screen      Screener
	metrics     *Metrics      // counts the 503s of the message budget; nil counts nothing
	budget      messageBudget // of the bodies of POSTs being served
	next        http.Handler
}

// gateEnvelope is what the gate reads of a JSON-RPC message.
type gateEnvelope struct {
	Method string `json:"method"`
	Params struct {
		Meta       metaVersion     `json:"_meta"`
		ClientInfo *gateClientInfo `json:"clientInfo"`
	} `json:"params"`
}

// gateClientInfo is an initialize request's clientInfo.
type gateClientInfo struct {
	Name    string `json:"name"`
	Version string `json:"version"`
}

// metaVersion is the protocol version a request's _meta names, read as
// mcp.Meta reads it (ProtocolVersion): "" when the member is absent or
// not a string, and an error when _meta is neither an object nor null.
// Unlike mcp.Meta it does not decode the other members' values.
type metaVersion string

func (v *metaVersion) UnmarshalJSON(b []byte) error {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return err
	}
	var s string
	if raw, ok := m[mcp.MetaKeyProtocolVersion]; ok && json.Unmarshal(raw, &s) == nil {
		*v = metaVersion(s)
	}
	return nil
}

func (g *sessionGate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	modern := mcp.IsModernProtocol(r.Header.Get(mcp.HeaderProtocolVersion))
	var env gateEnvelope
	if r.Method == http.MethodPost {
		body, taken, ok := g.readBody(w, r)
		if !ok {
			return
		}
		defer func() { g.budget.give(taken) }()
		// Strictly, before anything decodes it: a duplicate or case-variant
		// member must not mean one thing here and another to mcp-go, and
		// a message that is not a request mcp-go can read is answered
		// here, as on stdio, whatever its session. The walk also reads
		// what the gate needs: the message is not decoded again here.
		e := examine(body)
		if e.refused != nil {
			writeEnvelopeError(w, http.StatusBadRequest, e.refused)
			return
		}
		if e.serve == serveParseError {
			// Answered in the words of stdio, not of mcp-go's handler.
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			json.NewEncoder(w).Encode(parseError)
			return
		}
		if msg, sc := screenArguments(body, e, g.screen); sc != nil {
			// mcp-go reads the call without its arguments: the large
			// body is no longer held.
			setBody(r, msg)
			r = r.WithContext(withScreened(r.Context(), sc))
			g.budget.give(taken)
			taken = 0
		}
		env = e.gate
		modern = modern || mcp.IsModernProtocol(string(env.Params.Meta))
		switch env.Method {
		case string(mcp.MethodNotificationCancelled):
			if modern {
				// 2026-07-28 over HTTP cancels a request by closing its
				// stream and expects no notifications/cancelled; without
				// sessions mcp-go would apply one to the request of that
				// id of any client in flight.
				w.WriteHeader(http.StatusAccepted)
				return
			}
		case string(mcp.MethodToolsCall):
			ps, rs := newPostStream(w, r)
			defer ps.finish()
			w, r = ps, rs
		}
	}
	if modern {
		// 2026-07-28 has no sessions; mcp-go ignores Mcp-Session-Id.
		if r.Method == http.MethodPost && env.Method == string(mcp.MethodSubscriptionsListen) {
			w, r = withListenAck(w, r)
		}
		g.next.ServeHTTP(w, r)
		return
	}
	tokenHash, _ := r.Context().Value(tokenHashKey{}).(string)
	id, _ := r.Context().Value(identityKey{}).(Identity)
	if r.Method == http.MethodPost && env.Method == string(mcp.MethodInitialize) {
		var name, version string
		if ci := env.Params.ClientInfo; ci != nil {
			name, version = ci.Name, ci.Version
		}
		g.initialize(w, r, tokenHash, id, name, version)
		return
	}
	sid := r.Header.Get(mcpserver.HeaderKeySessionID)
	if sid == "" {
		refuse(w, r, http.StatusBadRequest, "the Mcp-Session-Id header is required: send initialize first and repeat the session id it returns on every request")
		return
	}
	rec, err := g.sessions.Lookup(r.Context(), tokenHash, sid)
	if errors.Is(err, errNoSession) {
		refuse(w, r, http.StatusNotFound, fmt.Sprintf("session %q not found: it was ended (DELETE), idle for longer than the server's session idle timeout, replaced by newer sessions of the same token, or never existed; send initialize to start a new session", clipHeader(sid)))
		return
	}
	if err != nil {
		g.logger.Error("http session: lookup", "err", err)
		refuse(w, r, http.StatusServiceUnavailable, "the session could not be read from the ledger; retry shortly")
		return
	}
	ctx := context.WithValue(withSessionClient(r.Context(), rec.ClientName, rec.ClientVersion), sessionStateKey{}, &sessionState{rec: rec})
	if r.Method == http.MethodGet {
		var done func()
		ctx, done = g.streams.add(ctx, sid)
		defer done()
		g.sessions.watch(sid)
		defer g.sessions.unwatch(sid)
	}
	g.next.ServeHTTP(w, r.WithContext(ctx))
}

// readBody reads a POST body, at most maxBody bytes within the body
// timeout, and puts it back on r for the handlers behind. A body over
// largeMessage bytes first takes its size from the message budget (one
// of unknown length, the largest size, once it has passed largeMessage);
// taken is what to give back once the request is served. On failure it
// answers (413, 503 with Retry-After when the budget is spent, 408 or
// 400), gives back what it took, and reports false.
func (g *sessionGate) readBody(w http.ResponseWriter, r *http.Request) (body []byte, taken int, ok bool) {
	if r.ContentLength > maxBody {
		refuse(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is larger than %d bytes", maxBody))
		return nil, 0, false
	}
	busy := func() {
		g.metrics.busyRefused(BusyMessageBudget)
		refuseForNow(w, r, http.StatusServiceUnavailable, time.Second, busyMessage)
	}
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(g.bodyTimeout))
	src := http.MaxBytesReader(w, r.Body, maxBody)
	var err error
	if n := int(r.ContentLength); n > largeMessage {
		if !g.budget.take(n) {
			busy()
			return nil, 0, false
		}
		taken = n
		body, err = readAll(make([]byte, 0, n+1), src) // +1: room to read the end
	} else if body, err = readAll(nil, io.LimitReader(src, largeMessage+1)); err == nil && len(body) > largeMessage {
		if !g.budget.take(maxBody) {
			busy()
			return nil, 0, false
		}
		taken = maxBody
		body, err = readAll(body, src)
	}
	// A read deadline left in place would end the request's context when
	// it passes (net/http watches the connection once the body is read),
	// cutting off a long tool call or event stream.
	_ = rc.SetReadDeadline(time.Time{})
	if err == nil {
		setBody(r, body)
		return body, taken, true
	}
	g.budget.give(taken)
	var tooBig *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &tooBig):
		refuse(w, r, http.StatusRequestEntityTooLarge, fmt.Sprintf("the request body is larger than %d bytes", maxBody))
	case errors.As(err, &ne) && ne.Timeout():
		refuse(w, r, http.StatusRequestTimeout, fmt.Sprintf("the request body was not received within %s", g.bodyTimeout))
	default:
		refuse(w, r, http.StatusBadRequest, "the request body could not be read")
	}
	return nil, 0, false
}

// readAll is io.ReadAll appending to b: a body whose length is known is
// read into a buffer of that size, not one grown to twice it.
func readAll(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}

// setBody puts body on r as the body the handlers behind read.
func setBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
}

// streamSet tracks the open GET event streams, to end them at shutdown or
// when their session ends.
type streamSet struct {
	mu     sync.Mutex
	next   uint64
	open   map[uint64]stream
	closed bool
}

type stream struct {
	session string
	cancel  context.CancelFunc
}

func newStreamSet() *streamSet { return &streamSet{open: map[uint64]stream{}} }

// add returns ctx, cancelled when the stream must end, and the function
// to call when it has ended.
func (s *streamSet) add(ctx context.Context, session string) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		cancel()
		return ctx, func() {}
	}
	n := s.next
	s.next++
	s.open[n] = stream{session, cancel}
	return ctx, func() {
		s.mu.Lock()
		delete(s.open, n)
		s.mu.Unlock()
		cancel()
	}
}

func (s *streamSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, st := range s.open {
		st.cancel()
	}
}

func (s *streamSet) closeSession(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range s.open {
		if st.session == id {
			st.cancel()
		}
	}
}

// discardResponse is a ResponseWriter that keeps nothing.
type discardResponse struct{ h http.Header }

func (d discardResponse) Header() http.Header         { return d.h }
func (d discardResponse) Write(p []byte) (int, error) { return len(p), nil }
func (d discardResponse) WriteHeader(int)             {}

// ServeConfig configures ServeHTTP.
type ServeConfig struct {
	Addr   string
	Logger *slog.Logger
	// Grace is how long a shutdown waits for requests in flight to be
	// answered; it must exceed the longest call (see cmd serve).
	Grace time.Duration
	// FilesPerConn is how many open files one connection served may hold
	// at once: 2 when its request may call the order API (1 when zero).
	// See server/conns.go.
	FilesPerConn int
	// Metrics, when set, counts the requests refused at the connection
	// capacity.
	Metrics *Metrics
}

// ServeHTTP serves h on cfg.Addr until ctx is done, then shuts down
// gracefully: it stops accepting, ends the GET event streams, and waits up
// to cfg.Grace for every request in flight to be answered. Requests still
// running after the grace are cut off, and ServeHTTP returns an error
// saying so.
func ServeHTTP(ctx context.Context, h http.Handler, cfg ServeConfig) error {
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	capacity, maxOpen := connLimits(fileLimit(), max(cfg.FilesPerConn, 1))
	gl := newGuardListener(ln, capacity, maxOpen, logger)
	gl.metrics = cfg.Metrics
	srv := &http.Server{
		Handler: h,
		// Also the bound on a connection that sends nothing.
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	gl.guard(srv)
	if hh, ok := h.(*HTTPHandler); ok {
		srv.RegisterOnShutdown(hh.closeStreams)
	}
	logger.Info("serving MCP over Streamable HTTP", "addr", ln.Addr().String(), "endpoint", "/mcp", "shutdown_grace", cfg.Grace, "max_connections", capacity)
	grace := cfg.Grace
	if grace <= 0 {
		grace = 10 * time.Second
	}
	srv.RegisterOnShutdown(func() { logger.Info("shutting down: answering the requests in flight", "grace", grace) })
	err = ServeUntil(ctx, srv, gl, grace)
	if errors.Is(err, ErrGraceExceeded) {
		return fmt.Errorf("%w (their operations are recorded and reconciled)", err)
	}
	return err
}

// ErrGraceExceeded is returned by ServeUntil when requests were still
// running at the end of the shutdown grace (they were cut off).
var ErrGraceExceeded = errors.New("shutdown: requests still running after the grace were cut off")

// ServeUntil serves ln with srv until ctx is done or serving fails, then
// shuts srv down: it stops accepting, and lets the requests in flight
// finish for up to grace. Requests still running then are cut off
// (srv.Close) and the error is ErrGraceExceeded. A clean shutdown is nil.
func ServeUntil(ctx context.Context, srv *http.Server, ln net.Listener, grace time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		srv.Close()
		<-errc
		return fmt.Errorf("%w (%s): %w", ErrGraceExceeded, grace, err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// initialize lets mcp-go answer an initialize under a session id chosen
// here, and records the session in the ledger only when that answer is a
// success: a refused initialize (a malformed one, an unsupported
// version) leaves no session, returns no Mcp-Session-Id, and cannot evict
// a live session of its token. The answer — small, never streamed — is
// held until then.
func (g *sessionGate) initialize(w http.ResponseWriter, r *http.Request, tokenHash string, id Identity, name, version string) {
	pending := &sessionRecord{ID: newSessionID(), ClientName: clip(name), ClientVersion: clip(version)}
	ctx := context.WithValue(withSessionClient(r.Context(), pending.ClientName, pending.ClientVersion), sessionStateKey{}, &sessionState{created: pending})
	held := &heldResponse{header: http.Header{}}
	g.next.ServeHTTP(held, r.WithContext(ctx))
	if held.succeeded() {
		if _, err := g.sessions.createWithID(r.Context(), pending.ID, tokenHash, id, name, version); err != nil {
			g.sessions.free(pending.ID)
			g.logger.Error("http session: create", "err", err)
			refuse(w, r, http.StatusServiceUnavailable, "the session could not be recorded in the ledger; retry shortly")
			return
		}
	} else {
		held.header.Del(mcpserver.HeaderKeySessionID)
		g.sessions.free(pending.ID) // mcp-go keeps even a refused initialize's session in memory
	}
	for k, v := range held.header {
		w.Header()[k] = v
	}
	w.WriteHeader(held.status)
	w.Write(held.body.Bytes())
}

// heldResponse records an answer instead of sending it.
type heldResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (h *heldResponse) Header() http.Header { return h.header }
func (h *heldResponse) WriteHeader(status int) {
	if h.status == 0 {
		h.status = status
	}
}
func (h *heldResponse) Write(b []byte) (int, error) {
	if h.status == 0 {
		h.status = http.StatusOK
	}
	return h.body.Write(b)
}
func (h *heldResponse) Flush() {}

// succeeded reports whether the held answer is a JSON-RPC result (as JSON
// or as the data of server-sent events), not an error.
func (h *heldResponse) succeeded() bool {
	if h.status != http.StatusOK {
		return false
	}
	body := h.body.Bytes()
	if strings.HasPrefix(h.header.Get("Content-Type"), "text/event-stream") {
		var last []byte
		for _, line := range bytes.Split(body, []byte("\n")) {
			if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
				last = bytes.TrimSpace(data)
			}
		}
		body = last
	}
	var msg struct {
		Result json.RawMessage `json:"result"`
		Error  json.RawMessage `json:"error"`
	}
	return json.Unmarshal(body, &msg) == nil && len(msg.Result) > 0 && len(msg.Error) == 0
}
