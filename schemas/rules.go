package schemas

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Bounds of a declared input schema (CheckRules).
const (
	// MaxSchemaBytes bounds a declared input schema's JSON.
	MaxSchemaBytes = 64 << 10
	// MaxSchemaDepth bounds how deeply its objects and arrays nest.
	MaxSchemaDepth = 8
)

// operationKeyProperty is the operation_key every side-effecting tool
// takes, as CheckRules adds it to a declared schema.
var operationKeyProperty = map[string]any{
	"type": "string", "format": "uuid", "maxLength": 36,
	"description": "Idempotency key (a UUID) naming this one business intent. Make ONE key per intent with new_operation_key before the first call, and reuse it on every retry of that intent. " +
		"Never mint a new key because a call failed or timed out: the first call may have taken effect, and a new key can do it twice. A different request needs a new key.",
}

// CheckRules holds a declared tool's input schema (raw JSON) to the house
// rules the embedded schemas follow, and returns it ready to publish and
// to validate with: draft 2020-12; every object closed
// ("additionalProperties": false, no patternProperties); every string
// bounded by maxLength (or enum / const / a bounded format), every array
// by maxItems; no references ($ref, $dynamicRef, $id), so the schema is
// whole and means the same everywhere; at most MaxSchemaDepth levels and
// MaxSchemaBytes; and operation_key added as a required uuid (a schema
// that declares its own operation_key is refused: the key is the gate's,
// never the API's). The problems are all listed in one error, each
// prefixed with the JSON path it is at. The result compiles with the
// engine Validator uses.
func CheckRules(raw []byte) ([]byte, error) {
	if len(raw) > MaxSchemaBytes {
		return nil, fmt.Errorf("the input schema is %d bytes, more than %d", len(raw), MaxSchemaBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("the input schema is not a JSON object: %v", err)
	}
	if dec.More() {
		return nil, errors.New("the input schema has text after its JSON object")
	}
	var problems []string
	add := func(path, msg string) { problems = append(problems, path+": "+msg) }
	if s, ok := doc["$schema"]; ok && s != "https://json-schema.org/draft/2020-12/schema" {
		add("$schema", "only draft 2020-12 is accepted (\"https://json-schema.org/draft/2020-12/schema\")")
	}
	if t, _ := doc["type"].(string); t != "object" {
		add("(root)", `must be "type": "object" (a tool's arguments are an object)`)
	}
	props, _ := doc["properties"].(map[string]any)
	if _, ok := props["operation_key"]; ok {
		add("properties.operation_key", "must not be declared: idemgate adds the operation key itself, and passes it downstream as the declaration's operation_key section says")
	}
	checkNode(doc, "(root)", 0, add)
	if len(problems) > 0 {
		sort.Strings(problems)
		return nil, fmt.Errorf("the input schema breaks the house rules:\n  %s", strings.Join(problems, "\n  "))
	}
	if props == nil {
		props = map[string]any{}
	}
	props["operation_key"] = operationKeyProperty
	doc["properties"] = props
	req, _ := doc["required"].([]any)
	doc["required"] = append([]any{"operation_key"}, req...)
	doc["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	parsed, err := jsonschema.UnmarshalJSON(bytes.NewReader(out))
	if err == nil {
		err = c.AddResource(baseURL+"declared.json", parsed)
	}
	if err == nil {
		_, err = c.Compile(baseURL + "declared.json")
	}
	if err != nil {
		return nil, fmt.Errorf("the input schema does not compile: %v", err)
	}
	return out, nil
}

// boundedFormats are string formats whose values have a bounded length.
var boundedFormats = map[string]bool{"uuid": true, "date": true, "date-time": true, "time": true, "ipv4": true, "ipv6": true}

// checkNode checks one subschema at path (depth levels deep) and its
// children, reporting each problem to add.
func checkNode(n map[string]any, path string, depth int, add func(path, msg string)) {
	if depth > MaxSchemaDepth {
		add(path, fmt.Sprintf("nests more than %d levels deep", MaxSchemaDepth))
		return
	}
	for _, k := range []string{"$ref", "$dynamicRef", "$id", "$anchor", "$dynamicAnchor", "$defs", "definitions", "patternProperties", "unevaluatedProperties", "dependentSchemas", "if", "then", "else", "not"} {
		if _, ok := n[k]; ok {
			add(path, fmt.Sprintf("%q is not accepted in a declared schema (keep it whole and plain: properties, items, enums, bounds)", k))
		}
	}
	_, hasEnum := n["enum"]
	_, hasConst := n["const"]
	types := typesOf(n["type"])
	if len(types) == 0 && !hasEnum && !hasConst {
		add(path, `names no "type"`)
	}
	for _, t := range types {
		switch t {
		case "object":
			if ap, ok := n["additionalProperties"]; !ok || ap != false {
				add(path, `an object must be closed: "additionalProperties": false`)
			}
			props, _ := n["properties"].(map[string]any)
			for _, name := range sortedNames(props) {
				child, ok := props[name].(map[string]any)
				if !ok {
					add(path+"."+name, "must be a schema object")
					continue
				}
				checkNode(child, childPath(path, name), depth+1, add)
			}
			for _, r := range asList(n["required"]) {
				if name, _ := r.(string); props[name] == nil {
					add(path, fmt.Sprintf("requires %q, which it does not define", r))
				}
			}
		case "array":
			if _, ok := n["maxItems"]; !ok {
				add(path, `an array must be bounded: "maxItems"`)
			}
			items, ok := n["items"].(map[string]any)
			if !ok {
				add(path, `an array must say what its "items" are (one schema)`)
				continue
			}
			checkNode(items, path+"[]", depth+1, add)
		case "string":
			f, _ := n["format"].(string)
			if _, ok := n["maxLength"]; !ok && !hasEnum && !hasConst && !boundedFormats[f] {
				add(path, `a string must be bounded: "maxLength" (or an enum)`)
			}
		case "integer", "number", "boolean", "null":
		default:
			add(path, fmt.Sprintf("unknown type %q", t))
		}
	}
	for _, k := range []string{"anyOf", "oneOf", "allOf", "prefixItems"} {
		for i, sub := range asList(n[k]) {
			if m, ok := sub.(map[string]any); ok {
				checkNode(m, fmt.Sprintf("%s.%s[%d]", path, k, i), depth+1, add)
			}
		}
	}
}

func childPath(path, name string) string {
	if path == "(root)" {
		return name
	}
	return path + "." + name
}

func typesOf(v any) []string {
	switch t := v.(type) {
	case string:
		return []string{t}
	case []any:
		var out []string
		for _, x := range t {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

func sortedNames(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
