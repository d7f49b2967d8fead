package bolt

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"idemgate/ledger"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// Several processes on one ledger file (DESIGN §7: each MCP client spawns
// its own server). The test binary re-executes itself as helper processes
// (TestHelperProcess, selected by helperModeEnv); each helper runs its
// Execute calls against the shared file and prints a report line.

const (
	helperModeEnv  = "IDEMGATE_LEDGER_HELPER"       // "mixed" or "onekey"
	helperPathEnv  = "IDEMGATE_LEDGER_HELPER_PATH"  // the ledger file
	helperIndexEnv = "IDEMGATE_LEDGER_HELPER_INDEX" // this helper's number
	helperCallsEnv = "IDEMGATE_LEDGER_HELPER_CALLS" // how many Execute calls
	helperReport   = "HELPER-REPORT "
	helperReady    = "HELPER-READY" // the helper has opened the ledger
)

// helperResult is what one helper process reports.
type helperResult struct {
	Index    int      `json:"index"`
	Done     int      `json:"done"`
	Executed int      `json:"executed"`
	Replayed int      `json:"replayed"`
	MaxMS    float64  `json:"max_ms"`
	TotalMS  float64  `json:"total_ms"`
	Errors   []string `json:"errors,omitempty"`
	// Writer: this process was the file's writer when every helper had
	// opened it (the others forward their transactions to it).
	Writer bool `json:"writer"`
}

// helperKeys is the key sequence of helper index in mode: in "mixed" every
// even call uses a key shared by all helpers (in the same order, so they
// race for it) and every odd call a key of its own; in "onekey" every call
// uses one key.
func helperKeys(mode string, index, calls int) []string {
	keys := make([]string, calls)
	for j := range keys {
		switch {
		case mode == "onekey":
			keys[j] = "the-one-key"
		case j%2 == 0:
			keys[j] = fmt.Sprintf("shared-%04d", j/2)
		default:
			keys[j] = fmt.Sprintf("own%d-%04d", index, j/2)
		}
	}
	return keys
}

// helperClaim is the claim every process makes for key: the same request,
// so a second process gets a replay, never a mismatch.
func helperClaim(key string) ledger.Claim {
	return ledger.Claim{Actor: testActor("t1"), Key: key, Tool: "create_order", Fingerprint: "fp-" + key, OnLeaseExpiry: ledger.StateRetryable}
}

// helperApply writes one uniquely named effect per execution, so a second
// execution of a key would show as a second value under its prefix.
func helperApply(index int) ledger.ApplyFunc {
	return func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		if err := tx.Put(effectsCollection, rec.Key+"/"+uuid.NewString(), []byte(strconv.Itoa(index))); err != nil {
			return ledger.Outcome{}, err
		}
		return ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{"key":"` + rec.Key + `"}`)}, nil
	}
}

// TestHelperProcess is not a test: it is the body of a helper process.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(helperModeEnv)
	if mode == "" {
		t.Skip("helper process body; run by the multi-process tests")
	}
	index, _ := strconv.Atoi(os.Getenv(helperIndexEnv))
	calls, _ := strconv.Atoi(os.Getenv(helperCallsEnv))
	res := helperResult{Index: index}
	report := func() {
		b, _ := json.Marshal(res)
		fmt.Fprintf(os.Stdout, "\n%s%s\n", helperReport, b)
	}
	s, err := Open(os.Getenv(helperPathEnv), ledger.Options{})
	if err != nil {
		res.Errors = append(res.Errors, "open: "+err.Error())
		report()
		return
	}
	// Wait for the parent's start signal, given once every helper has
	// opened the file, so every helper begins at once.
	fmt.Println(helperReady)
	if _, err := io.ReadFull(os.Stdin, make([]byte, 1)); err != nil {
		res.Errors = append(res.Errors, "start signal: "+err.Error())
	}
	res.Writer = s.sh.isWriter() // every helper has the file open
	ctx := context.Background()
	apply := helperApply(index)
	begin := time.Now()
	for _, key := range helperKeys(mode, index, calls) {
		t0 := time.Now()
		d, err := s.Execute(ctx, helperClaim(key), apply)
		ms := float64(time.Since(t0).Microseconds()) / 1000
		res.MaxMS = max(res.MaxMS, ms)
		switch {
		case err != nil:
			res.Errors = append(res.Errors, key+": "+err.Error())
			continue
		case d.Kind == ledger.DecisionExecuted:
			res.Executed++
		case d.Kind == ledger.DecisionReplay:
			res.Replayed++
		default:
			res.Errors = append(res.Errors, fmt.Sprintf("%s: decision %s", key, d.Kind))
		}
		if want := `{"key":"` + key + `"}`; string(d.Record.Result) != want {
			res.Errors = append(res.Errors, fmt.Sprintf("%s: result %s, want %s", key, d.Record.Result, want))
		}
		res.Done++
	}
	res.TotalMS = float64(time.Since(begin).Microseconds()) / 1000
	if err := s.Close(); err != nil {
		res.Errors = append(res.Errors, "close: "+err.Error())
	}
	report()
}

// runHelpers starts procs helper processes in mode on path, releases them
// at once and returns their reports.
func runHelpers(t *testing.T, mode, path string, procs, calls int) []helperResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type proc struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		stdout bytes.Buffer  // once done is closed
		done   chan struct{} // stdout was read to its end
		stderr bytes.Buffer
	}
	ready := make(chan int, procs)
	ps := make([]*proc, procs)
	for i := range ps {
		p := &proc{cmd: exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1", "-test.timeout=60s"), done: make(chan struct{})}
		p.cmd.Env = append(os.Environ(),
			helperModeEnv+"="+mode,
			helperPathEnv+"="+path,
			helperIndexEnv+"="+strconv.Itoa(i),
			helperCallsEnv+"="+strconv.Itoa(calls),
		)
		p.cmd.Stderr = &p.stderr
		var err error
		if p.stdin, err = p.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		out, err := p.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := p.cmd.Start(); err != nil {
			t.Fatalf("start helper %d: %v", i, err)
		}
		go func() {
			defer close(p.done)
			sent := false
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if sc.Text() == helperReady && !sent {
					ready <- i
					sent = true
				}
				p.stdout.WriteString(sc.Text() + "\n")
			}
			io.Copy(io.Discard, out)
			if !sent { // it failed before it was ready: its report says why
				ready <- i
			}
		}()
		ps[i] = p
	}
	for range ps { // every helper has opened the file (or failed: it reports)
		select {
		case <-ready:
		case <-ctx.Done():
			t.Fatal("the helpers did not all open the ledger in 60 s")
		}
	}
	for _, p := range ps { // the start signal
		p.stdin.Write([]byte{1})
		p.stdin.Close()
	}
	results := make([]helperResult, procs)
	for i, p := range ps {
		<-p.done
		err := p.cmd.Wait()
		var line string
		sc := bufio.NewScanner(&p.stdout)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), helperReport); ok {
				line = rest
			}
		}
		if err != nil || line == "" {
			t.Fatalf("helper %d: %v\nstdout:\n%s\nstderr:\n%s", i, err, p.stdout.String(), p.stderr.String())
		}
		if err := json.Unmarshal([]byte(line), &results[i]); err != nil {
			t.Fatalf("helper %d report %q: %v", i, line, err)
		}
	}
	return results
}

// checkHelpers asserts exactly-once across processes and that no process
// starved, and returns the distinct keys.
func checkHelpers(t *testing.T, mode, path string, results []helperResult, calls int, maxLatency time.Duration) {
	t.Helper()
	distinct := map[string]bool{}
	for i := range results {
		for _, k := range helperKeys(mode, i, calls) {
			distinct[k] = true
		}
	}
	executed, writers := 0, 0
	for _, r := range results {
		if r.Writer {
			writers++
		}
		t.Logf("process %d: %d/%d calls done (%d executed, %d replayed) in %.0f ms, max single call %.1f ms",
			r.Index, r.Done, calls, r.Executed, r.Replayed, r.TotalMS, r.MaxMS)
		for _, e := range r.Errors {
			t.Errorf("process %d: %s", r.Index, e)
		}
		if r.Done != calls {
			t.Errorf("process %d finished %d of %d calls", r.Index, r.Done, calls)
		}
		if r.MaxMS > float64(maxLatency.Milliseconds()) {
			t.Errorf("process %d waited %.0f ms for one call (bound %v): starved", r.Index, r.MaxMS, maxLatency)
		}
		executed += r.Executed
	}
	if executed != len(distinct) {
		t.Errorf("%d executions reported across processes, want one per key: %d", executed, len(distinct))
	}
	if writers != 1 {
		t.Errorf("%d of %d processes were the file's writer once all had opened it, want 1 (the others forward)", writers, len(results))
	}

	s := mustOpenPath(t, path, ledger.Options{})
	perKey := map[string]int{}
	for k := range effects(t, s) {
		key, _, _ := strings.Cut(k, "/")
		perKey[key]++
	}
	total := 0
	for k, n := range perKey {
		total += n
		if n != 1 {
			t.Errorf("key %s has %d side effects, want 1", k, n)
		}
		if !distinct[k] {
			t.Errorf("effect of unexpected key %s", k)
		}
	}
	if total != len(distinct) {
		t.Errorf("%d side effects for %d distinct keys", total, len(distinct))
	}
	for k := range distinct {
		rec, err := s.Get(context.Background(), "t1", k)
		if err != nil {
			t.Errorf("Get(%s): %v", k, err)
			continue
		}
		if rec.State != ledger.StateSucceeded || rec.Attempts != 1 {
			t.Errorf("%s: state %s, attempts %d; want succeeded, 1", k, rec.State, rec.Attempts)
		}
	}
	if n, err := s.VerifyAudit(context.Background()); err != nil {
		t.Errorf("VerifyAudit after %d processes: %d entries, %v", len(results), n, err)
	}
}

// TestMultiProcessOverlappingKeys: 2 processes × 500 Execute calls on one
// file, half of each process's keys shared with the other.
func TestMultiProcessOverlappingKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	const procs, calls = 2, 500
	path := filepath.Join(t.TempDir(), "ledger.db")
	results := runHelpers(t, "mixed", path, procs, calls)
	checkHelpers(t, "mixed", path, results, calls, 3*time.Second)
}

// TestMultiProcessOneKey: 3 processes × 16 calls of one key, all released
// at once: one side effect.
func TestMultiProcessOneKey(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	const procs, calls = 3, 16
	path := filepath.Join(t.TempDir(), "ledger.db")
	results := runHelpers(t, "onekey", path, procs, calls)
	checkHelpers(t, "onekey", path, results, calls, 3*time.Second)
}
