package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// listedTool is one tool of tools/list, re-encoded by the client library.
type listedTool struct {
	Name         string
	Description  string
	InputSchema  json.RawMessage
	OutputSchema json.RawMessage
	Annotations  map[string]any
	// FullSchemas: the library keeps the schemas verbatim (go-sdk); mcp-go
	// keeps only type, properties, required and additionalProperties.
	FullSchemas bool
}

func (s *session) listTools(t testing.TB) []listedTool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []listedTool
	switch {
	case s.mc != nil:
		res, err := s.mc.ListTools(ctx, mcpListToolsRequest())
		if err != nil {
			t.Fatalf("[%s] tools/list: %v", s.flavor.Name, err)
		}
		for _, tool := range res.Tools {
			b, err := json.Marshal(tool)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, decodeListedTool(t, b, false))
		}
	case s.gs != nil:
		res, err := s.gs.ListTools(ctx, nil)
		if err != nil {
			t.Fatalf("[%s] tools/list: %v", s.flavor.Name, err)
		}
		for _, tool := range res.Tools {
			b, err := json.Marshal(tool)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, decodeListedTool(t, b, true))
		}
	}
	return out
}

func decodeListedTool(t testing.TB, b []byte, full bool) listedTool {
	t.Helper()
	var raw struct {
		Name         string          `json:"name"`
		Description  string          `json:"description"`
		InputSchema  json.RawMessage `json:"inputSchema"`
		OutputSchema json.RawMessage `json:"outputSchema"`
		Annotations  map[string]any  `json:"annotations"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatalf("tool %s: %v", b, err)
	}
	return listedTool{raw.Name, raw.Description, raw.InputSchema, raw.OutputSchema, raw.Annotations, full}
}

// schemaProjection keeps the parts of a schema object every client library
// preserves.
func schemaProjection(t testing.TB, b []byte) map[string]any {
	t.Helper()
	v, err := decodeJSON(b)
	if err != nil {
		t.Fatalf("schema %s: %v", b, err)
	}
	m, _ := v.(map[string]any)
	out := map[string]any{}
	for _, k := range []string{"type", "properties", "required", "additionalProperties"} {
		if x, ok := m[k]; ok {
			if a, isArr := x.([]any); isArr && len(a) == 0 {
				continue // mcp-go re-encodes an absent "required" as []
			}
			out[k] = x
		}
	}
	return out
}

func readSchemaFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(moduleRoot, "schemas", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestToolsList: tools/list publishes exactly the six tools, each with the
// input schema of its schemas/*.json file, the shared output schema, every
// behaviour hint set explicitly to the value DESIGN §4 gives, and — for the
// side-effecting tools — a description that tells the model to reuse the
// key on retries.
func TestToolsList(t *testing.T) {
	type hints struct{ readOnly, destructive, idempotent, openWorld bool }
	want := map[string]hints{
		"create_order":         {readOnly: false, destructive: false, idempotent: true, openWorld: false},
		"send_notification":    {readOnly: false, destructive: false, idempotent: true, openWorld: true},
		"get_order":            {readOnly: true, destructive: false, idempotent: true, openWorld: false},
		"list_orders":          {readOnly: true, destructive: false, idempotent: true, openWorld: false},
		"new_operation_key":    {readOnly: false, destructive: false, idempotent: false, openWorld: false},
		"get_operation_status": {readOnly: true, destructive: false, idempotent: true, openWorld: false},
		"update_order":         {readOnly: false, destructive: true, idempotent: true, openWorld: false},
		"cancel_order":         {readOnly: false, destructive: true, idempotent: true, openWorld: false},
		// Approver tools: listed only for the approver role.
		"list_pending_approvals": {readOnly: true, destructive: false, idempotent: true, openWorld: false},
		"decide_approval":        {readOnly: false, destructive: true, idempotent: true, openWorld: false},
		"reconcile_operation":    {readOnly: false, destructive: false, idempotent: true, openWorld: true},
		"resolve_operation":      {readOnly: false, destructive: true, idempotent: true, openWorld: false},
	}
	agentTools := []string{"cancel_order", "create_order", "get_operation_status", "get_order", "list_orders", "new_operation_key", "reconcile_operation", "send_notification", "update_order"}
	approverTools := append([]string{"decide_approval", "list_pending_approvals", "resolve_operation"}, agentTools...)
	slices.Sort(approverTools)
	output := readSchemaFile(t, "result")
	forEachFlavor(t, allFlavors, func(t *testing.T, f flavor) {
		approver := startServer(t, f, serverConfig{Args: []string{"--role", "approver", "--principal", "boss"}})
		var approverNames []string
		for _, tool := range approver.listTools(t) {
			approverNames = append(approverNames, tool.Name)
		}
		slices.Sort(approverNames)
		if !slices.Equal(approverNames, approverTools) {
			t.Errorf("approver's tools = %v, want %v", approverNames, approverTools)
		}
		s := startServer(t, f, serverConfig{})
		tools := s.listTools(t)
		var names []string
		for _, tool := range tools {
			names = append(names, tool.Name)
		}
		slices.Sort(names)
		if !slices.Equal(names, agentTools) {
			t.Fatalf("agent's tools = %v, want %v", names, agentTools)
		}
		for _, tool := range tools {
			h := want[tool.Name]
			input := readSchemaFile(t, tool.Name)
			if tool.FullSchemas {
				if !jsonEqual(tool.InputSchema, input) {
					t.Errorf("%s: inputSchema differs from schemas/%s.json:\n%s", tool.Name, tool.Name, tool.InputSchema)
				}
				if !jsonEqual(tool.OutputSchema, output) {
					t.Errorf("%s: outputSchema differs from schemas/result.json:\n%s", tool.Name, tool.OutputSchema)
				}
			} else {
				if got, w := schemaProjection(t, tool.InputSchema), schemaProjection(t, input); !jsonEqualValues(got, w) {
					t.Errorf("%s: inputSchema %v, want (projection of the file) %v", tool.Name, got, w)
				}
				if got, w := schemaProjection(t, tool.OutputSchema), schemaProjection(t, output); !jsonEqualValues(got, w) {
					t.Errorf("%s: outputSchema %v, want %v", tool.Name, got, w)
				}
			}
			for name, wantVal := range map[string]bool{
				"readOnlyHint": h.readOnly, "destructiveHint": h.destructive,
				"idempotentHint": h.idempotent, "openWorldHint": h.openWorld,
			} {
				v, ok := tool.Annotations[name]
				if !ok {
					t.Errorf("%s: annotation %s is not set explicitly (annotations %v)", tool.Name, name, tool.Annotations)
					continue
				}
				if v != wantVal {
					t.Errorf("%s: %s = %v, want %v", tool.Name, name, v, wantVal)
				}
			}
			if title, _ := tool.Annotations["title"].(string); title == "" {
				t.Errorf("%s: no title annotation", tool.Name)
			}
			if tool.Name == "create_order" || tool.Name == "send_notification" || tool.Name == "update_order" || tool.Name == "cancel_order" {
				d := strings.ToLower(tool.Description)
				for _, phrase := range []string{"every retry", "never mint a new key"} {
					if !strings.Contains(d, phrase) {
						t.Errorf("%s: description does not tell the model %q:\n%s", tool.Name, phrase, tool.Description)
					}
				}
			}
		}
	})
}

func jsonEqualValues(a, b any) bool {
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && jsonEqual(ja, jb)
}
