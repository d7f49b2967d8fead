// Command idemgate is an MCP server whose side-effecting tools are safe to
// call twice. See README.md.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"idemgate/approvals"
	"idemgate/demo"
	"idemgate/ledger"
	"idemgate/server"
	"idemgate/tools"
)

const usage = `idemgate — an MCP server whose side-effecting tools are safe to call twice

Usage:
  idemgate serve [flags]          serve MCP over stdio (embedded ledger), or --http ADDR
  idemgate tokens add --principal P --tenant T --role agent|approver
                                  create a bearer token for --http (shown once; stored hashed)
  idemgate ops list [flags]       list recent operations
  idemgate ops show KEY [flags]   show one operation's record
  idemgate approvals list|show ID|approve ID|reject ID [--comment C]
                                  decide approvals as an approver, on the same ledger
  idemgate reconcile KEY          ask the order API what became of an unknown operation
  idemgate resolve KEY --outcome succeeded|not_executed --evidence TEXT [--downstream-ref R]
                                  settle an unknown operation by hand, as an approver
  idemgate outbox requeue MESSAGE_ID   retry a dead-lettered notification
  idemgate stats [--tenant T] [--json]
                                  reliability numbers: duplicates, replays, unknown outcomes, retries
  idemgate audit verify|tail|export
                                  check the audit hash chain, print recent entries, or export it as JSON lines
  idemgate demo                   walk through the guarantees with a real server
  idemgate version

Run "idemgate COMMAND -h" for a command's flags.
`

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(args[1:], stdin, stdout, stderr)
	case "ops":
		err = ops(args[1:], stdout, stderr)
	case "approvals":
		err = approvalsCmd(args[1:], stdout, stderr)
	case "audit":
		err = audit(args[1:], stdout, stderr)
	case "stats":
		err = stats(args[1:], stdout, stderr)
	case "outbox":
		err = outboxCmd(args[1:], stdout, stderr)
	case "reconcile", "resolve":
		err = settleCmd(args[0], args[1:], stdout, stderr)
	case "tokens":
		err = tokensCmd(args[1:], stdout, stderr)
	case "demo":
		err = runDemo(args[1:], stdout, stderr)
	case "version", "--version":
		fmt.Fprintln(stdout, "idemgate", server.Version)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "idemgate: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "idemgate:", err)
		if errors.As(err, new(usageError)) {
			return 2
		}
		return 1
	}
	return 0
}

type usageError struct{ error }

func (l *settings) open() (*ledger.BoltStore, error) {
	if l.db == "" {
		return nil, usageError{errors.New("--db is empty and no data directory could be found; pass --db PATH")}
	}
	if err := l.load(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(l.db), 0o700); err != nil {
		return nil, fmt.Errorf("ledger directory: %w", err)
	}
	return ledger.OpenBolt(l.db, ledger.Options{
		Retention: l.retention, TombstoneRetention: l.tombstoneRetention,
		SuspectWindow: l.suspectWindow, RequireIssuedKeys: l.requireIssued,
		ApprovalTTL: l.file.ApprovalTTL.Duration, Lease: l.lease, Observe: l.observe,
	})
}

// defaultDB is the ledger file in the user's data directory.
func defaultDB() string {
	dir := os.Getenv("XDG_DATA_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		dir = filepath.Join(home, ".local", "share")
		if runtime.GOOS == "darwin" {
			dir = filepath.Join(home, "Library", "Application Support")
		}
	}
	return filepath.Join(dir, "idemgate", "ledger.db")
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

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
			Ready: func(ctx context.Context) error { return store.View(ctx, func(ledger.Tx) error { return nil }) },
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

func ops(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "show") {
		return usageError{errors.New("usage: idemgate ops list [--tenant T] [--state S] [--limit N] | idemgate ops show KEY [--tenant T]")}
	}
	sub := args[0]
	fs := flag.NewFlagSet("ops "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	tenant := fs.String("tenant", env("IDEMGATE_TENANT", "default"), "tenant (\"\" with list: every tenant)")
	state := fs.String("state", "", "list only this state")
	limit := fs.Int("limit", 50, "list at most this many (1-10000)")
	asJSON := fs.Bool("json", false, "print JSON")
	rest := args[1:]
	var key string
	if sub == "show" {
		if len(rest) == 0 || len(rest[0]) == 0 || rest[0][0] == '-' {
			return usageError{errors.New("usage: idemgate ops show KEY [--tenant T]")}
		}
		key, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if *limit < 1 || *limit > 10000 {
		return usageError{fmt.Errorf("--limit must be 1-10000, got %d", *limit)}
	}
	store, err := lf.open()
	if err != nil {
		return err
	}
	defer store.Close()
	ctx := context.Background()
	if sub == "show" {
		rec, err := store.Get(ctx, *tenant, key)
		if errors.Is(err, ledger.ErrNotFound) {
			return fmt.Errorf("no operation %q in tenant %q", key, *tenant)
		}
		if err != nil {
			return err
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rec)
	}
	recs, err := store.List(ctx, ledger.Filter{Tenant: *tenant, State: ledger.State(*state), Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(recs)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "FIRST SEEN\tTENANT\tKEY\tTOOL\tSTATE\tATTEMPTS\tSUMMARY")
	for _, r := range recs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.FirstSeenAt.UTC().Format(time.RFC3339), r.Tenant, r.Key, r.Tool, r.State, r.Attempts, r.Summary)
	}
	return w.Flush()
}

func runDemo(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	keep := fs.Bool("keep", false, "keep the demo's temporary ledger and print its path")
	if err := fs.Parse(args); err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	return demo.Run(context.Background(), self, stdout, *keep)
}

func audit(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "verify" && args[0] != "tail" && args[0] != "export") {
		return usageError{errors.New("usage: idemgate audit verify | tail [-n N] | export [--after SEQ]")}
	}
	fs := flag.NewFlagSet("audit "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	n := fs.Int("n", 20, "tail: how many of the newest entries (1-10000)")
	after := fs.Uint64("after", 0, "export: only entries with a sequence number above this (resume an earlier export)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *n < 1 || *n > 10000 {
		return usageError{fmt.Errorf("-n must be 1-10000, got %d", *n)}
	}
	store, err := lf.open()
	if err != nil {
		return err
	}
	defer store.Close()
	ctx := context.Background()
	if args[0] == "verify" {
		count, err := store.VerifyAudit(ctx)
		if err != nil {
			return fmt.Errorf("audit chain broken after %d good entries: %w", count, err)
		}
		fmt.Fprintf(stdout, "audit chain intact: %d entries\n", count)
		return nil
	}
	enc := json.NewEncoder(stdout)
	if args[0] == "export" {
		// The whole log (or what follows --after) as JSON lines, oldest
		// first, paged so that a long log is never held in memory; each
		// line keeps its hash chain fields for an external verifier.
		for seq := *after; ; {
			page, err := store.AuditLog(ctx, seq, 10000)
			if err != nil {
				return err
			}
			for _, e := range page {
				if err := enc.Encode(e); err != nil {
					return err
				}
				seq = e.Seq
			}
			if len(page) < 10000 {
				return nil
			}
		}
	}
	entries, err := store.AuditTail(ctx, *n)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := enc.Encode(e); err != nil {
			return err
		}
	}
	return nil
}

// approvalsCmd lets an approver list and decide approvals from a terminal,
// on the same ledger the agents' servers use, through the same code as the
// decide_approval tool.
func approvalsCmd(args []string, stdout, stderr io.Writer) error {
	const use = "usage: idemgate approvals list | show ID | approve ID [--comment C] | reject ID [--comment C]  (with --principal P --tenant T)"
	if len(args) == 0 {
		return usageError{errors.New(use)}
	}
	sub, rest := args[0], args[1:]
	var id string
	switch sub {
	case "list":
	case "show", "approve", "reject":
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
			return usageError{errors.New(use)}
		}
		id, rest = rest[0], rest[1:]
	default:
		return usageError{errors.New(use)}
	}
	fs := flag.NewFlagSet("approvals "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	principal := fs.String("principal", env("IDEMGATE_PRINCIPAL", ""), "the approver deciding (env IDEMGATE_PRINCIPAL)")
	tenant := fs.String("tenant", env("IDEMGATE_TENANT", "default"), "tenant (env IDEMGATE_TENANT)")
	comment := fs.String("comment", "", "why; recorded in the audit log (approve, reject)")
	outbox := fs.String("outbox-dir", env("IDEMGATE_OUTBOX_DIR", ""), "notification sink directory (default: 'outbox' beside --db)")
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q; %s", fs.Args(), use)}
	}
	who := server.Identity{Principal: *principal, Tenant: *tenant, Role: approvals.RoleApprover}
	if err := who.Validate(); err != nil {
		return usageError{err}
	}
	if len(*comment) > 1000 {
		return usageError{fmt.Errorf("--comment is %d characters; at most 1000", len(*comment))}
	}
	store, svc, err := lf.openService(*outbox, 0, quietLogger(stderr))
	if err != nil {
		return err
	}
	defer store.Close()
	ctx := context.Background()
	actor := ledger.Actor{Tenant: who.Tenant, Principal: who.Principal, Role: who.Role, ClientName: "idemgate-cli"}
	var resp *tools.Response
	switch sub {
	case "list":
		resp = svc.Call(ctx, actor, "list_pending_approvals", map[string]any{"limit": 100}, nil)
	case "show":
		resp = svc.ShowApproval(ctx, actor, id)
	default:
		args := map[string]any{"approval_id": id, "decision": sub}
		if *comment != "" {
			args["comment"] = *comment
		}
		resp = svc.Call(ctx, actor, "decide_approval", args, nil)
		// Deliver what the approved operation queued, so a confirmation is
		// not left waiting for the next server to start.
		svc.Deliverer().DeliverPending(ctx)
	}
	if sub == "list" || sub == "show" {
		if err := printApprovals(stdout, resp); err != nil {
			return err
		}
	} else {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(resp); err != nil {
			return err
		}
	}
	rejectedAsAsked := sub == "reject" && resp.Status == ledger.StateRejected && resp.Approval != nil && resp.Approval.DecidedBy == who.Principal
	if resp.IsError && resp.Error != nil && !rejectedAsAsked {
		return fmt.Errorf("%s: %s", resp.Error.Code, resp.Error.Message)
	}
	return nil
}

// printApprovals prints approvals for a person: each with its diff text.
func printApprovals(w io.Writer, resp *tools.Response) error {
	if resp.IsError {
		return nil
	}
	var r struct {
		Approvals []map[string]any `json:"approvals"`
		Approval  map[string]any   `json:"approval"`
	}
	if err := json.Unmarshal(resp.Result, &r); err != nil {
		return err
	}
	if r.Approval != nil {
		r.Approvals = append(r.Approvals, r.Approval)
	}
	if len(r.Approvals) == 0 {
		fmt.Fprintln(w, "no pending approvals")
	}
	for _, a := range r.Approvals {
		fmt.Fprintf(w, "%v  %v  %v  requested by %v  expires %v\n  why: %v\n", a["approval_id"], a["status"], a["tool"], a["requested_by"], a["expires_at"], a["reason"])
		fmt.Fprintf(w, "  operation_key: %v\n", a["operation_key"])
		for _, line := range strings.Split(strings.TrimRight(fmt.Sprint(a["diff_text"]), "\n"), "\n") {
			fmt.Fprintf(w, "  | %s\n", line)
		}
		fmt.Fprintln(w)
	}
	return nil
}

func stats(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	tenant := fs.String("tenant", "", "only this tenant (default: every tenant)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	store, err := lf.open()
	if err != nil {
		return err
	}
	defer store.Close()
	st, err := ledger.ComputeStats(context.Background(), store, *tenant)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	for _, row := range []struct {
		name string
		v    any
	}{
		{"operations", st.Operations},
		{"tool calls with a key", st.Calls},
		{"retry amplification (calls per operation)", fmt.Sprintf("%.2f", st.RetryAmplification)},
		{"duplicate side effects (must be 0)", st.DuplicateSideEffects},
		{"replays served", st.ReplaysServed},
		{"fingerprint mismatches refused", st.MismatchesRefused},
		{"invalid arguments refused", st.InvalidRefused},
		{"suspected duplicates held (new key, same request)", st.SuspectedDuplicates},
		{"false dedupes (held duplicates approved as new intents)", st.FalseDedupes},
		{"unknown outcomes", st.Unknown},
		{"  settled", st.Settled},
		{"  still unknown", st.StillUnsure},
		{"late replays after retention (key_expired)", st.LateReplays},
	} {
		fmt.Fprintf(w, "%s\t%v\n", row.name, row.v)
	}
	return w.Flush()
}

// outboxCmd lets an operator put a dead-lettered message back in the queue
// once the gateway is fixed; a running server delivers it.
func outboxCmd(args []string, stdout, stderr io.Writer) error {
	const use = "usage: idemgate outbox requeue MESSAGE_ID [--db PATH]"
	if len(args) < 2 || args[0] != "requeue" || strings.HasPrefix(args[1], "-") {
		return usageError{errors.New(use)}
	}
	id := args[1]
	fs := flag.NewFlagSet("outbox requeue", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	if err := fs.Parse(args[2:]); err != nil {
		return err
	}
	store, svc, err := lf.openService("", 0, quietLogger(stderr))
	if err != nil {
		return err
	}
	defer store.Close()
	if err := svc.Deliverer().Requeue(context.Background(), id); err != nil {
		if errors.Is(err, tools.ErrMessageNotFound) || errors.Is(err, tools.ErrMessageNotDead) {
			return usageError{err}
		}
		return err
	}
	fmt.Fprintf(stdout, "requeued %s; a running server delivers it within a second\n", id)
	return nil
}

// settleCmd runs reconcile_operation or resolve_operation from a
// terminal, through the same code as the tools.
func settleCmd(sub string, args []string, stdout, stderr io.Writer) error {
	use := "usage: idemgate reconcile KEY [--tenant T] | idemgate resolve KEY --outcome succeeded|not_executed --evidence TEXT [--downstream-ref R] --principal P [--tenant T]"
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return usageError{errors.New(use)}
	}
	key, rest := args[0], args[1:]
	fs := flag.NewFlagSet(sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	principal := fs.String("principal", env("IDEMGATE_PRINCIPAL", "operator"), "who acts (env IDEMGATE_PRINCIPAL); resolve needs an approver's name")
	tenant := fs.String("tenant", env("IDEMGATE_TENANT", "default"), "tenant (env IDEMGATE_TENANT)")
	outcome := fs.String("outcome", "", "resolve: succeeded or not_executed")
	evidence := fs.String("evidence", "", "resolve: what you checked and what it showed (10-2000 characters)")
	ref := fs.String("downstream-ref", "", "resolve: the order system's id for what was done")
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q; %s", fs.Args(), use)}
	}
	who := server.Identity{Principal: *principal, Tenant: *tenant, Role: approvals.RoleApprover}
	if err := who.Validate(); err != nil {
		return usageError{err}
	}
	store, svc, err := lf.openService("", 0, quietLogger(stderr))
	if err != nil {
		return err
	}
	defer store.Close()
	actor := ledger.Actor{Tenant: who.Tenant, Principal: who.Principal, Role: who.Role, ClientName: "idemgate-cli"}
	tool, callArgs := "reconcile_operation", map[string]any{"operation_key": key}
	if sub == "resolve" {
		tool = "resolve_operation"
		callArgs["outcome"], callArgs["evidence"] = *outcome, *evidence
		if *ref != "" {
			callArgs["downstream_ref"] = *ref
		}
	}
	ctx := context.Background()
	resp := svc.Call(ctx, actor, tool, callArgs, nil)
	svc.Deliverer().DeliverPending(ctx) // a settled order's confirmation goes out now
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(resp); err != nil {
		return err
	}
	if resp.IsError && resp.Error != nil {
		return fmt.Errorf("%s: %s", resp.Error.Code, resp.Error.Message)
	}
	return nil
}

// tokensCmd creates bearer tokens for the HTTP transport.
func tokensCmd(args []string, stdout, stderr io.Writer) error {
	const use = "usage: idemgate tokens add --principal P --tenant T --role agent|approver [--tokens FILE] [--note TEXT]"
	if len(args) == 0 || args[0] != "add" {
		return usageError{errors.New(use)}
	}
	fs := flag.NewFlagSet("tokens add", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var id server.Identity
	fs.StringVar(&id.Principal, "principal", "", "who the token acts for")
	fs.StringVar(&id.Tenant, "tenant", "default", "the token's tenant")
	fs.StringVar(&id.Role, "role", "agent", "agent or approver")
	file := fs.String("tokens", env("IDEMGATE_TOKENS", ""), "tokens file (default: tokens.json beside the default ledger)")
	note := fs.String("note", "", "what the token is for (at most 200 characters)")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *file == "" {
		*file = filepath.Join(filepath.Dir(env("IDEMGATE_DB", defaultDB())), "tokens.json")
	}
	if err := id.Validate(); err != nil {
		return usageError{err}
	}
	token, err := server.AddToken(*file, id, *note)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "added a token for %s (tenant %s, role %s) to %s; it is shown only now:\n", id.Principal, id.Tenant, id.Role, *file)
	fmt.Fprintln(stdout, token)
	return nil
}
