package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/client/transport"
)

// rawStdio is `idemgate serve` on stdio driven by hand-written JSON-RPC
// lines, for messages no MCP client library would send.
type rawStdio struct {
	t       *testing.T
	cmd     *exec.Cmd
	stderr  *syncBuffer
	stdin   io.WriteCloser
	answers chan map[string]any
	nextID  int
}

func startRawStdio(t *testing.T, extra ...string) *rawStdio {
	t.Helper()
	return startRawStdioEnv(t, nil, extra...)
}

// startRawStdioEnv is startRawStdio with env added to the server's
// environment.
func startRawStdioEnv(t *testing.T, env []string, extra ...string) *rawStdio {
	t.Helper()
	args := append([]string{"serve", "--db", filepath.Join(t.TempDir(), "ledger.db"), "--log-level", "error"}, extra...)
	stopOwnerAtEnd(t, args)
	cmd := exec.Command(idemgate, args...)
	cmd.Env = append(os.Environ(), env...)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
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
	r := &rawStdio{t: t, cmd: cmd, stderr: stderr, stdin: stdin, answers: make(chan map[string]any, 16), nextID: 100}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
		if t.Failed() {
			t.Logf("server stderr:\n%s", stderr.String())
		}
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				r.answers <- m
			}
		}
		close(r.answers)
	}()
	r.send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	if m := r.next(); m["id"] != float64(1) || m["result"] == nil {
		t.Fatalf("initialize answer: %v", m)
	}
	r.send(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	return r
}

func (r *rawStdio) send(line string) {
	r.t.Helper()
	if _, err := io.WriteString(r.stdin, line+"\n"); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rawStdio) next() map[string]any {
	r.t.Helper()
	select {
	case m, ok := <-r.answers:
		if !ok {
			r.t.Fatal("the server closed stdout")
		}
		return m
	case <-time.After(20 * time.Second):
		r.t.Fatal("no answer within 20 s")
	}
	return nil
}

// rpcError is the error of a JSON-RPC answer; it fails the test when the
// answer has none or carries another id.
func rpcError(t *testing.T, m map[string]any, id any) (code int, msg string) {
	t.Helper()
	e, ok := m["error"].(map[string]any)
	if !ok {
		t.Fatalf("answer %v, want a JSON-RPC error", clipAnswer(m))
	}
	if m["id"] != id {
		t.Errorf("error answer has id %v, want %v", m["id"], id)
	}
	code = int(e["code"].(float64))
	msg, _ = e["message"].(string)
	return code, msg
}

func clipAnswer(m map[string]any) string {
	b, _ := json.Marshal(m)
	if len(b) > 400 {
		return string(b[:400]) + "…"
	}
	return string(b)
}

// call sends tools/call and returns the answer.
func (r *rawStdio) call(tool string, args any) map[string]any {
	r.t.Helper()
	r.nextID++
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": r.nextID, "method": "tools/call",
		"params": map[string]any{"name": tool, "arguments": args}})
	r.send(string(b))
	m := r.next()
	if m["id"] != float64(r.nextID) {
		r.t.Fatalf("answer %v to request %d", clipAnswer(m), r.nextID)
	}
	return m
}

// orders is list_orders(customer).count.
func (r *rawStdio) orders(customer string) int {
	r.t.Helper()
	m := r.call("list_orders", map[string]any{"customer_id": customer})
	res, _ := m["result"].(map[string]any)
	sc, _ := res["structuredContent"].(map[string]any)
	result, _ := sc["result"].(map[string]any)
	n, ok := result["count"].(float64)
	if !ok {
		r.t.Fatalf("list_orders: %v", clipAnswer(m))
	}
	return int(n)
}

// vmHWM is the peak resident set of the server process, in bytes.
func (r *rawStdio) vmHWM() int {
	r.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", r.cmd.Process.Pid))
	if err != nil {
		r.t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				r.t.Fatalf("VmHWM %q: %v", v, err)
			}
			return kb << 10
		}
	}
	r.t.Skip("no VmHWM in /proc/PID/status")
	return 0
}

func validOrderArgs(customer string) map[string]any {
	return orderArgs(newKey(), customer, coffee, nil)
}

// TestDeepNestingRefused (issue 8 defect 1): an 18 KB create_order whose
// arguments nest an array 9 000 levels deep took the server to 1.3 GB. It
// is now refused at the transport with a JSON-RPC error naming the limit,
// before it is decoded; the server's peak RSS stays small and it keeps
// serving. Arguments a little too deep for the tools (40 levels) pass the
// transport and get an invalid_arguments tool error.
func TestDeepNestingRefused(t *testing.T) {
	r := startRawStdio(t)
	deep := func(id, n int) string {
		return `{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"tools/call","params":{"name":"create_order","arguments":{"operation_key":"` +
			newKey() + `","customer_id":"deep","currency":"EUR","items":` + strings.Repeat("[", n) + strings.Repeat("]", n) + `}}}`
	}
	msg := deep(2, 9000)
	if len(msg) < 18000 || len(msg) > 19000 {
		t.Fatalf("message is %d bytes, want about 18 KB", len(msg))
	}
	for i := range 8 { // eight of them took 10.4 GB
		r.send(deep(2+i, 9000))
		code, text := rpcError(t, r.next(), float64(2+i))
		if code != -32600 || !strings.Contains(text, "more than 64 levels deep") {
			t.Fatalf("9 000-deep create_order: code %d %q, want -32600 naming the 64-level limit", code, text)
		}
	}
	if hwm := r.vmHWM(); hwm > 200<<20 {
		t.Errorf("peak RSS %d MB after eight 9 000-deep requests, want under 200 MB", hwm>>20)
	} else {
		t.Logf("peak RSS %d MB", hwm>>20)
	}

	// Too deep for a tool, not for the transport: a tool error.
	r.send(deep(20, 40))
	m := r.next()
	res, _ := m["result"].(map[string]any)
	if res == nil || res["isError"] != true || !strings.Contains(fmt.Sprint(res["structuredContent"]), "more than 32 levels deep") {
		t.Errorf("40-deep create_order: %v, want an invalid_arguments tool error naming the 32-level limit", clipAnswer(m))
	}

	// The server keeps serving, and nothing was ordered.
	if n := r.orders("deep"); n != 0 {
		t.Errorf("%d orders for the refused requests, want 0", n)
	}
	if m := r.call("create_order", validOrderArgs("after-deep")); m["result"].(map[string]any)["isError"] == true {
		t.Fatalf("create_order after the deep ones: %v", clipAnswer(m))
	}
	if n := r.orders("after-deep"); n != 1 {
		t.Errorf("%d orders, want 1", n)
	}
}

// TestDuplicateEnvelopeMembers (issue 8 defect 9): duplicate and
// case-variant member names — in the envelope or the arguments — are
// refused with a JSON-RPC invalid request naming them, and nothing runs.
// encoding/json took the last value and matched names ignoring case, so
// "name":"list_orders","NAME":"create_order" placed an order while a proxy
// reading the first value saw a harmless list_orders.
func TestDuplicateEnvelopeMembers(t *testing.T) {
	r := startRawStdio(t)
	args, _ := json.Marshal(validOrderArgs("dup"))
	a := string(args)
	tests := []struct {
		name, line, want string
	}{
		{"name and NAME", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_orders","NAME":"create_order","arguments":` + a + `}}`,
			`members "name" and "NAME" in params differ only in case`},
		{"name twice", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_orders","name":"create_order","arguments":` + a + `}}`,
			`member "name" appears twice in params`},
		{"method and METHOD", `{"jsonrpc":"2.0","id":2,"method":"tools/list","METHOD":"tools/call","params":{"name":"create_order","arguments":` + a + `}}`,
			`members "method" and "METHOD" in the message differ only in case`},
		{"arguments twice", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_order","arguments":{"customer_id":"x"},"Arguments":` + a + `}}`,
			`members "arguments" and "Arguments" in params differ only in case`},
		{"case variant in arguments", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_order","arguments":` +
			strings.Replace(a, `"customer_id":"dup"`, `"customer_id":"dup","Customer_ID":"other"`, 1) + `}}`,
			`members "customer_id" and "Customer_ID" in params.arguments differ only in case`},
		{"duplicate inside an item", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_order","arguments":` +
			strings.Replace(a, `"quantity":2`, `"quantity":2,"quantity":200`, 1) + `}}`,
			`member "quantity" appears twice in params.arguments.items[0]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r.t = t
			r.send(tt.line)
			code, msg := rpcError(t, r.next(), float64(2))
			if code != -32600 || !strings.Contains(msg, tt.want) {
				t.Errorf("code %d %q, want -32600 with %q", code, msg, tt.want)
			}
		})
	}
	r.t = t
	if n := r.orders("dup"); n != 0 {
		t.Errorf("%d orders placed by refused messages, want 0", n)
	}
	// The same arguments, written once, place the order.
	if m := r.call("create_order", json.RawMessage(a)); m["result"].(map[string]any)["isError"] == true {
		t.Fatalf("create_order: %v", clipAnswer(m))
	}
	if n := r.orders("dup"); n != 1 {
		t.Errorf("%d orders, want 1", n)
	}
}

// TestProtocolErrorsAreBounded (issue 8 defect 9): what reaches no tool
// gets a JSON-RPC error, as docs/tools.md lists, and no error repeats more
// than 64 characters of the request (a 100 000-digit number came back
// whole). A hidden approver tool is answered exactly like an unknown one.
func TestProtocolErrorsAreBounded(t *testing.T) {
	r := startRawStdio(t)
	long := strings.Repeat("7", 100000)
	tests := []struct {
		name, line string
		code       int
		want       string
	}{
		{"100 000-digit number", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_order","arguments":{"customer_id":"n","items":[{"sku":"a","quantity":` + long + `,"unit_price_minor":1}]}}}`,
			-32602, "params.arguments.items[0].quantity: number is longer than 64 characters"},
		{"number beyond float64", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_order","arguments":{"customer_id":"n","items":[{"sku":"a","quantity":1e999,"unit_price_minor":1}]}}}`,
			-32602, "number is beyond the range of a 64-bit float (got 1e999)"},
		{"non-string tool name", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":["create_order"],"arguments":{}}}`,
			-32602, "params.name must be a string naming a tool (got an array)"},
		{"huge tool name", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"` + long + `","arguments":{}}}`,
			-32602, "params.name must be 1 to 64 characters"},
		{"huge method", `{"jsonrpc":"2.0","id":2,"method":"` + long + `"}`,
			-32600, "the method is longer than 64 characters"},
		{"unknown tool", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"drop_orders","arguments":{}}}`,
			-32602, "tool 'drop_orders' not found"},
		{"hidden approver tool", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"decide_approval","arguments":{}}}`,
			-32602, "tool 'decide_approval' not found"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r.t = t
			r.send(tt.line)
			m := r.next()
			code, msg := rpcError(t, m, float64(2))
			if code != tt.code || !strings.Contains(msg, tt.want) {
				t.Errorf("code %d %q, want %d with %q", code, msg, tt.code, tt.want)
			}
			if b, _ := json.Marshal(m); utf8.RuneCount(b) > 400 || bytes.Contains(b, []byte(strings.Repeat("7", 65))) {
				t.Errorf("answer is %d bytes or repeats the input: %.300s", len(b), b)
			}
		})
	}
	r.t = t
	// Unknown and hidden are indistinguishable but for the name.
	r.send(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"zzzzzzzzzzzzzzz","arguments":{}}}`)
	_, unknown := rpcError(t, r.next(), float64(3))
	r.send(`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"resolve_operation","arguments":{}}}`)
	_, hidden := rpcError(t, r.next(), float64(3))
	if strings.ReplaceAll(hidden, "resolve_operation", "zzzzzzzzzzzzzzz") != unknown {
		t.Errorf("hidden tool %q, unknown tool %q: they must read alike", hidden, unknown)
	}
	if n := r.orders("n"); n != 0 {
		t.Errorf("%d orders, want 0", n)
	}
}

// TestStrictEnvelopeOverHTTP: the HTTP transport reads bodies as strictly
// as stdio: a case-variant tool name and a 9 000-deep body are answered 400
// with a JSON-RPC error and never run; the server keeps serving.
func TestStrictEnvelopeOverHTTP(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	token := addToken(t, tokens, "alice", "acme", "agent")
	base := httpServer(t, filepath.Join(dir, "ledger.db"), tokens)
	s := httpSession(t, base, token)

	args, _ := json.Marshal(validOrderArgs("http-dup"))
	// The session's own headers, so that without the strict reading the
	// message would be served.
	sessionID := s.mc.GetTransport().(*transport.StreamableHTTP).GetSessionId()
	post := func(name, body string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, base+"/mcp", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Session-Id", sessionID)
		req.Header.Set("Mcp-Protocol-Version", s.mc.ProtocolVersion())
		req.Header.Set("Mcp-Method", "tools/call")
		req.Header.Set("Mcp-Name", name)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return resp.StatusCode, string(b)
	}
	meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"` + s.mc.ProtocolVersion() + `","io.modelcontextprotocol/clientCapabilities":{}}`
	status, body := post("create_order", `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{`+meta+`,"name":"list_orders","NAME":"create_order","arguments":`+string(args)+`}}`)
	if status != 400 || !strings.Contains(body, `"code":-32600`) || !strings.Contains(body, `differ only in case`) || !strings.Contains(body, `"id":5`) {
		t.Errorf("case-variant name over HTTP: %d %s", status, body)
	}
	deep := `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{` + meta + `,"name":"create_order","arguments":{"items":` +
		strings.Repeat("[", 9000) + strings.Repeat("]", 9000) + `}}}`
	status, body = post("create_order", deep)
	if status != 400 || !strings.Contains(body, "more than 64 levels deep") {
		t.Errorf("9 000-deep body over HTTP: %d %.300s", status, body)
	}
	if n := s.orderCount(t, "http-dup"); n != 0 {
		t.Errorf("%d orders, want 0", n)
	}
	s.mustSucceed(t, "create_order", validOrderArgs("http-dup"))
	if n := s.orderCount(t, "http-dup"); n != 1 {
		t.Errorf("%d orders, want 1", n)
	}
}
