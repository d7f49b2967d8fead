// Command noop is the benchmark baseline of the idemgate end-to-end suite:
// an mcp-go stdio server with one tool, "noop", that returns a constant. It
// measures what the MCP transport and the client cost on their own, so the
// ledger's share of an idemgate call can be read off the difference.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

func main() {
	s := server.NewMCPServer("noop", "1", server.WithToolCapabilities(false))
	t := mcp.NewTool("noop", mcp.WithDescription("Returns a constant."), mcp.WithReadOnlyHintAnnotation(true))
	s.AddTool(t, func(context.Context, mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultStructured(map[string]any{"status": "succeeded", "replayed": false, "next_action": "none"},
			`{"status":"succeeded","replayed":false,"next_action":"none"}`), nil
	})
	if err := server.ServeStdio(s, server.WithWorkerPoolSize(64)); err != nil {
		fmt.Fprintln(os.Stderr, "noop:", err)
		os.Exit(1)
	}
}
