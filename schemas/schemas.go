package schemas

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

//go:embed *.json
var files embed.FS

// outputFile holds the result envelope shared by every tool; every other
// JSON file is the input schema of the tool it is named after.
const outputFile = "result.json"

// baseURL is where the embedded files live for the compiler; nothing is
// ever fetched from it.
const baseURL = "mem:///"

// InputSchema returns the raw JSON Schema of a tool's arguments, as
// published in tools/list, and false when the tool has none. The caller
// owns the returned bytes.
func InputSchema(tool string) ([]byte, bool) {
	if tool == "" || tool == strings.TrimSuffix(outputFile, ".json") || strings.ContainsAny(tool, `/\.`) {
		return nil, false
	}
	b, err := files.ReadFile(tool + ".json")
	if err != nil {
		return nil, false
	}
	return b, true
}

// OutputSchema returns the raw JSON Schema of the result envelope every
// tool answers with. The caller owns the returned bytes.
func OutputSchema() []byte {
	b, err := files.ReadFile(outputFile)
	if err != nil {
		panic("schemas: " + outputFile + " is not embedded") // the build guarantees it is
	}
	return b
}

// Validator checks tool arguments against the embedded schemas. It is
// immutable after New and safe for concurrent use.
type Validator struct {
	tools  map[string]*jsonschema.Schema
	output *jsonschema.Schema
	// info describes every (sub)schema by its absolute location, the
	// SchemaURL the library reports in errors.
	info map[string]schemaInfo
}

type schemaInfo struct {
	types []string // the schema's "type"
	props []string // its "properties", in the order the file declares them
}

// New compiles every embedded schema (draft 2020-12, with "format"
// asserted, so a malformed uuid or date is an error, not an annotation).
// It fails only if a schema file is broken.
func New() (*Validator, error) { return NewWith(nil) }

// NewWith is New with more tools' input schemas: the *.json files at the
// top of extra (nil: none), each named after its tool like the embedded
// ones, which it must not repeat. It is for tests that define a tool no
// build ships; tools/list publishes the embedded files only (InputSchema).
func NewWith(extra fs.FS) (*Validator, error) {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	raws := map[string][]byte{}
	for _, fsys := range []fs.FS{files, extra} {
		if fsys == nil {
			continue
		}
		names, err := fs.Glob(fsys, "*.json")
		if err != nil {
			return nil, err
		}
		for _, name := range names {
			if _, dup := raws[name]; dup {
				return nil, fmt.Errorf("schemas: %s: defined twice", name)
			}
			raw, err := fs.ReadFile(fsys, name)
			if err != nil {
				return nil, err
			}
			doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
			if err != nil {
				return nil, fmt.Errorf("schemas: %s: %w", name, err)
			}
			if err := c.AddResource(baseURL+name, doc); err != nil {
				return nil, fmt.Errorf("schemas: %s: %w", name, err)
			}
			raws[name] = raw
		}
	}

	v := &Validator{tools: map[string]*jsonschema.Schema{}, info: map[string]schemaInfo{}}
	for name, raw := range raws {
		sch, err := c.Compile(baseURL + name)
		if err != nil {
			return nil, fmt.Errorf("schemas: %s: %w", name, err)
		}
		order, err := propertyOrder(raw)
		if err != nil {
			return nil, fmt.Errorf("schemas: %s: %w", name, err)
		}
		walk(sch, map[*jsonschema.Schema]bool{}, func(s *jsonschema.Schema) {
			info := schemaInfo{props: order[strings.TrimPrefix(s.Location, baseURL+name+"#")]}
			if s.Types != nil {
				info.types = s.Types.ToStrings()
			}
			v.info[s.Location] = info
		})
		if name == outputFile {
			v.output = sch
		} else {
			v.tools[strings.TrimSuffix(name, ".json")] = sch
		}
	}
	if v.output == nil {
		return nil, errors.New("schemas: " + outputFile + " is missing")
	}
	return v, nil
}

// Tools returns the sorted names of the tools that have an input schema.
func (v *Validator) Tools() []string {
	names := make([]string, 0, len(v.tools))
	for name := range v.tools {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// Request is a tool call whose arguments passed validation.
type Request struct {
	// Tool is the tool's name.
	Tool string
	// Args are the validated arguments with schema defaults applied and
	// numbers as json.Number in canonical form (1.0 and 1e0 become 1).
	// operation_key, when present, is in lowercase.
	Args map[string]any
	// OperationKey is the lowercase operation key, "" when the tool has none.
	OperationKey string
	// Fingerprint is Fingerprint(Tool, Args): lowercase hex SHA-256.
	Fingerprint string
	// Canonical is the RFC 8785 JSON that was hashed.
	Canonical []byte
}

// Decode copies Args into dst (a pointer to a typed struct) by a JSON
// round trip.
func (r *Request) Decode(dst any) error {
	b, err := json.Marshal(r.Args)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, dst)
}

// Prepare validates a tool call's arguments and returns them ready for the
// ledger: defaults applied, operation key checked and lowercased,
// fingerprint computed. args is what an MCP library decoded (a
// map[string]any, or nil or JSON null for no arguments), raw JSON as
// json.RawMessage or []byte, or a *Screened: arguments Screen refused
// before they were decoded, whose problems Prepare returns.
//
// Errors: ErrUnknownTool (wrapped) when the tool has no schema; otherwise
// a *ValidationError listing every problem with the arguments, schema and
// operation key alike, so one round trip tells the caller all there is to
// fix. Nothing is claimed or run before Prepare succeeds.
func (v *Validator) Prepare(tool string, args any) (*Request, error) {
	sch, ok := v.tools[tool]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownTool, truncate(tool))
	}
	if s, ok := args.(*Screened); ok {
		return nil, s.Err
	}
	doc, problems := v.validate(sch, args)
	m, _ := doc.(map[string]any)
	_, hasKey := sch.Properties["operation_key"]
	key, _ := m["operation_key"].(string)
	if hasKey && isUUID(key) {
		// Also when other arguments are wrong: the caller learns
		// everything to fix in one round trip.
		var kerr *ValidationError
		if errors.As(CheckOperationKey(key), &kerr) {
			problems = append(problems, problem{loc: []pathElem{{name: "operation_key"}}, msg: kerr.Problems[0].Message})
		}
	}
	if len(problems) > 0 {
		return nil, finish(tool, problems)
	}
	if m == nil { // unreachable: every input schema requires an object
		return nil, finish(tool, []problem{{msg: "arguments must be an object"}})
	}
	m = canonicalNumbers(m).(map[string]any)
	applyDefaults(sch, m)

	req := &Request{Tool: tool, Args: m}
	if hasKey && key != "" {
		req.OperationKey = strings.ToLower(key)
		m["operation_key"] = req.OperationKey
	}
	var err error
	req.Fingerprint, req.Canonical, err = Fingerprint(tool, m)
	if err != nil {
		return nil, fmt.Errorf("schemas: fingerprint of valid %s arguments: %w", tool, err)
	}
	return req, nil
}

// ValidateResult checks a tool result against the shared output schema
// (result.json). It returns nil or a *ValidationError; meant for tests and
// for a server that wants to check what it is about to send.
func (v *Validator) ValidateResult(result any) error {
	if _, problems := v.validate(v.output, result); len(problems) > 0 {
		return finish("", problems)
	}
	return nil
}

// validate decodes args into a JSON value with exact numbers (json.Number)
// and validates it against sch. It returns the value, which may be nil,
// and the problems found.
func (v *Validator) validate(sch *jsonschema.Schema, args any) (any, []problem) {
	doc, err := decode(args)
	if err != nil {
		return nil, []problem{{msg: err.Error()}}
	}
	var loc []pathElem
	if ps := checkNumbers(doc, &loc, nil); len(ps) > 0 {
		return doc, ps
	}
	if err := sch.Validate(doc); err != nil {
		var verr *jsonschema.ValidationError
		if !errors.As(err, &verr) {
			return doc, []problem{{msg: err.Error()}}
		}
		return doc, v.collect(verr, doc, nil)
	}
	return doc, nil
}

// errTooDeep is the problem reported for arguments nested deeper than
// MaxDepth.
var errTooDeep = errors.New("arguments nest arrays and objects more than " + strconv.Itoa(MaxDepth) +
	" levels deep (the limit; no tool needs more than 3)")

// decode turns args into a JSON value whose numbers are json.Number, so
// integers stay exact whatever their size. Arguments nested deeper than
// MaxDepth are refused before they are encoded or decoded, so the work
// done is O(size of args).
func decode(args any) (any, error) {
	var raw []byte
	switch a := args.(type) {
	case nil:
		return map[string]any{}, nil
	case json.RawMessage:
		raw = a
	case []byte:
		raw = a
	default:
		if deeperThan(a, MaxDepth) {
			return nil, errTooDeep
		}
		b, err := json.Marshal(a)
		if err != nil {
			return nil, errors.New("arguments could not be encoded as JSON")
		}
		raw = b
	}
	if len(raw) == 0 {
		return map[string]any{}, nil
	}
	if NestingDepth(raw, MaxDepth) > MaxDepth {
		return nil, errTooDeep
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, errors.New("arguments are not valid JSON: " + truncate(strings.TrimPrefix(err.Error(), "json: ")))
	}
	if doc == nil { // JSON null: MCP allows a call without arguments
		return map[string]any{}, nil
	}
	return doc, nil
}

// maxNumberLen bounds the text of a number. Longer numbers, and numbers
// beyond float64 range, are refused before schema validation: the
// validator compares numbers as big.Rat, which costs time and memory
// proportional to the digits and the exponent.
const maxNumberLen = 64

// checkNumbers appends a problem for every number in v that is too long
// or beyond float64 range. loc is the path of v; it is one stack shared by
// the whole walk (pushed and popped, copied only into a problem), so the
// walk costs O(size of v), not O(size × depth).
func checkNumbers(v any, loc *[]pathElem, out []problem) []problem {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			*loc = append(*loc, pathElem{name: k})
			out = checkNumbers(e, loc, out)
			*loc = (*loc)[:len(*loc)-1]
		}
	case []any:
		for i, e := range v {
			*loc = append(*loc, pathElem{index: i, isIndex: true})
			out = checkNumbers(e, loc, out)
			*loc = (*loc)[:len(*loc)-1]
		}
	case json.Number:
		if len(v) > maxNumberLen {
			return append(out, problem{loc: slices.Clone(*loc), msg: fmt.Sprintf("number is too long (at most %d characters)", maxNumberLen)})
		}
		f, err := strconv.ParseFloat(string(v), 64)
		mantissa, _, _ := strings.Cut(strings.ToLower(string(v)), "e")
		if err != nil || (f == 0 && strings.ContainsAny(mantissa, "123456789")) {
			return append(out, problem{loc: slices.Clone(*loc), msg: "number is out of range (got " + echo(v) + ")"})
		}
	}
	return out
}

// applyDefaults gives every absent property that has a "default" in the
// schema that default, recursively through objects and array items.
// The value must already be valid against the schema.
func applyDefaults(s *jsonschema.Schema, v any) {
	if s == nil {
		return
	}
	applyDefaults(s.Ref, v)
	switch v := v.(type) {
	case map[string]any:
		for name, ps := range s.Properties {
			if val, ok := v[name]; ok {
				applyDefaults(ps, val)
			} else if ps.Default != nil {
				v[name] = canonicalNumbers(clone(*ps.Default))
			}
		}
	case []any:
		for _, e := range v {
			applyDefaults(s.Items2020, e)
		}
	}
}

// clone deep-copies a JSON value so defaults are never shared between
// requests.
func clone(v any) any {
	switch v := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[k] = clone(e)
		}
		return m
	case []any:
		a := make([]any, len(v))
		for i, e := range v {
			a[i] = clone(e)
		}
		return a
	default:
		return v
	}
}

// walk visits s and the subschemas this package's files use, once each.
func walk(s *jsonschema.Schema, seen map[*jsonschema.Schema]bool, fn func(*jsonschema.Schema)) {
	if s == nil || seen[s] {
		return
	}
	seen[s] = true
	fn(s)
	for _, p := range s.Properties {
		walk(p, seen, fn)
	}
	walk(s.Items2020, seen, fn)
	walk(s.Ref, seen, fn)
	if ap, ok := s.AdditionalProperties.(*jsonschema.Schema); ok {
		walk(ap, seen, fn)
	}
}

// propertyOrder reads a schema file and returns, for the JSON pointer of
// every schema object with "properties", the property names in file order
// (Go maps forget it, and "allowed: …" reads best in the order the schema
// presents the arguments).
func propertyOrder(raw []byte) (map[string][]string, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	out := map[string][]string{}
	var value func(ptr string, isProps bool) error
	value = func(ptr string, isProps bool) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			var names []string
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return err
				}
				key := kt.(string)
				child := ptr + "/" + strings.ReplaceAll(strings.ReplaceAll(key, "~", "~0"), "/", "~1")
				if isProps {
					names = append(names, key)
					err = value(child, false) // a subschema
				} else {
					err = value(child, key == "properties")
				}
				if err != nil {
					return err
				}
			}
			if isProps {
				out[strings.TrimSuffix(ptr, "/properties")] = names
			}
			_, err = dec.Token()
			return err
		case json.Delim('['):
			for i := 0; dec.More(); i++ {
				if err := value(ptr+"/"+strconv.Itoa(i), false); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		}
		return nil
	}
	return out, value("", false)
}
