package server

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"reflect"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"

	"idemgate/ledger"
	"idemgate/schemas"
	"idemgate/tools"
	"idemgate/tools/toolstest"
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

// TestRegisteredToolsBindNoHeader: New registers each tool with an input
// schema that binds no header to a parameter (mcp-go re-reads it on every
// HTTP tools/call), which is exactly what the published schema binds,
// while tools/list publishes each schema file, as an approver sees every
// tool and an agent every tool but the approver-only ones.
func TestRegisteredToolsBindNoHeader(t *testing.T) {
	svc, _ := toolstest.New(t, ledger.Options{}, tools.Options{})
	agent := Identity{Principal: "a", Tenant: "t", Role: "agent"}
	s := New(svc, agent, slog.New(slog.DiscardHandler), nil)
	out := json.RawMessage(schemas.OutputSchema())
	for _, spec := range svc.Specs() {
		registered := s.GetTool(spec.Name)
		if registered == nil {
			t.Fatalf("%s: not registered", spec.Name)
		}
		published := toolOf(spec, out)
		if got, want := mcp.ExtractParamHeaderBindings(&registered.Tool), mcp.ExtractParamHeaderBindings(&published); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: registered header bindings %v, published %v", spec.Name, got, want)
		}
		if len(registered.Tool.RawInputSchema) >= len(published.RawInputSchema) {
			t.Errorf("%s: registered the whole input schema (%d bytes)", spec.Name, len(registered.Tool.RawInputSchema))
		}
	}
	for _, role := range []string{"agent", "approver"} {
		ctx := WithIdentity(context.Background(), Identity{Principal: "p", Tenant: "t", Role: role})
		resp := s.HandleMessage(ctx, json.RawMessage(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		b, err := json.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Result struct {
				Tools []struct {
					Name        string          `json:"name"`
					InputSchema json.RawMessage `json:"inputSchema"`
				} `json:"tools"`
			} `json:"result"`
		}
		if err := json.Unmarshal(b, &list); err != nil {
			t.Fatal(err)
		}
		want := 0
		for _, spec := range svc.Specs() {
			if role == "approver" || !spec.ApproverOnly {
				want++
			}
		}
		if len(list.Result.Tools) != want || want == 0 {
			t.Fatalf("%s: tools/list has %d tools, want %d: %s", role, len(list.Result.Tools), want, b)
		}
		for _, tool := range list.Result.Tools {
			file, _ := schemas.InputSchema(tool.Name)
			var compact bytes.Buffer
			if err := json.Compact(&compact, file); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(tool.InputSchema, compact.Bytes()) {
				t.Errorf("%s: tools/list publishes %s's input schema as %.80s…, not its file", role, tool.Name, tool.InputSchema)
			}
		}
	}
}

// TestRegisteredToolKeepsHeaderBindings: a tool whose input schema binds
// a parameter to a header, or whose annotations mcp-go refuses, is
// registered with that schema whole, so mcp-go still checks the header
// (or refuses the tool).
func TestRegisteredToolKeepsHeaderBindings(t *testing.T) {
	for _, schema := range []string{
		`{"type":"object","properties":{"region":{"type":"string","x-mcp-header":"Region"}}}`,
		`{"type":"object","properties":{"o":{"type":"object","properties":{"r":{"type":"string","x-mcp-header":"R"}}}}}`,
		`{"type":"object","properties":{"items":{"type":"array","x-mcp-header":"Items"}}}`,
	} {
		tool := mcp.NewToolWithRawSchema("t", "d", json.RawMessage(schema))
		if got := registeredTool(tool); !bytes.Equal(got.RawInputSchema, tool.RawInputSchema) {
			t.Errorf("%s: registered as %s", schema, got.RawInputSchema)
		}
	}
	plain := mcp.NewToolWithRawSchema("t", "d", json.RawMessage(`{"type":"object","properties":{"a":{"type":"string"}}}`))
	if got := registeredTool(plain); string(got.RawInputSchema) != `{"type":"object"}` {
		t.Errorf("a schema without bindings registered as %s", got.RawInputSchema)
	}
}
