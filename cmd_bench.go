package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"idemgate/ledger/postgres"
	"idemgate/loadgen"
	"idemgate/owner"
	"idemgate/server"
)

// The arguments that make `idemgate bench` one of the processes its
// floors measure, instead of a load generator; not for people.
const (
	noopServerArg     = "__noop-server"      // the no-op MCP server on stdio
	noopHTTPServerArg = "__noop-http-server" // the no-op MCP server over Streamable HTTP (see serveNoopHTTP)
	inProcessArg      = "__in-process"       // creates made in process (see inProcessCmd)
)

// maxFloorConns bounds the connections of the PostgreSQL claim floor
// (--floor-db), and floorTime is how long it is measured each time.
const (
	maxFloorConns = 256
	floorTime     = 2 * time.Second
)

// defaultMix is the tool mix of `idemgate bench` without --mix.
const defaultMix = "create_order=8,get_order=1,send_notification=1"

// maxBenchURLs bounds --url and --server-pid: the replicas one bench drives.
const maxBenchURLs = 64

// benchCmd is `idemgate bench`: a load generator that drives a server it
// spawns over stdio (on a fresh temporary ledger, or --db), or a running
// HTTP server (--url, --token), and reports throughput, latency, server
// CPU and correctness (see package loadgen). The exit status is 1 when
// correctness failed.
func benchCmd(args []string, stdout, stderr io.Writer) error {
	switch {
	case len(args) == 1 && args[0] == noopServerArg:
		return server.ServeNoop(loadgen.NoopTool)
	case len(args) == 1 && args[0] == noopHTTPServerArg:
		return serveNoopHTTP(stdout)
	case len(args) >= 1 && args[0] == inProcessArg:
		return inProcessCmd(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var targets, serverPIDs []string // checked once parsed, as every flag
	fs.Func("url", fmt.Sprintf("drive the Streamable HTTP server at this URL (e.g. http://127.0.0.1:8080/mcp) instead of spawning idemgate serve over stdio; repeat it for the replicas of one deployment (at most %d): the clients are spread over them in turn", maxBenchURLs), func(s string) error {
		targets = append(targets, s)
		return nil
	})
	token := fs.String("token", env("IDEMGATE_TOKEN", ""), "with --url: the bearer token to call with (an agent's; env IDEMGATE_TOKEN)")
	fs.Func("server-pid", "with --url: the local server's process id, to report its CPU per call (a serve --http on a ledger file runs in the file's owner: its pid, which serve prints at start); repeat it for several replicas: their CPU is added up", func(s string) error {
		serverPIDs = append(serverPIDs, s)
		return nil
	})
	db := fs.String("db", "", "the ledger the spawned server uses (default: a fresh one in a temporary directory, removed afterwards)")
	config := fs.String("config", "", "a configuration file for the spawned server (its policy applies to the calls)")
	clients := fs.Int("clients", 8, fmt.Sprintf("concurrent callers (1-%d); over stdio they share the one connection, over HTTP each has its own", loadgen.MaxClients))
	dup := fs.Float64("dup-ratio", 0.1, "share of create_order and send_notification calls that repeat an earlier key with the same arguments (0-1); each must be replayed")
	mismatch := fs.Float64("mismatch-ratio", 0, "share that reuse an earlier key with changed arguments (0-1); each must be refused with key_reused_with_different_request")
	keySpace := fs.Int("key-space", 0, "duplicates reuse one of the last N keys answered (0: any earlier key)")
	mixFlag := fs.String("mix", defaultMix, "the tools called, with weights")
	duration := fs.Duration("duration", 10*time.Second, fmt.Sprintf("how long to issue calls (up to %s; 0 with --calls: no time limit)", loadgen.MaxDuration))
	calls := fs.Int64("calls", 0, "stop after this many calls (0: no limit; with --duration the run stops at the first)")
	timeout := fs.Duration("timeout", 30*time.Second, "bound on one call (1ms-10m)")
	floors := fs.Bool("floors", false, "also measure the floors before and after the run and report calls as ratios to them: a no-op MCP call over the run's transport (stdio; with --url Streamable HTTP, a connection per client), its server's CPU per call, and for a spawned server on a ledger file a raw bbolt commit beside the ledger and the same create_order made in one process without MCP (on a postgres:// --db: the claim floor of --floor-db)")
	outboxDir := fs.String("outbox-dir", "", "with --url: the server's outbox directory, when it writes notifications as files on this machine, to report how deliveries kept up (a spawned server's is known)")
	drainTimeout := fs.Duration("drain-timeout", time.Minute, "after the last call, wait up to this long for the run's notifications to be delivered and report how long it took (0: do not wait; 0-10m)")
	floorDB := fs.String("floor-db", "", fmt.Sprintf("a postgres:// URL: also measure PostgreSQL's bare claim (INSERT … ON CONFLICT of a new key, autocommit) there, from --clients connections (at most %d) before and after the run, in a table of its own, and report new creates/s as a share of it; with --floors and a postgres:// --db, that database", maxFloorConns))
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("bench takes no arguments, got %q; see idemgate bench -h", fs.Args())}
	}
	mix, err := loadgen.ParseMix(*mixFlag)
	if err != nil {
		return usageError{fmt.Errorf("--mix: %w", err)}
	}
	cfg := loadgen.Config{Clients: *clients, DupRatio: *dup, MismatchRatio: *mismatch, KeySpace: *keySpace,
		Mix: mix, Duration: *duration, Calls: *calls, CallTimeout: *timeout}
	if *timeout < time.Millisecond || *timeout > 10*time.Minute {
		return usageError{fmt.Errorf("--timeout must be 1ms..10m, got %s", *timeout)}
	}
	if err := cfg.Validate(); err != nil {
		// The engine names its fields as the flags are named, without
		// the dashes.
		msg := err.Error()
		for _, f := range []string{"clients", "dup-ratio", "mismatch-ratio", "key-space", "duration", "calls"} {
			if strings.HasPrefix(msg, f+" ") {
				msg = "--" + msg
				break
			}
		}
		return usageError{errors.New(strings.Replace(msg, "+ mismatch-ratio", "+ --mismatch-ratio", 1))}
	}
	remote := len(targets) > 0
	if len(targets) > maxBenchURLs || len(serverPIDs) > maxBenchURLs {
		return usageError{fmt.Errorf("at most %d --url and %d --server-pid, got %d and %d", maxBenchURLs, maxBenchURLs, len(targets), len(serverPIDs))}
	}
	for _, t := range targets {
		u, err := url.Parse(t)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usageError{fmt.Errorf("--url %q: want an http:// or https:// URL of the MCP endpoint, e.g. http://127.0.0.1:8080/mcp", t)}
		}
	}
	var pids []int // the server's processes, whose CPU is reported: --server-pid, or the spawned server and its ledger's owner (see package owner)
	for _, p := range serverPIDs {
		pid, err := strconv.Atoi(p)
		if err != nil || pid <= 0 {
			return usageError{fmt.Errorf("--server-pid %q: want a process id", p)}
		}
		pids = append(pids, pid)
	}
	switch {
	case remote && (*db != "" || *config != ""):
		return usageError{errors.New("--db and --config are for the spawned server; with --url the server is already running")}
	case !remote && *outboxDir != "":
		return usageError{errors.New("--outbox-dir is for --url; the spawned server's outbox directory is known")}
	case *drainTimeout < 0 || *drainTimeout > 10*time.Minute:
		return usageError{fmt.Errorf("--drain-timeout must be 0..10m, got %s", *drainTimeout)}
	case !remote && len(pids) > 0:
		return usageError{errors.New("--server-pid is for --url; the spawned server's CPU is reported anyway")}
	case len(targets) > *clients:
		return usageError{fmt.Errorf("%d URLs for %d --clients: every URL needs a client at least", len(targets), *clients)}
	}
	pgLedger := !remote && loadgen.IsPostgresURL(*db)
	if *floorDB == "" && *floors && pgLedger {
		*floorDB = *db
	}
	if *floorDB != "" && !loadgen.IsPostgresURL(*floorDB) {
		return usageError{errors.New("--floor-db must be a postgres:// or postgresql:// URL: the database the server's ledger is in")}
	}
	if remote && *token == "" {
		return usageError{errors.New("--url needs --token (or env IDEMGATE_TOKEN): an agent's bearer token, see idemgate tokens add")}
	}
	for _, pid := range pids {
		if _, err := loadgen.ProcessCPU(pid); err != nil {
			return usageError{fmt.Errorf("--server-pid %d: cannot read its CPU time: %v", pid, err)}
		}
	}
	if *config != "" {
		if _, err := os.Stat(*config); err != nil {
			return usageError{fmt.Errorf("--config: %w", err)}
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var callers []loadgen.Caller
	var ownerPlace *owner.Place
	var ledgerDir, what string
	if remote {
		what = strings.Join(targets, " ")
		// One connection per client, all kept alive; client i calls the
		// i-th URL in turn.
		hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConns: *clients, MaxIdleConnsPerHost: *clients, IdleConnTimeout: 90 * time.Second}}
		for i := range *clients {
			c, err := loadgen.DialHTTP(ctx, targets[i%len(targets)], *token, hc)
			if err != nil {
				closeAll(callers)
				return err
			}
			callers = append(callers, c)
		}
		defer closeAll(callers)
	} else {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding this program to spawn its server: %w", err)
		}
		dbPath := *db
		if dbPath == "" {
			dir, err := os.MkdirTemp("", "idemgate-bench-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(dir)
			// The ledger's owner ends before its directory goes.
			defer func() {
				if ownerPlace != nil {
					owner.Stop(*ownerPlace, 30*time.Second)
				}
			}()
			dbPath = filepath.Join(dir, "ledger.db")
		}
		ledgerDir = filepath.Dir(dbPath)
		if !spawnedNotifiesByWebhook(*config) {
			*outboxDir = env("IDEMGATE_OUTBOX_DIR", filepath.Join(dataDirOf(dbPath), "outbox")) // where serve puts it
		}
		serveArgs := []string{"serve", "--db", dbPath, "--log-level", "warn", "--workers", fmt.Sprint(min(*clients, 100))}
		if *config != "" {
			serveArgs = append(serveArgs, "--config", *config)
		}
		what = "stdio: idemgate " + strings.Join(serveArgs, " ")
		if *db == "" {
			what = "stdio: idemgate serve on a fresh temporary ledger, --workers " + fmt.Sprint(min(*clients, 100))
		}
		c, err := loadgen.SpawnStdio(ctx, exe, serveArgs, stderr)
		if err != nil {
			return err
		}
		defer c.Close()
		callers = []loadgen.Caller{c}
		pids = []int{c.PID()}
		if !postgres.IsURL(dbPath) {
			if place, err := owner.PlaceOf(dbPath); err == nil {
				ownerPlace = &place
				if p, ok := owner.PID(place); ok && p > 0 {
					pids = append(pids, p)
				}
			}
		}
	}

	var fl loadgen.Floors
	var noopCallers []loadgen.Caller
	var noopPID int
	if *floors {
		exe, _ := os.Executable()
		if remote {
			fl.Transport = "http"
			srv, err := loadgen.SpawnHTTP(exe, []string{"bench", noopHTTPServerArg}, stderr)
			if err != nil {
				return fmt.Errorf("starting the no-op floor server: %w", err)
			}
			defer srv.Close()
			noopPID = srv.PID()
			// The same client as the run's: a connection per client.
			hc := &http.Client{Transport: &http.Transport{MaxIdleConns: *clients, MaxIdleConnsPerHost: *clients, IdleConnTimeout: 90 * time.Second}}
			for range *clients {
				c, err := loadgen.DialHTTP(ctx, srv.URL, *token, hc)
				if err != nil {
					closeAll(noopCallers)
					return fmt.Errorf("the no-op floor server: %w", err)
				}
				noopCallers = append(noopCallers, c)
			}
			defer closeAll(noopCallers)
		} else {
			fl.Transport = "stdio"
			noop, err := loadgen.SpawnStdio(ctx, exe, []string{"bench", noopServerArg}, stderr)
			if err != nil {
				return fmt.Errorf("starting the no-op floor server: %w", err)
			}
			defer noop.Close()
			noopCallers, noopPID = []loadgen.Caller{noop}, noop.PID()
		}
	}
	var noopCPU time.Duration
	var noopCalls int
	// noopLatency measures the no-op floor's p50, one caller at a time,
	// and adds up its server's CPU meanwhile.
	noopLatency := func() (float64, error) {
		c0, err0 := loadgen.ProcessCPU(noopPID)
		s, err := loadgen.NoopLatency(ctx, noopCallers[0], time.Second, 5000)
		if err != nil {
			return 0, err
		}
		if c1, err1 := loadgen.ProcessCPU(noopPID); err0 == nil && err1 == nil {
			noopCPU += c1 - c0
			noopCalls += s.Calls
		}
		return s.P50, nil
	}
	commitFloor := !remote && !pgLedger // a PostgreSQL ledger has the claim floor instead
	if *floors {
		progressNote(stderr, "measuring the floors (before the run)…")
		if commitFloor {
			c, err := loadgen.CommitLatency(ledgerDir, time.Second, 2000)
			if err != nil {
				return fmt.Errorf("commit floor: %w", err)
			}
			fl.CommitP50Start, fl.CommitPages = c.P50, c.Pages
			if fl.InProcess, err = measureInProcess(ctx, ledgerDir, stderr); err != nil {
				return fmt.Errorf("in-process floor: %w", err)
			}
		}
		if fl.NoopP50Start, err = noopLatency(); err != nil {
			return err
		}
		if fl.NoopRate, err = loadgen.NoopRate(ctx, noopCallers, *clients, 2*time.Second); err != nil {
			return err
		}
	}

	claimFloor := loadgen.ClaimFloor{Connections: min(*clients, maxFloorConns)}
	if *floorDB != "" {
		progressNote(stderr, "measuring the PostgreSQL claim floor (before the run)…")
		if claimFloor.RateStart, err = loadgen.PGClaimRate(ctx, *floorDB, claimFloor.Connections, floorTime); err != nil {
			return err
		}
	}

	if isTerminal(stderr) {
		cfg.Progress = func(p loadgen.Progress) { drawProgress(stderr, p) }
	}
	var watch *loadgen.DeliveryWatch
	if *outboxDir != "" {
		if watch, err = loadgen.WatchDelivery(*outboxDir); err != nil {
			return fmt.Errorf("--outbox-dir: %w", err)
		}
	}
	// The server's CPU: its processes' (a ledger's owner's includes the
	// calls of any other client of that ledger meanwhile).
	serverCPU := func() (time.Duration, error) {
		var used time.Duration
		for _, p := range pids {
			u, err := loadgen.ProcessCPU(p)
			if err != nil {
				return 0, err
			}
			used += u
		}
		return used, nil
	}
	var cpu0 time.Duration
	if len(pids) > 0 {
		if cpu0, err = serverCPU(); err != nil {
			pids = nil // not local after all: no CPU figure
		}
	}
	rep, err := loadgen.Run(ctx, cfg, callers)
	if err != nil {
		return err
	}
	if cfg.Progress != nil {
		fmt.Fprint(stderr, "\r\033[K")
	}
	rep.Target = what
	if watch != nil && ctx.Err() == nil {
		if *drainTimeout > 0 {
			progressNote(stderr, "waiting for the run's notifications to be delivered…")
		}
		if err := watch.Finish(ctx, rep, *drainTimeout); err != nil {
			return fmt.Errorf("counting the delivered notifications: %w", err)
		}
	}
	if len(pids) > 0 {
		if cpu1, err := serverCPU(); err == nil {
			rep.SetServerCPU(cpu1 - cpu0)
			rep.ServerCPU.IncludesDrain = rep.Delivery != nil && *drainTimeout > 0
		}
	}
	if *floors && ctx.Err() == nil {
		progressNote(stderr, "measuring the floors (after the run)…")
		if fl.NoopP50End, err = noopLatency(); err != nil {
			return err
		}
		if commitFloor {
			c, err := loadgen.CommitLatency(ledgerDir, time.Second, 2000)
			if err != nil {
				return fmt.Errorf("commit floor: %w", err)
			}
			fl.CommitP50End = c.P50
		}
		fl.NoopP50 = (fl.NoopP50Start + fl.NoopP50End) / 2
		fl.CommitP50 = (fl.CommitP50Start + fl.CommitP50End) / 2
		if noopCalls > 0 {
			fl.NoopCPUPerCall = float64(noopCPU.Microseconds()) / float64(noopCalls)
		}
		rep.SetFloors(fl)
	}
	if *floorDB != "" && ctx.Err() == nil {
		progressNote(stderr, "measuring the PostgreSQL claim floor (after the run)…")
		if claimFloor.RateEnd, err = loadgen.PGClaimRate(ctx, *floorDB, claimFloor.Connections, floorTime); err != nil {
			return err
		}
		rep.SetClaimFloor(claimFloor)
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
	} else {
		rep.WriteText(stdout)
	}
	if !rep.Correctness.OK {
		return fmt.Errorf("correctness failed: %d answers broke a guarantee, %d unexpected answers (see the report)", rep.Correctness.Failures, unexpectedCount(rep))
	}
	if ctx.Err() != nil {
		return errors.New("interrupted: the report covers the calls made until then")
	}
	return nil
}

func unexpectedCount(r *loadgen.Report) int {
	n := 0
	for _, v := range r.Correctness.Unexpected {
		n += v
	}
	return n
}

// spawnedNotifiesByWebhook reports whether the spawned server would send
// notifications to a webhook (config or environment) rather than write
// them as files: then its outbox directory tells nothing. A configuration
// the server refuses is reported by the server.
func spawnedNotifiesByWebhook(config string) bool {
	var l settings
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	l.register(fs)
	var args []string
	if config != "" {
		args = []string{"--config", config}
	}
	if fs.Parse(args) != nil || l.load() != nil {
		return false
	}
	return l.file.Notifications.WebhookURL != ""
}

// serveNoopHTTP serves the no-op floor over Streamable HTTP on a loopback
// port of its own, prints its MCP endpoint's URL on stdout and serves
// until stdin closes (the load generator that started it closes it).
func serveNoopHTTP(stdout io.Writer) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Returns when stdin closes, or with the process.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		cancel()
	}()
	fmt.Fprintf(stdout, "http://%s/mcp\n", ln.Addr())
	return server.ServeNoopHTTP(ctx, ln, loadgen.NoopTool)
}

func closeAll(cs []loadgen.Caller) {
	for _, c := range cs {
		c.(*loadgen.Client).Close()
	}
}

// isTerminal reports whether w is a terminal (a character device), where a
// progress line may be redrawn.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func progressNote(w io.Writer, msg string) {
	if isTerminal(w) {
		fmt.Fprint(w, "\r\033[K"+msg)
	}
}

// drawProgress redraws the progress line: a bar when the run's end is
// known, the calls so far, the rate and the errors.
func drawProgress(w io.Writer, p loadgen.Progress) {
	frac := -1.0
	if p.Planned > 0 {
		frac = p.Elapsed.Seconds() / p.Planned.Seconds()
	}
	if p.Target > 0 {
		if f := float64(p.Calls) / float64(p.Target); f > frac {
			frac = f
		}
	}
	bar := ""
	if frac >= 0 {
		frac = min(frac, 1)
		const width = 24
		n := int(frac * width)
		bar = fmt.Sprintf("[%s%s] %3.0f%%  ", strings.Repeat("#", n), strings.Repeat(".", width-n), 100*frac)
	}
	rate := float64(p.Calls) / max(p.Elapsed.Seconds(), 1e-9)
	fmt.Fprintf(w, "\r\033[K%s%.0fs  %d calls  %.0f calls/s  %d errors", bar, p.Elapsed.Seconds(), p.Calls, rate, p.Errors)
}
