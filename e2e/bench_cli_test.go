package e2e

import (
	"bytes"
	"encoding/json"
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
	if rep.Target != base+"/mcp" || rep.ServerCPU != nil {
		t.Fatalf("target %q, server CPU %+v: want the URL and no CPU figure", rep.Target, rep.ServerCPU)
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
		{[]string{"--url", "http://127.0.0.1:1/mcp", "--token", "t", "--floors"}, "--floors needs the spawned server"},
		{[]string{"--url", "http://127.0.0.1:1/mcp", "--token", "t", "--db", "x.db"}, "with --url the server is already running"},
		{[]string{"--server-pid", "1"}, "--server-pid is for --url"},
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
