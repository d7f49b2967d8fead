package server

import (
	"context"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// ServeNoop serves the no-op floor of idemgate bench (loadgen.Floors) over
// the process's stdin and stdout: a trivial MCP server with one read-only
// tool, named tool, that answers a constant envelope — mcp-go's own stdio
// server, with none of idemgate's (no ledger, no line limits, no drain), so
// that what it costs is the transport and the client alone. It returns
// when stdin closes.
func ServeNoop(tool string) error {
	s := mcpserver.NewMCPServer("idemgate-bench-noop", "1", mcpserver.WithToolCapabilities(false))
	t := mcp.NewTool(tool, mcp.WithDescription("Returns a constant."), mcp.WithReadOnlyHintAnnotation(true))
	s.AddTool(t, func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultStructured(map[string]any{"status": "succeeded", "replayed": false, "next_action": "none"},
			`{"status":"succeeded","replayed":false,"next_action":"none"}`), nil
	})
	return mcpserver.ServeStdio(s, mcpserver.WithWorkerPoolSize(64))
}
