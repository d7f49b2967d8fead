package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/owner"
	"idemgate/server"
	"idemgate/tools"
)

// ownerArg makes idemgate the owner of a ledger file, as serve starts it
// (see servePipe); not for people.
const ownerArg = "__owner"

// ownerIdleDefault is how long an owner stays with no client before it
// exits (env IDEMGATE_OWNER_IDLE).
const ownerIdleDefault = time.Minute

// ownerTakeOver bounds how long a new owner waits for the ledger while
// the owner before it, which no longer answers, finishes its calls and
// closes it.
const ownerTakeOver = 30 * time.Second

// maxOwnerClients bounds the clients one owner serves at once (each a
// stdio serve, with up to --workers calls of its own); one more is
// refused with a message that says so.
const maxOwnerClients = 256

// servePipe is serve over stdio on a ledger file: it passes its client's
// messages to the process that owns the file, starting one when none
// answers (see package owner). What this process checks itself: its flags
// and configuration file, and the token it was given. The owner checks
// the rest, and refuses a client of another build or configuration.
func servePipe(o *serveOptions, stdin io.Reader, stdout, stderr io.Writer) error {
	lf := &o.lf
	if lf.db == "" {
		return usageError{errors.New("--db is empty and no data directory could be found; pass --db PATH")}
	}
	id := o.id
	verified := false
	if o.token != "" {
		// The token's own identity, checked against the tokens file; the
		// owner checks what the ledger requires of an approver.
		tf := tokenFlags{token: o.token, tokens: o.tokensFile}
		var err error
		if id, err = tf.identity(lf, o.fs, id, false); err != nil {
			return err
		}
		verified = true
	}
	place, config, err := o.ownerPlace()
	if err != nil {
		return err
	}
	hello := owner.Hello{Config: config, Principal: id.Principal, Tenant: id.Tenant, Role: id.Role,
		OnBehalfOf: id.OnBehalfOf, Model: id.Model, TokenVerified: verified, Workers: o.workers}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	args := ownerArgs(config)
	start := func() error { return owner.Start(exe, args, ownerEnv()) }
	connect := func() (*owner.Conn, error) { return owner.Connect(place, hello, start) }
	first, err := connect()
	if err != nil {
		var refused *owner.RefusedError
		if errors.As(err, &refused) {
			return errors.New(refused.Reason)
		}
		return err
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: o.level}))
	logger.Info("serving MCP on stdio through the ledger's owner", "db", lf.db, "owner_pid", first.Welcome.PID, "principal", id.Principal, "tenant", id.Tenant, "role", id.Role)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }()
	return owner.Pipe(ctx, first, owner.PipeConfig{In: stdin, Out: stdout, Connect: connect, Grace: o.grace(), Logger: logger})
}

// ownerArgs are the arguments that start an owner of config.
func ownerArgs(config map[string]string) []string {
	args := []string{ownerArg}
	for name, v := range config {
		if flag, ok := strings.CutPrefix(name, "--"); ok {
			args = append(args, "--"+flag+"="+v)
		}
	}
	return args
}

// ownerEnv is the environment an owner is started with: this process's,
// without the token that says who this client is.
func ownerEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "IDEMGATE_TOKEN=") {
			env = append(env, kv)
		}
	}
	return env
}

// ownerCmd is the owner of a ledger file: it opens the ledger, listens on
// the ledger's socket and serves each client that connects (a serve on
// stdio passing its client's messages) as serve serves its stdio, with
// the client's identity. It runs the background loops a server runs. It
// exits a quiet period (IDEMGATE_OWNER_IDLE, default a minute) after its
// last client left, when its ledger file is removed or replaced, or on
// SIGTERM/SIGINT, answering the calls in flight first.
//
// Until it is ready it reports on its standard error, which the starting
// client reads (owner.Start); from then on it logs to its place's log file.
func ownerCmd(args []string, stderr io.Writer) error {
	setGCDefault()
	idle := ownerIdleDefault
	if v := os.Getenv("IDEMGATE_OWNER_IDLE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 100*time.Millisecond || d > 24*time.Hour {
			return usageError{fmt.Errorf("IDEMGATE_OWNER_IDLE %q: want a duration between 100ms and 24h", v)}
		}
		idle = d
	}
	o, err := parseServe("owner", args, stderr)
	if err != nil {
		return err
	}
	lf := &o.lf
	place, config, err := o.ownerPlace()
	if err != nil {
		return err
	}
	logFile, err := openOwnerLog(place.Log)
	if err != nil {
		return err
	}
	defer logFile.Close()
	// Until it is ready the owner's log goes to the starting client too.
	out := &startingLog{log: logFile, starter: stderr}
	logger := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: o.level}))
	// The tools run here: so do their spans and metrics, configured by
	// the environment of the client that started this owner.
	tel, stopTelemetry, err := startTelemetry(logger)
	if err != nil {
		return usageError{err}
	}
	defer stopTelemetry()
	lf.tel = tel
	lf.mayCreate = true
	observers := &auditObservers{}
	lf.observe = observers.observe
	// The ledger's lock makes this process its owner. Another owner may
	// hold it: one that answers (started beside this one) keeps it; one
	// that is leaving (it no longer answers) is waited for.
	lf.wait = 250 * time.Millisecond
	var (
		store ledger.Store
		svc   *tools.Service
	)
	for deadline := time.Now().Add(ownerTakeOver); ; {
		store, svc, err = lf.openService(o.outbox, o.wait, logger)
		if !errors.Is(err, bolt.ErrLocked) {
			break // opened, or a reason no wait mends (another user's file)
		}
		if c, derr := owner.Dial(place, time.Second); derr == nil {
			c.Close()
			fmt.Fprintln(stderr, owner.Elsewhere)
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("for %s: %w", ownerTakeOver, err)
		}
	}
	if err != nil {
		return err
	}
	owned = &ownedLedger{o: o, place: place, store: store, svc: svc, observers: observers}
	ledgerFile, err := os.Stat(lf.db)
	if err != nil {
		store.Close()
		return err
	}
	bg := newLoops()
	defer func() {
		if cerr := closeAfter(bg, svc, store); cerr != nil {
			logger.Error("shutdown", "err", cerr)
		}
	}()
	ln, err := owner.Listen(place)
	if err != nil {
		return err
	}
	defer ln.Close() // before the ledger closes
	if err := startLoops(bg, o, store, svc, logFile, logger); err != nil {
		return err
	}
	// Ready: from now on everything goes to the log, a panic's trace too.
	out.ready(owner.Ready)
	if err := syscall.Dup2(int(logFile.Fd()), 2); err != nil {
		logger.Warn("standard error to the log", "err", err)
	}
	logger.Info("owning the ledger", "db", lf.db, "socket", place.Socket, "pid", os.Getpid(), "build", owner.Build(), "idle_exit", idle)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() { <-ctx.Done(); stop() }()
	srv := &ownerServer{o: o, config: config, place: place, svc: svc, store: store, log: logger, idle: idle, lastLeft: time.Now(), leave: make(chan string, 1)}
	stopping := make(chan string, 1)
	go func() { stopping <- srv.quiet(ctx, ledgerFile) }()
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	var conns sync.WaitGroup
	go func() {
		for {
			c, err := ln.Accept(func(err error) { logger.Warn("refused a connection", "err", err) })
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer conns.Done()
				srv.serveConn(ctx, c)
			}()
		}
	}()
	why := <-stopping
	logger.Info("owner exiting", "why", why)
	ln.Close() // the ledger is closed last (deferred): a new owner finds no socket of this one
	stop()
	conns.Wait()
	bg.Stop()
	return nil
}

// startingLog is an owner's log, which until the owner is ready its
// starting client reads too (on the owner's standard error).
type startingLog struct {
	mu      sync.Mutex
	log     io.Writer
	starter io.Writer // nil once ready
}

func (w *startingLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.starter != nil {
		w.starter.Write(p)
	}
	return w.log.Write(p)
}

// ready tells the starting client the last line it reads.
func (w *startingLog) ready(line string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Fprintln(w.starter, line)
	w.starter = nil
}

// openOwnerLog opens the owner's log for appending; a log over 10 MiB is
// kept as one older file (.1) and started again.
func openOwnerLog(path string) (*os.File, error) {
	if fi, err := os.Stat(path); err == nil && fi.Size() > 10<<20 {
		os.Rename(path, path+".1")
	}
	return os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
}

// ownerServer serves the clients of one owner.
type ownerServer struct {
	o        *serveOptions
	config   map[string]string
	place    owner.Place
	svc      *tools.Service
	store    ledger.Store
	log      *slog.Logger
	idle     time.Duration
	mu       sync.Mutex
	clients  int
	lastLeft time.Time   // when the last client left (the start, before any came)
	leaving  bool        // the owner is exiting for a client of another build or configuration
	leave    chan string // why the owner is leaving (buffered, one)
}

// quiet returns, with the reason, when the owner should exit: idle for
// s.idle with no client, its ledger file gone or replaced (a new file at
// the path is another ledger), or ctx done.
func (s *ownerServer) quiet(ctx context.Context, ledgerFile os.FileInfo) string {
	check := time.NewTicker(min(s.idle, 2*time.Second))
	defer check.Stop()
	for {
		select {
		case <-ctx.Done():
			return "signal"
		case why := <-s.leave:
			return why
		case <-check.C:
		}
		if fi, err := os.Stat(s.place.Ledger); err != nil || !os.SameFile(fi, ledgerFile) {
			return "the ledger file was removed or replaced"
		}
		s.mu.Lock()
		idle := s.clients == 0 && time.Since(s.lastLeft) >= s.idle
		s.mu.Unlock()
		if idle {
			return "no client for " + s.idle.String()
		}
	}
}

// clientCount is the number of connections served, this one included.
func (s *ownerServer) clientCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clients
}

func (s *ownerServer) isLeaving() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leaving
}

// leaveIfAlone starts the owner's exit when the client asking is its only
// one, within a second (a client that restarts with another configuration
// comes while its earlier connection is still closing), and reports
// whether it is leaving.
func (s *ownerServer) leaveIfAlone() bool {
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		s.mu.Lock()
		if !s.leaving && s.clients == 1 {
			s.leaving = true
			s.leave <- "a client of another build or configuration came, and no other client was connected"
		}
		leaving := s.leaving
		s.mu.Unlock()
		if leaving || time.Now().After(deadline) {
			return leaving
		}
	}
}

// note counts a client that came (+1) or left (-1).
func (s *ownerServer) note(delta int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.clients += delta
	if delta < 0 {
		s.lastLeft = time.Now()
	}
}

// serveConn reads a client's hello, refuses it or welcomes it, and then
// serves its MCP messages as serve serves stdio, as the identity it gave.
func (s *ownerServer) serveConn(ctx context.Context, c *net.UnixConn) {
	s.note(+1)
	defer s.note(-1)
	defer c.Close()
	r := bufio.NewReaderSize(c, 64<<10)
	var h owner.Hello
	if err := owner.Receive(c, r, &h); err != nil {
		level := slog.LevelWarn
		if errors.Is(err, io.ErrUnexpectedEOF) {
			level = slog.LevelDebug // a connection closed unsaid (owner.PID asks so)
		}
		s.log.Log(ctx, level, "a client's hello", "err", err)
		return
	}
	if n := s.clientCount(); n > maxOwnerClients {
		owner.Send(c, owner.Welcome{PID: os.Getpid(), Build: owner.Build(),
			Error: fmt.Sprintf("the owner of ledger %s (pid %d) serves %d clients, its most: end some of the MCP clients using this ledger, then start again", s.place.Ledger, os.Getpid(), maxOwnerClients)})
		return
	}
	if err := owner.Check(h, owner.Build(), s.config, s.place.Ledger); err != nil || s.isLeaving() {
		// A client of another build or configuration: with no other
		// client, make way for an owner of its own.
		w := owner.Welcome{PID: os.Getpid(), Build: owner.Build()}
		if startsOwners(h) {
			w.Leaving = s.leaveIfAlone()
		}
		if err != nil {
			w.Error = err.Error()
		} else {
			w.Error = "the owner of this ledger is exiting"
		}
		s.log.Warn("refused a client", "client_pid", h.PID, "err", w.Error, "leaving", w.Leaving)
		owner.Send(c, w)
		return
	}
	if len(h.Command) > 0 {
		s.runCommand(ctx, c, r, h)
		return
	}
	id, err := s.admit(ctx, h)
	if err != nil {
		s.log.Warn("refused a client", "client_pid", h.PID, "err", err)
		owner.Send(c, owner.Welcome{PID: os.Getpid(), Build: owner.Build(), Error: err.Error()})
		return
	}
	if err := owner.Send(c, owner.Welcome{OK: true, PID: os.Getpid(), Build: owner.Build()}); err != nil {
		return
	}
	log := s.log.With("client_pid", h.PID, "principal", id.Principal)
	log.Info("client connected", "tenant", id.Tenant, "role", id.Role)
	err = server.ServeStdio(ctx, server.New(s.svc, id, log, nil), server.StdioConfig{
		In: r, Out: c, Workers: min(max(h.Workers, 1), 100), Grace: s.o.grace(), Logger: log, Screen: s.svc.Screen,
	})
	log.Info("client left", "err", err)
}

// startsOwners reports whether the client of h starts an owner when none
// runs: a serve or the console does; a one-shot command (ops list…)
// opens the file itself, and an owner does not leave for it.
func startsOwners(h owner.Hello) bool {
	return len(h.Command) == 0 || h.Command[0] == "serve" || h.Command[0] == "console"
}

// runCommand runs the command a client sent (see throughOwner) and sends
// its output and exit status; the command is asked to stop when the
// client closes its side of c.
func (s *ownerServer) runCommand(ctx context.Context, c *net.UnixConn, r *bufio.Reader, h owner.Hello) {
	if err := owner.Send(c, owner.Welcome{OK: true, PID: os.Getpid(), Build: owner.Build()}); err != nil {
		return
	}
	log := s.log.With("client_pid", h.PID)
	log.Info("running a command", "command", h.Command[0])
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		io.Copy(io.Discard, r) // until the client closes its side
		cancel()
	}()
	out := owner.NewOutput(c)
	code := runHosted(ctx, h.Command, h.Env, out)
	if err := out.Exit(code); err != nil {
		log.Warn("a command's exit status", "err", err)
	}
	log.Info("command ended", "command", h.Command[0], "status", code)
}

// admit checks a client's identity: it is valid, and an approver without a verified
// token is refused where the configuration or the ledger requires one.
func (s *ownerServer) admit(ctx context.Context, h owner.Hello) (server.Identity, error) {
	id := server.Identity{Principal: h.Principal, Tenant: h.Tenant, Role: h.Role, OnBehalfOf: h.OnBehalfOf, Model: h.Model}
	if err := id.Validate(); err != nil {
		return id, err
	}
	if id.Role == approvals.RoleApprover && !h.TokenVerified {
		if s.o.lf.file.RequireApproverToken {
			return id, approverTokenNeeded(&s.o.lf, true)
		}
		on, err := approverTokensRequired(ctx, s.store)
		if err != nil {
			return id, fmt.Errorf("reading the ledger: %w", err)
		}
		if on {
			return id, approverTokenNeeded(&s.o.lf, false)
		}
	}
	return id, nil
}
