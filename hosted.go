package main

// Commands run by the owner of their ledger file. When a process owns a
// ledger file (see package owner and ownerCmd), the commands that use the
// ledger — ops, approvals, audit, stats, outbox, reconcile, resolve,
// backup, check, and serve --http and the console — do not open the file:
// they send themselves to the owner, which runs them over its ledger and
// sends back what they write and their exit status. A command given a
// setting of the ledger's configuration that differs from the owner's is
// refused, naming it.

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/postgres"
	"idemgate/owner"
	"idemgate/tools"
)

// owned is the ledger this process owns, when it is an owner: set by
// ownerCmd before it serves, nil in every other process.
var owned *ownedLedger

// ownedLedger is the owner's ledger and the service over it, which the
// commands it runs share.
type ownedLedger struct {
	o         *serveOptions
	place     owner.Place
	store     ledger.Store
	svc       *tools.Service
	observers *auditObservers
}

// auditObservers passes each audit entry the owner's ledger writes to the
// observers registered now (the metrics of the serve --http it runs).
type auditObservers struct {
	mu   sync.Mutex
	next int
	fns  map[int]func(ledger.AuditEntry)
}

func (a *auditObservers) observe(e ledger.AuditEntry) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, fn := range a.fns {
		fn(e)
	}
}

// add registers fn until the returned func is called.
func (a *auditObservers) add(fn func(ledger.AuditEntry)) (remove func()) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fns == nil {
		a.fns = map[int]func(ledger.AuditEntry){}
	}
	a.next++
	id := a.next
	a.fns[id] = fn
	return func() {
		a.mu.Lock()
		defer a.mu.Unlock()
		delete(a.fns, id)
	}
}

// hostedStore is the owner's ledger as a command it runs has it: closing
// it leaves the ledger open (and ends the command's audit observer).
type hostedStore struct {
	ledger.Store
	remove func()
}

func (h hostedStore) Close() error {
	if h.remove != nil {
		h.remove()
	}
	return nil
}

// host makes l the owner's settings (the command's were checked against
// them), with opens that return the owner's ledger and service.
func (l *settings) host(o *ownedLedger) {
	mine := *l
	*l = o.o.lf
	l.fs, l.observe, l.hosted = mine.fs, mine.observe, o
	if flagSet(l.fs, "audit-checkpoint-key") {
		l.checkpointKey, l.file.Audit.CheckpointKey = mine.checkpointKey, mine.checkpointKey
	}
	if flagSet(l.fs, "public-url") {
		l.publicURL, l.file.Console.PublicURL = mine.publicURL, mine.publicURL
	}
}

// commandsOwn are settings of serve that a command other than serve uses
// for itself, not the ledger: the key audit verify checks checkpoints
// with (export signs with), the address people open the console at. The
// owner does not compare them, and the command keeps its own.
var commandsOwn = map[string]bool{"audit-checkpoint-key": true, "public-url": true}

// hostedOpen is the owner's ledger and service for a command it runs.
func (l *settings) hostedOpen() (ledger.Store, *tools.Service) {
	// The command sees every audit entry of the calls answered before it
	// (replays and refusals are buffered for a moment), as a command that
	// opened the file after their server ended would.
	if f, ok := l.hosted.store.(interface{ FlushAudit() error }); ok {
		f.FlushAudit()
	}
	h := hostedStore{Store: l.hosted.store}
	if l.observe != nil {
		h.remove = l.hosted.observers.add(l.observe)
	}
	l.segments = l.hosted.o.lf.segments
	return h, l.hosted.svc
}

// The environment of a command the owner runs. Flags take their defaults
// from IDEMGATE_ variables (env) when they are registered; a command run
// for a client must see the client's, not the owner's. The owner runs
// one command's flag registration and parsing at a time, under cmdEnvMu,
// with cmdEnv set to the client's variables; the command gives the lock
// up once parsed (when it asks whether to run in the owner) or when it
// returns.
var (
	cmdEnvMu sync.Mutex
	cmdEnv   atomic.Pointer[commandEnv]
)

type commandEnv struct {
	vars    map[string]string
	release func() // gives cmdEnvMu up, once
}

// env is the variable name of this process's environment, or of the
// client's while the owner parses a command it runs for one; def when
// unset or empty.
func env(name, def string) string {
	if e := cmdEnv.Load(); e != nil {
		if v := e.vars[name]; v != "" {
			return v
		}
		return def
	}
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// runHosted runs, in the owner, a command a client sent (hello's Command
// and Env), writing to out, and returns its exit status. ctx ends when
// the client closes its side.
func runHosted(ctx context.Context, words []string, vars map[string]string, out *owner.Output) int {
	if len(words) == 0 || !hostedCommands[words[0]] {
		fmt.Fprintf(out.Stderr(), "idemgate: the owner of a ledger runs only its commands (ops, approvals, …), not %q\n", words)
		return 2
	}
	cmdEnvMu.Lock()
	var once sync.Once
	e := &commandEnv{vars: vars, release: func() {
		once.Do(func() {
			cmdEnv.Store(nil)
			cmdEnvMu.Unlock()
		})
	}}
	cmdEnv.Store(e)
	defer e.release()
	return run(ctx, words, strings.NewReader(""), out.Stdout(), out.Stderr())
}

// hostedCommands are the commands an owner runs for its clients: those
// that call throughOwner.
var hostedCommands = map[string]bool{
	"ops": true, "approvals": true, "audit": true, "stats": true, "outbox": true, "reconcile": true,
	"resolve": true, "backup": true, "check": true, "console": true, "serve": true,
}

// exitStatus is the exit status of a command the owner ran; run exits
// with it (the command's own output already said why).
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// throughOwner is a command that runs in the owner of its ledger file
// when one serves it.
type throughOwner struct {
	words []string      // the command's words: "approvals", "approve"
	fs    *flag.FlagSet // its flags, parsed
	args  []string      // its arguments, paths among them absolute
	db    string        // its ledger
	lf    *settings     // its settings, if it has them
	// lasting: serve --http or the console, which start an owner when
	// none runs (a long-running process does not hold the file itself)
	// and start one again when it ends.
	lasting bool
	// config is what the owner compares: by default the settings of the
	// ledger's configuration the command was given (configGiven).
	config map[string]string
	// ownerArgs start an owner (lasting commands).
	ownerArgs []string
}

// run returns nil when the command is to run in this process: no owner
// serves its ledger (a command that is not lasting then opens the file
// itself), or this process is the owner. Otherwise it runs the command in
// the owner, copying its output to stdout and stderr, and returns its exit
// status as an exitStatus, or why it could not.
func (t throughOwner) run(ctx context.Context, stdout, stderr io.Writer) error {
	if t.db == "" || postgres.IsURL(t.db) {
		return nil
	}
	if e := cmdEnv.Load(); owned != nil && e != nil {
		// This process is the owner, running the command for a client.
		e.release()
		if p, err := owner.PlaceOf(t.db); err != nil || p.Ledger != owned.place.Ledger {
			return fmt.Errorf("the owner of %s was asked about ledger %s", owned.place.Ledger, t.db)
		}
		if t.lf != nil {
			t.lf.host(owned)
		}
		return nil
	}
	place, err := owner.PlaceOf(t.db)
	if err != nil {
		return nil // the command says what is wrong with the path
	}
	argv, err := t.argv()
	if err != nil {
		return err
	}
	config := t.config
	if config == nil {
		if config, err = configGiven(t.fs); err != nil {
			return err
		}
	}
	if v := os.Getenv("IDEMGATE_APPROVAL_NOTIFY_SECRET"); v != "" {
		config["IDEMGATE_APPROVAL_NOTIFY_SECRET's sha256"] = digest([]byte(v))
	}
	hello := owner.Hello{Command: argv, Env: clientEnv(place.Ledger), Config: config}
	start := func() error { return owner.ErrNoOwner }
	if t.lasting {
		if t.ownerArgs == nil {
			c := maps.Clone(config)
			c["--db"] = place.Ledger
			t.ownerArgs = ownerArgs(c)
		}
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		start = func() error { return owner.Start(exe, t.ownerArgs, ownerEnv()) }
	}
	for {
		c, err := owner.Connect(place, hello, start)
		if errors.Is(err, owner.ErrNoOwner) {
			return nil
		}
		var refused *owner.RefusedError
		if errors.As(err, &refused) {
			return errors.New(refused.Reason)
		}
		if err != nil {
			return err
		}
		if t.lasting {
			fmt.Fprintf(stderr, "idemgate: %s runs in the process that owns ledger %s (pid %d; its log: %s)\n", t.words[0], place.Ledger, c.Welcome.PID, place.Log)
		}
		code, err := relay(ctx, c, stdout, stderr)
		if err == nil {
			return exitStatus(code)
		}
		if !errors.Is(err, owner.ErrOwnerGone) {
			return err
		}
		if !t.lasting {
			return fmt.Errorf("the ledger's owner (pid %d) ended before %s did: what it changed is in the ledger (idemgate ops list); run it again to see", c.Welcome.PID, strings.Join(t.words, " "))
		}
		if ctx.Err() != nil {
			return nil
		}
		fmt.Fprintf(stderr, "idemgate: the ledger's owner (pid %d) ended; starting another and %s in it again\n", c.Welcome.PID, strings.Join(t.words, " "))
		time.Sleep(100 * time.Millisecond)
	}
}

// relay copies the output of the command running on c until its exit
// status; when ctx ends first it asks the command to stop (closing this
// side of c) and waits for the status still.
func relay(ctx context.Context, c *owner.Conn, stdout, stderr io.Writer) (int, error) {
	defer c.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			c.CloseWrite()
		case <-done:
		}
	}()
	return owner.Relay(c.R, stdout, stderr)
}

// pathFlags are the flags whose values are files: the owner runs in
// another directory, so they are sent absolute.
var pathFlags = map[string]bool{
	"db": true, "config": true, "outbox-dir": true, "tokens": true, "archive": true,
	"checkpoint": true, "export": true, "audit-checkpoint-key": true, "out": true,
}

// argv is the command as the owner runs it: its words, the flags it was
// given (paths absolute; a repeated flag once per value), then its
// arguments after "--".
func (t throughOwner) argv() ([]string, error) {
	argv := append([]string{}, t.words...)
	var err error
	t.fs.Visit(func(f *flag.Flag) {
		values := []string{f.Value.String()}
		if l, ok := f.Value.(*stringList); ok {
			values = *l
		}
		for _, v := range values {
			if pathFlags[f.Name] && v != "" && !postgres.IsURL(v) {
				abs, aerr := filepath.Abs(v)
				if aerr != nil {
					err = aerr
				}
				v = abs
			}
			argv = append(argv, "--"+f.Name+"="+v)
		}
	})
	return append(append(argv, "--"), t.args...), err
}

// configGiven is the part of the ledger's configuration a command was
// given on its command line: the flags it shares with serve that are not
// per client (paths absolute), and the configuration file's digest.
func configGiven(fs *flag.FlagSet) (map[string]string, error) {
	c := map[string]string{}
	var err error
	fs.Visit(func(f *flag.Flag) {
		if !serveFlags()[f.Name] || perClient[f.Name] || commandsOwn[f.Name] {
			return
		}
		v := f.Value.String()
		if pathFlags[f.Name] && v != "" && !postgres.IsURL(v) {
			if v, err = filepath.Abs(v); err != nil {
				return
			}
		}
		c["--"+f.Name] = v
		if f.Name == "config" {
			b, rerr := os.ReadFile(v)
			if rerr != nil {
				err = usageError{fmt.Errorf("config file: %w", rerr)}
				return
			}
			c["the configuration file's sha256"] = digest(b)
		}
	})
	return c, err
}

// serveFlags are the names of serve's flags.
var serveFlags = sync.OnceValue(func() map[string]bool {
	names := map[string]bool{}
	o := &serveOptions{}
	o.flags(io.Discard).VisitAll(func(f *flag.Flag) { names[f.Name] = true })
	return names
})

// clientEnv is this process's IDEMGATE_ variables, for a command the
// owner runs: paths absolute, IDEMGATE_DB the ledger's.
func clientEnv(ledger string) map[string]string {
	vars := map[string]string{}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, "IDEMGATE_") || v == "" {
			continue
		}
		switch k {
		case "IDEMGATE_CONFIG", "IDEMGATE_OUTBOX_DIR", "IDEMGATE_TOKENS", "IDEMGATE_AUDIT_CHECKPOINT_KEY":
			if abs, err := filepath.Abs(v); err == nil {
				v = abs
			}
		}
		vars[k] = v
	}
	vars["IDEMGATE_DB"] = ledger
	return vars
}

// inOwner runs a command with settings l in the owner of its ledger file
// when one serves it (see throughOwner.run): words are the command's,
// args its arguments. nil: run it here.
func (l *settings) inOwner(fs *flag.FlagSet, stdout, stderr io.Writer, words []string, args ...string) error {
	return throughOwner{words: words, fs: fs, args: args, db: l.db, lf: l}.run(context.Background(), stdout, stderr)
}
