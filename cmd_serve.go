package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"idemgate/ledger"
	"idemgate/server"
	"idemgate/tools"
	"io"
	"log/slog"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func serve(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	var id server.Identity
	fs.StringVar(&id.Principal, "principal", env("IDEMGATE_PRINCIPAL", "local-agent"), "who this server acts for (env IDEMGATE_PRINCIPAL)")
	fs.StringVar(&id.Tenant, "tenant", env("IDEMGATE_TENANT", "default"), "tenant whose operations this server sees (env IDEMGATE_TENANT)")
	fs.StringVar(&id.Role, "role", env("IDEMGATE_ROLE", "agent"), "agent or approver (env IDEMGATE_ROLE)")
	outbox := fs.String("outbox-dir", env("IDEMGATE_OUTBOX_DIR", ""), "directory the notification sink writes one file per message into (default: 'outbox' beside --db)")
	wait := fs.Duration("wait", 5*time.Second, "how long a duplicate call waits for a running operation before answering in_progress")
	workers := fs.Int("workers", 32, "concurrent tool calls (1-100)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error (logs go to stderr)")
	httpAddr := fs.String("http", env("IDEMGATE_HTTP", ""), "serve Streamable HTTP on this address (e.g. 127.0.0.1:8080) instead of stdio; identities come from --tokens (env IDEMGATE_HTTP)")
	tokensFile := fs.String("tokens", env("IDEMGATE_TOKENS", ""), "bearer tokens file for --http (default: tokens.json beside --db; create entries with idemgate tokens add)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("serve takes no arguments, got %q", fs.Args())}
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
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	var tokens *server.Tokens
	var metrics *server.Metrics
	if *httpAddr != "" {
		if *tokensFile == "" {
			*tokensFile = filepath.Join(filepath.Dir(lf.db), "tokens.json")
		}
		var err error
		if tokens, err = server.LoadTokens(*tokensFile); err != nil {
			return usageError{fmt.Errorf("%w (create one with: idemgate tokens add --principal P --tenant T --role agent --tokens %s)", err, *tokensFile)}
		}
		metrics = server.NewMetrics()
		lf.observe = metrics.ObserveAudit
	}
	store, svc, err := lf.openService(*outbox, *wait, logger)
	if err != nil {
		return err
	}
	defer store.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	bg, cancelBg := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); svc.Deliverer().Run(bg) }()
	go sweepLoop(bg, store, logger)
	go reconcileLoop(bg, svc, lf.lease, logger)
	if *httpAddr != "" {
		// Over HTTP every request acts for its token's identity; the
		// --principal/--tenant/--role of stdio do not apply.
		h := server.NewHTTPHandler(server.New(svc, server.Identity{}, logger, metrics), server.HTTPConfig{
			Tokens: tokens, Metrics: metrics, Logger: logger,
			Health: func(ctx context.Context) (bool, any) {
				h := store.Health(ctx)
				status := "ok"
				if !h.OK {
					status = "unavailable"
				}
				return h.OK, struct {
					Status string        `json:"status"`
					Ledger ledger.Health `json:"ledger"`
				}{status, h}
			},
		})
		err = server.ServeHTTP(ctx, h, *httpAddr, logger)
	} else {
		logger.Info("serving MCP on stdio", "db", lf.db, "principal", id.Principal, "tenant", id.Tenant, "role", id.Role)
		err = server.ServeStdio(ctx, server.New(svc, id, logger, nil), stdin, stdout, *workers, logger)
	}
	cancelBg()
	<-done
	if errors.Is(err, context.Canceled) || errors.Is(err, io.EOF) {
		err = nil
	}
	return err
}

// sweepLoop turns expired records into tombstones every ten minutes until
// ctx is done.
func sweepLoop(ctx context.Context, store ledger.Store, logger *slog.Logger) {
	t := time.NewTicker(10 * time.Minute)
	defer t.Stop()
	for {
		if c, d, err := store.Sweep(ctx); err != nil && ctx.Err() == nil {
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

// reconcileLoop expires stale leases and reconciles unknown operations
// with the order API every third of a lease, until ctx is done.
func reconcileLoop(ctx context.Context, svc *tools.Service, lease time.Duration, logger *slog.Logger) {
	t := time.NewTicker(min(max(lease/3, 100*time.Millisecond), 10*time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if e, r, err := svc.Sweep(ctx); err != nil && ctx.Err() == nil {
			logger.Warn("reconciliation sweep", "err", err)
		} else if e+r > 0 {
			logger.Info("reconciliation sweep", "leases_expired", e, "reconciled", r)
		}
	}
}
