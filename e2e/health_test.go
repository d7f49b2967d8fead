//go:build linux

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// setFileSizeLimit sets RLIMIT_FSIZE of process pid (prlimit(2)): writes
// past limit bytes of any file fail with EFBIG, as writes fail on a full
// disk. Go ignores SIGXFSZ, so the process sees the error.
func setFileSizeLimit(t *testing.T, pid int, limit uint64) {
	t.Helper()
	lim := syscall.Rlimit{Cur: limit, Max: ^uint64(0)}
	if _, _, errno := syscall.RawSyscall6(syscall.SYS_PRLIMIT64, uintptr(pid), uintptr(syscall.RLIMIT_FSIZE), uintptr(unsafe.Pointer(&lim)), 0, 0, 0); errno != 0 {
		t.Fatalf("prlimit(%d, RLIMIT_FSIZE, %d): %v", pid, limit, errno)
	}
}

type healthBody struct {
	Status string `json:"status"`
	Ledger struct {
		OK              bool   `json:"ok"`
		Problem         string `json:"problem"`
		LastCommitError string `json:"last_commit_error"`
		Probe           string `json:"probe"`
		FreeBytes       uint64 `json:"free_bytes"`
		MinFreeBytes    uint64 `json:"min_free_bytes"`
	} `json:"ledger"`
}

func getHealth(t *testing.T, base string) (int, healthBody, string) {
	t.Helper()
	resp, err := http.Get(base + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var h healthBody
	if err := json.Unmarshal(raw, &h); err != nil {
		t.Fatalf("/healthz body is not JSON: %v: %s", err, raw)
	}
	return resp.StatusCode, h, string(raw)
}

// TestHealthzOnFailingWrites (issue 8, defect 7): while every write of the
// ledger fails, /healthz answers 503 with the commit error in its JSON
// body; once writes work again it answers 200 without a restart.
func TestHealthzOnFailingWrites(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(idemgate, "serve", "--http", addr, "--db", db, "--tokens", tokens, "--log-level", "warn")
	stopOwnerAtEnd(t, cmd.Args[1:])
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("server stderr:\n%s", stderr.String())
		}
	})
	base := "http://" + addr
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get(base + "/healthz"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not answer: %s", stderr.String())
		}
	}
	a := httpSession(t, base, alice)
	a.mustSucceed(t, "create_order", orderArgs(newKey(), "before", coffee, nil))
	code, h, raw := getHealth(t, base)
	if code != 200 || h.Status != "ok" || !h.Ledger.OK || h.Ledger.FreeBytes == 0 || h.Ledger.MinFreeBytes == 0 {
		t.Fatalf("healthy ledger: /healthz %d %s", code, raw)
	}

	// Every page past the two meta pages now fails to be written, by
	// the ledger's owner, which serves HTTP for the process.
	pid, ok := ownerPID(db)
	if !ok {
		t.Fatal("no owner of the ledger")
	}
	setFileSizeLimit(t, pid, 8192)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	e, err := a.call(ctx, "create_order", orderArgs(newKey(), "during", coffee, nil))
	cancel()
	if err == nil && e.Status == "succeeded" {
		t.Fatalf("create_order succeeded with every write failing: %s", e)
	}
	code, h, raw = getHealth(t, base)
	t.Logf("/healthz with every write failing: %d %s", code, raw)
	if code != 503 || h.Status != "unavailable" || h.Ledger.OK {
		t.Fatalf("/healthz with every write failing: %d %s; want 503", code, raw)
	}
	if !strings.Contains(h.Ledger.LastCommitError, "file too large") || !strings.Contains(h.Ledger.Probe, "file too large") || !strings.Contains(h.Ledger.Problem, "cannot commit") {
		t.Errorf("/healthz body does not carry the commit error: %s", raw)
	}

	// The disk recovers: health recovers without a restart, and so do calls.
	setFileSizeLimit(t, pid, ^uint64(0))
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		// a probe runs at most once a second; the last one failed
		if code, h, raw = getHealth(t, base); code == 200 || time.Now().After(deadline) {
			break
		}
	}
	if code != 200 || !h.Ledger.OK || h.Ledger.LastCommitError != "" { // the probe, or any other commit, succeeded
		t.Fatalf("/healthz after the writes work again: %d %s; want 200", code, raw)
	}
	a.mustSucceed(t, "create_order", orderArgs(newKey(), "after", coffee, nil))
	if code, _, raw := getHealth(t, base); code != 200 {
		t.Errorf("/healthz after a successful call: %d %s", code, raw)
	}
	if r := runCLI(t, 30*time.Second, "check", "--db", db); r.Code != 0 {
		t.Errorf("check after the failed writes: %s %s", r.Stdout, r.Stderr)
	}
}

// freeAddr returns a loopback address no one listens on now.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// healthRecovers polls /healthz until it answers 200, for at most 5 s (a
// probe runs at most once a second), and returns the last answer.
func healthRecovers(t *testing.T, base string) (int, healthBody, string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		code, h, raw := getHealth(t, base)
		if code == 200 || time.Now().After(deadline) {
			return code, h, raw
		}
	}
}

// TestHealthzWhenTheFileCannotGrow (issue 18, defect 4): when the ledger
// file may not grow, small commits still fit in its free pages while a
// create_order's do not. /healthz must then answer 503 — a small probe
// commit that succeeds does not make it healthy — and 200 again once a
// commit as large can be made.
func TestHealthzWhenTheFileCannotGrow(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	tokens := filepath.Join(dir, "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	base, _ := httpServerProcess(t, freeAddr(t), db, tokens)
	a := httpSession(t, base, alice)
	a.mustSucceed(t, "create_order", orderArgs(newKey(), "before", coffee, nil))
	pid, ok := ownerPID(db) // it serves HTTP for the process
	if !ok {
		t.Fatal("no owner of the ledger")
	}

	fi, err := os.Stat(db)
	if err != nil {
		t.Fatal(err)
	}
	setFileSizeLimit(t, pid, uint64(fi.Size()))
	var failed envelope
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		e, err := a.call(ctx, "create_order", orderArgs(newKey(), fmt.Sprintf("during-%d", i), coffee, nil))
		cancel()
		if err != nil {
			t.Fatalf("create_order %d: %v", i, err)
		}
		if e.Status != "succeeded" {
			failed = e
			break
		}
		if i == 2000 {
			t.Fatalf("2000 create_order calls succeeded in a file of %d bytes that may not grow", fi.Size())
		}
	}
	t.Logf("the create_order that needed the file to grow: %s", failed)
	// Two checks over more than a probe interval: the second one probes.
	for i := 0; i < 2; i++ {
		code, h, raw := getHealth(t, base)
		t.Logf("/healthz while the file cannot grow: %d %s", code, raw)
		if code != 503 || h.Ledger.OK || !strings.Contains(h.Ledger.LastCommitError, "file too large") || !strings.Contains(h.Ledger.Problem, "cannot commit") {
			t.Fatalf("/healthz while every create_order fails: %d %s; want 503 with the commit's error", code, raw)
		}
		time.Sleep(1100 * time.Millisecond)
	}

	setFileSizeLimit(t, pid, ^uint64(0))
	if code, _, raw := healthRecovers(t, base); code != 200 {
		t.Fatalf("/healthz once the file may grow again: %d %s; want 200", code, raw)
	}
	a.mustSucceed(t, "create_order", orderArgs(newKey(), "after", coffee, nil))
}
