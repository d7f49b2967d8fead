//go:build linux

package e2e

import (
	"context"
	"encoding/json"
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

	// Every page past the two meta pages now fails to be written.
	setFileSizeLimit(t, cmd.Process.Pid, 8192)
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
	setFileSizeLimit(t, cmd.Process.Pid, ^uint64(0))
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
