package server

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"idemgate/schemas"
	"idemgate/tools"
)

// TestToolSchemaCompacted: a tool's input schema is registered compacted
// (mcp-go re-reads it on every HTTP tools/call), and tools/list still
// publishes exactly the bytes the schema file encodes to.
func TestToolSchemaCompacted(t *testing.T) {
	for _, name := range []string{"create_order", "update_order", "get_order"} {
		file, ok := schemas.InputSchema(name)
		if !ok {
			t.Fatalf("no schema for %s", name)
		}
		tool := toolOf(tools.Spec{Name: name, Description: "d"}, json.RawMessage(schemas.OutputSchema()))
		var want bytes.Buffer
		if err := json.Compact(&want, file); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(tool.RawInputSchema, want.Bytes()) {
			t.Errorf("%s: registered schema is not the file compacted", name)
		}
		if len(tool.RawInputSchema) >= len(file) {
			t.Errorf("%s: registered %d bytes, the file has %d", name, len(tool.RawInputSchema), len(file))
		}
		published, err := json.Marshal(tool)
		if err != nil {
			t.Fatal(err)
		}
		asFile := tool
		asFile.RawInputSchema = file
		fromFile, err := json.Marshal(asFile)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(published, fromFile) {
			t.Errorf("%s: tools/list entry changed:\n%s\n%s", name, published, fromFile)
		}
		if got := mcp.ExtractParamHeaderBindings(&tool); got != nil {
			t.Errorf("%s: header bindings %v, want none", name, got)
		}
	}
}
