package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"idemgate/loadgen"
)

// runBench runs `idemgate bench ARGS --json` and decodes its report; the
// run must succeed (exit 0: correctness held).
func runBench(t *testing.T, args ...string) *loadgen.Report {
	t.Helper()
	r := runCLI(t, 2*time.Minute, append(append([]string{"bench"}, args...), "--json")...)
	if r.Code != 0 {
		t.Fatalf("idemgate bench %v: exit %d\nstdout: %s\nstderr: %s", args, r.Code, r.Stdout, r.Stderr)
	}
	var rep loadgen.Report
	dec := json.NewDecoder(strings.NewReader(r.Stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("the --json report does not decode: %v\n%s", err, r.Stdout)
	}
	if strings.Contains(r.Stderr, "\r") {
		t.Errorf("a progress line was drawn on a stderr that is not a terminal: %q", r.Stderr)
	}
	return &rep
}

// checkReport asserts what every successful report holds: calls were made
// and answered, the latency figures are ordered, the kinds add up, and
// correctness held with one order per create key.
func checkReport(t *testing.T, rep *loadgen.Report, clients int) {
	t.Helper()
	if rep.Clients != clients || rep.Calls == 0 || rep.Failed != 0 || rep.Throughput <= 0 || rep.Elapsed <= 0 {
		t.Fatalf("report: clients %d (want %d), calls %d, failed %d, calls/s %v, elapsed %v", rep.Clients, clients, rep.Calls, rep.Failed, rep.Throughput, rep.Elapsed)
	}
	l := rep.Latency
	if l.Count != int(rep.Calls) || !(0 < l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.Max) {
		t.Fatalf("latency %+v is not ordered or does not count %d calls", l, rep.Calls)
	}
	var sum int64
	for _, k := range rep.Kinds {
		sum += k.Calls
	}
	if sum != rep.Calls {
		t.Fatalf("the kinds add up to %d calls, the report says %d", sum, rep.Calls)
	}
	if rep.Kinds["create_order/new"] == nil || rep.Kinds["create_order/new"].Calls == 0 {
		t.Fatalf("no new create_order in the run: %v", rep.Kinds)
	}
	c := rep.Correctness
	if !c.OK || c.Failures != 0 || len(c.Unexpected) != 0 {
		t.Fatalf("correctness: %+v", c)
	}
	if c.Keys["create_order"] == 0 || c.Orders != c.Keys["create_order"] {
		t.Fatalf("%d create keys named %d orders: want exactly one order per key", c.Keys["create_order"], c.Orders)
	}
}

// TestBenchCLIStdio: `idemgate bench` against the server it spawns, on a
// ledger the test then reads with `idemgate stats`: the ledger confirms
// the report (as many operations as keys, each executed once, the
// replays and refusals counted, no duplicate side effect).
func TestBenchCLIStdio(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	rep := runBench(t, "--duration", "2s", "--clients", "4", "--dup-ratio", "0.3", "--mismatch-ratio", "0.05", "--db", db)
	checkReport(t, rep, 4)
	if rep.ServerCPU == nil || rep.ServerCPU.PerCall <= 0 {
		t.Errorf("no server CPU per call for a spawned server: %+v", rep.ServerCPU)
	}
	if !strings.HasPrefix(rep.Target, "stdio: idemgate serve --db "+db) {
		t.Errorf("target %q does not name the spawned server and its ledger", rep.Target)
	}
	if rep.Floors != nil || rep.Ratios != nil {
		t.Errorf("floors reported without --floors")
	}
	c := rep.Correctness
	if c.Replays == 0 || c.RefusedMismatch == 0 {
		t.Errorf("replays %d, refused mismatches %d: want both > 0 at dup 0.3, mismatch 0.05 over 2 s", c.Replays, c.RefusedMismatch)
	}
	// Every answered new create_order queued a confirmation and every new
	// send_notification a message; bench waited for them all, and they are
	// the files of the outbox beside the ledger.
	checkDelivered(t, rep, filepath.Join(filepath.Dir(db), "outbox"))

	r := runCLI(t, 30*time.Second, "stats", "--db", db, "--json")
	if r.Code != 0 {
		t.Fatalf("stats: exit %d: %s", r.Code, r.Stderr)
	}
	var st struct {
		Operations           int64 `json:"operations"`
		Executions           int64 `json:"executions"`
		DuplicateSideEffects int64 `json:"duplicate_side_effects"`
		ReplaysServed        int64 `json:"replays_served"`
		MismatchesRefused    int64 `json:"fingerprint_mismatches_refused"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("stats --json: %v\n%s", err, r.Stdout)
	}
	keys := int64(c.Keys["create_order"] + c.Keys["send_notification"])
	if st.Operations != keys || st.Executions != keys || st.DuplicateSideEffects != 0 || st.ReplaysServed != c.Replays || st.MismatchesRefused != c.RefusedMismatch {
		t.Fatalf("the ledger says %+v; the report says %d keys, %d replays, %d refused mismatches", st, keys, c.Replays, c.RefusedMismatch)
	}
}

// TestBenchCLIHTTP: `idemgate bench --url --token` against a running HTTP
// server, each client with its own connection; --server-pid is not given,
// so no CPU figure.
func TestBenchCLIHTTP(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	tok := addToken(t, tokens, "bench-agent", "acme", "agent")
	base := httpServer(t, filepath.Join(dir, "ledger.db"), tokens)
	rep := runBench(t, "--url", base+"/mcp", "--token", tok, "--duration", "2s", "--clients", "4", "--mismatch-ratio", "0.05")
	checkReport(t, rep, 4)
	if rep.Target != base+"/mcp" || rep.ServerCPU != nil || rep.Delivery != nil {
		t.Fatalf("target %q, server CPU %+v, delivery %+v: want the URL, no CPU figure and no delivery figures (no --outbox-dir)", rep.Target, rep.ServerCPU, rep.Delivery)
	}

	// The replicas of a deployment: --url repeated, the clients spread
	// over them in turn (here one server twice, as two replicas behind
	// two addresses would be).
	rep = runBench(t, "--url", base+"/mcp", "--url", base+"/mcp", "--token", tok, "--duration", "1s", "--clients", "4", "--dup-ratio", "0.2")
	checkReport(t, rep, 4)
	if want := base + "/mcp " + base + "/mcp"; rep.Target != want {
		t.Fatalf("target %q, want %q", rep.Target, want)
	}
	// A token the server does not know: refused before any call, saying so.
	r := runCLI(t, 30*time.Second, "bench", "--url", base+"/mcp", "--token", "not-a-token", "--duration", "1s")
	if r.Code != 1 || !strings.Contains(r.Stderr, "did not answer initialize") || strings.Contains(r.Stdout, "calls/s") {
		t.Fatalf("bench with an unknown token: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
}

// TestBenchCLIServerDoesNotStart: a spawned server that exits at once
// (here: a configuration file it refuses) is reported with its own error,
// exit 1, and no report.
func TestBenchCLIServerDoesNotStart(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "bad.toml")
	if err := os.WriteFile(cfg, []byte("no_such_setting = 3\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, 60*time.Second, "bench", "--config", cfg, "--duration", "1s")
	if r.Code != 1 || !strings.Contains(r.Stderr, "unknown keys no_such_setting") || !strings.Contains(r.Stderr, "the spawned server") || r.Stdout != "" {
		t.Fatalf("bench with a refused config: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
}

// TestBenchCLIFloors: --floors measures the no-op and commit floors before
// and after the run and states each kind of call as a ratio to them.
func TestBenchCLIFloors(t *testing.T) {
	rep := runBench(t, "--floors", "--calls", "40", "--duration", "0", "--clients", "2", "--mix", "create_order=1")
	checkReport(t, rep, 2)
	if rep.Calls != 40 {
		t.Fatalf("--calls 40 made %d calls", rep.Calls)
	}
	f := rep.Floors
	if f == nil || f.NoopP50 <= 0 || f.NoopP50Start <= 0 || f.NoopP50End <= 0 || f.CommitP50 <= 0 || f.NoopRate <= 0 {
		t.Fatalf("floors %+v: want every figure measured", f)
	}
	ra := rep.Ratios["create_order/new"]
	if ra == nil || ra.Noop <= 0 || ra.NoopCommit <= 0 || rep.ThroughputVsNoop <= 0 {
		t.Fatalf("ratios %+v, throughput vs no-op %v: want create_order/new against both floors", ra, rep.ThroughputVsNoop)
	}
	if f.Transport != "stdio" || f.NoopCPUPerCall <= 0 || f.CommitPages < 1 {
		t.Fatalf("floors %+v: want the stdio no-op server's CPU per call and the pages of a raw commit", f)
	}
	p := f.InProcess
	if p == nil || p.Creates == 0 || p.P50 <= 0 || p.CPUPerCreate <= 0 || p.CPUPerCreateDelivered <= 0 || p.CommitsPerCreate <= 0 || p.PagesPerCommit < f.CommitPages {
		t.Fatalf("in-process floor %+v: want every figure, and a create's commit at least a raw commit's pages", p)
	}
	if c := rep.ServerCPU; c == nil || c.XNoop <= 0 || c.XInProcess <= 0 || !c.IncludesDrain {
		t.Fatalf("server CPU %+v: want it against the no-op server's and the in-process create's, until the messages were delivered", c)
	}
}

// checkDelivered asserts the delivery figures of a run that waited for its
// messages: as many queued as new keys answered, all delivered, and as
// many message files in dir.
func checkDelivered(t *testing.T, rep *loadgen.Report, dir string) {
	t.Helper()
	d := rep.Delivery
	c := rep.Correctness
	if d == nil {
		t.Fatal("no delivery figures in the report")
	}
	if d.Queued != c.Keys["create_order"]+c.Keys["send_notification"] || !d.Drained || d.Left != 0 || d.BacklogAtEnd > d.Queued || d.DeliveredDuringRun+d.BacklogAtEnd != d.Queued {
		t.Fatalf("delivery %+v for keys %v: want every message queued by a new key delivered", d, c.Keys)
	}
	n, err := loadgen.CountMessages(dir)
	if err != nil || n != d.Queued {
		t.Fatalf("%d message files in the outbox (%v), the report says %d queued and delivered", n, err, d.Queued)
	}
}

// benchHTTPServer starts `idemgate serve --http` on a free loopback port
// over a new ledger in dir, with an agent's token and its outbox in
// dir/outbox, and returns its base URL, the token and its process id. The
// server is stopped (SIGINT) when the test ends.
func benchHTTPServer(t *testing.T, dir string, extra ...string) (base, token string, pid int) {
	t.Helper()
	tokens := filepath.Join(dir, "tokens.json")
	token = addToken(t, tokens, "bench-agent", "acme", "agent")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	db := filepath.Join(dir, "ledger.db")
	base, _ = httpServerProcess(t, addr, db, tokens,
		append([]string{"--outbox-dir", filepath.Join(dir, "outbox")}, extra...)...)
	pid, ok := ownerPID(db) // which serves HTTP for the process
	if !ok {
		t.Fatal("no owner of the ledger")
	}
	return base, token, pid
}

// TestBenchCLIHTTPFloors: with --url, --floors measures the no-op floor
// over Streamable HTTP — a no-op server bench starts itself, called by the
// same client from as many connections — before and after the run, with
// that server's CPU per call, and states calls/s as a share of its calls/s
// at the same concurrency; with --server-pid the server's CPU per call is
// stated against the no-op server's, and with --outbox-dir the run's
// confirmations are counted as they are delivered. No bbolt commit or
// in-process floor: the server's ledger is not bench's to know.
func TestBenchCLIHTTPFloors(t *testing.T) {
	dir := t.TempDir()
	base, tok, pid := benchHTTPServer(t, dir, "--workers", "8")
	rep := runBench(t, "--url", base+"/mcp", "--token", tok, "--server-pid", fmt.Sprint(pid), "--floors",
		"--outbox-dir", filepath.Join(dir, "outbox"), "--calls", "120", "--duration", "0", "--clients", "4", "--dup-ratio", "0.2", "--mix", "create_order=3,send_notification=1")
	checkReport(t, rep, 4)
	f := rep.Floors
	if f == nil || f.Transport != "http" || f.NoopP50 <= 0 || f.NoopP50Start <= 0 || f.NoopP50End <= 0 || f.NoopRate <= 0 || f.NoopCPUPerCall <= 0 {
		t.Fatalf("floors %+v: want the no-op floor over HTTP, measured before and after, with its CPU", f)
	}
	if f.CommitP50 != 0 || f.CommitPages != 0 || f.InProcess != nil {
		t.Fatalf("floors %+v: no commit or in-process floor with --url", f)
	}
	if rep.ThroughputVsNoop <= 0 || rep.Ratios["create_order/new"] == nil || rep.Ratios["create_order/new"].NoopCommit != 0 {
		t.Fatalf("throughput vs no-op %v, ratios %+v: want calls/s against the no-op's, and no commit ratio", rep.ThroughputVsNoop, rep.Ratios)
	}
	if c := rep.ServerCPU; c == nil || c.PerCall <= 0 || c.XNoop <= 0 || c.XInProcess != 0 || !c.IncludesDrain {
		t.Fatalf("server CPU %+v: want it per call against the no-op server's", c)
	}
	checkDelivered(t, rep, filepath.Join(dir, "outbox"))
}

// TestBenchCLIBadFlags: every flag out of bounds is refused (exit 2) with
// a sentence naming it, before any server starts.
func TestBenchCLIBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--clients", "0"}, "--clients must be 1..4096, got 0"},
		{[]string{"--clients", "5000"}, "--clients must be 1..4096"},
		{[]string{"--dup-ratio", "1.2"}, "--dup-ratio must be 0..1"},
		{[]string{"--dup-ratio", "0.7", "--mismatch-ratio", "0.5"}, "--dup-ratio + --mismatch-ratio must be at most 1"},
		{[]string{"--duration", "-1s"}, "--duration must be"},
		{[]string{"--duration", "0"}, "give a duration or a number of calls (--duration, --calls"},
		{[]string{"--calls", "-5"}, "--calls must be"},
		{[]string{"--key-space", "-1"}, "--key-space must be"},
		{[]string{"--timeout", "0s"}, "--timeout must be 1ms..10m"},
		{[]string{"--mix", "create_order=x"}, "--mix: mix entry"},
		{[]string{"--mix", "delete_everything=1"}, "unknown tool"},
		{[]string{"--url", "ftp://x/mcp", "--token", "t"}, "want an http:// or https:// URL"},
		{[]string{"--url", "http://127.0.0.1:1/mcp"}, "--url needs --token"},
		{[]string{"--outbox-dir", "x"}, "--outbox-dir is for --url"},
		{[]string{"--drain-timeout", "-1s"}, "--drain-timeout must be 0..10m"},
		{[]string{"--drain-timeout", "11m"}, "--drain-timeout must be 0..10m"},
		{[]string{"--url", "http://127.0.0.1:1/mcp", "--token", "t", "--db", "x.db"}, "with --url the server is already running"},
		{[]string{"--server-pid", "1"}, "--server-pid is for --url"},
		{[]string{"--url", "http://127.0.0.1:1/mcp", "--token", "t", "--server-pid", "0"}, "want a process id"},
		{[]string{"--url", "http://127.0.0.1:1/mcp", "--url", "http://127.0.0.1:2/mcp", "--url", "http://127.0.0.1:3/mcp", "--token", "t", "--clients", "2"}, "3 URLs for 2 --clients"},
		{[]string{"extra"}, "bench takes no arguments"},
	} {
		r := runCLI(t, 30*time.Second, append([]string{"bench"}, tc.args...)...)
		if r.Code != 2 || !strings.Contains(r.Stderr, tc.want) {
			t.Errorf("bench %v: exit %d, stderr %q; want exit 2 saying %q", tc.args, r.Code, r.Stderr, tc.want)
		}
	}
}

// TestBenchCLICtrlC: Ctrl-C at a terminal signals the whole foreground
// process group. The load generator stops issuing calls, lets those in
// flight finish, and prints the report of the calls made (exit 1, saying
// it was interrupted); the server it spawned, in a group of its own, does
// not see the signal, so no call in flight is dropped.
func TestBenchCLICtrlC(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	cmd := exec.Command(idemgate, "bench", "--db", db, "--duration", "10m", "--clients", "8", "--json")
	stopOwnerAtEnd(t, cmd.Args[1:])
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // the "terminal's" process group
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Calls are being made once the ledger holds operations.
	if !eventually(60*time.Second, func() bool {
		r := runCLI(t, 30*time.Second, "stats", "--db", db, "--json")
		return r.Code == 0 && !strings.Contains(r.Stdout, `"operations": 0,`)
	}) {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatalf("no operation reached the ledger within 60 s\nstderr: %s", stderr.String())
	}
	if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(90 * time.Second):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		t.Fatalf("bench did not stop within 90 s of Ctrl-C\nstderr: %s", stderr.String())
	}
	if cmd.ProcessState.ExitCode() != 1 || !strings.Contains(stderr.String(), "interrupted") {
		t.Fatalf("exit %d, stderr %q: want exit 1 saying it was interrupted", cmd.ProcessState.ExitCode(), stderr.String())
	}
	var rep loadgen.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("no report after Ctrl-C: %v\n%s", err, stdout.String())
	}
	checkReport(t, &rep, 8)
}
