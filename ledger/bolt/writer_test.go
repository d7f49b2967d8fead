package bolt

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/bolt/forward"
	"idemgate/ledger/ledgertest"
)

// openForwarder opens path a second time in this process, beside the
// writer w: the second open must forward to w, not open the file.
func openForwarder(t *testing.T, path string, o ledger.Options) *File {
	t.Helper()
	f, err := Open(path, o)
	if err != nil {
		t.Fatalf("second Open(%s): %v", path, err)
	}
	if f.be != nil || f.sh.client == nil {
		f.Close()
		t.Fatalf("the second open of %s opened the file instead of forwarding to its writer", path)
	}
	return f
}

// TestForwarderContract runs the whole ledger contract on a forwarder:
// every transaction goes over the socket to the writer's file.
func TestForwarderContract(t *testing.T) {
	ledgertest.Run(t, func(t *testing.T, o ledger.Options) ledger.Store {
		path := filepath.Join(t.TempDir(), "ledger.db")
		w := mustOpenPath(t, path, ledger.Options{})
		if w.be == nil {
			t.Fatal("the first open is not the writer")
		}
		f := openForwarder(t, path, o)
		t.Cleanup(func() { f.Close() }) // before the writer's (cleanups run last first)
		return f
	})
}

// TestForwarderBackendContract checks the backend guarantees one by one
// on a forwarder's backend.
func TestForwarderBackendContract(t *testing.T) {
	ledgertest.RunBackend(t, func(t *testing.T) ledger.Backend {
		path := filepath.Join(t.TempDir(), "ledger.db")
		mustOpenPath(t, path, ledger.Options{})
		return openForwarder(t, path, ledger.Options{}).sh
	})
}

// TestSocketPathTooLong: a ledger path too long for a unix socket gets a
// hashed socket name in the runtime directory, and forwarding works.
func TestSocketPathTooLong(t *testing.T) {
	dir := filepath.Join(t.TempDir(), strings.Repeat("d", 60), strings.Repeat("e", 60))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	runtime := t.TempDir()
	t.Setenv("XDG_RUNTIME_DIR", runtime)
	path := filepath.Join(dir, "ledger.db")
	w := mustOpenPath(t, path, ledger.Options{})
	if !strings.HasPrefix(w.sh.sock, runtime+string(filepath.Separator)) {
		t.Fatalf("socket %s, want one in %s", w.sh.sock, runtime)
	}
	fi, err := os.Stat(w.sh.sock)
	if err != nil {
		t.Fatal(err)
	}
	if got := fi.Mode().Perm(); got != 0o600 {
		t.Errorf("socket mode %o, want 600", got)
	}
	f := openForwarder(t, path, ledger.Options{})
	defer f.Close()
	if _, err := f.Execute(context.Background(), newClaim("t1", "create_order", "fp"), helperApply(1)); err != nil {
		t.Fatalf("Execute through the forwarder: %v", err)
	}
}

// TestFailoverWhenWriterCloses: two forwarders run concurrent Executes of
// overlapping keys while the writer closes; one of them becomes the writer
// and every call completes with one execution per key.
func TestFailoverWhenWriterCloses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	w, err := Open(path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fs := []*File{openForwarder(t, path, ledger.Options{}), openForwarder(t, path, ledger.Options{})}
	const workers, calls = 8, 60
	var wg sync.WaitGroup
	errs := make(chan error, len(fs)*workers*calls)
	started := make(chan struct{}, len(fs)*workers)
	for i, f := range fs {
		for g := range workers {
			wg.Go(func() {
				for j := range calls {
					if j == 2 {
						started <- struct{}{}
					}
					key := fmt.Sprintf("shared-%d-%d", g, j)
					if j%2 == 1 {
						key = fmt.Sprintf("own%d-%d-%d", i, g, j)
					}
					d, err := f.Execute(context.Background(), helperClaim(key), helperApply(i))
					if err != nil {
						errs <- fmt.Errorf("%s: %w", key, err)
					} else if d.Kind != ledger.DecisionExecuted && d.Kind != ledger.DecisionReplay {
						errs <- fmt.Errorf("%s: decision %s", key, d.Kind)
					}
				}
			})
		}
	}
	for range len(fs) * workers {
		<-started
	}
	if err := w.Close(); err != nil {
		t.Errorf("writer Close: %v", err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	failovers := fs[0].sh.failovers.Load() + fs[1].sh.failovers.Load()
	t.Logf("failovers %d, outcomes read back %d", failovers, fs[0].sh.readBacks.Load()+fs[1].sh.readBacks.Load())
	if failovers == 0 {
		t.Error("no forwarder noticed the writer close")
	}
	if a, b := fs[0].sh.isWriter(), fs[1].sh.isWriter(); a == b {
		t.Errorf("writers after the close: %v, %v; want exactly one", a, b)
	}
	for _, f := range fs {
		f.Close()
	}
	checkOneEffectPerKey(t, path, nil)
}

// checkOneEffectPerKey opens path and checks that no key has more than one
// side effect, that every key with an effect has a succeeded record, and
// that every key in mustHave has exactly one effect.
func checkOneEffectPerKey(t *testing.T, path string, mustHave map[string]bool) {
	t.Helper()
	s := mustOpenPath(t, path, ledger.Options{})
	perKey := map[string]int{}
	for k := range effects(t, s) {
		key, _, _ := strings.Cut(k, "/")
		perKey[key]++
	}
	for k, n := range perKey {
		if n != 1 {
			t.Errorf("key %s has %d side effects, want 1", k, n)
		}
		rec, err := s.Get(context.Background(), "t1", k)
		if err != nil || rec.State != ledger.StateSucceeded {
			t.Errorf("key %s has an effect but record %+v, %v", k, rec, err)
		}
	}
	for k := range mustHave {
		if perKey[k] != 1 {
			t.Errorf("key %s answered as done has %d side effects, want 1", k, perKey[k])
		}
	}
	if n, err := s.VerifyAudit(context.Background()); err != nil {
		t.Errorf("VerifyAudit: %d entries, %v", n, err)
	}
	t.Logf("%d keys executed once each", len(perKey))
}

const (
	killHelperEnv = "IDEMGATE_WRITER_KILL_HELPER" // this helper's number
	killPathEnv   = "IDEMGATE_WRITER_KILL_PATH"
	killReport    = "WRITER-HELPER-REPORT "
)

// killResult is what one helper of TestWriterKilledMidLoad reports.
type killResult struct {
	Done      []string `json:"done"` // keys answered executed or replayed
	Busy      int      `json:"busy"` // keys held by the killed writer's claims
	Errors    []string `json:"errors,omitempty"`
	Failovers int64    `json:"failovers"`
	ReadBacks int64    `json:"read_backs"`
	Writer    bool     `json:"writer"` // this process was the writer at the end
}

const killWorkers, killCalls = 8, 40

// TestWriterKillHelper is not a test: it is the body of a helper process
// of TestWriterKilledMidLoad. It opens the ledger, prints READY, waits for
// the start byte, runs killWorkers callers of killCalls Executes each, and
// reports.
func TestWriterKillHelper(t *testing.T) {
	idx := os.Getenv(killHelperEnv)
	if idx == "" {
		t.Skip("helper process body; run by TestWriterKilledMidLoad")
	}
	index, _ := strconv.Atoi(idx)
	var res killResult
	var mu sync.Mutex
	calls := 0
	s, err := Open(os.Getenv(killPathEnv), ledger.Options{})
	if err != nil {
		fmt.Printf("\n%s{\"errors\":[%q]}\n", killReport, "open: "+err.Error())
		return
	}
	fmt.Println("READY")
	if _, err := io.ReadFull(os.Stdin, make([]byte, 1)); err != nil {
		res.Errors = append(res.Errors, "start signal: "+err.Error())
	}
	var wg sync.WaitGroup
	for g := range killWorkers {
		wg.Go(func() {
			for j := range killCalls {
				key := fmt.Sprintf("shared-%d-%d", g, j)
				if j%2 == 1 {
					key = fmt.Sprintf("own%d-%d-%d", index, g, j)
				}
				d, err := s.Execute(context.Background(), helperClaim(key), helperApply(index))
				mu.Lock()
				if calls++; calls == killWorkers*killCalls/4 {
					fmt.Println("QUARTER") // the parent kills the writer now
				}
				switch {
				case err != nil:
					res.Errors = append(res.Errors, key+": "+err.Error())
				case d.Kind == ledger.DecisionExecuted || d.Kind == ledger.DecisionReplay:
					res.Done = append(res.Done, key)
				case d.Kind == ledger.DecisionBusy:
					res.Busy++
				default:
					res.Errors = append(res.Errors, fmt.Sprintf("%s: decision %s", key, d.Kind))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.Failovers, res.ReadBacks = s.sh.failovers.Load(), s.sh.readBacks.Load()
	res.Writer = s.sh.isWriter()
	if err := s.Close(); err != nil {
		res.Errors = append(res.Errors, "close: "+err.Error())
	}
	b, _ := json.Marshal(res)
	fmt.Printf("\n%s%s\n", killReport, b)
}

// TestWriterKilledMidLoad: four processes, eight callers each, on one
// file; the writer is killed with SIGKILL while they run. The others take
// over without an error, no key is executed twice, and every key a
// surviving process was answered for has its one execution in the file.
func TestWriterKilledMidLoad(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns processes")
	}
	path := filepath.Join(t.TempDir(), "ledger.db")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	type proc struct {
		cmd    *exec.Cmd
		stdin  io.WriteCloser
		stdout *bufio.Reader
		rest   bytes.Buffer
		stderr bytes.Buffer
	}
	start := func(i int) *proc {
		p := &proc{cmd: exec.CommandContext(ctx, os.Args[0], "-test.run=^TestWriterKillHelper$", "-test.count=1", "-test.timeout=80s")}
		p.cmd.Env = append(os.Environ(), killHelperEnv+"="+strconv.Itoa(i), killPathEnv+"="+path)
		p.cmd.Stderr = &p.stderr
		var err error
		if p.stdin, err = p.cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		out, err := p.cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		p.stdout = bufio.NewReader(out)
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for { // READY: opened (the first helper as the writer)
			line, err := p.stdout.ReadString('\n')
			if err != nil {
				t.Fatalf("helper %d did not get ready: %v\n%s", i, err, p.stderr.String())
			}
			if strings.TrimSpace(line) == "READY" {
				break
			}
		}
		return p
	}
	procs := []*proc{start(0)} // the writer
	for i := 1; i < 4; i++ {
		procs = append(procs, start(i))
	}
	for _, p := range procs {
		p.stdin.Write([]byte{1})
		p.stdin.Close()
	}
	for { // the writer has made a quarter of its calls
		line, err := procs[0].stdout.ReadString('\n')
		if err != nil {
			t.Fatalf("the writer helper ended early: %v\n%s", err, procs[0].stderr.String())
		}
		if strings.TrimSpace(line) == "QUARTER" {
			break
		}
	}
	if err := procs[0].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	procs[0].cmd.Wait()

	done := map[string]bool{}
	var failovers, readBacks int64
	busy := 0
	for i, p := range procs[1:] {
		io.Copy(&p.rest, p.stdout)
		err := p.cmd.Wait()
		var res killResult
		var line string
		for _, l := range strings.Split(p.rest.String(), "\n") {
			if rest, ok := strings.CutPrefix(l, killReport); ok {
				line = rest
			}
		}
		if err != nil || line == "" {
			t.Fatalf("helper %d: %v\nstdout:\n%s\nstderr:\n%s", i+1, err, p.rest.String(), p.stderr.String())
		}
		if err := json.Unmarshal([]byte(line), &res); err != nil {
			t.Fatalf("helper %d report %q: %v", i+1, line, err)
		}
		for _, e := range res.Errors {
			t.Errorf("helper %d: %s", i+1, e)
		}
		for _, k := range res.Done {
			done[k] = true
		}
		failovers += res.Failovers
		readBacks += res.ReadBacks
		busy += res.Busy
		t.Logf("helper %d: %d answered, %d busy (the killed writer's claims), %d failovers, %d outcomes read back, writer at the end: %v",
			i+1, len(res.Done), res.Busy, res.Failovers, res.ReadBacks, res.Writer)
	}
	if failovers == 0 {
		t.Error("no helper failed over: the writer was not killed mid-load")
	}
	checkOneEffectPerKey(t, path, done)
}

// isWriter reports whether this process is the file's writer.
func (s *shared) isWriter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.local != nil
}

// TestForwardedRoundTrips reports what one forwarded Execute costs in
// round trips to the writer (reads inside its transaction).
func TestForwardedRoundTrips(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	mustOpenPath(t, path, ledger.Options{})
	f := openForwarder(t, path, ledger.Options{})
	defer f.Close()
	ctx := context.Background()
	const n = 50
	before := f.sh.client.RoundTrips()
	for i := range n {
		if _, err := f.Execute(ctx, helperClaim(fmt.Sprintf("key-%d", i)), helperApply(1)); err != nil {
			t.Fatal(err)
		}
	}
	mid := f.sh.client.RoundTrips()
	for i := range n {
		if _, err := f.Execute(ctx, helperClaim(fmt.Sprintf("key-%d", i)), helperApply(1)); err != nil {
			t.Fatal(err)
		}
	}
	after := f.sh.client.RoundTrips()
	t.Logf("round trips per forwarded Execute: new key %.1f, replay %.1f; reads prefetched, both: %d", float64(mid-before)/n, float64(after-mid)/n, f.sh.client.PrefetchHits())
	if f.sh.client.PrefetchHits() == 0 {
		t.Error("no read of a forwarded Execute was prefetched")
	}
}

// TestSocketPathTooLongNoRuntimeDir: without $XDG_RUNTIME_DIR the hashed
// socket goes to a private directory (0700) in the temporary directory.
func TestSocketPathTooLongNoRuntimeDir(t *testing.T) {
	tmp, err := os.MkdirTemp("", "w") // short: t.TempDir's name would not leave room for the socket
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(tmp) })
	t.Setenv("XDG_RUNTIME_DIR", "")
	t.Setenv("TMPDIR", tmp)
	path := filepath.Join(tmp, strings.Repeat("d", 60), strings.Repeat("e", 60), "ledger.db")
	sock, err := socketPath(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(tmp, fmt.Sprintf("idemgate-%d", os.Getuid())); filepath.Dir(sock) != want {
		t.Fatalf("socket %s, want one in %s", sock, want)
	}
	if again, _ := socketPath(path); again != sock {
		t.Errorf("socketPath is not stable: %s, then %s", sock, again)
	}
	if err := os.Chmod(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := socketPath(path); err == nil {
		t.Error("a socket directory open to others was accepted")
	}
}

// TestFailoverBetweenCurrentAndCall: a failover in another goroutine
// replaces and closes the forwarder's client after current() returned it
// and before the call on it; the client refuses the call as closed (it
// never began), and the call runs again on what replaced the client — a
// new client to the same writer, or this process as the writer — instead
// of failing with ledger.ErrClosed. In "read back", the failover comes
// after an Update whose outcome was unknown, between current() and the
// ReadBack of its marker.
func TestFailoverBetweenCurrentAndCall(t *testing.T) {
	for _, call := range []string{"update", "view", "read back"} {
		for _, becomeWriter := range []bool{false, true} {
			name := call + "/new client"
			if becomeWriter {
				name = call + "/this process the writer"
			}
			t.Run(name, func(t *testing.T) { failoverBetweenCurrentAndCall(t, call, becomeWriter) })
		}
	}
}

func failoverBetweenCurrentAndCall(t *testing.T, call string, becomeWriter bool) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	w, err := Open(path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	var cut *atomic.Bool
	if call == "read back" {
		var sock string
		sock, cut = cutProxy(t, w.sh.sock)
		if err := os.WriteFile(path+".writer", []byte(sock), 0o600); err != nil { // forwarders dial the proxy
			t.Fatal(err)
		}
	}
	f := openForwarder(t, path, ledger.Options{})
	defer f.Close()
	s := f.sh
	runs := 0 // of the Update's fn
	put := func(k, v string) func(ledger.BTx) error {
		return func(tx ledger.BTx) error {
			runs++
			b, err := tx.Data("t", true)
			if err != nil {
				return err
			}
			if cut != nil && runs == 1 {
				cut.Store(true) // the writer's answer to this commit never arrives
			}
			return b.Put([]byte(k), []byte(v))
		}
	}
	if call == "view" {
		if err := s.Update(ctx, put("k", "seeded")); err != nil {
			t.Fatal(err)
		}
	}
	runs = 0

	// The failover runs once, at the first client current returns: in
	// "read back", the one that replaced the client lost with the commit.
	first := s.client
	var replaced *forward.Client
	s.afterCurrent = func(c *forward.Client) {
		if c == nil || replaced != nil || (cut != nil && c == first) {
			return
		}
		replaced = c
		if becomeWriter {
			if err := w.Close(); err != nil {
				t.Error(err)
			}
		}
		done := make(chan error)
		go func() { done <- s.failover(c) }()
		if err := <-done; err != nil {
			t.Errorf("failover: %v", err)
		}
	}
	var got string
	switch call {
	case "update", "read back":
		err = s.Update(ctx, put("k", "v"))
	case "view":
		err = s.View(ctx, func(tx ledger.BTx) error {
			b, err := tx.Data("t", false)
			if err == nil && b != nil {
				got = string(b.Get([]byte("k")))
			}
			return err
		})
	}
	s.afterCurrent = nil
	if err != nil {
		t.Fatalf("%s with a failover between current and the call: %v", call, err)
	}
	if replaced == nil {
		t.Fatal("no failover ran between current and the call")
	}
	if call == "read back" && s.readBacks.Load() == 0 {
		t.Error("the Update's outcome was never unknown: nothing was read back")
	}
	// Refused as closed, the call never began; read back, the Update was
	// found committed: either way fn ran once.
	if call != "view" && runs != 1 {
		t.Errorf("the Update's fn ran %d times, want 1", runs)
	}
	if err := replaced.Update(ctx, forward.NewMarker(), func(ledger.BTx) error { return nil }); !errors.Is(err, ledger.ErrClosed) {
		t.Errorf("the replaced client's Update = %v, want ledger.ErrClosed", err)
	}
	if s.isWriter() != becomeWriter {
		t.Errorf("this process is the writer: %v, want %v", s.isWriter(), becomeWriter)
	}
	if err := s.View(ctx, func(tx ledger.BTx) error {
		b, err := tx.Data("t", false)
		if err == nil && b != nil && call != "view" {
			got = string(b.Get([]byte("k")))
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	want := map[bool]string{true: "seeded", false: "v"}[call == "view"]
	if got != want {
		t.Errorf("k = %q, want %q", got, want)
	}
}

// cutProxy relays connections to the unix socket sock. Once the returned
// flag is set, the next answer from sock is not passed on: the proxy
// closes that connection and clears the flag, so a forwarder that had
// sent its commit does not learn whether it committed.
func cutProxy(t *testing.T, sock string) (string, *atomic.Bool) {
	dir, err := os.MkdirTemp("", "cut") // short: a socket's path is at most 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ln, err := net.Listen("unix", filepath.Join(dir, "p.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	cut := new(atomic.Bool)
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("unix", sock)
			if err != nil {
				in.Close()
				continue
			}
			go func() {
				io.Copy(out, in)
				out.Close()
			}()
			go func() {
				defer in.Close()
				defer out.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := out.Read(buf)
					if n > 0 && cut.CompareAndSwap(true, false) {
						return
					}
					if n > 0 {
						if _, err := in.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), cut
}

// TestCommitStatsCountsFunctions: CommitStats counts every transaction
// function the writer committed, its own and forwarded ones (one each),
// in fewer commits than functions when they run concurrently; a
// forwarder, which commits nothing itself, reports zero (it dereferenced
// the writer's backend it does not have).
func TestCommitStatsCountsFunctions(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	w := mustOpenPath(t, path, ledger.Options{})
	f := openForwarder(t, path, ledger.Options{})
	defer f.Close()
	put := func(tx ledger.BTx) error {
		b, err := tx.Data("stats_test", true)
		if err != nil {
			return err
		}
		return b.Put([]byte(forward.NewMarker()), []byte("v"))
	}
	s0 := w.CommitStats()
	const local, forwarded = 16, 8
	var wg sync.WaitGroup
	errs := make(chan error, local+forwarded)
	for i := range local + forwarded {
		wg.Go(func() {
			if i < local {
				errs <- w.sh.Update(ctx, put)
			} else {
				errs <- f.sh.Update(ctx, put)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	s1 := w.CommitStats()
	if fns := s1.Functions - s0.Functions; fns != local+forwarded {
		t.Errorf("Functions grew by %d, want %d", fns, local+forwarded)
	}
	if c := s1.Commits - s0.Commits; c < 1 || c > local+forwarded {
		t.Errorf("Commits grew by %d, want 1..%d", c, local+forwarded)
	}
	if st := f.CommitStats(); st != (CommitStats{}) {
		t.Errorf("the forwarder's CommitStats = %+v, want zero", st)
	}
}
