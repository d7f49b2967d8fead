package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// TestMessageBudget: small messages take nothing; large ones share
// messageBudgetBytes, and what is given back can be taken again.
func TestMessageBudget(t *testing.T) {
	var b messageBudget
	for range 100 {
		if !b.take(largeMessage) {
			t.Fatal("a message of largeMessage bytes was refused")
		}
	}
	for i := range 4 {
		if !b.take(MaxMessageBytes) {
			t.Fatalf("message %d of the largest size refused; the budget holds four", i+1)
		}
	}
	if b.take(largeMessage + 1) {
		t.Fatal("a large message taken beyond the budget")
	}
	b.give(MaxMessageBytes)
	if !b.take(MaxMessageBytes) {
		t.Fatal("the bytes given back could not be taken again")
	}
	if b.take(MaxMessageBytes) {
		t.Fatal("a fifth message of the largest size taken")
	}
}

// TestStdioBudget: over stdio, large messages are served while the
// budget holds them (four of 8 MiB); one more is answered at once with a
// retryable -32000 error under its id, and once the others are answered
// the same message is served.
func TestStdioBudget(t *testing.T) {
	release := make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	// Without a budget the held calls would keep the test waiting for
	// request 5's answer: they are let go after a while all the same.
	defer time.AfterFunc(30*time.Second, free).Stop()
	s := mcpserver.NewMCPServer("t", "1", mcpserver.WithToolCapabilities(false))
	s.AddTool(mcp.NewTool("hold", mcp.WithString("x")), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		<-release
		return mcp.NewToolResultText("held"), nil
	})
	in, feed := io.Pipe()
	out, answers := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- ServeStdio(context.Background(), s, StdioConfig{In: in, Out: answers, Workers: 8, Grace: time.Second, Logger: slog.New(slog.DiscardHandler)})
		answers.Close()
	}()
	lines := bufio.NewScanner(out)
	next := func() map[string]any {
		t.Helper()
		if !lines.Scan() {
			t.Fatalf("no answer: %v", lines.Err())
		}
		var m map[string]any
		if err := json.Unmarshal(lines.Bytes(), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	// A call of MaxMessageBytes-64 bytes, most of them blanks.
	large := func(id int) string {
		head := `{"jsonrpc":"2.0","id":` + strconv.Itoa(id) + `,"method":"tools/call","params":{"name":"hold","arguments":{"x":"a"`
		return head + strings.Repeat(" ", MaxMessageBytes-64-len(head)-4) + `}}}` + "\n"
	}
	send := func(line string) {
		t.Helper()
		if _, err := io.WriteString(feed, line); err != nil {
			t.Fatal(err)
		}
	}
	for id := 1; id <= 5; id++ {
		send(large(id))
	}
	m := next()
	e, _ := m["error"].(map[string]any)
	if m["id"] != float64(5) || e["code"] != float64(codeServerBusy) || !strings.Contains(e["message"].(string), "retry in a moment") {
		t.Fatalf("answer %v; want request 5 refused as busy (-32000, retry)", m)
	}
	free()
	for range 4 {
		if m := next(); m["result"] == nil {
			t.Fatalf("answer %v; want a result", m)
		}
	}
	send(large(6))
	if m := next(); m["id"] != float64(6) || m["result"] == nil {
		t.Fatalf("answer %v; want request 6 served once the others were answered", m)
	}
	feed.Close()
	<-done
}
