package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"idemgate/loadgen"
	"idemgate/server"
)

// noopServerArg makes `idemgate bench` serve the no-op floor's MCP server
// on stdio instead (what --floors spawns); not for people.
const noopServerArg = "__noop-server"

// maxFloorConns bounds the connections of the PostgreSQL claim floor
// (--floor-db), and floorTime is how long it is measured each time.
const (
	maxFloorConns = 256
	floorTime     = 2 * time.Second
)

// defaultMix is the tool mix of `idemgate bench` without --mix.
const defaultMix = "create_order=8,get_order=1,send_notification=1"

// benchCmd is `idemgate bench`: a load generator that drives a server it
// spawns over stdio (on a fresh temporary ledger, or --db), or a running
// HTTP server (--url, --token), and reports throughput, latency, server
// CPU and correctness (see package loadgen). The exit status is 1 when
// correctness failed.
func benchCmd(args []string, stdout, stderr io.Writer) error {
	if len(args) == 1 && args[0] == noopServerArg {
		return server.ServeNoop(loadgen.NoopTool)
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	target := fs.String("url", "", "drive the Streamable HTTP server at this URL (e.g. http://127.0.0.1:8080/mcp) instead of spawning idemgate serve over stdio")
	token := fs.String("token", env("IDEMGATE_TOKEN", ""), "with --url: the bearer token to call with (an agent's; env IDEMGATE_TOKEN)")
	serverPID := fs.Int("server-pid", 0, "with --url: the local server's process id, to report its CPU per call")
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
	floors := fs.Bool("floors", false, "also measure the floors before and after the run (a no-op MCP call over stdio, and a raw bbolt commit beside the ledger — or, on a postgres:// --db, the claim floor of --floor-db) and report calls as ratios to them; not with --url")
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
	remote := *target != ""
	switch {
	case remote && (*db != "" || *config != ""):
		return usageError{errors.New("--db and --config are for the spawned server; with --url the server is already running")}
	case remote && *floors:
		return usageError{errors.New("--floors needs the spawned server (no --url): the floors are measured over stdio beside its ledger")}
	case !remote && *serverPID != 0:
		return usageError{errors.New("--server-pid is for --url; the spawned server's CPU is reported anyway")}
	case *serverPID < 0:
		return usageError{fmt.Errorf("--server-pid must be a process id, got %d", *serverPID)}
	}
	pgLedger := !remote && loadgen.IsPostgresURL(*db)
	if *floorDB == "" && *floors && pgLedger {
		*floorDB = *db
	}
	if *floorDB != "" && !loadgen.IsPostgresURL(*floorDB) {
		return usageError{errors.New("--floor-db must be a postgres:// or postgresql:// URL: the database the server's ledger is in")}
	}
	if remote {
		u, err := url.Parse(*target)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return usageError{fmt.Errorf("--url %q: want an http:// or https:// URL of the MCP endpoint, e.g. http://127.0.0.1:8080/mcp", *target)}
		}
		if *token == "" {
			return usageError{errors.New("--url needs --token (or env IDEMGATE_TOKEN): an agent's bearer token, see idemgate tokens add")}
		}
	}
	if *serverPID > 0 {
		if _, err := loadgen.ProcessCPU(*serverPID); err != nil {
			return usageError{fmt.Errorf("--server-pid %d: cannot read its CPU time: %v", *serverPID, err)}
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
	var pid int
	var ledgerDir, what string
	if remote {
		what = *target
		// One connection per client, all kept alive.
		hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyFromEnvironment, MaxIdleConns: *clients, MaxIdleConnsPerHost: *clients, IdleConnTimeout: 90 * time.Second}}
		for range *clients {
			c, err := loadgen.DialHTTP(ctx, *target, *token, hc)
			if err != nil {
				closeAll(callers)
				return err
			}
			callers = append(callers, c)
		}
		defer closeAll(callers)
		pid = *serverPID
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
			dbPath = filepath.Join(dir, "ledger.db")
		}
		ledgerDir = filepath.Dir(dbPath)
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
		pid = c.PID()
	}

	var fl loadgen.Floors
	var noop *loadgen.Client
	if *floors {
		exe, _ := os.Executable()
		if noop, err = loadgen.SpawnStdio(ctx, exe, []string{"bench", noopServerArg}, stderr); err != nil {
			return fmt.Errorf("starting the no-op floor server: %w", err)
		}
		defer noop.Close()
		progressNote(stderr, "measuring the floors (before the run)…")
		if !pgLedger { // a PostgreSQL ledger has the claim floor instead
			if fl.CommitP50Start, err = loadgen.CommitLatency(ledgerDir, time.Second, 2000); err != nil {
				return fmt.Errorf("commit floor: %w", err)
			}
		}
		if fl.NoopP50Start, err = loadgen.NoopLatency(ctx, noop, time.Second, 5000); err != nil {
			return err
		}
		if fl.NoopRate, err = loadgen.NoopRate(ctx, noop, *clients, 2*time.Second); err != nil {
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
	var cpu0 time.Duration
	if pid > 0 {
		if cpu0, err = loadgen.ProcessCPU(pid); err != nil {
			pid = 0 // not local after all: no CPU figure
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
	if pid > 0 {
		if cpu1, err := loadgen.ProcessCPU(pid); err == nil {
			rep.SetServerCPU(cpu1 - cpu0)
		}
	}
	if *floors && ctx.Err() == nil {
		progressNote(stderr, "measuring the floors (after the run)…")
		if fl.NoopP50End, err = loadgen.NoopLatency(ctx, noop, time.Second, 5000); err != nil {
			return err
		}
		if !pgLedger {
			if fl.CommitP50End, err = loadgen.CommitLatency(ledgerDir, time.Second, 2000); err != nil {
				return fmt.Errorf("commit floor: %w", err)
			}
		}
		fl.NoopP50 = (fl.NoopP50Start + fl.NoopP50End) / 2
		fl.CommitP50 = (fl.CommitP50Start + fl.CommitP50End) / 2
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
