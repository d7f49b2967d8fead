package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The tests of issue 19, items 2 and 3: serve --http, the console and the
// command line on a ledger file another process owns run in that owner.

// TestCommandsRunInTheOwner: with an owner serving a ledger file, the
// command line's reads, decisions, backup and check run in the owner (its
// log says so) and print what they print without one; a relative path is
// the caller's; a command given another setting of the ledger is refused
// naming it, and the owner stays; with no owner, a command opens the
// file itself and starts none.
func TestCommandsRunInTheOwner(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	s := startServer(t, mcpGoLegacy, serverConfig{DB: db, Args: []string{"--approval-threshold", "5000"}})
	pid, ok := ownerPID(db)
	if !ok {
		t.Fatal("no owner after a stdio serve started")
	}
	key := newKey()
	s.mustSucceed(t, "create_order", uniqueOrder(key, "cli-owner"))
	held := s.callTool(t, "create_order", orderArgs(newKey(), "cli-big", coffee, map[string]any{"items": []map[string]any{{"sku": "big", "quantity": 10, "unit_price_minor": 9000}}}))
	if held.Status != "awaiting_approval" || held.Approval == nil {
		t.Fatalf("a large order: %v, want awaiting_approval", held)
	}

	show := runCLI(t, 20*time.Second, "ops", "show", key, "--db", db, "--json")
	if show.Code != 0 || !strings.Contains(show.Stdout, key) {
		t.Fatalf("ops show through the owner: exit %d\n%s\n%s", show.Code, show.Stdout, show.Stderr)
	}
	stats := runCLI(t, 20*time.Second, "stats", "--db", db, "--json")
	var st struct {
		Operations int `json:"operations"`
	}
	if stats.Code != 0 || json.Unmarshal([]byte(stats.Stdout), &st) != nil || st.Operations != 2 {
		t.Fatalf("stats through the owner: exit %d, %d operations, want 2\n%s\n%s", stats.Code, st.Operations, stats.Stdout, stats.Stderr)
	}
	approve := runCLI(t, 20*time.Second, "approvals", "approve", held.Approval.ApprovalID, "--db", db, "--principal", "boss", "--comment", "ok")
	if approve.Code != 0 || !strings.Contains(approve.Stdout, "succeeded") {
		t.Fatalf("approvals approve through the owner: exit %d\n%s\n%s", approve.Code, approve.Stdout, approve.Stderr)
	}
	if n := s.orderCount(t, "cli-big"); n != 1 {
		t.Errorf("customer cli-big has %d orders after the approval, want 1", n)
	}

	// A relative path is the caller's directory's, not the owner's.
	backup := exec.Command(idemgate, "backup", "copy.db", "--db", db)
	backup.Dir = dir
	if out, err := backup.CombinedOutput(); err != nil || !strings.Contains(string(out), filepath.Join(dir, "copy.db")) {
		t.Fatalf("backup copy.db through the owner: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "copy.db")); err != nil {
		t.Fatalf("the backup is not in the caller's directory: %v", err)
	}
	if r := runCLI(t, 20*time.Second, "check", "--db", db); r.Code != 0 || !strings.Contains(r.Stdout, "ok") {
		t.Fatalf("check through the owner: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := runCLI(t, 20*time.Second, "audit", "verify", "--db", db); r.Code != 0 {
		t.Fatalf("audit verify through the owner: exit %d\n%s", r.Code, r.Stderr)
	}
	log := ownerLog(db)
	for _, cmd := range []string{"ops", "stats", "approvals", "backup", "check", "audit"} {
		if !strings.Contains(log, "running a command") || !strings.Contains(log, "command="+cmd) {
			t.Errorf("the owner's log does not show %s run in it:\n%s", cmd, log)
		}
	}

	// Another setting of the ledger is refused, naming it; the owner stays.
	r := runCLI(t, 20*time.Second, "ops", "list", "--db", db, "--approval-threshold", "7000")
	if r.Code != 1 || !strings.Contains(r.Stderr, `--approval-threshold is "7000" here, "5000" in the owner`) || !strings.Contains(r.Stderr, "leave these settings out") {
		t.Errorf("ops list with another threshold: exit %d, stderr %s; want 1 naming the setting", r.Code, r.Stderr)
	}
	if again, ok := ownerPID(db); !ok || again != pid {
		t.Errorf("owner after a refused command: %d (%v), want %d still", again, ok, pid)
	}
	// The same setting as the owner's is accepted.
	if r := runCLI(t, 20*time.Second, "ops", "list", "--db", db, "--approval-threshold", "5000"); r.Code != 0 {
		t.Errorf("ops list with the owner's threshold: exit %d: %s", r.Code, r.Stderr)
	}

	// No owner: the command opens the file itself, and starts none.
	s.Close()
	stopOwner(t, db)
	if r := runCLI(t, 20*time.Second, "ops", "show", key, "--db", db); r.Code != 0 || !strings.Contains(r.Stdout, key) {
		t.Fatalf("ops show with no owner: exit %d\n%s\n%s", r.Code, r.Stdout, r.Stderr)
	}
	if p, ok := ownerPID(db); ok {
		t.Errorf("ops show started an owner (pid %d)", p)
	}
}

// TestHTTPFrontsAndOwnerKilled: two serve --http processes on one ledger
// file (both run in its owner); callers make orders under new keys through
// both; one of them is killed (SIGKILL) and then the owner. Callers whose
// call failed repeat it with the same key on the surviving process, which
// starts a new owner: every key has exactly one order, every success is
// replayed with its order, and the audit chain verifies.
func TestHTTPFrontsAndOwnerKilled(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	tokens := filepath.Join(dir, "tokens.json")
	tok := addToken(t, tokens, "agent-h", "default", "agent")
	a := startHTTP(t, db, tokens, 0, "--lease", "2s")
	b := startHTTP(t, db, tokens, 0, "--lease", "2s")
	first, ok := ownerPID(db)
	if !ok {
		t.Fatal("no owner after serve --http started on a ledger file")
	}

	const callers, perCaller = 6, 30
	type outcome struct{ key, customer, order string }
	var (
		mu       sync.Mutex
		outcomes []outcome
		repeated int
		wg       sync.WaitGroup
	)
	aKilled, ownerKilled := make(chan struct{}), make(chan struct{})
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			front := []*httpProc{a, b}[c%2]
			s := httpSession(t, front.base, tok)
			customer := fmt.Sprintf("front-%d", c)
			for n := range perCaller {
				switch n {
				case perCaller / 3:
					<-aKilled
				case 2 * perCaller / 3:
					<-ownerKilled
				}
				key := newKey()
				var e envelope
				for deadline := time.Now().Add(time.Minute); ; {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					var err error
					e, err = s.call(ctx, "create_order", uniqueOrder(key, customer))
					cancel()
					if err == nil && e.Status == "succeeded" {
						break
					}
					if time.Now().After(deadline) {
						t.Errorf("key %s not succeeded within a minute: %v, %v", key, e, err)
						return
					}
					// Repeat the same call on the surviving process.
					mu.Lock()
					repeated++
					mu.Unlock()
					time.Sleep(200 * time.Millisecond)
					if again, err := tryHTTPSession(t, b.base, tok); err == nil {
						s = again
					}
				}
				mu.Lock()
				outcomes = append(outcomes, outcome{key, customer, e.orderID()})
				mu.Unlock()
			}
		}()
	}
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(outcomes) }
	if !eventually(30*time.Second, func() bool { return count() >= callers*perCaller/3-callers }) {
		t.Fatal("no load before the kills")
	}
	a.cmd.Process.Kill()
	close(aKilled)
	if !eventually(30*time.Second, func() bool { return count() >= 2*callers*perCaller/3-2*callers }) {
		t.Fatal("no load after the first kill")
	}
	killOwner(t, db)
	close(ownerKilled)
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	second, ok := ownerPID(db)
	if !ok || second == first {
		t.Fatalf("owner after the kill: %d (%v), before %d: want a new one", second, ok, first)
	}
	t.Logf("%d calls repeated with their key after the kills", repeated)
	if len(outcomes) != callers*perCaller {
		t.Fatalf("%d outcomes, want %d", len(outcomes), callers*perCaller)
	}
	s := httpSession(t, b.base, tok)
	seen := map[string]string{}
	byCustomer := map[string]int{}
	for _, o := range outcomes {
		if k, dup := seen[o.order]; dup || o.order == "" {
			t.Errorf("order %q answered for keys %s and %s", o.order, k, o.key)
		}
		seen[o.order] = o.key
		byCustomer[o.customer]++
		e := s.mustSucceed(t, "create_order", uniqueOrder(o.key, o.customer))
		if !e.Replayed || e.orderID() != o.order {
			t.Fatalf("replay of %s: replayed %v order %s, want order %s", o.key, e.Replayed, e.orderID(), o.order)
		}
	}
	for customer, n := range byCustomer {
		if got := s.orderCount(t, customer); got != n {
			t.Errorf("customer %s has %d orders, want %d (one per key)", customer, got, n)
		}
	}
	b.cmd.Process.Signal(syscall.SIGINT)
	<-b.exited
	stopOwner(t, db)
	mustVerify(t, db)
}
