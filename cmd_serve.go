package main

import (
	"context"
	"errors"
	"fmt"
	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/ledger/postgres"
	"idemgate/server"
	"idemgate/tools"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"
)

func serve(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if owned == nil { // not a serve --http the owner runs for a client
		setGCDefault()
		stopProfiles, err := startProfiles(os.Getenv("IDEMGATE_CPUPROFILE"), os.Getenv("IDEMGATE_MEMPROFILE"))
		if err != nil {
			return err
		}
		defer stopProfiles(stderr)
	}
	o, err := parseServe("serve", args, stderr)
	if err != nil {
		return err
	}
	if o.piped() {
		return servePipe(o, stdin, stdout, stderr)
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// A second signal during the shutdown ends the process at once.
	go func() { <-ctx.Done(); stop() }()
	if o.httpAddr != "" && !o.ownLedger {
		// On a ledger file, the file's owner serves HTTP for this
		// process (started when none runs, and again if it ends).
		_, config, err := o.ownerPlace()
		if err != nil {
			return err
		}
		t := throughOwner{words: []string{"serve"}, fs: o.fs, db: o.lf.db, lf: &o.lf, lasting: true, config: config, ownerArgs: ownerArgs(config)}
		if err := t.run(ctx, stdout, stderr); err != nil {
			return err
		}
	}
	lf, id := &o.lf, o.id
	if o.httpAddr == "" && (id.Role == approvals.RoleApprover || o.token != "") {
		tf := tokenFlags{token: o.token, tokens: o.tokensFile}
		if id, err = tf.identity(lf, o.fs, id, id.Role == approvals.RoleApprover); err != nil {
			return err
		}
	}
	var origins *server.Origins
	if o.httpAddr != "" {
		list := server.DefaultOrigins(o.httpAddr)
		if o.allowedOrigins != "" {
			list = append(list, strings.Split(o.allowedOrigins, ",")...)
		}
		var err error
		if origins, err = server.ParseOrigins(list); err != nil {
			return usageError{fmt.Errorf("--allowed-origins: %w", err)}
		}
		if origins, err = withConsoleOrigin(list, lf.file.Console.PublicURL); err != nil {
			return usageError{fmt.Errorf("[console] public_url / --public-url: %w", err)}
		}
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: o.level}))

	var tokens *server.Tokens
	var metrics *server.Metrics
	if o.httpAddr != "" {
		if o.tokensFile == "" {
			o.tokensFile = filepath.Join(lf.dataDir(), "tokens.json")
		}
		var err error
		if tokens, err = server.LoadTokens(o.tokensFile); errors.Is(err, os.ErrNotExist) && lf.file.Auth.Enabled() {
			tokens = nil // [auth]'s access tokens alone
		} else if err != nil {
			return usageError{fmt.Errorf("%w (create one with: idemgate tokens add --principal P --tenant T --role agent --tokens %s)", err, o.tokensFile)}
		}
		metrics = server.NewMetrics()
		lf.observe = metrics.ObserveAudit
	}
	var oauth *server.OAuth
	var signIn *server.SignIn
	if o.httpAddr != "" && lf.file.Auth.Enabled() {
		var err error
		if oauth, signIn, err = startOAuth(ctx, lf.file.Auth, lf.file.Console.PublicURL, logger); err != nil {
			return err
		}
	}
	if owned == nil { // in the owner, the owner's service traces
		tel, stopTelemetry, err := startTelemetry(logger)
		if err != nil {
			return usageError{err}
		}
		defer stopTelemetry()
		lf.tel = tel
	}
	lf.mayCreate = true // a server starts a new ledger where none exists
	store, svc, err := lf.openService(o.outbox, o.wait, logger)
	if err != nil {
		return err
	}
	metrics.WatchSegments(lf.segments)
	if db, ok := store.(*postgres.DB); ok {
		metrics.WatchDatabase(db.Stats)
	}
	// Every background loop is joined before the ledger closes, on every
	// way out of serve.
	bg := newLoops()
	defer func() {
		if cerr := closeAfter(bg, svc, store); cerr != nil {
			logger.Error("shutdown", "err", cerr)
		}
	}()
	grace := o.grace()
	if lf.hosted == nil { // the owner runs its own
		if err := startLoops(bg, o, store, svc, stderr, logger); err != nil {
			return err
		}
	}
	if o.httpAddr != "" {
		sessions := server.NewSessions(store, server.SessionConfig{IdleTimeout: o.sessionIdle, MaxPerToken: o.maxSessions}, logger, metrics)
		bg.Go(sessions.Run)
		// Over HTTP every request acts for its token's identity; the
		// --principal/--tenant/--role of stdio do not apply.
		// One guard for /mcp and the console: guesses at either count together.
		guard := server.NewAuthGuard(o.authLimit, logger, metrics)
		h := server.NewHTTPHandler(server.New(svc, server.Identity{}, logger, metrics), server.HTTPConfig{
			Addr: o.httpAddr, Tokens: tokens, OAuth: oauth, Metrics: metrics, Logger: logger, Origins: origins,
			Sessions: sessions, BodyTimeout: o.bodyTimeout, Guard: guard, Screen: svc.Screen,
			UI: newConsole(bg, lf.file.Console.PublicURL, lf.file.Console.TraceURL, store, svc, tokens, guard, logger, false, nil, signIn),
			Health: func(ctx context.Context) (bool, any, any) {
				h := store.Health(ctx)
				status := "ok"
				if !h.OK {
					status = "unavailable"
				}
				type body struct {
					Status string        `json:"status"`
					Ledger ledger.Health `json:"ledger"`
				}
				return h.OK, body{status, h}, body{status, h.Public()}
			},
		})
		cfg := server.ServeConfig{Addr: o.httpAddr, Logger: logger, Grace: grace, Metrics: metrics}
		if lf.file.OrdersAPI.URL != "" || len(lf.file.Tools) > 0 || lf.file.ToolsDir != "" {
			cfg.FilesPerConn = 2 // a create_order (or a declared tool's call) holds its connection to the API too
		}
		err = server.ServeHTTP(ctx, h, cfg)
	} else {
		logger.Info("serving MCP on stdio", "db", postgres.Redacted(lf.db), "principal", id.Principal, "tenant", id.Tenant, "role", id.Role)
		err = server.ServeStdio(ctx, server.New(svc, id, logger, nil), server.StdioConfig{
			In: stdin, Out: stdout, Workers: o.workers, Grace: grace, Logger: logger, Screen: svc.Screen,
		})
	}
	bg.Stop() // the deliverer's last pass ends before the answer is returned
	if errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		err = nil
	}
	return err
}

// withConsoleOrigin is the allowed origins of serve --http: list (the
// server's own and --allowed-origins) and, with a console public URL, that
// URL's origin. The console's pages, opened there through a proxy, post
// back with it as Origin, and the proxy passes its host as Host, which the
// loopback Host check then admits too (the hosts of allowed origins pass).
func withConsoleOrigin(list []string, publicURL string) (*server.Origins, error) {
	if publicURL != "" {
		o, err := server.OriginOf(publicURL)
		if err != nil {
			return nil, err
		}
		list = append(slices.Clip(list), o)
	}
	return server.ParseOrigins(list)
}

// sweepEvery is the retention sweep's period.
const sweepEvery = 10 * time.Minute

// sweepLoop turns expired records into tombstones at once and then every
// ten minutes, when this process holds task; it returns when ctx is done
// (after the pass in progress), giving task up.
func sweepLoop(ctx context.Context, store ledger.Store, task *sharedTask, logger *slog.Logger) {
	t := time.NewTicker(sweepEvery)
	defer t.Stop()
	defer task.end()
	for {
		if !task.take(ctx) {
			// Another process sweeps.
		} else if c, d, err := store.Sweep(ctx); err != nil && ctx.Err() == nil {
			logger.Warn("retention sweep", "err", err)
		} else if c+d > 0 {
			logger.Info("retention sweep", "tombstoned", c, "deleted", d)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// reconcileEvery is the reconciliation loop's period: a third of a lease,
// between 100 ms and 10 s.
func reconcileEvery(lease time.Duration) time.Duration {
	return min(max(lease/3, 100*time.Millisecond), 10*time.Second)
}

// reconcileLoop expires stale leases and reconciles unknown operations
// with the order API every third of a lease, when this process holds
// task; it returns when ctx is done (after the pass in progress), giving
// task up.
func reconcileLoop(ctx context.Context, svc *tools.Service, lease time.Duration, task *sharedTask, logger *slog.Logger) {
	t := time.NewTicker(reconcileEvery(lease))
	defer t.Stop()
	defer task.end()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !task.take(ctx) {
			continue // another process reconciles
		}
		if e, r, err := svc.Sweep(ctx); err != nil && ctx.Err() == nil {
			logger.Warn("reconciliation sweep", "err", err)
		} else if e+r > 0 {
			logger.Info("reconciliation sweep", "leases_expired", e, "reconciled", r)
		}
	}
}

// shutdownGrace is how long a shutdown waits for calls in flight: one
// order API call, a duplicate's wait for a running operation, and a margin
// for the ledger writes around them.
func shutdownGrace(callTimeout, wait time.Duration) time.Duration {
	return callTimeout + wait + 5*time.Second
}

// startProfiles is serve's hidden profiling hook, for measuring the
// server while idemgate bench (or anything else) drives it: with cpu set
// (env IDEMGATE_CPUPROFILE) a CPU profile is written there from the start
// of serve until it returns; with heap set (env IDEMGATE_MEMPROFILE) an
// allocation profile (every allocation since the start, pprof's allocs
// profile) is written there when serve returns. Read them with go tool
// pprof. stop writes them and reports a failure on w; it never fails
// serve.
func startProfiles(cpu, heap string) (stop func(w io.Writer), err error) {
	var cpuFile *os.File
	if cpu != "" {
		if cpuFile, err = os.Create(cpu); err != nil {
			return nil, fmt.Errorf("IDEMGATE_CPUPROFILE: %w", err)
		}
		if err := pprof.StartCPUProfile(cpuFile); err != nil {
			cpuFile.Close()
			return nil, fmt.Errorf("IDEMGATE_CPUPROFILE: %w", err)
		}
	}
	return func(w io.Writer) {
		if cpuFile != nil {
			pprof.StopCPUProfile()
			if err := cpuFile.Close(); err != nil {
				fmt.Fprintln(w, "IDEMGATE_CPUPROFILE:", err)
			}
		}
		if heap != "" {
			runtime.GC() // the profile's in-use figures are as of the last GC
			if err := writeProfile("allocs", heap); err != nil {
				fmt.Fprintln(w, "IDEMGATE_MEMPROFILE:", err)
			}
		}
	}, nil
}

func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// serveGOGC is serve's garbage-collection target when the GOGC
// environment variable is unset (Go's default is 100). A server's live
// heap is small — a few MB: the ledger's data is bbolt's memory map, not
// heap — while each call allocates tens of KB (JSON-RPC, schema
// validation, the answer), so at 100 the collector ran every few dozen
// calls; measured with idemgate bench, it was about a tenth of the
// server's CPU. At 400 it runs a quarter as often, for a heap of some
// 5 × the live data instead of 2 ×.
const serveGOGC = 400

// setGCDefault applies serveGOGC unless GOGC is set, which the runtime
// has then already applied, as for any Go program.
func setGCDefault() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(serveGOGC)
	}
}

// startOAuth is the checker of [auth]'s access tokens and, when [auth]
// names a console client, the console's sign-in through the provider,
// whose callback is on consoleURL (see OAuthConfig.ConsoleRedirect). The
// issuer's metadata is read in the background from now, so that a wrong
// issuer shows in the log at start; a failure is tried again at the first
// token.
func startOAuth(ctx context.Context, a server.OAuthConfig, consoleURL string, logger *slog.Logger) (*server.OAuth, *server.SignIn, error) {
	oauth, err := server.NewOAuth(a, nil)
	if err != nil {
		return nil, nil, usageError{err}
	}
	var signIn *server.SignIn
	if a.ConsoleClientID != "" {
		if signIn, err = oauth.NewSignIn(a.ConsoleClientID, a.ConsoleClientSecret, a.ConsoleRedirect(consoleURL)); err != nil {
			return nil, nil, usageError{fmt.Errorf("[auth] console_client_id: %w", err)}
		}
	}
	go func() {
		if err := oauth.Discover(ctx); err != nil {
			logger.Warn("oauth: the authorization server's metadata cannot be read now (tried again at the first token)", "issuer", a.Issuer, "err", err)
		} else {
			logger.Info("oauth: accepting access tokens", "issuer", a.Issuer, "resource", a.Resource)
		}
	}()
	return oauth, signIn, nil
}
