package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOversizedMessage: a JSON-RPC line larger than the server's limit
// is answered with a parse error, and the server keeps serving the next
// request on the same connection.
func TestOversizedMessage(t *testing.T) {
	cmd := exec.Command(idemgate, "serve", "--db", filepath.Join(t.TempDir(), "ledger.db"), "--log-level", "error")
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
	t.Cleanup(func() { stdin.Close(); cmd.Wait() })
	answers := make(chan map[string]any, 8)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				answers <- m
			}
		}
		close(answers)
	}()
	next := func() map[string]any {
		t.Helper()
		select {
		case m, ok := <-answers:
			if !ok {
				t.Fatal("the server closed stdout")
			}
			return m
		case <-time.After(10 * time.Second):
			t.Fatal("no answer within 10 s")
		}
		return nil
	}
	send := func(s string) {
		t.Helper()
		if _, err := fmt.Fprintln(stdin, s); err != nil {
			t.Fatal(err)
		}
	}
	send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`)
	if m := next(); m["id"] != float64(1) || m["result"] == nil {
		t.Fatalf("initialize answer: %v", m)
	}
	send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	huge := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_order","arguments":{"note":"` + strings.Repeat("x", 9<<20) + `"}}}`
	send(huge)
	if m := next(); m["error"] == nil {
		t.Fatalf("oversized message answered with %v, want a JSON-RPC error", m)
	}
	send(`{"jsonrpc":"2.0","id":3,"method":"tools/list"}`)
	if m := next(); m["id"] != float64(3) || m["result"] == nil {
		t.Fatalf("the request after the oversized one: %v", m)
	}
}
