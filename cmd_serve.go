package main

import (
	"context"
	"errors"
	"flag"
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

	"github.com/google/uuid"
)

func serve(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	setGCDefault()
	stopProfiles, err := startProfiles(os.Getenv("IDEMGATE_CPUPROFILE"), os.Getenv("IDEMGATE_MEMPROFILE"))
	if err != nil {
		return err
	}
	defer stopProfiles(stderr)
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	var id server.Identity
	fs.StringVar(&id.Principal, "principal", env("IDEMGATE_PRINCIPAL", "local-agent"), "who this server acts for (env IDEMGATE_PRINCIPAL)")
	fs.StringVar(&id.Tenant, "tenant", env("IDEMGATE_TENANT", "default"), "tenant whose operations this server sees (env IDEMGATE_TENANT)")
	fs.StringVar(&id.Role, "role", env("IDEMGATE_ROLE", "agent"), "agent or approver (env IDEMGATE_ROLE)")
	fs.StringVar(&id.OnBehalfOf, "on-behalf-of", env("IDEMGATE_ON_BEHALF_OF", ""), "stdio: the user this agent acts for, recorded on every audit entry (env IDEMGATE_ON_BEHALF_OF; over --http the token's)")
	fs.StringVar(&id.Model, "model", env("IDEMGATE_MODEL", ""), "stdio: the model driving this agent, recorded on every audit entry (env IDEMGATE_MODEL; over --http the token's)")
	outbox := fs.String("outbox-dir", env("IDEMGATE_OUTBOX_DIR", ""), "directory the notification sink writes messages into, as --outbox-format says (default: 'outbox' beside --db)")
	wait := fs.Duration("wait", 5*time.Second, "how long a duplicate call waits for a running operation before answering in_progress")
	workers := fs.Int("workers", 32, "concurrent tool calls (1-100)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error (logs go to stderr)")
	httpAddr := fs.String("http", env("IDEMGATE_HTTP", ""), "serve Streamable HTTP on this address (e.g. 127.0.0.1:8080) instead of stdio; identities come from --tokens (env IDEMGATE_HTTP)")
	tokensFile := fs.String("tokens", env("IDEMGATE_TOKENS", ""), "bearer tokens file for --http (default: tokens.json beside --db; create entries with idemgate tokens add)")
	token := fs.String("token", env("IDEMGATE_TOKEN", ""), "stdio: a token from --tokens whose principal, tenant and role this server acts as; required for --role approver when the config sets require_approver_token (prefer env IDEMGATE_TOKEN)")
	allowedOrigins := fs.String("allowed-origins", env("IDEMGATE_ALLOWED_ORIGINS", ""), "with --http: comma-separated browser origins (scheme://host[:port]) allowed besides the server's own; a request with any other Origin gets 403 (env IDEMGATE_ALLOWED_ORIGINS)")
	sessionIdle := fs.Duration("session-idle-timeout", server.DefaultSessionIdleTimeout, "with --http: a session unused this long ends (its id then gets 404)")
	maxSessions := fs.Int("max-sessions-per-token", server.DefaultMaxSessionsPerToken, "with --http: sessions one token may hold; a new one ends the token's least recently used")
	bodyTimeout := fs.Duration("http-body-timeout", server.DefaultBodyTimeout, "with --http: how long a client may take to send one request body")
	checkpointEvery := fs.Duration("audit-checkpoint-every", time.Minute, "with --audit-checkpoint-key: how often a signed checkpoint of the audit chain's head is logged (to stderr) when the chain grew; one more is logged at shutdown")
	authLimit := authFailureLimitFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("serve takes no arguments, got %q", fs.Args())}
	}
	if *httpAddr == "" && (id.Role == approvals.RoleApprover || *token != "") {
		if err := lf.load(); err != nil {
			return err
		}
		tf := tokenFlags{token: *token, tokens: *tokensFile}
		var err error
		if id, err = tf.identity(&lf, fs, id, id.Role == approvals.RoleApprover); err != nil {
			return err
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", *logLevel)}
	}
	if err := id.Validate(); err != nil {
		return usageError{err}
	}
	if *workers < 1 || *workers > 100 {
		return usageError{fmt.Errorf("--workers must be 1-100, got %d", *workers)}
	}
	if *wait <= 0 || *wait > 5*time.Minute {
		return usageError{fmt.Errorf("--wait must be between 0 and 5m, got %s", *wait)}
	}
	if *sessionIdle < time.Second || *sessionIdle > 30*24*time.Hour {
		return usageError{fmt.Errorf("--session-idle-timeout must be between 1s and 720h, got %s", *sessionIdle)}
	}
	if *maxSessions < 1 || *maxSessions > 10000 {
		return usageError{fmt.Errorf("--max-sessions-per-token must be 1-10000, got %d", *maxSessions)}
	}
	if *authLimit < 0 {
		return usageError{fmt.Errorf("--auth-failure-limit must be 0 (never pause) or more, got %d", *authLimit)}
	}
	if *bodyTimeout < 100*time.Millisecond || *bodyTimeout > 10*time.Minute {
		return usageError{fmt.Errorf("--http-body-timeout must be between 100ms and 10m, got %s", *bodyTimeout)}
	}
	if *checkpointEvery < 100*time.Millisecond || *checkpointEvery > 24*time.Hour {
		return usageError{fmt.Errorf("--audit-checkpoint-every must be between 100ms and 24h, got %s", *checkpointEvery)}
	}
	var origins *server.Origins
	if *httpAddr != "" {
		if err := lf.load(); err != nil { // for the console's public URL
			return err
		}
		list := server.DefaultOrigins(*httpAddr)
		if *allowedOrigins != "" {
			list = append(list, strings.Split(*allowedOrigins, ",")...)
		}
		var err error
		if origins, err = server.ParseOrigins(list); err != nil {
			return usageError{fmt.Errorf("--allowed-origins: %w", err)}
		}
		if origins, err = withConsoleOrigin(list, lf.file.Console.PublicURL); err != nil {
			return usageError{fmt.Errorf("[console] public_url / --public-url: %w", err)}
		}
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	var tokens *server.Tokens
	var metrics *server.Metrics
	if *httpAddr != "" {
		if *tokensFile == "" {
			*tokensFile = filepath.Join(lf.dataDir(), "tokens.json")
		}
		var err error
		if tokens, err = server.LoadTokens(*tokensFile); err != nil {
			return usageError{fmt.Errorf("%w (create one with: idemgate tokens add --principal P --tenant T --role agent --tokens %s)", err, *tokensFile)}
		}
		metrics = server.NewMetrics()
		lf.observe = metrics.ObserveAudit
	}
	lf.mayCreate = true // a server starts a new ledger where none exists
	store, svc, err := lf.openService(*outbox, *wait, logger)
	if err != nil {
		return err
	}
	metrics.WatchSegments(lf.segments)
	// Every background loop is joined before the ledger closes, on every
	// way out of serve.
	bg := newLoops()
	defer func() {
		if cerr := closeAfter(bg, svc, store); cerr != nil {
			logger.Error("shutdown", "err", cerr)
		}
	}()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// A second signal during the shutdown ends the process at once.
	go func() { <-ctx.Done(); stop() }()
	// The shutdown waits this long for calls in flight to be answered:
	// longer than one call to the order API plus a duplicate's wait for a
	// running operation, so a call that has just started still gets its
	// result (or its recorded unknown outcome) back.
	grace := shutdownGrace(lf.file.OrdersAPI.Timeout.Duration, *wait)
	if name := lf.file.Audit.CheckpointKey; name != "" {
		key, err := loadCheckpointKey(name)
		if err != nil {
			return usageError{err}
		}
		if key.priv == nil {
			return usageError{fmt.Errorf("audit checkpoint key %s is a public key: serve signs checkpoints with the private key", name)}
		}
		bg.Go(func(ctx context.Context) { checkpointLoop(ctx, store, key.priv, *checkpointEvery, stderr, logger) })
	}
	bg.Go(svc.Deliverer().Run)
	// One replica (process) at a time runs each sweep; the others skip.
	holder := uuid.NewString()
	bg.Go(func(ctx context.Context) {
		sweepLoop(ctx, store, &sharedTask{store: store, name: "retention-sweep", holder: holder, hold: 3 * sweepEvery, log: logger}, logger)
	})
	bg.Go(func(ctx context.Context) {
		task := &sharedTask{store: store, name: "reconcile", holder: holder, hold: max(lf.lease, 3*reconcileEvery(lf.lease)), log: logger}
		reconcileLoop(ctx, svc, lf.lease, task, logger)
	})
	if *httpAddr != "" {
		sessions := server.NewSessions(store, server.SessionConfig{IdleTimeout: *sessionIdle, MaxPerToken: *maxSessions}, logger, metrics)
		bg.Go(sessions.Run)
		// Over HTTP every request acts for its token's identity; the
		// --principal/--tenant/--role of stdio do not apply.
		// One guard for /mcp and the console: guesses at either count together.
		guard := server.NewAuthGuard(*authLimit, logger, metrics)
		h := server.NewHTTPHandler(server.New(svc, server.Identity{}, logger, metrics), server.HTTPConfig{
			Addr: *httpAddr, Tokens: tokens, Metrics: metrics, Logger: logger, Origins: origins,
			Sessions: sessions, BodyTimeout: *bodyTimeout, Guard: guard, Screen: svc.Screen,
			UI: newConsole(bg, lf.file.Console.PublicURL, store, svc, tokens, guard, logger, false, nil),
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
		cfg := server.ServeConfig{Addr: *httpAddr, Logger: logger, Grace: grace, Metrics: metrics}
		if lf.file.OrdersAPI.URL != "" {
			cfg.FilesPerConn = 2 // a create_order holds its connection to the API too
		}
		err = server.ServeHTTP(ctx, h, cfg)
	} else {
		logger.Info("serving MCP on stdio", "db", postgres.Redacted(lf.db), "principal", id.Principal, "tenant", id.Tenant, "role", id.Role)
		err = server.ServeStdio(ctx, server.New(svc, id, logger, nil), server.StdioConfig{
			In: stdin, Out: stdout, Workers: *workers, Grace: grace, Logger: logger, Screen: svc.Screen,
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
