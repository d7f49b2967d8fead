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
	"idemgate/schemas"
	"idemgate/server"
	"idemgate/tools"
)

const usage = `idemgate — an MCP server whose side-effecting tools are safe to call twice

Usage:
  idemgate serve [flags]          serve MCP over stdio (embedded ledger)
  idemgate ops list [flags]       list recent operations
  idemgate ops show KEY [flags]   show one operation's record
  idemgate approvals list|show ID|approve ID|reject ID [--comment C]
                                  decide approvals as an approver, on the same ledger
  idemgate audit verify|tail      check the audit hash chain, or print recent entries
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

// ledgerFlags are the flags shared by every command that opens the ledger.
type ledgerFlags struct {
	db                 string
	retention          time.Duration
	tombstoneRetention time.Duration
	suspectWindow      time.Duration
	requireIssued      bool
	policyFile         string
	approvalThreshold  int64
	maxRecipients      int
	approvalTTL        time.Duration
	fs                 *flag.FlagSet
	policy             approvals.Policy
}

func (l *ledgerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.db, "db", env("IDEMGATE_DB", defaultDB()), "ledger file (bbolt); shared safely by several processes (env IDEMGATE_DB)")
	fs.DurationVar(&l.retention, "retention", 24*time.Hour, "how long a finished operation's full result is kept and replayed")
	fs.DurationVar(&l.tombstoneRetention, "tombstone-retention", 30*24*time.Hour, "how long after retention a tombstone still refuses re-execution (key_expired)")
	fs.DurationVar(&l.suspectWindow, "suspect-window", 10*time.Minute, "a new key with the same request as an operation this recent is held as a suspected duplicate")
	fs.BoolVar(&l.requireIssued, "require-issued-keys", false, "accept only operation keys handed out by new_operation_key")
	def := approvals.Default()
	fs.StringVar(&l.policyFile, "policy", env("IDEMGATE_POLICY", ""), "approval and deny policy file (TOML; see README); flags below override it (env IDEMGATE_POLICY)")
	fs.Int64Var(&l.approvalThreshold, "approval-threshold", def.CreateOrderThresholdMinor, "create_order totals at or above this (minor units) need approval; 0 disables")
	fs.IntVar(&l.maxRecipients, "max-recipients", def.MaxRecipients, "notifications to more recipients need approval; 0 disables")
	fs.DurationVar(&l.approvalTTL, "approval-ttl", def.ApprovalTTL.Duration, "pending approvals expire (operation rejected, approval_expired) after this")
	l.fs = fs
}

// loadPolicy reads --policy and applies the flags that were set on top.
func (l *ledgerFlags) loadPolicy() error {
	p := approvals.Default()
	if l.policyFile != "" {
		var err error
		if p, err = approvals.Load(l.policyFile); err != nil {
			return usageError{err}
		}
	}
	l.fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "approval-threshold":
			p.CreateOrderThresholdMinor = l.approvalThreshold
		case "max-recipients":
			p.MaxRecipients = l.maxRecipients
		case "approval-ttl":
			p.ApprovalTTL.Duration = l.approvalTTL
		}
	})
	if err := p.Validate(); err != nil {
		return usageError{fmt.Errorf("policy: %w", err)}
	}
	l.policy = p
	return nil
}

func (l *ledgerFlags) open() (*ledger.BoltStore, error) {
	for name, d := range map[string]time.Duration{"retention": l.retention, "tombstone-retention": l.tombstoneRetention, "suspect-window": l.suspectWindow} {
		if d <= 0 {
			return nil, usageError{fmt.Errorf("--%s must be positive, got %s", name, d)}
		}
	}
	if l.db == "" {
		return nil, usageError{errors.New("--db is empty and no data directory could be found; pass --db PATH")}
	}
	if err := l.loadPolicy(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(l.db), 0o700); err != nil {
		return nil, fmt.Errorf("ledger directory: %w", err)
	}
	return ledger.OpenBolt(l.db, ledger.Options{
		Retention: l.retention, TombstoneRetention: l.tombstoneRetention,
		SuspectWindow: l.suspectWindow, RequireIssuedKeys: l.requireIssued,
		ApprovalTTL: l.policy.ApprovalTTL.Duration,
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
	var lf ledgerFlags
	lf.register(fs)
	var id server.Identity
	fs.StringVar(&id.Principal, "principal", env("IDEMGATE_PRINCIPAL", "local-agent"), "who this server acts for (env IDEMGATE_PRINCIPAL)")
	fs.StringVar(&id.Tenant, "tenant", env("IDEMGATE_TENANT", "default"), "tenant whose operations this server sees (env IDEMGATE_TENANT)")
	fs.StringVar(&id.Role, "role", env("IDEMGATE_ROLE", "agent"), "agent or approver (env IDEMGATE_ROLE)")
	outbox := fs.String("outbox-dir", env("IDEMGATE_OUTBOX_DIR", ""), "directory the notification sink writes one file per message into (default: 'outbox' beside --db)")
	wait := fs.Duration("wait", 5*time.Second, "how long a duplicate call waits for a running operation before answering in_progress")
	workers := fs.Int("workers", 32, "concurrent tool calls (1-100)")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error (logs go to stderr)")
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

	store, err := lf.open()
	if err != nil {
		return err
	}
	defer store.Close()
	if *outbox == "" {
		*outbox = filepath.Join(filepath.Dir(lf.db), "outbox")
	}
	v, err := schemas.New()
	if err != nil {
		return err
	}
	svc, err := tools.New(store, v, tools.Options{WaitInProgress: *wait, OutboxDir: *outbox, Logger: logger, Policy: &lf.policy})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	bg, cancelBg := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); svc.Deliverer().Run(bg) }()
	go sweepLoop(bg, store, logger)
	logger.Info("serving MCP on stdio", "db", lf.db, "principal", id.Principal, "tenant", id.Tenant, "role", id.Role)
	err = server.ServeStdio(ctx, server.New(svc, id, logger), stdin, stdout, *workers, logger)
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

func ops(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "show") {
		return usageError{errors.New("usage: idemgate ops list [--tenant T] [--state S] [--limit N] | idemgate ops show KEY [--tenant T]")}
	}
	sub := args[0]
	fs := flag.NewFlagSet("ops "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf ledgerFlags
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
	if len(args) == 0 || (args[0] != "verify" && args[0] != "tail") {
		return usageError{errors.New("usage: idemgate audit verify | idemgate audit tail [-n N]")}
	}
	fs := flag.NewFlagSet("audit "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf ledgerFlags
	lf.register(fs)
	n := fs.Int("n", 20, "tail: how many of the newest entries (1-10000)")
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
	entries, err := store.AuditTail(ctx, *n)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
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
	var lf ledgerFlags
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
	store, err := lf.open()
	if err != nil {
		return err
	}
	defer store.Close()
	if *outbox == "" {
		*outbox = filepath.Join(filepath.Dir(lf.db), "outbox")
	}
	v, err := schemas.New()
	if err != nil {
		return err
	}
	svc, err := tools.New(store, v, tools.Options{OutboxDir: *outbox, Policy: &lf.policy})
	if err != nil {
		return err
	}
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
	if resp.IsError && resp.Error != nil {
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
