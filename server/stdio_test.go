package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// stdioTestServer is a small MCP server: a tool that echoes its argument,
// and one that panics.
func stdioTestServer() *mcpserver.MCPServer {
	s := mcpserver.NewMCPServer("t", "1", mcpserver.WithToolCapabilities(false), mcpserver.WithRecovery())
	s.AddTool(mcp.NewTool("echo", mcp.WithString("x")), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText(fmt.Sprint(req.GetArguments()["x"])), nil
	})
	s.AddTool(mcp.NewTool("boom"), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		panic("boom")
	})
	// structured answers as idemgate's tools do (toResult): its argument
	// json, a JSON text, as structured content and as text.
	s.AddTool(mcp.NewTool("structured", mcp.WithString("json"), mcp.WithBoolean("error")), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		text := req.GetString("json", "")
		r := mcp.NewToolResultStructured(json.RawMessage(text), text)
		r.IsError = req.GetBool("error", false)
		return r, nil
	})
	return s
}

// modernMeta is the _meta of a request of the 2026-07-28 era, which has
// no handshake: its result carries a resultType and the server's
// identity.
const modernMeta = `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientInfo":{"name":"t","version":"1"},"io.modelcontextprotocol/clientCapabilities":{}}`

// stdioExchange is a conversation: each line sent, and whether it is
// answered.
var stdioExchange = []struct {
	line     string
	answered bool
}{
	{`not json`, true},
	{`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`, true},
	{`{"jsonrpc":"2.0","method":"notifications/initialized"}`, false},
	{`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, true},
	{`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"x":"hé"}}}`, true},
	{`{"jsonrpc":"2.0","id":"s","method":"nope"}`, true},
	{`{"jsonrpc":"2.0","id":4,"method":"ping"}`, true},
	{`{"jsonrpc":"2.0","id":99,"result":{}}`, false},
	{`{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"boom"}}`, true},
	{`{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"structured","arguments":{"json":"{\"status\":\"completed\",\"replayed\":true,\"note\":\"x y\\\"z\"}"}}}`, true},
	{`{"jsonrpc":"2.0","id":"11","method":"tools/call","params":{"name":"structured","arguments":{"json":"{ \"a\" : [1, 2.50, {}],\n\"b\":\"\\u00e9\"}","error":true}}}`, true},
	{`{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"structured","arguments":{"json":"{\"html\":\"<b>&amp;</b>\",\"sep\":\"\u2028\u2029\",\"é\":\"\\u003c\"}"}}}`, true},
	{`{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"structured","arguments":{"json":"[]"}}}`, true},
	{`{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":"structured","arguments":{"json":"{\"a\":1}"},` + modernMeta + `}}`, true},
	{`{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"name":"echo","arguments":{"x":"<\u2028>"},` + modernMeta + `}}`, true},
	{`{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"missing"}}`, true},
}

// converse runs serve on a pipe, sends stdioExchange line by line, and
// returns every answer, in order, and whatever was written after the
// input ended.
func converse(t *testing.T, serve func(ctx context.Context, in io.Reader, out io.Writer) error) (answers []string, trailing []string) {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := serve(context.Background(), inR, outW)
		outW.Close()
		done <- err
	}()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(outR)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for _, x := range stdioExchange {
		if _, err := io.WriteString(inW, x.line+"\n"); err != nil {
			t.Fatal(err)
		}
		if !x.answered {
			continue
		}
		select {
		case l := <-lines:
			answers = append(answers, l)
		case <-time.After(10 * time.Second):
			t.Fatalf("no answer to %s", x.line)
		}
	}
	inW.Close()
	for l := range lines {
		trailing = append(trailing, l)
	}
	if err := <-done; err != nil {
		t.Fatalf("serve: %v", err)
	}
	return answers, trailing
}

// TestStdioAnswersAsMCPGo: the stdio transport answers every kind of line
// — not JSON, requests of the handshake era, notifications, answers from
// the client, tool calls that succeed, panic or name no tool — with
// exactly the bytes mcp-go's own stdio server writes, and nothing else.
// (Messages that are not JSON-RPC requests mcp-go can read are answered
// by the envelope check instead: TestCheckEnvelopeRefuses.)
func TestStdioAnswersAsMCPGo(t *testing.T) {
	got, gotTrailing := converse(t, func(ctx context.Context, in io.Reader, out io.Writer) error {
		return ServeStdio(ctx, stdioTestServer(), StdioConfig{In: in, Out: out, Workers: 2, Grace: 5 * time.Second,
			Logger: slog.New(slog.DiscardHandler)})
	})
	want, wantTrailing := converse(t, func(ctx context.Context, in io.Reader, out io.Writer) error {
		std := mcpserver.NewStdioServer(stdioTestServer())
		std.SetErrorLogger(log.New(io.Discard, "", 0))
		return std.Listen(ctx, in, out)
	})
	if len(got) != len(want) {
		t.Fatalf("%d answers, mcp-go %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("answer %d:\n got %s\nwant %s", i, got[i], want[i])
		}
	}
	if len(gotTrailing) != 0 || len(wantTrailing) != 0 {
		t.Errorf("lines after the input ended: %q (mcp-go: %q)", gotTrailing, wantTrailing)
	}
}
