//go:build linux

package e2e

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLedgerServedByAnotherUser (issue 18, item 9): a process of another
// user opening a ledger file that a live server holds is refused at once,
// with who holds the ledger and what to do, not after 30 s with "writer
// process was lost". The files are made readable and writable by everyone
// (as a ledger shared by a group would be) so that the refusal is the
// writer's, not the file mode's. The server keeps serving.
func TestLedgerServedByAnotherUser(t *testing.T) {
	dir, bin := sharedDir(t)
	db := filepath.Join(dir, "ledger.db")
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	base, _ := httpServerProcess(t, freeAddr(t), db, tokens)
	openToAll(t, dir)
	refusedAsNobody(t, dir, bin, db)
	httpSession(t, base, alice).mustSucceed(t, "create_order", orderArgs(newKey(), "after", coffee, nil))
}

// TestLedgerOwnedByAnotherUser (issue 19): a stdio server of another user
// on a ledger whose owner is root's (its socket beside the ledger, as
// without XDG_RUNTIME_DIR) is refused at once by the owner's peer check,
// with who owns it and what to do; root's server keeps serving.
func TestLedgerOwnedByAnotherUser(t *testing.T) {
	dir, bin := sharedDir(t)
	db := filepath.Join(dir, "ledger.db")
	t.Setenv("XDG_RUNTIME_DIR", "") // the owner's socket beside the ledger
	s := startServer(t, mcpGoLegacy, serverConfig{DB: db})
	s.mustSucceed(t, "create_order", orderArgs(newKey(), "before", coffee, nil))
	if _, err := os.Stat(db + ".owner.sock"); err != nil {
		t.Fatalf("the owner's socket beside the ledger: %v", err)
	}
	openToAll(t, dir)
	out := refusedAsNobody(t, dir, bin, db)
	if !strings.Contains(out, "owns ledger") {
		t.Errorf("the refusal %q is not the owner's peer check", out)
	}
	s.mustSucceed(t, "create_order", orderArgs(newKey(), "after", coffee, nil))
}

// sharedDir is a new directory any user may write in, holding a copy of
// the idemgate binary (the build directory is root's alone); the test
// skips unless it runs as root, which may run a process as another user.
func sharedDir(t *testing.T) (dir, bin string) {
	if os.Getuid() != 0 {
		t.Skip("needs root, to run a process as another user")
	}
	dir = t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	bin = filepath.Join(dir, "idemgate")
	raw, err := os.ReadFile(idemgate)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, raw, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir, bin
}

// openToAll makes the ledger's files in dir readable and writable by
// everyone (as a ledger shared by a group would be), so that a refusal is
// idemgate's, not the file mode's.
func openToAll(t *testing.T, dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "ledger.db") {
			os.Chmod(filepath.Join(dir, e.Name()), 0o666)
		}
	}
}

// refusedAsNobody runs bin's serve on db as user nobody and wants it
// refused at once, naming both users and what to do; it returns what the
// serve wrote.
func refusedAsNobody(t *testing.T, dir, bin, db string) string {
	t.Helper()
	cmd := exec.Command(bin, "serve", "--db", db, "--log-level", "warn")
	cmd.Env = []string{"HOME=" + dir, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, _ := refusedServe(t, cmd)
	for _, want := range []string{"another user", "root", "nobody", "run idemgate as root"} {
		if !strings.Contains(out, want) {
			t.Errorf("the refusal does not say %q: %s", want, out)
		}
	}
	return out
}

// refusedServe runs cmd, a serve, with an input that stays open (a serve
// ends at its end, not at a refusal) and wants it to exit with an error
// within 5 s; it returns what it wrote on stderr, trimmed.
func refusedServe(t *testing.T, cmd *exec.Cmd) (string, error) {
	t.Helper()
	stdin, keepOpen, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer keepOpen.Close()
	cmd.Stdin, cmd.Stdout = stdin, io.Discard
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	began := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stdin.Close()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("%v was still running after 10 s: %s", cmd.Args, stderr.String())
	}
	took := time.Since(began)
	out := strings.TrimSpace(stderr.String())
	t.Logf("%v ended after %v: %v: %s", cmd.Args[1:], took.Round(time.Millisecond), err, out)
	if err == nil {
		t.Errorf("%v ended without an error", cmd.Args[1:])
	}
	if took > 5*time.Second {
		t.Errorf("refused after %v; want at once", took)
	}
	return out, err
}
