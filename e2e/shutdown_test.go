package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestShutdownAPINeverAnswers: SIGTERM while a create_order waits on an
// order API that never answers it, and whose lookup by key cannot tell
// either. docs/operating.md ("Shutdown") promises that a call already received
// gets its answer before the process exits — here the recorded unknown
// outcome: the call ends at --orders-api-timeout, the client gets status
// unknown with error outcome_unknown and next_action reconcile, the
// process exits 0, and the ledger holds the operation as unknown (read
// afterwards with `idemgate ops show`). Nothing is re-sent meanwhile: the
// API received exactly one write and committed none.
func TestShutdownAPINeverAnswers(t *testing.T) {
	const timeout = 2 * time.Second // --orders-api-timeout
	apiFlags := func(api *fakeAPI) []string {
		return apiArgs(api, "--orders-api-timeout", timeout.String())
	}
	// checkUnknown checks the client's answer and what the API saw.
	checkUnknown := func(t *testing.T, api *fakeAPI, key string, e envelope) {
		t.Helper()
		if e.Status != "unknown" || e.code() != "outcome_unknown" || e.NextAction != "reconcile" || !e.IsError || e.OperationKey != key {
			t.Errorf("answer: status %q %s; want status unknown, error outcome_unknown, next_action reconcile for key %s", e.Status, e, key)
		}
		if st := api.Stats(); st.WriteRequests != 1 || st.Created != 0 {
			t.Errorf("the API received %d writes and created %d orders; want the one write, never answered and never committed", st.WriteRequests, st.Created)
		}
	}
	// checkLedger reads the record with the command line after the server
	// exited.
	checkLedger := func(t *testing.T, db, tenant, key string) {
		t.Helper()
		r := runCLI(t, 10*time.Second, "ops", "show", key, "--db", db, "--tenant", tenant, "--json")
		if r.Code != 0 {
			t.Fatalf("ops show after the shutdown: exit %d: %s", r.Code, r.Stderr)
		}
		var shown struct {
			Record *struct {
				State    string `json:"state"`
				Attempts int    `json:"attempts"`
			} `json:"record"`
		}
		if err := json.Unmarshal([]byte(r.Stdout), &shown); err != nil {
			t.Fatalf("ops show --json: %v\n%s", err, r.Stdout)
		}
		if shown.Record == nil || shown.Record.State != "unknown" || shown.Record.Attempts != 1 {
			t.Errorf("the ledger after the shutdown holds %+v, want the operation unknown after 1 attempt\n%s", shown.Record, r.Stdout)
		}
	}

	t.Run("http", func(t *testing.T) {
		dir := t.TempDir()
		db := filepath.Join(dir, "ledger.db")
		tokens := filepath.Join(dir, "tokens.json")
		alice := addToken(t, tokens, "alice", "acme", "agent")
		api := newFakeAPI(t)
		api.SetLookupUnavailable(true)
		h := api.InjectHold(fault{Kind: HoldBeforeCommit, Match: matchCreate}) // never released while the server runs
		p := startHTTP(t, db, tokens, 0, append(apiFlags(api), "--http-body-timeout", "1s")...)
		s := httpSession(t, p.base, alice)
		key := newKey()
		answer := make(chan envelope, 1)
		go func() {
			e, err := s.call(context.Background(), "create_order", faOrder(key, "cust-never"))
			if err != nil {
				e = envelope{Status: "transport error: " + err.Error()}
			}
			answer <- e
		}()
		h.Wait(t, 10*time.Second)
		p.cmd.Process.Signal(syscall.SIGTERM)
		var e envelope
		select {
		case e = <-answer:
		case <-p.exited:
			t.Fatalf("the server exited (%v) before answering the call in flight\n%s", p.err, p.stderr.String())
		case <-time.After(timeout + 20*time.Second):
			t.Fatalf("the call in flight was not answered within %v of SIGTERM", timeout+20*time.Second)
		}
		checkUnknown(t, api, key, e)
		select {
		case <-p.exited:
			if p.err != nil {
				t.Errorf("exit: %v, want exit status 0\n%s", p.err, p.stderr.String())
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("the server did not exit after answering")
		}
		checkLedger(t, db, "acme", key)
	})

	t.Run("stdio", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "ledger.db")
		api := newFakeAPI(t)
		api.SetLookupUnavailable(true)
		h := api.InjectHold(fault{Kind: HoldBeforeCommit, Match: matchCreate})
		s := startServer(t, mcpGoLegacy, serverConfig{DB: db, Tenant: "acme", Principal: "alice", Args: apiFlags(api)})
		key := newKey()
		answer := make(chan envelope, 1)
		go func() {
			e, err := s.call(context.Background(), "create_order", faOrder(key, "cust-never-stdio"))
			if err != nil {
				e = envelope{Status: "transport error: " + err.Error()}
			}
			answer <- e
		}()
		h.Wait(t, 10*time.Second)
		s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case e := <-answer:
			checkUnknown(t, api, key, e)
		case <-time.After(timeout + 20*time.Second):
			t.Fatalf("the call in flight was not answered within %v of SIGTERM", timeout+20*time.Second)
		}
		if code := stdioExitCode(t, s, 20*time.Second); code != 0 {
			t.Errorf("exit status %d after SIGTERM, want 0\n%s", code, s.stderr.String())
		}
		checkLedger(t, db, "acme", key)
	})
}

// stdioExitCode waits until the stdio server of s has exited on its own
// (its client still connected: stdin open), then disconnects the client —
// which reaps the process — and returns the exit status. A server that
// does not exit within timeout fails the test: closing its input would
// have ended it for another reason.
func stdioExitCode(t *testing.T, s *session, timeout time.Duration) int {
	t.Helper()
	pid := s.cmd.Process.Pid
	if !eventually(timeout, func() bool { return exitedUnreaped(pid) }) {
		t.Fatalf("the stdio server (pid %d) did not exit within %v of SIGTERM", pid, timeout)
	}
	s.Close() // the client library waits for the process
	if s.cmd.ProcessState == nil {
		t.Fatalf("the stdio server exited but was not waited for")
	}
	return s.cmd.ProcessState.ExitCode()
}

// exitedUnreaped reports whether process pid, a child of this process, has
// exited and waits to be reaped (a zombie), without reaping it: the client
// library that started it waits for it itself.
func exitedUnreaped(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false // reaped already, or no /proc: the caller times out
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
	return strings.HasPrefix(strings.TrimSpace(rest), "Z")
}
