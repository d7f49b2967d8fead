package main

// The settings every command that opens the ledger shares: flags, the
// configuration file, and opening the ledger and the tool service from
// them. Commands (cmd_*.go) use these; main.go only dispatches.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing/fstest"
	"time"

	"github.com/BurntSushi/toml"

	"idemgate/approvals"
	"idemgate/declared"
	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/ledger/postgres"
	"idemgate/orders"
	"idemgate/outbox"
	"idemgate/owner"
	"idemgate/schemas"
	"idemgate/server"
	"idemgate/telemetry"
	"idemgate/tools"
)

// fileConfig is the TOML configuration file (--config): the approval
// policy's keys at the top level, and a section per downstream. Unknown
// keys are an error naming them, so a typo cannot silently switch a rule
// or a downstream off.
type fileConfig struct {
	approvals.Policy
	// RequireApproverToken: decisions taken outside the HTTP transport —
	// `idemgate approvals approve|reject`, `idemgate resolve` and a stdio
	// `serve --role approver` — need a token of role approver from the
	// tokens file, whose principal then acts (not --principal).
	RequireApproverToken bool `toml:"require_approver_token"`

	OrdersAPI struct {
		URL       string             `toml:"url"`
		SafeRetry bool               `toml:"safe_retry"`
		Timeout   approvals.Duration `toml:"timeout"`
	} `toml:"orders_api"`
	Notifications struct {
		WebhookURL string `toml:"webhook_url"`
		// OutboxFormat is how the outbox directory holds delivered
		// messages: OutboxFiles (the default) or OutboxSegments.
		OutboxFormat string `toml:"outbox_format"`
	} `toml:"notifications"`
	// Approvals reaches approvers (docs/approvals.md, "Reaching approvers"): each new
	// approval request POSTs a notice to NotifyWebhook through the outbox,
	// signed with NotifySecret when set.
	Approvals struct {
		NotifyWebhook string `toml:"notify_webhook"`
		NotifySecret  string `toml:"notify_secret"`
	} `toml:"approvals"`
	// Console.PublicURL is where people reach the console (the base of
	// the links in approvers' notices).
	// Console.TraceURL is the team's trace viewer, with {trace_id} (and
	// optionally {span_id}) where a trace's id goes: the console links an
	// operation's history to its traces.
	Console struct {
		PublicURL string `toml:"public_url"`
		TraceURL  string `toml:"trace_url"`
	} `toml:"console"`
	// Audit.Retention is the age past which `idemgate audit prune`
	// archives and removes audit entries (unset: keep them all).
	// Audit.CheckpointKey is the Ed25519 key file (PEM) that signs the
	// audit chain's checkpoints (serve, audit export) and checks them
	// (audit verify --checkpoint); see checkpointKey.
	Audit struct {
		Retention     approvals.Duration `toml:"retention"`
		CheckpointKey string             `toml:"checkpoint_key"`
	} `toml:"audit"`
	// Auth makes serve --http an OAuth resource server beside the tokens
	// file: it accepts the access tokens of an authorization server
	// (docs/oauth.md). Unset: the tokens file alone.
	Auth server.OAuthConfig `toml:"auth"`
	// Tools are side-effecting tools declared here ([[tools]]), and
	// ToolsDir a directory of files of more (*.toml, [[tools]] only;
	// relative to the configuration file): see docs/declared-tools.md.
	Tools    []declared.Decl `toml:"tools"`
	ToolsDir string          `toml:"tools_dir"`
}

// settings are what the commands that open the ledger share: the ledger's
// own flags, and the configuration file with the flags that override it.
type settings struct {
	db                 string
	retention          time.Duration
	tombstoneRetention time.Duration
	suspectWindow      time.Duration
	lease              time.Duration
	requireIssued      bool
	configFile         string
	approvalThreshold  int64
	maxRecipients      int
	approvalTTL        time.Duration
	ordersAPI          string
	ordersSafeRetry    bool
	ordersTimeout      time.Duration
	notifyWebhook      string
	outboxFormat       string
	approvalWebhook    string
	publicURL          string
	checkpointKey      string

	fs      *flag.FlagSet
	file    fileConfig              // after load: the file with the set flags applied
	observe func(ledger.AuditEntry) // metrics hook, when metrics are served

	readOnlySink bool // the service delivers nothing (a read-only command)
	// segments is the segments sink service opened, if any (for metrics).
	segments *outbox.SegmentSink
	// tel is the process's telemetry (OTEL_*), given to the tool service
	// and its downstreams' transports; nil: off.
	tel *telemetry.Provider
	// mayCreate lets open create a new ledger where no file exists: only
	// serve (and init) do; every other command refuses a missing ledger
	// rather than start an empty one that remembers no key.
	mayCreate bool
	// wait bounds how long an open waits for a ledger file another
	// process has open (0: bolt.DefaultWait).
	wait time.Duration
	// hosted: the command runs in the owner of its ledger file, whose
	// ledger and service its opens return (see throughOwner).
	hosted *ownedLedger
}

// readOnlySink is the notification sink of a read-only command: it
// delivers nothing and creates nothing.
type readOnlySink struct{}

func (readOnlySink) Deliver(context.Context, *outbox.Message) error {
	return errors.New("a read-only command delivers no notifications")
}

func (readOnlySink) Flush() error { return nil }

func (l *settings) register(fs *flag.FlagSet) {
	fs.StringVar(&l.db, "db", env("IDEMGATE_DB", defaultDB()), "ledger: a file (bbolt), which one process owns and every idemgate process on the machine uses through it, or a postgres:// URL, shared by several machines (env IDEMGATE_DB)")
	fs.DurationVar(&l.retention, "retention", 24*time.Hour, "how long a finished operation's full result is kept and replayed")
	fs.DurationVar(&l.tombstoneRetention, "tombstone-retention", 30*24*time.Hour, "how long after retention a tombstone still refuses re-execution (key_expired)")
	fs.DurationVar(&l.suspectWindow, "suspect-window", 10*time.Minute, "a new key with the same request as an operation this recent is held as a suspected duplicate")
	fs.DurationVar(&l.lease, "lease", 30*time.Second, "how long an executor owns a running operation without renewing; then it becomes unknown (order API) or retryable (embedded)")
	fs.BoolVar(&l.requireIssued, "require-issued-keys", false, "accept only operation keys handed out by new_operation_key")
	def := approvals.Default()
	fs.StringVar(&l.configFile, "config", env("IDEMGATE_CONFIG", ""), "configuration file (TOML: policy, [orders_api], [notifications], [approvals], [console]; see docs/approvals.md); flags override it (env IDEMGATE_CONFIG)")
	fs.Int64Var(&l.approvalThreshold, "approval-threshold", def.CreateOrderThresholdMinor, "create_order totals at or above this (minor units) need approval; 0 disables")
	fs.IntVar(&l.maxRecipients, "max-recipients", def.MaxRecipients, "notifications to more recipients need approval; 0 disables")
	fs.DurationVar(&l.approvalTTL, "approval-ttl", def.ApprovalTTL.Duration, "pending approvals expire (operation rejected, approval_expired) after this")
	fs.StringVar(&l.ordersAPI, "orders-api", env("IDEMGATE_ORDERS_API", ""), "base URL of an HTTP order API to keep orders in instead of the embedded store (env IDEMGATE_ORDERS_API)")
	fs.BoolVar(&l.ordersSafeRetry, "orders-api-safe-retry", false, "the order API guarantees a same-key retry returns the first outcome (lets a proven-absent operation be re-sent without approval)")
	fs.DurationVar(&l.ordersTimeout, "orders-api-timeout", 10*time.Second, "bound on one call to the order API")
	fs.StringVar(&l.notifyWebhook, "notify-webhook", env("IDEMGATE_NOTIFY_WEBHOOK", ""), "POST notifications to this gateway URL (Idempotency-Key = message id) instead of writing files (env IDEMGATE_NOTIFY_WEBHOOK)")
	fs.StringVar(&l.outboxFormat, "outbox-format", env("IDEMGATE_OUTBOX_FORMAT", ""), "how notifications are written to the outbox directory: files (one <message_id>.json each, the default) or segments (JSON lines appended to segments/<seq>.jsonl, one write and sync per delivery pass); every process on one ledger must use the same (config [notifications] outbox_format; env IDEMGATE_OUTBOX_FORMAT)")
	fs.StringVar(&l.approvalWebhook, "approval-notify-webhook", env("IDEMGATE_APPROVAL_NOTIFY_WEBHOOK", ""), "POST a notice to this URL when an approval is requested, through the outbox (config [approvals] notify_webhook; needs --public-url; env IDEMGATE_APPROVAL_NOTIFY_WEBHOOK; the signing secret: notify_secret or env IDEMGATE_APPROVAL_NOTIFY_SECRET)")
	fs.StringVar(&l.publicURL, "public-url", env("IDEMGATE_PUBLIC_URL", ""), "the console's URL as people open it, e.g. https://gate.example.com: the base of the links in approvers' notices; an https one makes the console's cookie Secure, and serve --http allows its origin and host (config [console] public_url; env IDEMGATE_PUBLIC_URL)")
	fs.StringVar(&l.checkpointKey, "audit-checkpoint-key", env("IDEMGATE_AUDIT_CHECKPOINT_KEY", ""), "Ed25519 key file (PEM) kept outside the ledger: its private key signs the audit chain's checkpoints (serve's log, audit export), its public key is enough for audit verify --checkpoint; make one with: openssl genpkey -algorithm ed25519 -out FILE (config [audit] checkpoint_key; env IDEMGATE_AUDIT_CHECKPOINT_KEY)")
	l.fs = fs
}

// load reads --config and applies the flags that were set on top of it.
func (l *settings) load() error {
	c := fileConfig{Policy: approvals.Default()}
	c.OrdersAPI.Timeout.Duration = l.ordersTimeout
	if l.configFile != "" {
		b, err := os.ReadFile(l.configFile)
		if err != nil {
			return usageError{fmt.Errorf("config file: %w", err)}
		}
		if len(b) > 1<<20 {
			return usageError{fmt.Errorf("config file %s: larger than 1 MiB", l.configFile)}
		}
		md, err := toml.Decode(string(b), &c)
		if err != nil {
			return usageError{fmt.Errorf("config file %s: %w", l.configFile, err)}
		}
		if un := md.Undecoded(); len(un) > 0 {
			keys := make([]string, len(un))
			for i, k := range un {
				keys[i] = k.String()
			}
			return usageError{fmt.Errorf("config file %s: unknown keys %s", l.configFile, strings.Join(keys, ", "))}
		}
	}
	l.fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "approval-threshold":
			c.CreateOrderThresholdMinor = l.approvalThreshold
		case "max-recipients":
			c.MaxRecipients = l.maxRecipients
		case "approval-ttl":
			c.ApprovalTTL.Duration = l.approvalTTL
		case "orders-api-safe-retry":
			c.OrdersAPI.SafeRetry = l.ordersSafeRetry
		case "orders-api-timeout":
			c.OrdersAPI.Timeout.Duration = l.ordersTimeout
		}
	})
	if l.ordersAPI != "" {
		c.OrdersAPI.URL = l.ordersAPI
	}
	if l.notifyWebhook != "" {
		c.Notifications.WebhookURL = l.notifyWebhook
	}
	if l.outboxFormat != "" {
		c.Notifications.OutboxFormat = l.outboxFormat
	}
	if l.approvalWebhook != "" {
		c.Approvals.NotifyWebhook = l.approvalWebhook
	}
	if v := env("IDEMGATE_APPROVAL_NOTIFY_SECRET", ""); v != "" {
		c.Approvals.NotifySecret = v
	}
	if l.publicURL != "" {
		c.Console.PublicURL = l.publicURL
	}
	if l.checkpointKey != "" {
		c.Audit.CheckpointKey = l.checkpointKey
	}
	var errs []error
	switch f := c.Notifications.OutboxFormat; {
	case f == "":
		c.Notifications.OutboxFormat = outboxFiles
	case f != outboxFiles && f != outboxSegments:
		errs = append(errs, fmt.Errorf("[notifications] outbox_format / --outbox-format %q: want %s or %s", f, outboxFiles, outboxSegments))
	case f == outboxSegments && c.Notifications.WebhookURL != "":
		errs = append(errs, errors.New("[notifications] outbox_format = segments is for the outbox directory, and webhook_url (--notify-webhook) sends notifications to a gateway instead: set one of them"))
	}
	if c.Console.PublicURL != "" {
		u, err := approvals.CheckPublicURL(c.Console.PublicURL)
		if err != nil {
			errs = append(errs, fmt.Errorf("[console] public_url / --public-url: %w", err))
		}
		c.Console.PublicURL = u
	}
	if t := c.Console.TraceURL; t != "" {
		if u, err := url.Parse(strings.NewReplacer("{trace_id}", "0", "{span_id}", "0").Replace(t)); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || !strings.Contains(t, "{trace_id}") {
			errs = append(errs, fmt.Errorf("[console] trace_url %q: want an http(s) URL with {trace_id} where a trace's id goes", t))
		}
	}
	if v := env("IDEMGATE_AUTH_INTROSPECTION_SECRET", ""); v != "" {
		c.Auth.IntrospectionClientSecret = v
	}
	if v := env("IDEMGATE_AUTH_CONSOLE_SECRET", ""); v != "" {
		c.Auth.ConsoleClientSecret = v
	}
	if c.Auth.Enabled() {
		if _, err := server.NewOAuth(c.Auth, nil); err != nil {
			errs = append(errs, err)
		}
	}
	if c.Approvals.NotifyWebhook != "" && c.Console.PublicURL == "" {
		errs = append(errs, errors.New("[approvals] notify_webhook needs [console] public_url (or --public-url): each notice links to the approval's console page"))
	}
	if err := c.Policy.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("policy: %w", err))
	}
	if t := c.OrdersAPI.Timeout.Duration; t <= 0 || t > 5*time.Minute {
		errs = append(errs, fmt.Errorf("orders API timeout must be between 0 and 5m, got %s", t))
	}
	for name, d := range map[string]time.Duration{"retention": l.retention, "tombstone-retention": l.tombstoneRetention, "suspect-window": l.suspectWindow, "lease": l.lease} {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("--%s must be positive, got %s", name, d))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return usageError{err}
	}
	l.file = c
	return nil
}

// openService opens the ledger and builds the tool service over it with
// the configured downstreams: the order API (or the embedded store) and the
// notification sink (webhook gateway, or files or segments in outboxDir,
// by default "outbox" beside the ledger). The caller closes the store.
func (l *settings) openService(outboxDir string, wait time.Duration, logger *slog.Logger) (ledger.Store, *tools.Service, error) {
	return l.openServiceMode(false, outboxDir, wait, logger)
}

// openServiceMode is openService, with the ledger opened read-only when
// readOnly is set (approvals list and show): the store never writes, and
// the notification sink refuses to deliver rather than create its
// directory.
func (l *settings) openServiceMode(readOnly bool, outboxDir string, wait time.Duration, logger *slog.Logger) (ledger.Store, *tools.Service, error) {
	if l.hosted != nil {
		store, svc := l.hostedOpen()
		return store, svc, nil
	}
	open := l.open
	if readOnly {
		open = l.openReadOnly
	}
	store, err := open()
	if err != nil {
		return nil, nil, err
	}
	if !readOnly && l.file.RequireApproverToken {
		if err := setApproverTokenRule(context.Background(), store, true); err != nil {
			store.Close()
			return nil, nil, fmt.Errorf("recording require_approver_token in the ledger: %w", err)
		}
	}
	if outboxDir == "" {
		outboxDir = filepath.Join(l.dataDir(), "outbox")
	}
	if readOnly {
		l.readOnlySink = true
	}
	svc, err := l.service(store, outboxDir, wait, logger)
	if err != nil {
		store.Close()
		return nil, nil, err
	}
	return store, svc, nil
}

// quietLogger logs warnings and errors to w: for one-shot commands.
func quietLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// declarations are the declared tools of the configuration: its
// [[tools]], then those of tools_dir.
func (l *settings) declarations() ([]declared.Decl, error) {
	ds := slices.Clone(l.file.Tools)
	dir := "."
	if l.configFile != "" {
		dir = filepath.Dir(l.configFile)
	}
	declared.Locate(ds, dir)
	if d := l.file.ToolsDir; d != "" {
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		more, err := declared.LoadDir(d)
		if err != nil {
			return nil, usageError{err}
		}
		ds = append(ds, more...)
	}
	return ds, nil
}

// declaredTools builds the declared tools of the configuration, and the
// validator that knows their input schemas beside the built-in ones.
func (l *settings) declaredTools() ([]*declared.Tool, *schemas.Validator, error) {
	v, err := schemas.New()
	if err != nil {
		return nil, nil, err
	}
	ds, err := l.declarations()
	if err != nil || len(ds) == 0 {
		return nil, v, err
	}
	env := declared.Environ(os.LookupEnv)
	if l.readOnlySink {
		env = nil // a read-only command sends nothing: it needs no secret
	}
	built, err := declared.Build(ds, v.Tools(), env)
	if err != nil {
		return nil, nil, usageError{fmt.Errorf("declared tools:\n%w", err)}
	}
	extra := fstest.MapFS{}
	for _, t := range built {
		extra[t.Name()+".json"] = &fstest.MapFile{Data: t.InputSchema()}
		if l.tel != nil {
			t.WrapTransport(l.tel.Transport)
		}
	}
	if v, err = schemas.NewWith(extra); err != nil {
		return nil, nil, usageError{fmt.Errorf("declared tools: %w", err)}
	}
	return built, v, nil
}

func (l *settings) service(store ledger.Store, outboxDir string, wait time.Duration, logger *slog.Logger) (*tools.Service, error) {
	built, v, err := l.declaredTools()
	if err != nil {
		return nil, err
	}
	opts := tools.Options{WaitInProgress: wait, OutboxDir: outboxDir, Logger: logger, Policy: &l.file.Policy,
		Lease: l.lease, CallTimeout: l.file.OrdersAPI.Timeout.Duration, Telemetry: l.tel}
	for _, t := range built {
		opts.Declared = append(opts.Declared, t.Declared())
	}
	if u := l.file.OrdersAPI.URL; u != "" {
		api, err := orders.NewAPI(u, l.file.OrdersAPI.Timeout.Duration, l.file.OrdersAPI.SafeRetry)
		if err != nil {
			return nil, usageError{err}
		}
		if l.tel != nil {
			api.WrapTransport(l.tel.Transport)
		}
		opts.OrdersAPI = api
	}
	if u := l.file.Notifications.WebhookURL; u != "" {
		sink, err := outbox.NewWebhookSink(u, 10*time.Second)
		if err != nil {
			return nil, usageError{err}
		}
		if l.tel != nil {
			sink.WrapTransport(l.tel.Transport)
		}
		opts.Sink = sink
	} else if l.file.Notifications.OutboxFormat == outboxSegments && !l.readOnlySink {
		sink, err := outbox.NewSegmentSink(outboxDir, logger)
		if err != nil {
			return nil, err
		}
		opts.Sink, l.segments = sink, sink
	}
	if u := l.file.Approvals.NotifyWebhook; u != "" {
		sink, err := outbox.NewNoticeSink(u, 10*time.Second, l.file.Approvals.NotifySecret)
		if err != nil {
			return nil, usageError{fmt.Errorf("[approvals] notify_webhook: %w", err)}
		}
		if l.tel != nil {
			sink.WrapTransport(l.tel.Transport)
		}
		opts.NoticeSink, opts.ConsoleURL = sink, l.file.Console.PublicURL
	}
	if l.readOnlySink {
		opts.Sink = readOnlySink{}
		opts.NoticeSink = nil
	}
	return tools.New(store, v, opts)
}

// The formats of the outbox directory ([notifications] outbox_format).
// Files stay the default: consumers that watch the directory for one file
// per message keep working on an upgrade.
const (
	outboxFiles    = "files"    // <outbox-dir>/<message_id>.json (outbox.DirSink)
	outboxSegments = "segments" // <outbox-dir>/segments/<seq>.jsonl (outbox.SegmentSink)
)

// usageError is a mistake in how a command was called: run prints it
// and exits with status 2.
type usageError struct{ error }

// open opens the ledger for reading and writing, creating a new one only
// where no file exists (see bolt.Open). A postgres:// URL opens the
// PostgreSQL ledger instead (see postgres.Open): serve migrates its schema,
// every other command needs a database that already holds a ledger.
func (l *settings) open() (ledger.Store, error) {
	if l.hosted != nil {
		store, _ := l.hostedOpen()
		return store, nil
	}
	if l.db == "" {
		return nil, usageError{errors.New("--db is empty and no data directory could be found; pass --db PATH")}
	}
	if err := l.load(); err != nil {
		return nil, err
	}
	if postgres.IsURL(l.db) {
		if l.mayCreate {
			return asPG(postgres.Open(l.db, l.ledgerOptions()))
		}
		return asPG(postgres.OpenExisting(l.db, l.ledgerOptions()))
	}
	if !l.mayCreate {
		return l.asFile(bolt.OpenExisting(l.db, l.ledgerOptions(), l.boltWait()...))
	}
	if err := os.MkdirAll(filepath.Dir(l.db), 0o700); err != nil {
		return nil, fmt.Errorf("ledger directory: %w", err)
	}
	return l.asFile(bolt.Open(l.db, l.ledgerOptions(), l.boltWait()...))
}

// openReadOnly opens an existing ledger for reading only: the file is
// opened read-only and never written, nothing is created (see
// bolt.OpenReadOnly; for a postgres:// URL, postgres.OpenReadOnly). The
// read commands use it.
func (l *settings) openReadOnly() (ledger.Store, error) {
	if l.hosted != nil {
		store, _ := l.hostedOpen()
		return store, nil
	}
	if l.db == "" {
		return nil, usageError{errors.New("--db is empty and no data directory could be found; pass --db PATH")}
	}
	if err := l.load(); err != nil {
		return nil, err
	}
	if postgres.IsURL(l.db) {
		return asPG(postgres.OpenReadOnly(l.db, l.ledgerOptions()))
	}
	return l.asFile(bolt.OpenReadOnly(l.db, l.ledgerOptions(), l.boltWait()...))
}

// boltWait is the option of l.wait, if set.
func (l *settings) boltWait() []bolt.OpenOption {
	if l.wait > 0 {
		return []bolt.OpenOption{bolt.Wait(l.wait)}
	}
	return nil
}

// asFile is asStore, saying so when the ledger file is held because it is
// another user's (every process of one ledger runs as one user).
func (l *settings) asFile(f *bolt.File, err error) (ledger.Store, error) {
	if errors.Is(err, bolt.ErrLocked) {
		if uerr := owner.CheckFileUser(l.db, "ledger "+l.db+", which another process has open,"); uerr != nil {
			return nil, uerr
		}
	}
	return asStore(f, err)
}

// asStore returns f as a ledger.Store: nil (not a nil *bolt.File) on error.
func asStore(f *bolt.File, err error) (ledger.Store, error) {
	if err != nil {
		return nil, err
	}
	return f, nil
}

// asPG is asStore for a PostgreSQL ledger.
func asPG(d *postgres.DB, err error) (ledger.Store, error) {
	if err != nil {
		return nil, err
	}
	return d, nil
}

// dataDir is the directory of the files kept beside the ledger (the
// notification outbox, tokens.json): the ledger file's directory, or, for
// a PostgreSQL ledger, the default data directory.
func (l *settings) dataDir() string {
	return dataDirOf(l.db)
}

func dataDirOf(db string) string {
	if postgres.IsURL(db) {
		return filepath.Dir(defaultDB())
	}
	return filepath.Dir(db)
}

func (l *settings) ledgerOptions() ledger.Options {
	return ledger.Options{
		Retention: l.retention, TombstoneRetention: l.tombstoneRetention,
		SuspectWindow: l.suspectWindow, RequireIssuedKeys: l.requireIssued,
		ApprovalTTL: l.file.ApprovalTTL.Duration, Lease: l.lease, Observe: l.observe,
	}
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
