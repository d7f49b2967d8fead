package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"idemgate/loadgen"
)

// TestBenchmarkAllRows measures every row of issue 12's table in one run,
// one after another, with `idemgate bench` (each run measuring its floors
// before and after itself) and the project's benchmarks, and prints one
// markdown table: row, figure, floor, ratio, target, met. It is what
// BENCHMARKS.md's head is made of:
//
//	IDEMGATE_BENCH_ALL=1 go test -count=1 -timeout 0 -run TestBenchmarkAllRows -v ./e2e/
//
// IDEMGATE_BENCH_RECORDS (default 1000000) is the size of the large
// ledger (create at size) and of the retention sweep; IDEMGATE_BENCH_SECONDS
// (default 10) how long each bench run issues calls; IDEMGATE_BENCH_TABLE a
// file to write the table to as well; IDEMGATE_BENCH_OUT a directory to
// keep every run's JSON report and benchmark output in. The syncs row needs
// strace. Run it on a quiet machine: it asserts nothing about speed, and it
// fails only when a step cannot run or a run's correctness failed.
func TestBenchmarkAllRows(t *testing.T) {
	if os.Getenv("IDEMGATE_BENCH_ALL") != "1" {
		t.Skip("set IDEMGATE_BENCH_ALL=1 to measure every row of issue 12's table (see BENCHMARKS.md)")
	}
	records := envInt(t, "IDEMGATE_BENCH_RECORDS", 1_000_000)
	secs := envInt(t, "IDEMGATE_BENCH_SECONDS", 10)
	if records < 1000 || secs < 1 {
		t.Fatalf("IDEMGATE_BENCH_RECORDS must be at least 1000 and IDEMGATE_BENCH_SECONDS at least 1")
	}
	if d, ok := t.Deadline(); ok && time.Until(d) < allRowsEstimate(records, secs) {
		t.Fatalf("this run takes about %v at %d records; run it with -timeout 0", allRowsEstimate(records, secs).Round(time.Minute), records)
	}
	// The owners of the runs' ledger files (the bench's servers pass their
	// calls to them) exit soon after the run, as strace -f waits for them.
	t.Setenv("IDEMGATE_OWNER_IDLE", "1s")
	b := newAllBench(t, secs)
	b.stdioCreates()
	b.syncsPerCreate()
	b.replays()
	b.overHTTP()
	b.sinkPerMessage()
	b.startup()
	b.processesOnOneFile()
	b.fileGrowth()
	b.createAtSize(records)
	b.sweep(records)

	table := b.markdown(records)
	fmt.Println(table)
	if path := os.Getenv("IDEMGATE_BENCH_TABLE"); path != "" {
		if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// newAllBench is a run of rows with bench runs of secs each, keeping its
// reports in IDEMGATE_BENCH_OUT when that is set.
func newAllBench(t *testing.T, secs int) *allBench {
	b := &allBench{t: t, dir: t.TempDir(), out: os.Getenv("IDEMGATE_BENCH_OUT"), dur: fmt.Sprintf("%ds", secs), started: time.Now()}
	if b.out != "" {
		if err := os.MkdirAll(b.out, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

// allRowsEstimate is about how long TestBenchmarkAllRows takes on the
// project's 2-core machine: a dozen bench runs of secs each with their
// floors, and the compiles; then filling a ledger to records operations
// (some 3 000 creates/s at 100 k on a busy machine, fewer as the file
// grows) and writing and sweeping as many due records while two callers
// claim (the sweep then gives them half of the writer), and their floor.
func allRowsEstimate(records, secs int) time.Duration {
	return time.Duration(12*secs+200)*time.Second + time.Duration(records)*time.Millisecond
}

func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(strings.ReplaceAll(v, "_", ""))
	if err != nil {
		t.Fatalf("%s=%q: want a whole number", name, v)
	}
	return n
}

// allRow is one row of the table.
type allRow struct {
	name, figure, floor, ratio, target string
	met                                string // "yes", "no", or why it was not measured
}

// allBench runs the steps and gathers the rows.
type allBench struct {
	t       *testing.T
	dir     string
	out     string
	dur     string
	started time.Time
	rows    []allRow

	mu    sync.Mutex // bench runs concurrently (several processes on one file)
	notes []string   // the floors of each run, for the record
	step  int
}

func (b *allBench) add(r allRow) { b.rows = append(b.rows, r) }

// failed records a step that could not run as a row saying so, and fails
// the test (the other steps still run).
func (b *allBench) failed(name, target string, err error) {
	b.t.Helper()
	b.t.Errorf("%s: %v", name, err)
	b.add(allRow{name: name, figure: "—", floor: "—", ratio: "—", target: target, met: "not measured: " + oneLine(err.Error())})
}

func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 160 {
		s = s[:160] + "…"
	}
	return s
}

// save keeps a step's raw output in IDEMGATE_BENCH_OUT.
func (b *allBench) save(name string, data []byte) {
	if b.out == "" {
		return
	}
	b.mu.Lock()
	b.step++
	path := filepath.Join(b.out, fmt.Sprintf("%02d-%s", b.step, name))
	b.mu.Unlock()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		b.t.Error(err)
	}
}

func (b *allBench) note(s string) {
	b.mu.Lock()
	b.notes = append(b.notes, s)
	b.mu.Unlock()
}

// idemgate runs the binary with args and returns its stdout; an exit
// status other than 0 is an error with its stderr. Safe to call from
// several goroutines.
func (b *allBench) idemgate(timeout time.Duration, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, idemgate, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("idemgate %s: %v: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// bench runs `idemgate bench ARGS --json` and returns its report. Safe to
// call from several goroutines.
func (b *allBench) bench(name string, args ...string) (*loadgen.Report, error) {
	b.t.Logf("bench %s: idemgate bench %s", name, strings.Join(args, " "))
	stopOwnerAtEnd(b.t, append([]string{"bench"}, args...))
	out, err := b.idemgate(30*time.Minute, append(append([]string{"bench"}, args...), "--json")...)
	b.save(name+".json", out)
	if err != nil {
		return nil, err
	}
	var rep loadgen.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		return nil, fmt.Errorf("its report: %v", err)
	}
	if f := rep.Floors; f != nil {
		note := fmt.Sprintf("%s: no-op %.0f µs over %s (%.0f → %.0f)", name, f.NoopP50, f.Transport, f.NoopP50Start, f.NoopP50End)
		if f.CommitP50 > 0 {
			note += fmt.Sprintf(", bbolt commit %.0f µs (%.0f → %.0f)", f.CommitP50, f.CommitP50Start, f.CommitP50End)
		}
		b.note(note)
	}
	return &rep, nil
}

// goBench runs `go test -run '^$' -bench PATTERN ARGS PKG` in the module
// with env added, and returns each benchmark's metrics by name.
func (b *allBench) goBench(name, pkg, pattern string, env []string, args ...string) (map[string]map[string]float64, error) {
	cmdArgs := append([]string{"test", "-count=1", "-run", "^$", "-bench", pattern}, args...)
	cmdArgs = append(cmdArgs, pkg)
	b.t.Logf("bench %s: %s go %s", name, strings.Join(env, " "), strings.Join(cmdArgs, " "))
	cmd := exec.Command("go", cmdArgs...)
	cmd.Dir = moduleRoot
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	b.save(name+".txt", out)
	if err != nil {
		return nil, fmt.Errorf("go test: %v\n%s", err, out)
	}
	res := map[string]map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if name, m, ok := parseBenchLine(sc.Text()); ok {
			res[name] = m
		}
	}
	if len(res) == 0 {
		return nil, fmt.Errorf("no benchmark result in its output:\n%s", out)
	}
	return res, nil
}

// parseBenchLine reads a `go test -bench` result line: the benchmark's
// name (without the -GOMAXPROCS suffix), then its iterations, then value
// and unit pairs.
func parseBenchLine(line string) (string, map[string]float64, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
		return "", nil, false
	}
	if _, err := strconv.Atoi(f[1]); err != nil {
		return "", nil, false
	}
	name := f[0]
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			name = name[:i]
		}
	}
	m := map[string]float64{}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return "", nil, false
		}
		m[f[i+1]] = v
	}
	return name, m, true
}

// parseStraceCounts reads the calls of each syscall from `strace -c`'s
// summary.
func parseStraceCounts(out string) map[string]int {
	counts := map[string]int{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[len(f)-1] == "total" || f[len(f)-1] == "syscall" {
			continue
		}
		if _, err := strconv.ParseFloat(f[0], 64); err != nil {
			continue
		}
		n, err := strconv.Atoi(f[3])
		if err != nil {
			continue
		}
		counts[f[len(f)-1]] = n
	}
	return counts
}

// Formatting of figures.
func us(v float64) string   { return fmt.Sprintf("%.0f µs", v) }
func rate(v float64) string { return fmt.Sprintf("%.0f/s", v) }
func times(v float64) string {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return "—"
	}
	return fmt.Sprintf("%.2f×", v)
}

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// atMost and atLeast judge a ratio against its target.
func atMost(v, limit float64) string  { return yesNo(v > 0 && v <= limit) }
func atLeast(v, limit float64) string { return yesNo(v >= limit) }

// markdown is the table, the run's floors and how long it took; records
// is 0 for a run of some rows alone (TestBenchmarkOwnerRows,
// TestBenchmarkPostgresReplicas).
func (b *allBench) markdown(records int) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "\n| row | figure | floor | ratio | target | met? |\n|---|---|---|---|---|---|\n")
	for _, r := range b.rows {
		fmt.Fprintf(&sb, "| %s | %s | %s | %s | %s | %s |\n", r.name, r.figure, r.floor, r.ratio, r.target, r.met)
	}
	if records == 0 {
		fmt.Fprintf(&sb, "\nOne run of %s: %s per bench run, %s in all.\n", b.t.Name(), b.dur, time.Since(b.started).Round(time.Second))
		return sb.String()
	}
	fmt.Fprintf(&sb, "\nOne run of TestBenchmarkAllRows: %d records for the rows at size, %s per bench run, %s in all.\n", records, b.dur, time.Since(b.started).Round(time.Second))
	fmt.Fprintf(&sb, "Floors of each bench run (p50, mean of before → after):\n\n")
	for _, n := range b.notes {
		fmt.Fprintf(&sb, "- %s\n", n)
	}
	return sb.String()
}

// stdioCreates: new create_orders one at a time over stdio, against the
// no-op + commit floor, and the pages and CPU of the same create in
// process.
func (b *allBench) stdioCreates() {
	const (
		first = "first `create_order` over stdio (p50)"
		pages = "pages written per create commit"
		cpu   = "server CPU per create (separate process, sequential)"
	)
	rep, err := b.bench("stdio-creates", "--floors", "--clients", "1", "--dup-ratio", "0", "--mix", "create_order=1", "--duration", b.dur)
	if err != nil {
		b.failed(first, "≤ 1.6 × the floor", err)
		return
	}
	f, k, p := rep.Floors, rep.Kinds["create_order/new"], rep.Floors.InProcess
	ra := rep.Ratios["create_order/new"]
	b.add(allRow{first, us(k.Latency.P50), fmt.Sprintf("%s (no-op %s + commit %s)", us(f.NoopP50+f.CommitP50), us(f.NoopP50), us(f.CommitP50)),
		times(ra.NoopCommit), "≤ 1.6 × the floor", atMost(ra.NoopCommit, 1.6)})
	b.add(allRow{pages, fmt.Sprintf("%.1f (%.2f commits per create, in process)", p.PagesPerCommit, p.CommitsPerCreate),
		fmt.Sprintf("%.1f for a raw put", f.CommitPages), times(p.PagesPerCommit / f.CommitPages), "≤ 10", yesNo(p.PagesPerCommit <= 10)})
	c := rep.ServerCPU
	b.add(allRow{cpu, us(c.PerCall) + " (until its confirmation was delivered)", us(p.CPUPerCreateDelivered) + " in process, with its delivery",
		times(c.XInProcess), "≤ 1.3 × in process", atMost(c.XInProcess, 1.3)})
}

// syncsPerCreate counts the syncs of the spawned server (and of bench,
// which makes none) under strace, filtered by seccomp so the other
// syscalls run untraced: sequential new creates, their confirmations
// delivered.
func (b *allBench) syncsPerCreate() {
	const name, target = "syncs per create, one caller", "≤ 2.1"
	if _, err := exec.LookPath("strace"); err != nil {
		b.add(allRow{name, "—", "—", "—", target, "not measured: strace is not installed"})
		return
	}
	out := filepath.Join(b.dir, "strace.txt")
	args := []string{"-f", "--seccomp-bpf", "-c", "-e", "trace=fsync,fdatasync,syncfs", "-o", out,
		idemgate, "bench", "--clients", "1", "--calls", "2000", "--duration", b.dur, "--dup-ratio", "0", "--mix", "create_order=1", "--json"}
	b.t.Logf("bench syncs: strace %s", strings.Join(args, " "))
	cmd := exec.Command("strace", args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		b.failed(name, target, fmt.Errorf("%v: %s", err, stderr.String()))
		return
	}
	b.save("syncs.json", stdout.Bytes())
	var rep loadgen.Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		b.failed(name, target, err)
		return
	}
	summary, err := os.ReadFile(out)
	if err != nil {
		b.failed(name, target, err)
		return
	}
	b.save("syncs-strace.txt", summary)
	c := parseStraceCounts(string(summary))
	n := float64(rep.Correctness.Keys["create_order"])
	all := float64(c["fsync"]+c["fdatasync"]+c["syncfs"]) / n
	b.add(allRow{name, fmt.Sprintf("%.2f (fdatasync %.2f, syncfs %.2f, fsync %.2f; %d creates)", all, float64(c["fdatasync"])/n, float64(c["syncfs"])/n, float64(c["fsync"])/n, int(n)),
		"2 (one bbolt commit)", times(all / 2), target, yesNo(all <= 2.1)})
}

// replays: a replay against a get_order with the same answer, and the
// server's CPU per replay against the no-op server's.
func (b *allBench) replays() {
	const (
		vsGet = "replay over stdio (p50)"
		cpu   = "replay: server CPU per call"
	)
	if rep, err := b.bench("stdio-replay-vs-get", "--floors", "--clients", "1", "--dup-ratio", "1", "--mix", "create_order=1,get_order=1", "--duration", b.dur); err != nil {
		b.failed(vsGet, "≤ 1.2 × `get_order`", err)
	} else {
		b.add(allRow{vsGet, us(rep.Kinds["create_order/replay"].Latency.P50), us(rep.Kinds["get_order"].Latency.P50) + " for a `get_order` with the same answer",
			times(rep.ReplayVsGet), "≤ 1.2 × `get_order`", atMost(rep.ReplayVsGet, 1.2)})
	}
	if rep, err := b.bench("stdio-replay-cpu", "--floors", "--clients", "1", "--dup-ratio", "1", "--mix", "create_order=1", "--duration", b.dur); err != nil {
		b.failed(cpu, "≤ 1.5 × no-op", err)
	} else {
		c := rep.ServerCPU
		b.add(allRow{cpu, us(c.PerCall), us(rep.Floors.NoopCPUPerCall) + " for a no-op call", times(c.XNoop), "≤ 1.5 × no-op", atMost(c.XNoop, 1.5)})
	}
}

// overHTTP: 64 clients over Streamable HTTP against the no-op floor at 64
// connections — new creates (with their confirmations watched), then
// replays — on one server with --workers 64.
func (b *allBench) overHTTP() {
	dir := filepath.Join(b.dir, "http")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		b.t.Fatal(err)
	}
	// A subtest, so that the server stops with it, before the next rows.
	b.t.Run("http", func(t *testing.T) { b.overHTTPServer(t, dir) })
}

func (b *allBench) overHTTPServer(t *testing.T, dir string) {
	const (
		creates  = "HTTP, 64 clients, creates/s"
		replays  = "HTTP, 64 clients, replays/s"
		delivery = "confirmation delivery under load (64 HTTP callers, segment sink)"
	)
	// The server writes its confirmations with the segment sink: the sink
	// that meets the delivery targets (see sinkPerMessage).
	base, tok, pid := benchHTTPServer(t, dir, "--workers", "64", "--outbox-format", "segments")
	common := []string{"--url", base + "/mcp", "--token", tok, "--server-pid", fmt.Sprint(pid), "--floors", "--clients", "64", "--duration", b.dur}
	if rep, err := b.bench("http-creates", append(common, "--outbox-dir", filepath.Join(dir, "outbox"), "--dup-ratio", "0", "--mix", "create_order=1")...); err != nil {
		b.failed(creates, "≥ 30 % of no-op calls/s", err)
	} else {
		k, f := rep.Kinds["create_order/new"], rep.Floors
		share := k.Throughput / f.NoopRate
		b.add(allRow{creates, rate(k.Throughput), rate(f.NoopRate) + " no-op calls at 64 connections", fmt.Sprintf("%.0f %%", 100*share), "≥ 30 %", atLeast(share, 0.30)})
		d := rep.Delivery
		backlog := "no backlog at the end"
		switch {
		case d.BacklogAtEnd > 0 && d.Drained:
			backlog = fmt.Sprintf("backlog %d at the end, delivered in %.2f s (%.0f/s)", d.BacklogAtEnd, d.DrainSeconds, d.DrainPerS)
		case d.BacklogAtEnd > 0:
			backlog = fmt.Sprintf("backlog %d at the end, %d left after the drain timeout", d.BacklogAtEnd, d.Left)
		}
		b.add(allRow{delivery, fmt.Sprintf("%s written during the run; %s", rate(d.DeliveredPerS), backlog), rate(d.QueuedPerS) + " queued (creates/s)",
			times(d.KeepUp), "keeps up with creates", yesNo(d.KeepUp >= 0.95 && d.Drained)})
	}
	if rep, err := b.bench("http-replays", append(common, "--dup-ratio", "1", "--key-space", "1000", "--mix", "create_order=1")...); err != nil {
		b.failed(replays, "≥ 70 % of no-op calls/s", err)
	} else {
		k, f := rep.Kinds["create_order/replay"], rep.Floors
		share := k.Throughput / f.NoopRate
		b.add(allRow{replays, rate(k.Throughput), rate(f.NoopRate) + " no-op calls at 64 connections", fmt.Sprintf("%.0f %%", 100*share), "≥ 70 %", atLeast(share, 0.70)})
	}
}

// sinkPerMessage: the segment sink's cost per message in passes of 100
// (outbox's BenchmarkDirSink), against an fsync per message in the same
// run, with the directory sink's beside it; and the test that a full pass
// starts the next at once (with either sink).
func (b *allBench) sinkPerMessage() {
	const name, target = "delivery cost per message (segment sink, passes of 100)", "≤ 50 µs amortised"
	res, err := b.goBench("dirsink", "./outbox/", "BenchmarkDirSink/^(floor=fsync_per_message|sink=tmpfile,sync=syncfs|sink=segments,sync=fdatasync)$", nil, "-benchtime", "2000x")
	if err != nil {
		b.failed(name, target, err)
	} else {
		now, floor := res["BenchmarkDirSink/sink=segments,sync=fdatasync"]["ns/op"]/1e3, res["BenchmarkDirSink/floor=fsync_per_message"]["ns/op"]/1e3
		files := res["BenchmarkDirSink/sink=tmpfile,sync=syncfs"]["ns/op"] / 1e3
		b.add(allRow{name, fmt.Sprintf("%s (the directory sink: %s)", us(now), us(files)), us(floor) + " for a file fsynced per message", times(now / floor), target, yesNo(now > 0 && now <= 50)})
	}
	const full = "a full delivery pass starts the next at once"
	cmd := exec.Command("go", "test", "-count=1", "-run", "^TestFullPassStartsNextAtOnce$", "./outbox/")
	cmd.Dir = moduleRoot
	out, err := cmd.CombinedOutput()
	b.save("full-pass.txt", out)
	b.add(allRow{full, "TestFullPassStartsNextAtOnce " + map[bool]string{true: "passes", false: "fails"}[err == nil], "—", "—", "a full pass starts the next at once", yesNo(err == nil)})
}

// processesOnOneFile: 1, 2 and 4 bench processes at once, each spawning a
// server on the same new ledger file, 8 callers each, new creates.
func (b *allBench) processesOnOneFile() {
	var one float64
	for _, n := range []int{1, 2, 4} {
		db := filepath.Join(b.dir, fmt.Sprintf("procs-%d", n), "ledger.db")
		reps := make([]*loadgen.Report, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				reps[i], errs[i] = b.bench(fmt.Sprintf("processes-%d-%d", n, i), "--db", db, "--clients", "8", "--dup-ratio", "0", "--mix", "create_order=1", "--duration", b.dur, "--drain-timeout", "0")
			})
		}
		wg.Wait()
		total, p99 := 0.0, 0.0
		var err error
		for i := range n {
			if errs[i] != nil {
				err = errs[i]
				break
			}
			total += reps[i].Throughput
			p99 = max(p99, reps[i].Latency.P99)
		}
		var name, target string
		var limit float64
		switch n {
		case 1:
			if err != nil {
				b.failed("one process on a file, 8 callers (the floor of the next rows)", "—", err)
				return
			}
			one = total
			continue
		case 2:
			name, target, limit = "two processes on one file, 8 callers each", "≥ 0.9 × one process", 0.9
		case 4:
			name, target, limit = "four processes on one file, 8 callers each", "≥ 0.8 × one process", 0.8
		}
		if err != nil {
			b.failed(name, target, err)
			continue
		}
		b.add(allRow{name + ": calls/s", rate(total), rate(one) + " for one process", times(total / one), target, atLeast(total/one, limit)})
		b.add(allRow{name + ": p99", fmt.Sprintf("%.1f ms (the worst process's)", p99/1e3), "—", "—", "≤ 50 ms", yesNo(p99 <= 50_000)})
	}
}

// fileGrowth: the ledger file's size per create as written, compacted, and
// with the audit log exported, pruned and the file compacted.
func (b *allBench) fileGrowth() {
	const name, target = "file growth per create", "≤ 2.5 KB"
	dir := filepath.Join(b.dir, "growth")
	db := filepath.Join(dir, "ledger.db")
	rep, err := b.bench("growth", "--db", db, "--calls", "3000", "--duration", "0", "--clients", "8", "--dup-ratio", "0", "--mix", "create_order=1")
	if err != nil {
		b.failed(name, target, err)
		return
	}
	stopOwner(b.t, db) // compact needs the file to itself
	n := float64(rep.Correctness.Keys["create_order"])
	size := func(path string) float64 {
		st, err := os.Stat(path)
		if err != nil {
			b.t.Error(err)
			return 0
		}
		return float64(st.Size()) / n / 1000
	}
	written := size(db)
	steps := [][]string{
		{"compact", "--db", db, "--out", filepath.Join(dir, "compacted.db")},
		nil, // prune, once a second has passed since the last entry
		{"compact", "--db", db, "--no-backup"},
	}
	time.Sleep(1100 * time.Millisecond) // audit prune --before takes whole seconds and refuses the future
	steps[1] = []string{"audit", "prune", "--db", db, "--before", time.Now().UTC().Format(time.RFC3339), "--export", filepath.Join(dir, "audit.jsonl")}
	for _, s := range steps {
		if _, err := b.idemgate(30*time.Minute, s...); err != nil {
			b.failed(name, target, err)
			return
		}
	}
	compacted, pruned, export := size(filepath.Join(dir, "compacted.db")), size(db), size(filepath.Join(dir, "audit.jsonl"))
	b.add(allRow{name, fmt.Sprintf("%.1f KB with the audit log pruned and compacted (%.1f KB as written, %.1f KB compacted; %.0f creates)", pruned, written, compacted, n),
		"—", "—", target + "; audit archived and pruned; space reclaimed", fmt.Sprintf("%s (export: %.1f KB per create)", yesNo(pruned <= 2.5), export)})
}

// createAtSize: the same create in process (no MCP, the deliverer
// stopped) on a ledger of 10 000 and of records operations, each filled by
// create_orders through the tool service.
func (b *allBench) createAtSize(records int) {
	name := fmt.Sprintf("create at %s vs 10 k records (in process, p50)", sizeText(records))
	const target = "≤ 1.1 ×"
	at := func(n int) (*loadgen.InProcess, error) {
		db := filepath.Join(b.dir, fmt.Sprintf("size-%d", n), "ledger.db")
		b.t.Logf("bench size %d: idemgate bench %s --db %s --fill %d", n, inProcessArgForTests, db, n)
		out, err := b.idemgate(6*time.Hour, "bench", inProcessArgForTests, "--db", db, "--fill", fmt.Sprint(n))
		b.save(fmt.Sprintf("size-%d.json", n), out)
		if err != nil {
			return nil, err
		}
		var p loadgen.InProcess
		if err := json.Unmarshal(out, &p); err != nil {
			return nil, err
		}
		if st, err := os.Stat(db); err == nil {
			b.note(fmt.Sprintf("ledger of %d records: filled in %.0f s, %.2f GB", n, p.FillSeconds, float64(st.Size())/1e9))
		}
		os.RemoveAll(filepath.Dir(db))
		return &p, nil
	}
	small, err := at(10_000)
	if err != nil {
		b.failed(name, target, err)
		return
	}
	large, err := at(records)
	if err != nil {
		b.failed(name, target, err)
		return
	}
	b.add(allRow{name, us(large.P50), us(small.P50) + " at 10 k", times(large.P50 / small.P50), target, atMost(large.P50/small.P50, 1.1)})
	b.add(allRow{fmt.Sprintf("pages per create commit at %s vs 10 k records", sizeText(records)), fmt.Sprintf("%.1f", large.PagesPerCommit),
		fmt.Sprintf("%.1f at 10 k", small.PagesPerCommit), times(large.PagesPerCommit / small.PagesPerCommit), "(with the row above)", "—"})
}

// sweep: ledger/bolt's BenchmarkSweepClaimWait with records due records:
// two callers claim throughout the sweep, and the same callers making as
// many claims with no sweep are the floor, in the same run.
func (b *allBench) sweep(records int) {
	name := fmt.Sprintf("retention sweep of %s due records: the worst claim", sizeText(records))
	const target = "no claim waits > 20 ms because of a sweep"
	res, err := b.goBench("sweep", "./ledger/bolt/", "^BenchmarkSweepClaimWait$", []string{fmt.Sprintf("IDEMGATE_SWEEP_RECORDS=%d", records)}, "-benchtime", "1x", "-timeout", "0")
	if err != nil {
		b.failed(name, target, err)
		return
	}
	m := res["BenchmarkSweepClaimWait"]
	during, alone := m["claim-max-ms"], m["floor-max-ms"]
	b.add(allRow{name, fmt.Sprintf("%.1f ms (p50 %.1f ms, p99 %.1f ms, of %.0f claims; the longest wait of a transaction for a sweep transaction %.1f ms; the sweep took %.0f s)", during, m["claim-p50-ms"], m["claim-p99-ms"], m["claims-during-sweep"], m["behind-sweep-max-ms"], m["sweep-s"]),
		fmt.Sprintf("%.1f ms with no sweep (p50 %.1f ms, p99 %.1f ms)", alone, m["floor-p50-ms"], m["floor-p99-ms"]), fmt.Sprintf("+%.1f ms", during-alone),
		"≤ +20 ms over the worst claim with no sweep", yesNo(during-alone <= 20)})
}

func sizeText(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%d M", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%d k", n/1000)
	}
	return fmt.Sprint(n)
}

// inProcessArgForTests is the command line's argument for the in-process
// creates (cmd_bench_inproc.go).
const inProcessArgForTests = "__in-process"

// TestBenchAllRowsParsers: the parsers and the judging of
// TestBenchmarkAllRows, on outputs of the tools they read.
func TestBenchAllRowsParsers(t *testing.T) {
	name, m, ok := parseBenchLine("BenchmarkDirSink/sink=tmpfile,sync=syncfs-2   \t    2000\t     91234 ns/op\t     10960 msgs/s\t         0.01000 syncs/msg")
	if !ok || name != "BenchmarkDirSink/sink=tmpfile,sync=syncfs" || m["ns/op"] != 91234 || m["msgs/s"] != 10960 || m["syncs/msg"] != 0.01 {
		t.Fatalf("parseBenchLine = %q, %v, %v", name, m, ok)
	}
	if name, m, ok := parseBenchLine("BenchmarkSweepClaimWait \t 1\t7400000000 ns/op\t 32.50 claim-max-ms\t 3.900 claim-p50-ms"); !ok || name != "BenchmarkSweepClaimWait" || m["claim-max-ms"] != 32.5 {
		t.Fatalf("parseBenchLine (no GOMAXPROCS suffix) = %q, %v, %v", name, m, ok)
	}
	for _, line := range []string{"goos: linux", "PASS", "ok  \tidemgate/outbox\t3.1s", "BenchmarkX-2 --- FAIL", "BenchmarkX-2 \t 10 \t abc ns/op"} {
		if _, _, ok := parseBenchLine(line); ok {
			t.Errorf("parseBenchLine(%q) took it for a result", line)
		}
	}

	strace := `% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 91.02    1.201000         600      2002           fdatasync
  8.50    0.112000         448       250           syncfs
  0.48    0.006300         315        20         1 fsync
------ ----------- ----------- --------- --------- ----------------
100.00    1.319300         582      2272         1 total
`
	if got := parseStraceCounts(strace); len(got) != 3 || got["fdatasync"] != 2002 || got["syncfs"] != 250 || got["fsync"] != 20 {
		t.Fatalf("parseStraceCounts = %v", got)
	}

	for _, tc := range []struct {
		got, want string
	}{
		{atMost(1.59, 1.6), "yes"}, {atMost(1.61, 1.6), "**no**"}, {atMost(0, 1.6), "**no**"},
		{atLeast(0.3, 0.3), "yes"}, {atLeast(0.29, 0.3), "**no**"},
		{times(0), "—"}, {times(math.Inf(1)), "—"}, {times(1.234), "1.23×"},
		{sizeText(1_000_000), "1 M"}, {sizeText(20_000), "20 k"}, {sizeText(1500), "1500"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	if d := allRowsEstimate(1_000_000, 10); d < 12*time.Minute || d > 25*time.Minute {
		t.Errorf("the estimate at 1 M records is %v: out of line with what BENCHMARKS.md says", d)
	}
}
