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
	if os.Getuid() != 0 {
		t.Skip("needs root, to run a process as another user")
	}
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	bin := filepath.Join(dir, "idemgate") // the build directory is root's alone
	raw, err := os.ReadFile(idemgate)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, raw, 0o755); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "ledger.db")
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	base, _ := httpServerProcess(t, freeAddr(t), db, tokens)
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "ledger.db") {
			os.Chmod(filepath.Join(dir, e.Name()), 0o666)
		}
	}

	stdin, keepOpen, err := os.Pipe() // serve would end at EOF, not at the refusal
	if err != nil {
		t.Fatal(err)
	}
	defer keepOpen.Close()
	cmd := exec.Command(bin, "serve", "--db", db, "--log-level", "warn")
	cmd.Env = []string{"HOME=" + dir, "PATH=/usr/bin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
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
		t.Fatalf("the other user's serve was still running after 10 s: %s", stderr.String())
	}
	took := time.Since(began)
	t.Logf("the other user's serve ended after %v: %v: %s", took.Round(time.Millisecond), err, stderr.String())
	if err == nil {
		t.Fatalf("the other user's serve ended without an error")
	}
	for _, want := range []string{"another user", "root", "nobody", "run idemgate as root"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("the refusal does not say %q: %s", want, stderr.String())
		}
	}
	if took > 5*time.Second {
		t.Errorf("refused after %v; want at once", took)
	}
	httpSession(t, base, alice).mustSucceed(t, "create_order", orderArgs(newKey(), "after", coffee, nil))
}
