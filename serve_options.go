package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"

	"idemgate/declared"
	"idemgate/ledger"
	"idemgate/ledger/postgres"
	"idemgate/owner"
	"idemgate/server"
	"idemgate/tools"
)

// serveOptions are serve's flags, parsed and checked; the owner of a
// ledger file parses the same.
type serveOptions struct {
	fs              *flag.FlagSet
	lf              settings
	id              server.Identity
	outbox          string
	wait            time.Duration
	workers         int
	level           slog.Level
	httpAddr        string
	tokensFile      string
	token           string
	allowedOrigins  string
	sessionIdle     time.Duration
	maxSessions     int
	bodyTimeout     time.Duration
	checkpointEvery time.Duration
	authLimit       int
	ownLedger       bool
	logLevel        string
	authLimitFlag   *int
}

// perClient are the flags of serve that are not the ledger's
// configuration: who a stdio client acts as, how many calls it may run at
// once, its logging, and the flags of --http. A pipe passes the rest to
// the owner, which refuses a client whose rest differs from its own.
var perClient = map[string]bool{
	"principal": true, "tenant": true, "role": true, "on-behalf-of": true, "model": true,
	"token": true, "tokens": true, "workers": true, "log-level": true, "own-ledger": true,
	"http": true, "allowed-origins": true, "session-idle-timeout": true,
	"max-sessions-per-token": true, "http-body-timeout": true, "auth-failure-limit": true,
}

// parseServe parses and checks serve's flags (name is the command's, for
// messages) and loads the configuration file.
func parseServe(name string, args []string, stderr io.Writer) (*serveOptions, error) {
	o := &serveOptions{}
	fs := o.flags(stderr)
	fs.Init(name, flag.ContinueOnError)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.authLimit = *o.authLimitFlag
	if fs.NArg() > 0 {
		return nil, usageError{fmt.Errorf("%s takes no arguments, got %q", name, fs.Args())}
	}
	if err := o.level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, usageError{fmt.Errorf("--log-level %q: want debug, info, warn or error", o.logLevel)}
	}
	if err := o.id.Validate(); err != nil {
		return nil, usageError{err}
	}
	switch {
	case o.workers < 1 || o.workers > 100:
		return nil, usageError{fmt.Errorf("--workers must be 1-100, got %d", o.workers)}
	case o.wait <= 0 || o.wait > 5*time.Minute:
		return nil, usageError{fmt.Errorf("--wait must be between 0 and 5m, got %s", o.wait)}
	case o.sessionIdle < time.Second || o.sessionIdle > 30*24*time.Hour:
		return nil, usageError{fmt.Errorf("--session-idle-timeout must be between 1s and 720h, got %s", o.sessionIdle)}
	case o.maxSessions < 1 || o.maxSessions > 10000:
		return nil, usageError{fmt.Errorf("--max-sessions-per-token must be 1-10000, got %d", o.maxSessions)}
	case o.authLimit < 0:
		return nil, usageError{fmt.Errorf("--auth-failure-limit must be 0 (never pause) or more, got %d", o.authLimit)}
	case o.bodyTimeout < 100*time.Millisecond || o.bodyTimeout > 10*time.Minute:
		return nil, usageError{fmt.Errorf("--http-body-timeout must be between 100ms and 10m, got %s", o.bodyTimeout)}
	case o.checkpointEvery < 100*time.Millisecond || o.checkpointEvery > 24*time.Hour:
		return nil, usageError{fmt.Errorf("--audit-checkpoint-every must be between 100ms and 24h, got %s", o.checkpointEvery)}
	}
	if err := o.lf.load(); err != nil {
		return nil, err
	}
	return o, nil
}

// flags registers serve's flags in a new flag set writing to stderr.
func (o *serveOptions) flags(stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.fs = fs
	o.lf.register(fs)
	id := &o.id
	fs.StringVar(&id.Principal, "principal", env("IDEMGATE_PRINCIPAL", "local-agent"), "who this server acts for (env IDEMGATE_PRINCIPAL)")
	fs.StringVar(&id.Tenant, "tenant", env("IDEMGATE_TENANT", "default"), "tenant whose operations this server sees (env IDEMGATE_TENANT)")
	fs.StringVar(&id.Role, "role", env("IDEMGATE_ROLE", "agent"), "agent or approver (env IDEMGATE_ROLE)")
	fs.StringVar(&id.OnBehalfOf, "on-behalf-of", env("IDEMGATE_ON_BEHALF_OF", ""), "stdio: the user this agent acts for, recorded on every audit entry (env IDEMGATE_ON_BEHALF_OF; over --http the token's)")
	fs.StringVar(&id.Model, "model", env("IDEMGATE_MODEL", ""), "stdio: the model driving this agent, recorded on every audit entry (env IDEMGATE_MODEL; over --http the token's)")
	fs.StringVar(&o.outbox, "outbox-dir", env("IDEMGATE_OUTBOX_DIR", ""), "directory the notification sink writes messages into, as --outbox-format says (default: 'outbox' beside --db)")
	fs.DurationVar(&o.wait, "wait", 5*time.Second, "how long a duplicate call waits for a running operation before answering in_progress")
	fs.IntVar(&o.workers, "workers", 32, "concurrent tool calls (1-100)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error (logs go to stderr)")
	fs.StringVar(&o.httpAddr, "http", env("IDEMGATE_HTTP", ""), "serve Streamable HTTP on this address (e.g. 127.0.0.1:8080) instead of stdio; identities come from --tokens (env IDEMGATE_HTTP)")
	fs.StringVar(&o.tokensFile, "tokens", env("IDEMGATE_TOKENS", ""), "bearer tokens file for --http (default: tokens.json beside --db; create entries with idemgate tokens add)")
	fs.StringVar(&o.token, "token", env("IDEMGATE_TOKEN", ""), "stdio: a token from --tokens whose principal, tenant and role this server acts as; required for --role approver when the config sets require_approver_token (prefer env IDEMGATE_TOKEN)")
	fs.StringVar(&o.allowedOrigins, "allowed-origins", env("IDEMGATE_ALLOWED_ORIGINS", ""), "with --http: comma-separated browser origins (scheme://host[:port]) allowed besides the server's own; a request with any other Origin gets 403 (env IDEMGATE_ALLOWED_ORIGINS)")
	fs.DurationVar(&o.sessionIdle, "session-idle-timeout", server.DefaultSessionIdleTimeout, "with --http: a session unused this long ends (its id then gets 404)")
	fs.IntVar(&o.maxSessions, "max-sessions-per-token", server.DefaultMaxSessionsPerToken, "with --http: sessions one token may hold; a new one ends the token's least recently used")
	fs.DurationVar(&o.bodyTimeout, "http-body-timeout", server.DefaultBodyTimeout, "with --http: how long a client may take to send one request body")
	fs.DurationVar(&o.checkpointEvery, "audit-checkpoint-every", time.Minute, "with --audit-checkpoint-key: how often a signed checkpoint of the audit chain's head is logged (to stderr) when the chain grew; one more is logged at shutdown")
	fs.BoolVar(&o.ownLedger, "own-ledger", false, "stdio on a ledger file: open the file in this process instead of passing the calls to the process that owns it (which serve starts when none runs, and which every serve on the file shares); for a supervisor or container that runs one server per ledger")
	o.authLimitFlag = authFailureLimitFlag(fs)
	return fs
}

// piped reports whether this serve passes its client's calls to the
// ledger's owner: stdio on a ledger file, unless --own-ledger.
func (o *serveOptions) piped() bool {
	return o.httpAddr == "" && !o.ownLedger && !postgres.IsURL(o.lf.db)
}

// grace is how long a shutdown waits for the calls in flight to be
// answered: longer than one call to the order API plus a duplicate's wait
// for a running operation, so a call that has just started still gets its
// result (or its recorded unknown outcome) back; a declared tool's
// request counts with its own timeout.
func (o *serveOptions) grace() time.Duration {
	call := o.lf.file.OrdersAPI.Timeout.Duration
	if ds, err := o.lf.declarations(); err == nil {
		call = max(call, declared.LongestTimeout(ds))
	}
	return shutdownGrace(call, o.wait)
}

// configuration is the ledger's configuration as this serve has it, flag
// by flag (every flag but perClient's, paths made absolute), with the
// digests of the configuration file and of the approvals' signing secret
// from the environment. Owner and pipes compare it.
func (o *serveOptions) configuration() (map[string]string, error) {
	c := map[string]string{}
	o.fs.VisitAll(func(f *flag.Flag) {
		if !perClient[f.Name] {
			c["--"+f.Name] = f.Value.String()
		}
	})
	for _, name := range []string{"--db", "--config", "--outbox-dir", "--audit-checkpoint-key"} {
		if v := c[name]; v != "" && !postgres.IsURL(v) {
			abs, err := filepath.Abs(v)
			if err != nil {
				return nil, err
			}
			c[name] = abs
		}
	}
	if f := o.lf.configFile; f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, usageError{fmt.Errorf("config file: %w", err)}
		}
		c["the configuration file's sha256"] = digest(b)
	}
	if ds, err := o.lf.declarations(); err == nil && len(ds) > 0 {
		// Declared tools (tools_dir's files too) and their secrets, as
		// this process would run them.
		c["the declared tools' sha256"] = declared.Digest(ds, os.LookupEnv)
	}
	if v := os.Getenv("IDEMGATE_APPROVAL_NOTIFY_SECRET"); v != "" {
		c["IDEMGATE_APPROVAL_NOTIFY_SECRET's sha256"] = digest([]byte(v))
	}
	return c, nil
}

// ownerPlace is where the owner of this serve's ledger file listens, and
// the configuration owner and pipes compare.
func (o *serveOptions) ownerPlace() (owner.Place, map[string]string, error) {
	place, err := owner.PlaceOf(o.lf.db)
	if err != nil {
		return place, nil, usageError{err}
	}
	config, err := o.configuration()
	return place, config, err
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// startLoops starts, in bg, what a process serving a ledger runs beside
// the calls: the audit checkpoints (with a key), the outbox's deliverer,
// and the retention sweep and reconciliation, which one process at a time
// runs among those on the ledger.
func startLoops(bg *loops, o *serveOptions, store ledger.Store, svc *tools.Service, stderr io.Writer, logger *slog.Logger) error {
	lf := &o.lf
	if name := lf.file.Audit.CheckpointKey; name != "" {
		key, err := loadCheckpointKey(name)
		if err != nil {
			return usageError{err}
		}
		if key.priv == nil {
			return usageError{fmt.Errorf("audit checkpoint key %s is a public key: serve signs checkpoints with the private key", name)}
		}
		bg.Go(func(ctx context.Context) { checkpointLoop(ctx, store, key.priv, o.checkpointEvery, stderr, logger) })
	}
	bg.Go(svc.Deliverer().Run)
	holder := uuid.NewString()
	bg.Go(func(ctx context.Context) {
		sweepLoop(ctx, store, &sharedTask{store: store, name: "retention-sweep", holder: holder, hold: 3 * sweepEvery, log: logger}, logger)
	})
	bg.Go(func(ctx context.Context) {
		task := &sharedTask{store: store, name: "reconcile", holder: holder, hold: max(lf.lease, 3*reconcileEvery(lf.lease)), log: logger}
		reconcileLoop(ctx, svc, lf.lease, task, logger)
	})
	return nil
}
