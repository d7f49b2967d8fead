package server

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

// TestServeNoopHTTP: the HTTP no-op floor answers initialize and its one
// tool with the constant envelope over Streamable HTTP (a bearer token is
// ignored), and returns nil once its context is done.
func TestServeNoopHTTP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- ServeNoopHTTP(ctx, ln, "noop") }()

	tr, err := transport.NewStreamableHTTP("http://"+ln.Addr().String()+"/mcp",
		transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer anything"}))
	if err != nil {
		t.Fatal(err)
	}
	c := client.NewClient(tr)
	callCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Start(callCtx); err != nil {
		t.Fatal(err)
	}
	init := mcp.InitializeRequest{}
	init.Params.ProtocolVersion = mcp.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcp.Implementation{Name: "test", Version: "1"}
	if _, err := c.Initialize(callCtx, init); err != nil {
		t.Fatal(err)
	}
	req := mcp.CallToolRequest{}
	req.Params.Name = "noop"
	for range 3 {
		res, err := c.CallTool(callCtx, req)
		if err != nil {
			t.Fatal(err)
		}
		if res.IsError || string(res.RawStructuredContent) == "" && res.StructuredContent == nil {
			t.Fatalf("noop answered %+v", res)
		}
	}
	c.Close()

	stop()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("ServeNoopHTTP after its context was done: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeNoopHTTP did not return within 10 s of its context being done")
	}
}
