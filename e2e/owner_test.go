package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"idemgate/owner"
)

// The tests of issue 19: several stdio servers on one ledger file pass
// their calls to the one process that owns it.

// uniqueOrder is the arguments of an order under key that no other order
// of the test repeats (a repeat under a new key is held as a suspected
// duplicate).
func uniqueOrder(key, customer string) map[string]any {
	return orderArgs(key, customer, []item{{"sku-" + key[:8], 1, 100}}, nil)
}

// createUntilDone calls create_order with key until the answer is
// succeeded, repeating the same call (as the pipe's error tells a model
// to) after any other answer; it fails the test after within.
func createUntilDone(t *testing.T, s *session, key, customer string, within time.Duration) envelope {
	deadline := time.Now().Add(within)
	args := uniqueOrder(key, customer)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		e, err := s.call(ctx, "create_order", args)
		cancel()
		if err == nil && e.Status == "succeeded" {
			return e
		}
		if time.Now().After(deadline) {
			t.Errorf("key %s not succeeded within %v: last answer %v, err %v", key, within, e, err)
			return e
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestOwnerKilledUnderLoad: four stdio servers on one ledger file, two
// callers each making orders under new keys; the owner is killed (SIGKILL)
// in the middle. The calls it took with it are answered by the pipes with
// an error that says to repeat them; the callers repeat them with the
// same keys, the next call starts a new owner, and in the end every key
// has exactly one order, every success answered before the kill is
// replayed with the same order, and the audit chain verifies.
func TestOwnerKilledUnderLoad(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	cfg := serverConfig{DB: db, Args: []string{"--lease", "2s"}}
	var sessions []*session
	for range 4 {
		sessions = append(sessions, startServer(t, mcpGoLegacy, cfg))
	}
	first, _ := ownerPID(db)
	const perCaller = 40
	type outcome struct{ key, customer, order string }
	var (
		mu       sync.Mutex
		outcomes []outcome
		lostSeen int
		wg       sync.WaitGroup
	)
	killed := make(chan struct{})
	for i, s := range sessions {
		for c := range 2 {
			customer := fmt.Sprintf("kill-%d-%d", i, c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := range perCaller {
					if n == perCaller/2 {
						<-killed // half before the kill, half after
					}
					key := newKey()
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					e, err := s.call(ctx, "create_order", uniqueOrder(key, customer))
					cancel()
					if err != nil || e.Status != "succeeded" {
						mu.Lock()
						if err == nil && e.code() == "internal" && strings.Contains(e.Text, "same operation_key") {
							lostSeen++
						}
						mu.Unlock()
						e = createUntilDone(t, s, key, customer, time.Minute)
					}
					mu.Lock()
					outcomes = append(outcomes, outcome{key, customer, e.orderID()})
					mu.Unlock()
				}
			}()
		}
	}
	// Kill the owner while calls are in flight.
	if !eventually(30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(outcomes) >= 60 }) {
		t.Fatal("no load before the kill")
	}
	killOwner(t, db)
	close(killed)
	wg.Wait()
	second, ok := ownerPID(db)
	if !ok || second == first {
		t.Fatalf("owner after the kill: %d (%v), before %d: want a new one", second, ok, first)
	}
	t.Logf("%d calls answered 'repeat it' by the pipes when the owner was killed", lostSeen)

	byCustomer := map[string]int{}
	seen := map[string]string{}
	for _, o := range outcomes {
		byCustomer[o.customer]++
		if o.order == "" {
			t.Errorf("key %s: no order id", o.key)
		}
		if k, dup := seen[o.order]; dup {
			t.Errorf("order %s answered for keys %s and %s", o.order, k, o.key)
		}
		seen[o.order] = o.key
	}
	if len(outcomes) != 4*2*perCaller {
		t.Fatalf("%d outcomes, want %d", len(outcomes), 4*2*perCaller)
	}
	s := sessions[0]
	for customer, n := range byCustomer {
		if got := s.orderCount(t, customer); got != n {
			t.Errorf("customer %s has %d orders, want %d (one per key)", customer, got, n)
		}
	}
	// Every success is replayed with its order, from any of the servers.
	for i, o := range outcomes {
		e := sessions[i%4].mustSucceed(t, "create_order", uniqueOrder(o.key, o.customer))
		if !e.Replayed || e.orderID() != o.order {
			t.Fatalf("replay of %s: replayed %v order %s, want order %s", o.key, e.Replayed, e.orderID(), o.order)
		}
	}
	for _, s := range sessions {
		s.Close()
	}
	stopOwner(t, db)
	mustVerify(t, db)
}

// TestOwnerServesOthersWhileAClientIsStopped: one stdio server is stopped
// (SIGSTOP, as Ctrl-Z would) for a minute with a call of its own in
// flight; the others' calls are answered as usual all along, and the
// stopped one's call is answered when it continues.
func TestOwnerServesOthersWhileAClientIsStopped(t *testing.T) {
	const stopped = 60 * time.Second
	db := filepath.Join(t.TempDir(), "ledger.db")
	cfg := serverConfig{DB: db}
	a, b, c := startServer(t, mcpGoLegacy, cfg), startServer(t, mcpGoLegacy, cfg), startServer(t, goSDKLegacy, cfg)
	a.mustSucceed(t, "create_order", uniqueOrder(newKey(), "warm"))

	key := newKey()
	result := make(chan envelope, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), stopped+time.Minute)
		defer cancel()
		e, _ := a.call(ctx, "create_order", uniqueOrder(key, "stopped"))
		result <- e
	}()
	time.Sleep(50 * time.Millisecond)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer a.cmd.Process.Signal(syscall.SIGCONT)
	began := time.Now()
	var calls int
	var slowest time.Duration
	for time.Since(began) < stopped {
		for _, s := range []*session{b, c} {
			t0 := time.Now()
			s.mustSucceed(t, "create_order", uniqueOrder(newKey(), "others"))
			slowest = max(slowest, time.Since(t0))
			calls++
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("%d calls of the other servers while one was stopped for %v; slowest %v", calls, stopped, slowest)
	if slowest > 2*time.Second {
		t.Errorf("a call of another server took %v while one server was stopped", slowest)
	}
	a.cmd.Process.Signal(syscall.SIGCONT)
	select {
	case e := <-result:
		if e.Status != "succeeded" {
			t.Errorf("the stopped server's call: %v", e)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stopped server's call was not answered after it continued")
	}
	if n := b.orderCount(t, "stopped"); n != 1 {
		t.Errorf("%d orders of the stopped server's call, want 1", n)
	}
}

// TestOwnerStoppedAnswersWithinBound: while the owner is stopped (SIGSTOP)
// a call is answered within owner.StallBound with an error that tells the
// model to repeat it with the same key, never left hanging; once the
// owner continues, repeating it succeeds, once.
func TestOwnerStoppedAnswersWithinBound(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	s := startServer(t, mcpGoLegacy, serverConfig{DB: db})
	s.mustSucceed(t, "create_order", uniqueOrder(newKey(), "warm"))
	pid, ok := ownerPID(db)
	if !ok {
		t.Fatal("no owner")
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(pid, syscall.SIGCONT)
	if !eventually(5*time.Second, func() bool { return procState(pid) == 'T' }) {
		t.Fatalf("owner %d not stopped: state %c", pid, procState(pid))
	}
	keys := []string{newKey(), newKey()}
	for _, key := range keys { // the first over the stalled connection, the second over a new one
		began := time.Now()
		e := s.callTool(t, "create_order", uniqueOrder(key, "stopped-owner"))
		took := time.Since(began)
		t.Logf("answered after %v: %s", took.Round(time.Millisecond), e)
		if took > owner.StallBound+2*time.Second {
			t.Errorf("answered after %v, want within %v", took, owner.StallBound)
		}
		if !e.IsError || e.code() != "internal" || e.OperationKey != key || !strings.Contains(e.Text, "same operation_key") {
			t.Errorf("answer while the owner is stopped: %v", e)
		}
	}
	syscall.Kill(pid, syscall.SIGCONT)
	for _, key := range keys {
		createUntilDone(t, s, key, "stopped-owner", 30*time.Second)
	}
	if n := s.orderCount(t, "stopped-owner"); n != 2 {
		t.Errorf("%d orders, want 2 (one per key)", n)
	}
}

// TestOwnerRefusesOtherConfiguration: a serve whose configuration differs
// from the running owner's, while another client uses it, is refused at
// once in one line that names the difference and what to do; a serve of
// another build likewise. With no other client, the owner makes way: the
// new serve starts an owner of its own configuration.
func TestOwnerRefusesOtherConfiguration(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	s := startServer(t, mcpGoLegacy, serverConfig{DB: db})
	s.mustSucceed(t, "create_order", uniqueOrder(newKey(), "c"))
	pid, _ := ownerPID(db)

	refused := func(bin string, args ...string) string {
		t.Helper()
		cmd := exec.Command(bin, append([]string{"serve", "--db", db, "--log-level", "warn"}, args...)...)
		stopOwnerAtEnd(t, cmd.Args[1:])
		out, err := refusedServe(t, cmd)
		if strings.Count(out, "\n") != 0 {
			t.Errorf("serve %v: %v, stderr %q: want one line", args, err, out)
		}
		return out
	}
	out := refused(idemgate, "--wait", "7s")
	for _, want := range []string{"another configuration", `--wait is "7s" here, "5s" in the owner`, fmt.Sprintf("kill %d", pid)} {
		if !strings.Contains(out, want) {
			t.Errorf("configuration refusal %q does not say %q", out, want)
		}
	}
	other := filepath.Join(t.TempDir(), "idemgate-other")
	if err := goBuild("build", "-ldflags=-s", "-o", other, "idemgate"); err != nil { // another link: another build id
		t.Fatal(err)
	}
	out = refused(other)
	for _, want := range []string{"another build", fmt.Sprintf("kill %d", pid)} {
		if !strings.Contains(out, want) {
			t.Errorf("build refusal %q does not say %q", out, want)
		}
	}
	// The owner still serves its client.
	s.mustSucceed(t, "create_order", uniqueOrder(newKey(), "c"))

	// Alone, the owner makes way for a serve of another configuration.
	s.Close()
	s2 := startServer(t, mcpGoLegacy, serverConfig{DB: db, Args: []string{"--wait", "7s"}})
	if n := s2.orderCount(t, "c"); n != 2 {
		t.Errorf("%d orders after the new owner started, want 2", n)
	}
	if now, _ := ownerPID(db); now == pid {
		t.Errorf("the owner %d of the old configuration still serves", pid)
	}
}
