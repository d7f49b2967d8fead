package server

import (
	"encoding/json"
	"strings"
	"testing"

	"idemgate/schemas"
)

// TestScreenArguments: a tools/call whose arguments are 64 KiB or more
// and break the tool's schema is handed on without them, with the
// refusal; what the screen reads through the envelope's lexer (skipping
// and counting) gives the messages validation gives.
func TestScreenArguments(t *testing.T) {
	v, err := schemas.New()
	if err != nil {
		t.Fatal(err)
	}
	screen := Screener(v.Screen)
	items := `{"sku":"a","quantity":1,"unit_price_minor":1}`
	tests := []struct {
		name, args string
		want       string // the refusal; "" when the message passes unchanged
	}{
		{"wide note", `{"operation_key":"k","note":[` + strings.Repeat(`1,`, 40000) + `1]}`, "note: must be a string, got array"},
		{"too many items", `{"items":[` + strings.Repeat(items+",", 4999) + items + `]}`, "items: must contain at most 100 items (got 5000)"},
		{"long note", `{"note":"` + strings.Repeat("x", 70000) + `"}`, "note: must be at most 1000 characters (got 70000)"},
		{"small", `{"note":[1]}`, ""},
		{"wide but fine for the screen", `{"note":"x"` + strings.Repeat(" ", 70000) + `}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := []byte(`{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"create_order","arguments":` + tt.args + `,"_meta":{"progressToken":"p"}}}`)
			env := examine(msg)
			if env.refused != nil {
				t.Fatalf("refused: %s", env.refused.Message)
			}
			out, sc := screenArguments(msg, env, screen)
			if tt.want == "" {
				if sc != nil || string(out) != string(msg) {
					t.Fatalf("screened %v; want the message unchanged", sc)
				}
				return
			}
			if sc == nil || sc.Err.Error() != tt.want {
				t.Fatalf("refusal %v, want %q", sc, tt.want)
			}
			var m struct {
				ID     int
				Params struct {
					Name      string
					Arguments json.RawMessage
					Meta      map[string]any `json:"_meta"`
				}
			}
			if err := json.Unmarshal(out, &m); err != nil || m.ID != 7 || m.Params.Name != "create_order" || string(m.Params.Arguments) != "{}" || m.Params.Meta["progressToken"] != "p" {
				t.Fatalf("handed on %.300s (%v); want the call with arguments {}", out, err)
			}
		})
	}
}
