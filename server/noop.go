package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// newNoopServer is the no-op floor's MCP server: one read-only tool,
// named tool, that answers a constant envelope.
func newNoopServer(tool string) *mcpserver.MCPServer {
	s := mcpserver.NewMCPServer("idemgate-bench-noop", "1", mcpserver.WithToolCapabilities(false))
	t := mcp.NewTool(tool, mcp.WithDescription("Returns a constant."), mcp.WithReadOnlyHintAnnotation(true))
	s.AddTool(t, func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultStructured(map[string]any{"status": "succeeded", "replayed": false, "next_action": "none"},
			`{"status":"succeeded","replayed":false,"next_action":"none"}`), nil
	})
	return s
}

// ServeNoop serves the no-op floor of idemgate bench (loadgen.Floors) over
// the process's stdin and stdout: a trivial MCP server with one read-only
// tool, named tool, that answers a constant envelope — mcp-go's own stdio
// server, with none of idemgate's (no ledger, no line limits, no drain), so
// that what it costs is the transport and the client alone. It returns
// when stdin closes.
func ServeNoop(tool string) error {
	return mcpserver.ServeStdio(newNoopServer(tool), mcpserver.WithWorkerPoolSize(64))
}

// ServeNoopHTTP serves the same no-op floor over Streamable HTTP, at /mcp
// on ln: mcp-go's own Streamable HTTP handler with its sessions in memory
// and none of idemgate's layers (no bearer token check — a client may send
// one, it is ignored —, no sessions in the ledger, no Origin gate, no body
// limits), so that what it costs is the HTTP transport and the client
// alone. It returns when ctx is done, after letting the requests in
// flight finish (up to 5 s), or when serving fails.
func ServeNoopHTTP(ctx context.Context, ln net.Listener, tool string) error {
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcpserver.NewStreamableHTTPServer(newNoopServer(tool), mcpserver.WithEndpointPath("/mcp")))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	if err := ServeUntil(ctx, srv, ln, 5*time.Second); !errors.Is(err, ErrGraceExceeded) {
		return err
	}
	return nil
}
