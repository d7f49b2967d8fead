package e2e

import (
	"bufio"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestShutdownNotHeldByRefusedMessages: messages the strict envelope
// refuses with id null (a duplicate id, an id over 128 characters) are
// answered at once and are no call in flight: SIGTERM afterwards ends the
// server at once, not after its whole shutdown grace (20 s).
func TestShutdownNotHeldByRefusedMessages(t *testing.T) {
	r := startRawStdio(t, "--principal", "agent-1", "--tenant", "t1")
	r.send(`{"jsonrpc":"2.0","id":5,"id":6,"method":"ping"}`)
	if code, _ := rpcError(t, r.next(), nil); code != -32600 {
		t.Fatalf("duplicate id: code %d, want -32600", code)
	}
	r.send(`{"jsonrpc":"2.0","id":"` + strings.Repeat("x", 200) + `","method":"ping"}`)
	if code, _ := rpcError(t, r.next(), nil); code != -32600 {
		t.Fatalf("long id: code %d, want -32600", code)
	}
	r.send(`{"jsonrpc":"2.0","id":7,"method":"ping"}`)
	if m := r.next(); m["id"] != float64(7) || m["result"] == nil {
		t.Fatalf("ping after the refusals: %v", m)
	}
	started := time.Now()
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		for range r.answers { // drain stdout until the server closes it
		}
		close(exited)
	}()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not exit within 10 s of SIGTERM with nothing in flight")
	}
	if d := time.Since(started); d > 5*time.Second {
		t.Errorf("exit took %s after SIGTERM with nothing in flight", d)
	}
}

// TestAuditVerifiesWithLongUnicodeClientName: a client whose clientInfo
// name has a multi-byte character across the 64 bytes the audit log
// keeps; audit verify still finds the chain intact.
func TestAuditVerifiesWithLongUnicodeClientName(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	cmd := exec.Command(idemgate, "serve", "--db", db, "--principal", "agent-1", "--tenant", "t1", "--log-level", "error")
	stopOwnerAtEnd(t, cmd.Args[1:])
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	out := bufio.NewReader(stdout)
	send := func(m any) {
		b, _ := json.Marshal(m)
		if _, err := stdin.Write(append(b, '\n')); err != nil {
			t.Fatal(err)
		}
	}
	read := func() map[string]any {
		line, err := out.ReadBytes('\n')
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	send(map[string]any{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": map[string]any{
		"protocolVersion": "2025-06-18", "capabilities": map[string]any{},
		"clientInfo": map[string]any{"name": strings.Repeat("a", 63) + "é", "version": "1"}}})
	read()
	send(map[string]any{"jsonrpc": "2.0", "method": "notifications/initialized"})
	send(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": map[string]any{
		"name": "create_order", "arguments": validOrderArgs("cust-utf8")}})
	if m := read(); m["result"] == nil {
		t.Fatalf("create_order: %v", m)
	}
	stdin.Close()
	io.Copy(io.Discard, out)
	cmd.Wait()
	v, err := exec.Command(idemgate, "audit", "verify", "--db", db).CombinedOutput()
	if err != nil || !strings.Contains(string(v), "intact") {
		t.Fatalf("audit verify: %v\n%s", err, v)
	}
}
