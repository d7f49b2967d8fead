package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestBenchmarkOwnerRows measures the rows of issue 19 alone (they are
// also rows of TestBenchmarkAllRows): one, two and four `idemgate bench`
// processes on one ledger file, and a server's start-up as an MCP client
// sees it. Run it with IDEMGATE_BENCH_OWNER=1 (see BENCHMARKS.md).
func TestBenchmarkOwnerRows(t *testing.T) {
	if os.Getenv("IDEMGATE_BENCH_OWNER") != "1" {
		t.Skip("set IDEMGATE_BENCH_OWNER=1 to measure the rows of the ledger's owner (see BENCHMARKS.md)")
	}
	secs := envInt(t, "IDEMGATE_BENCH_SECONDS", 10)
	b := newAllBench(t, secs)
	b.startup()
	b.processesOnOneFile()
	fmt.Println(b.markdown(0))
}

// startupRounds is how many starts of each server the start-up row
// measures, interleaved so that the machine's drift touches both alike.
const startupRounds = 30

// startup: how long an MCP client waits from spawning a server to the
// answer of its initialize — idemgate serve on a ledger file whose owner
// already runs, against a no-op mcp-go stdio server in a program of its
// own (e2e/testdata/noop, built here) in the same run — and what the
// first start costs, which starts the owner.
func (b *allBench) startup() {
	const name, target = "start-up over stdio with the owner running (spawn → initialize answered; p50)", "≤ 1.2 × the no-op server's"
	db := filepath.Join(b.dir, "startup", "ledger.db")
	if err := os.MkdirAll(filepath.Dir(db), 0o700); err != nil {
		b.failed(name, target, err)
		return
	}
	bin := filepath.Join(b.dir, "noop")
	if err := goBuild("build", "-o", bin, "./e2e/testdata/noop"); err != nil {
		b.failed(name, target, err)
		return
	}
	serve := append([]string{idemgate}, "serve", "--db", db, "--log-level", "warn")
	noop := []string{bin}
	first, _, err := spawnInitialize(serve)
	if err != nil {
		b.failed(name, target, err)
		return
	}
	// The owner now runs (it stays a minute after its last client).
	var withOwner, noops []time.Duration
	var rss int
	for range startupRounds {
		d, _, err := spawnInitialize(noop)
		if err != nil {
			b.failed(name, target, err)
			return
		}
		noops = append(noops, d)
		d, kb, err := spawnInitialize(serve)
		if err != nil {
			b.failed(name, target, err)
			return
		}
		withOwner = append(withOwner, d)
		rss = max(rss, kb)
	}
	stopOwner(b.t, db)
	p50 := func(ds []time.Duration) time.Duration { slices.Sort(ds); return ds[len(ds)/2] }
	s, n := p50(withOwner), p50(noops)
	ratio := float64(s) / float64(n)
	b.add(allRow{name, fmt.Sprintf("%d µs (the first start, which starts the owner: %d µs; the serve's RSS %.1f MB)", s.Microseconds(), first.Microseconds(), float64(rss)/1024),
		fmt.Sprintf("%d µs for the no-op mcp-go server", n.Microseconds()), times(ratio), target, atMost(ratio, 1.2)})
}

// spawnInitialize starts the command argv, sends an initialize and
// returns how long the answer took from the spawn, and the process's
// resident memory (KB) once it answered; then it ends the process (the
// end of its input).
func spawnInitialize(argv []string) (time.Duration, int, error) {
	cmd := exec.Command(argv[0], argv[1:]...) // the caller stops the owner
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return 0, 0, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return 0, 0, err
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, 0, err
	}
	defer cmd.Wait()
	defer stdin.Close()
	if _, err := stdin.Write([]byte(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"startup","version":"1"}}}` + "\n")); err != nil {
		return 0, 0, err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	took := time.Since(began)
	if err != nil || !strings.Contains(line, `"result"`) {
		return 0, 0, fmt.Errorf("%v: initialize answered %q (%v): %s", argv, line, err, stderr.String())
	}
	return took, vmRSS(cmd.Process.Pid), nil
}

// vmRSS is the resident memory of process pid in KB (0 when unknown).
func vmRSS(pid int) int {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	return 0
}
