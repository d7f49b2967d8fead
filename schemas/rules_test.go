package schemas

import (
	"encoding/json"
	"strings"
	"testing"
	"testing/fstest"
)

func TestCheckRules(t *testing.T) {
	good := `{"type":"object","additionalProperties":false,"required":["amount"],"properties":{
		"amount":{"type":"integer","minimum":1,"maximum":1000000},
		"reason":{"type":"string","maxLength":200},
		"tags":{"type":"array","maxItems":5,"items":{"type":"string","enum":["a","b"]}}}}`
	out, err := CheckRules([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Required   []string                   `json:"required"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Required[0] != "operation_key" || doc.Properties["operation_key"] == nil {
		t.Errorf("operation_key not added and required: %s", out)
	}
	// The result is a schema the validator takes, refusing a missing key.
	v, err := NewWith(fstest.MapFS{"refund_x.json": {Data: out}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := v.Prepare("refund_x", map[string]any{"amount": 5}); err == nil {
		t.Error("a call without operation_key was accepted")
	}

	for name, tc := range map[string]struct{ schema, want string }{
		"open object":     {`{"type":"object","properties":{}}`, `"additionalProperties": false`},
		"unbounded str":   {`{"type":"object","additionalProperties":false,"properties":{"s":{"type":"string"}}}`, "s: a string must be bounded"},
		"unbounded array": {`{"type":"object","additionalProperties":false,"properties":{"a":{"type":"array","items":{"type":"integer"}}}}`, `a: an array must be bounded`},
		"own key":         {`{"type":"object","additionalProperties":false,"properties":{"operation_key":{"type":"string","maxLength":5}}}`, "must not be declared"},
		"ref":             {`{"type":"object","additionalProperties":false,"properties":{"x":{"$ref":"#/x"}}}`, `"$ref" is not accepted`},
		"not object":      {`{"type":"string","maxLength":3}`, `must be "type": "object"`},
		"not json":        {`{"type":`, "not a JSON object"},
		"nested open":     {`{"type":"object","additionalProperties":false,"properties":{"o":{"type":"object","properties":{}}}}`, `o: an object must be closed`},
		"undefined req":   {`{"type":"object","additionalProperties":false,"required":["x"],"properties":{}}`, `requires "x"`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := CheckRules([]byte(tc.schema))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("CheckRules = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func FuzzCheckRules(f *testing.F) {
	f.Add([]byte(`{"type":"object","additionalProperties":false,"properties":{"a":{"type":"string","maxLength":3}}}`))
	f.Add([]byte(`{"type":"object","properties":{"o":{"type":"array","items":{"type":"object"}}}}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		out, err := CheckRules(raw)
		if err != nil {
			return
		}
		// Whatever passes is a schema the validator compiles.
		if _, err := NewWith(fstest.MapFS{"fuzzed.json": {Data: out}}); err != nil {
			t.Fatalf("CheckRules accepted a schema NewWith refuses: %v\n%s", err, out)
		}
	})
}
