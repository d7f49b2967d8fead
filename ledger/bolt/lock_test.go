package bolt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"idemgate/ledger"
)

// holdEnv names the ledger a helper process holds (see TestHoldHelper);
// holdModeEnv is "rw" (Open) or "ro" (OpenReadOnly).
const (
	holdEnv     = "IDEMGATE_BOLT_TEST_HOLD"
	holdModeEnv = "IDEMGATE_BOLT_TEST_HOLD_MODE"
)

// TestHoldHelper is not a test: it is the body of a helper process that
// opens the ledger named by holdEnv, says "held", and keeps it open until
// its standard input ends.
func TestHoldHelper(t *testing.T) {
	path := os.Getenv(holdEnv)
	if path == "" {
		t.Skip("helper process body; run by TestOpenHeldByAnotherProcess")
	}
	open := Open
	if os.Getenv(holdModeEnv) == "ro" {
		open = OpenReadOnly
	}
	s, err := open(path, ledger.Options{})
	if err != nil {
		fmt.Println("open:", err)
		os.Exit(1)
	}
	fmt.Println("held")
	io.Copy(io.Discard, os.Stdin)
	s.Close()
	os.Exit(0)
}

// holdInChild opens path in a helper process (mode "rw" or "ro") and
// returns once it is held; release closes the helper's input and waits
// for it to exit, which gives the file up.
func holdInChild(t *testing.T, path, mode string) (release func()) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHoldHelper$")
	cmd.Env = append(os.Environ(), holdEnv+"="+path, holdModeEnv+"="+mode)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "held" {
		in.Close()
		cmd.Wait()
		t.Fatalf("helper: %q, %v", line, err)
	}
	done := false
	release = func() {
		if !done {
			done = true
			in.Close()
			if err := cmd.Wait(); err != nil {
				t.Errorf("helper: %v", err)
			}
		}
	}
	t.Cleanup(release)
	return release
}

// wantLocked checks that err is ErrLocked in one line that names the file
// and says what to do, and that the open gave up within its bound.
func wantLocked(t *testing.T, what string, err error, path string, took, wait time.Duration) {
	t.Helper()
	if !errors.Is(err, ErrLocked) {
		t.Fatalf("%s: %v, want ErrLocked", what, err)
	}
	msg := err.Error()
	for _, want := range []string{path, "open in another process", "serve --own-ledger", "compact", "owner"} {
		if !strings.Contains(msg, want) {
			t.Errorf("%s: %q does not say %q", what, msg, want)
		}
	}
	if strings.Contains(msg, "\n") {
		t.Errorf("%s: the message is not one line: %q", what, msg)
	}
	if took < wait || took > wait+2*time.Second {
		t.Errorf("%s: gave up after %v, want about %v", what, took, wait)
	}
}

// TestOpenHeldByAnotherProcess: while another process has the ledger open
// for writing, an open for writing and a read-only open each fail within
// their bound with ErrLocked, saying what to do; while it has the file
// open read-only, another read-only open shares it and a writable one is
// refused; once it has gone, the file opens.
func TestOpenHeldByAnotherProcess(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	mustOpenPath(t, path, ledger.Options{}).Close()
	const wait = 300 * time.Millisecond

	release := holdInChild(t, path, "rw")
	for name, open := range map[string]func(string, ledger.Options, ...OpenOption) (*File, error){"Open": Open, "OpenExisting": OpenExisting, "OpenReadOnly": OpenReadOnly} {
		start := time.Now()
		s, err := open(path, ledger.Options{}, Wait(wait))
		if s != nil {
			s.Close()
		}
		wantLocked(t, name+" of a file held for writing", err, path, time.Since(start), wait)
	}
	release()

	release = holdInChild(t, path, "ro")
	s, err := OpenReadOnly(path, ledger.Options{}, Wait(wait))
	if err != nil {
		t.Fatalf("OpenReadOnly beside another reader: %v", err)
	}
	if _, err := s.VerifyAudit(context.Background()); err != nil {
		t.Error(err)
	}
	s.Close()
	start := time.Now()
	s, err = Open(path, ledger.Options{}, Wait(wait))
	if s != nil {
		s.Close()
	}
	wantLocked(t, "Open of a file held for reading", err, path, time.Since(start), wait)
	release()

	mustOpenPath(t, path, ledger.Options{})
}

// TestSecondOpenInProcess: two opens of one file in one process are two
// holders, as two processes are (each has its own descriptor and lock):
// the second waits for the first to close, up to its bound. Nothing but
// the ledger file is ever created beside it.
func TestSecondOpenInProcess(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ledger.db")
	first := mustOpenPath(t, path, ledger.Options{})
	start := time.Now()
	_, err := Open(path, ledger.Options{}, Wait(100*time.Millisecond))
	wantLocked(t, "a second Open", err, path, time.Since(start), 100*time.Millisecond)

	go func() {
		time.Sleep(100 * time.Millisecond)
		first.Close()
	}()
	second, err := Open(path, ledger.Options{}, Wait(10*time.Second))
	if err != nil {
		t.Fatalf("Open once the first closed: %v", err)
	}
	second.Close()
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("the directory holds %v, want only ledger.db", names)
	}
}

// TestLockFollowsTheName: an open waiting for the lock while compact
// swaps a new file in under the ledger's name locks the new file, not the
// old one it first opened.
func TestLockFollowsTheName(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ledger.db")
	mustOpenPath(t, path, ledger.Options{}).Close()
	old, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	if err := flock(old, syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	type result struct {
		f   *os.File
		err error
	}
	got := make(chan result, 1)
	go func() {
		f, err := lockFile(path, false, 10*time.Second, lockedTodo)
		got <- result{f, err}
	}()
	time.Sleep(50 * time.Millisecond) // the open waits on the old file
	repl := filepath.Join(dir, "new.db")
	mustOpenPath(t, repl, ledger.Options{}).Close()
	if err := os.Rename(repl, path); err != nil {
		t.Fatal(err)
	}
	old.Close() // as compact does, once the new file is in place
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.f.Close()
	held, _ := r.f.Stat()
	now, _ := os.Stat(path)
	if !os.SameFile(held, now) {
		t.Error("the open locked the old file, not the one now named ledger.db")
	}
}
