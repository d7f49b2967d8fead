package main

import (
	"context"
	"flag"
	"fmt"
	"idemgate/approvals"
	"idemgate/console"
	"idemgate/ledger"
	"idemgate/server"
	"idemgate/tools"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// newConsole is the web console over store and svc; tokens (may be nil)
// log people in, and guard watches their failed logins; publicURL ("" for
// none) is where people open it (an https one makes the session cookie
// Secure). standalone: the console checks Host itself (under serve --http
// the transport does) and delivers what a decision queued. The console's
// one background task, verifying the audit chain once at its start, runs
// in bg, which the caller joins before closing store (closeAfter).
func newConsole(bg *loops, publicURL, traceURL string, store ledger.Store, svc *tools.Service, tokens *server.Tokens, guard *server.AuthGuard, logger *slog.Logger, standalone bool, ttl *time.Duration, signIn *server.SignIn) *console.Console {
	cfg := console.Config{Service: svc, Store: store, Logger: logger, CheckHost: standalone, PublicURL: publicURL, TraceURL: traceURL, Guard: guard.For(server.AuthConsoleLogin)}
	if signIn != nil {
		cfg.SignIn = consoleSignIn{signIn}
	}
	if tokens != nil {
		cfg.Lookup = func(token string) (console.Identity, bool) {
			id, ok, err := tokens.Lookup(token)
			if err != nil {
				logger.Warn("tokens file", "err", err)
			}
			return console.Identity{Principal: id.Principal, Tenant: id.Tenant, Role: id.Role}, ok
		}
	}
	if ttl != nil {
		cfg.SessionTTL = *ttl
	}
	if standalone {
		cfg.AfterDecide = func(ctx context.Context) { svc.Deliverer().DeliverPending(ctx) }
	}
	c := console.New(cfg)
	bg.Go(c.VerifyAtStart)
	return c
}

// consoleCmd serves the web console alone, over the same ledger the
// agents' servers use, and prints to stderr a one-time login link (with
// --principal or --token) or the login page's address.
func consoleCmd(ctx context.Context, args []string, stderr io.Writer) (err error) {
	fs := flag.NewFlagSet("console", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	listen := fs.String("listen", env("IDEMGATE_CONSOLE_LISTEN", "127.0.0.1:8081"), "address to serve the console on (env IDEMGATE_CONSOLE_LISTEN)")
	principal := fs.String("principal", env("IDEMGATE_PRINCIPAL", ""), "the approver the one-time login link logs in as (env IDEMGATE_PRINCIPAL); without it (and without --token) the login page's address is printed and people log in with their tokens")
	tenant := fs.String("tenant", env("IDEMGATE_TENANT", "default"), "tenant of --principal (env IDEMGATE_TENANT)")
	outbox := fs.String("outbox-dir", env("IDEMGATE_OUTBOX_DIR", ""), "notification sink directory (default: 'outbox' beside --db)")
	ttl := fs.Duration("session-ttl", console.DefaultSessionTTL, "how long a console session lasts")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error (logs go to stderr)")
	authLimit := authFailureLimitFlag(fs)
	var tf tokenFlags
	tf.register(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("console takes no arguments, got %q", fs.Args())}
	}
	if *authLimit < 0 {
		return usageError{fmt.Errorf("--auth-failure-limit must be 0 (never pause) or more, got %d", *authLimit)}
	}
	if *ttl < time.Second || *ttl > 30*24*time.Hour {
		return usageError{fmt.Errorf("--session-ttl must be between 1s and 720h, got %s", *ttl)}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", *logLevel)}
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// On a ledger file, the file's owner serves the console for this
	// process (started when none runs, and again if it ends).
	t := throughOwner{words: []string{"console"}, fs: fs, db: lf.db, lf: &lf, lasting: true}
	if err := t.run(ctx, stderr, stderr); err != nil {
		return err
	}
	if err := lf.load(); err != nil {
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	var link *server.Identity
	if *principal != "" || tf.token != "" {
		who, err := tf.identity(&lf, fs, server.Identity{Principal: *principal, Tenant: *tenant, Role: approvals.RoleApprover}, true)
		if err != nil {
			return err
		}
		if err := who.Validate(); err != nil {
			return usageError{err}
		}
		if who.Role != approvals.RoleApprover {
			return usageError{fmt.Errorf("the console is for approvers: --token has the role %s", who.Role)}
		}
		link = &who
	}
	tokensPath := tf.tokens
	if tokensPath == "" {
		tokensPath = filepath.Join(filepath.Dir(lf.db), "tokens.json")
	}
	var tokens *server.Tokens
	if _, err := os.Stat(tokensPath); err == nil || tf.tokens != "" {
		var err error
		if tokens, err = server.LoadTokens(tokensPath); err != nil {
			return usageError{err}
		}
	}
	auth := lf.file.Auth
	signsIn := auth.Enabled() && auth.ConsoleClientID != "" // through [auth]'s provider
	if tokens == nil && link == nil && !signsIn {
		return usageError{fmt.Errorf("nobody could log in: give --principal P --tenant T (a one-time login link is printed), a tokens file (--tokens; idemgate tokens add --role approver) or [auth] with a console_client_id (docs/oauth.md)")}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", *listen, err)
	}
	defer ln.Close()
	publicURL := lf.file.Console.PublicURL
	var signIn *server.SignIn
	if signsIn {
		// The provider sends people back to the console: to its public
		// address, else to its own.
		back := publicURL
		if back == "" {
			back = "http://" + displayAddr(ln.Addr().String())
		}
		if _, signIn, err = startOAuth(ctx, auth, back, logger); err != nil {
			return err
		}
	}
	store, svc, err := lf.openService(*outbox, 0, logger)
	if err != nil {
		return err
	}
	// Like serve: the background task and the service's detached work end
	// before the ledger closes.
	bg := newLoops()
	defer func() {
		if cerr := closeAfter(bg, svc, store); cerr != nil && err == nil {
			err = cerr
		}
	}()
	c := newConsole(bg, publicURL, lf.file.Console.TraceURL, store, svc, tokens, server.NewAuthGuard(*authLimit, logger, nil), logger, true, ttl, signIn)
	mux := http.NewServeMux()
	mux.Handle("/ui", c)
	mux.Handle("/ui/", c)
	mux.Handle("/{$}", http.RedirectHandler("/ui/approvals", http.StatusSeeOther))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: time.Minute, IdleTimeout: 2 * time.Minute,
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn)}
	if signIn != nil {
		fmt.Fprintf(stderr, "idemgate console: approvers may sign in through %s on the login page\n", auth.Issuer)
	}
	printLogin(stderr, ln.Addr().String(), publicURL, c, link)
	return server.ServeUntil(ctx, srv, ln, 10*time.Second)
}

// printLogin tells the person who started the console how to log in:
// with link (the --principal or --token approver), a one-time login link
// valid for 15 minutes; without, the login page, where people log in
// with their own tokens (a link logging in by itself would have to choose
// one of the tokens file's approvers for whoever reads this). listenAddr
// is the console's listener; publicURL, when set, is given too.
//
// With an https publicURL and a listener that is not loopback, only the
// public address is printed: the session cookie is Secure then, and a
// browser drops it over the listener's plain http (only loopback
// addresses are trusted without TLS) — and since both addresses would
// carry the one code, opening the local one would spend the public one.
func printLogin(w io.Writer, listenAddr, publicURL string, c *console.Console, link *server.Identity) {
	bases := []string{"http://" + displayAddr(listenAddr)}
	localDropped := publicURL != "" && strings.HasPrefix(strings.ToLower(publicURL), "https://") && !loopbackListener(listenAddr)
	if localDropped {
		bases = []string{publicURL}
	} else if publicURL != "" {
		bases = append(bases, publicURL)
	}
	path := console.Prefix + "/login"
	if link != nil {
		path = c.LoginLink(console.Identity{Principal: link.Principal, Tenant: link.Tenant, Role: link.Role}, 15*time.Minute)
		fmt.Fprintf(w, "idemgate console: open this link to log in as %s (tenant %s); it works once, within 15 minutes:\n\n    %s%s\n\n", link.Principal, link.Tenant, bases[0], path)
	} else {
		fmt.Fprintf(w, "idemgate console: open the login page and log in with an approver's token (idemgate tokens add --role approver):\n\n    %s%s\n\n(give --principal P --tenant T, or --token, for a one-time link that logs in by itself)\n", bases[0], path)
	}
	if len(bases) > 1 {
		fmt.Fprintf(w, "or the same through --public-url:\n\n    %s%s\n\n", bases[1], path)
	}
	if localDropped {
		fmt.Fprintf(w, "(the console's own address, http://%s, is not for logging in: the https --public-url makes the session cookie Secure, which a browser does not keep over plain http there)\n", displayAddr(listenAddr))
	}
}

// loopbackListener reports whether a listen address is on a loopback
// interface only (an unspecified host listens on every interface).
func loopbackListener(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// displayAddr is a listen address as a browser should open it: an
// unspecified host becomes 127.0.0.1.
func displayAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// authFailureLimitFlag registers --auth-failure-limit (serve --http and
// console): server.AuthGuard's limit.
func authFailureLimitFlag(fs *flag.FlagSet) *int {
	return fs.Int("auth-failure-limit", server.DefaultAuthFailureLimit,
		"failed authentications (wrong bearer tokens, wrong console logins) one source address may make within a minute before its requests are refused (429) for a minute; 0: never refuse (failures are still logged and counted). Behind a reverse proxy every client is the proxy's address")
}

// consoleSignIn is server.SignIn as the console takes it.
type consoleSignIn struct{ *server.SignIn }

func (s consoleSignIn) Exchange(ctx context.Context, code, verifier, nonce string) (console.Identity, error) {
	id, err := s.SignIn.Exchange(ctx, code, verifier, nonce)
	return console.Identity{Principal: id.Principal, Tenant: id.Tenant, Role: id.Role}, err
}
