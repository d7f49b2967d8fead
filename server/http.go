package server

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	mcpserver "github.com/mark3labs/mcp-go/server"
)

// HTTPConfig configures the Streamable HTTP transport.
type HTTPConfig struct {
	Addr    string   // listen address, e.g. 127.0.0.1:8080
	Tokens  *Tokens  // bearer tokens → identities
	Metrics *Metrics // served at /metrics; nil: no /metrics
	Logger  *slog.Logger
	// Ready reports whether the server can serve (the ledger opens); it
	// backs /healthz.
	Ready func(ctx context.Context) error
	// Health, when set, backs /healthz instead of Ready: ok false answers
	// 503; details is the JSON body.
	Health func(ctx context.Context) (ok bool, details any)
}

// maxBody bounds one HTTP request body, like MaxMessageBytes on stdio.
const maxBody = MaxMessageBytes

// NewHTTPHandler returns the HTTP handler: /mcp (Streamable HTTP, bearer
// token required: 401 with WWW-Authenticate otherwise), /healthz and
// /metrics.
func NewHTTPHandler(s *mcpserver.MCPServer, cfg HTTPConfig) http.Handler {
	mcpHandler := mcpserver.NewStreamableHTTPServer(s,
		mcpserver.WithEndpointPath("/mcp"),
		mcpserver.WithStreamableHTTPLogger(cfg.Logger),
		// The identity was put on the request's context by requireToken.
		mcpserver.WithHTTPContextFunc(func(ctx context.Context, r *http.Request) context.Context {
			if id, ok := r.Context().Value(identityKey{}).(Identity); ok {
				return WithIdentity(ctx, id)
			}
			return ctx
		}),
	)
	mux := http.NewServeMux()
	mux.Handle("/mcp", requireToken(cfg.Tokens, cfg.Logger, mcpHandler))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		if cfg.Health != nil {
			ok, details := cfg.Health(ctx)
			if !ok {
				cfg.Logger.Warn("health check", "details", details)
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			json.NewEncoder(w).Encode(details)
			return
		}
		if cfg.Ready != nil {
			if err := cfg.Ready(ctx); err != nil {
				cfg.Logger.Warn("health check", "err", err)
				w.WriteHeader(http.StatusServiceUnavailable)
				json.NewEncoder(w).Encode(map[string]string{"status": "unavailable", "error": "the ledger cannot be opened"})
				return
			}
		}
		json.NewEncoder(w).Encode(map[string]string{"status": "ok"})
	})
	if cfg.Metrics != nil {
		mux.Handle("GET /metrics", cfg.Metrics.Handler())
	}
	return mux
}

// requireToken lets through only requests with a valid bearer token,
// carrying its identity; others get 401 with WWW-Authenticate (RFC 6750).
func requireToken(tokens *Tokens, logger *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		token, ok := strings.CutPrefix(auth, "Bearer ")
		if !ok || token == "" || len(token) > 512 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idemgate"`)
			http.Error(w, "a bearer token is required (Authorization: Bearer <token>; see idemgate tokens add)", http.StatusUnauthorized)
			return
		}
		id, found, err := tokens.Lookup(strings.TrimSpace(token))
		if err != nil {
			logger.Warn("tokens file", "err", err)
		}
		if !found {
			w.Header().Set("WWW-Authenticate", `Bearer realm="idemgate", error="invalid_token"`)
			http.Error(w, "the bearer token is not valid", http.StatusUnauthorized)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		next.ServeHTTP(w, r.WithContext(WithIdentity(r.Context(), id)))
	})
}

// ServeHTTP serves h on cfg.Addr until ctx is done, then shuts down
// gracefully (in-flight calls get up to 10 s).
func ServeHTTP(ctx context.Context, h http.Handler, addr string, logger *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	logger.Info("serving MCP over Streamable HTTP", "addr", ln.Addr().String(), "endpoint", "/mcp")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
