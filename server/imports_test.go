package server

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOnlyServerServesMCP: the MCP library's server side is this
// package's (DESIGN §9): no other package of the module imports it, main
// included, which only wires (tests and their fixture binaries may).
func TestOnlyServerServesMCP(t *testing.T) {
	const mcpServer = "github.com/mark3labs/mcp-go/server"
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != ".." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") || filepath.Dir(path) == filepath.Join("..", "server") {
			return nil
		}
		af, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range af.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == mcpServer {
				t.Errorf("%s imports %s; only package server may", path, mcpServer)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
