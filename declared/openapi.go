package declared

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sort"
	"strings"
	"unicode"

	"github.com/getkin/kin-openapi/openapi3"

	"idemgate/schemas"
)

// Defaults the import gives what an OpenAPI document leaves unbounded
// (the house rules want every string and array bounded); each one is
// listed in the output for the person reviewing it.
const (
	importMaxLength = 1000
	importMaxItems  = 100
)

// Import writes declarations ([[tools]] TOML) of the operations named ops
// (operationId) of an OpenAPI 3.x document (JSON or YAML), whose API is
// at base, for a person to review: the input schema from the path and
// query parameters and the JSON request body; the Idempotency-Key header
// parameter, when the operation declares one, as how the key is passed
// (and safe_retry, the API honouring it); a GET of the same document
// taking an idempotency key in its query as the lookup; amount and
// currency body fields as the policy's facts. The document is parsed and
// validated by kin-openapi, and may not refer to other files. Every
// guess and every bound added is written as a comment beside it.
func Import(doc []byte, ops []string, base string) (string, error) {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.ContainsAny(base, "{}") {
		return "", fmt.Errorf("--base-url %q: want http(s)://host[:port][/path]", base)
	}
	base = u.String()
	if len(ops) == 0 {
		return "", errors.New("name at least one --operation (an operationId of the document)")
	}
	loader := openapi3.NewLoader() // IsExternalRefsAllowed false: the document alone
	t, err := loader.LoadFromData(doc)
	if err != nil {
		return "", fmt.Errorf("the OpenAPI document: %w", err)
	}
	if err := t.Validate(context.Background()); err != nil {
		return "", fmt.Errorf("the OpenAPI document is not valid: %w", err)
	}
	byID := map[string]found{}
	var paths []string
	for path := range t.Paths.Map() {
		paths = append(paths, path)
	}
	sort.Strings(paths)
	for _, path := range paths {
		item := t.Paths.Value(path)
		for method, op := range item.Operations() {
			if op.OperationID != "" {
				byID[op.OperationID] = found{method, path, op, item}
			}
		}
	}
	var b strings.Builder
	b.WriteString("# Declared tools imported from an OpenAPI document by `idemgate tools import`.\n# Review every line (especially the comments) before serving them; check with `idemgate tools check`.\n")
	for _, id := range ops {
		f, ok := byID[id]
		if !ok {
			return "", fmt.Errorf("the document has no operation %q", id)
		}
		im := importer{base: base}
		if err := im.declare(&b, id, f.method, f.path, f.op, f.item, byID); err != nil {
			return "", fmt.Errorf("operation %s: %w", id, err)
		}
	}
	return b.String(), nil
}

// found is one operation of the document.
type found struct {
	method, path string
	op           *openapi3.Operation
	item         *openapi3.PathItem
}

type importer struct {
	base  string
	notes []string
}

func (im *importer) declare(b *strings.Builder, id, method, path string, op *openapi3.Operation, item *openapi3.PathItem, all map[string]found) error {
	switch method {
	case "POST", "PUT", "PATCH", "DELETE":
	default:
		return fmt.Errorf("%s is not a side effect (POST, PUT, PATCH or DELETE)", method)
	}
	name := snake(id)
	props := map[string]any{}
	var required []string
	var keyHeader string
	var query []string
	params := append(openapi3.Parameters{}, item.Parameters...)
	params = append(params, op.Parameters...)
	for _, pr := range params {
		p := pr.Value
		if p == nil {
			continue
		}
		switch p.In {
		case openapi3.ParameterInHeader:
			if strings.EqualFold(p.Name, "Idempotency-Key") {
				keyHeader = p.Name
			} else {
				im.notes = append(im.notes, fmt.Sprintf("header parameter %s is not sent (a constant or secret goes in [tools.request.headers])", p.Name))
			}
			continue
		case openapi3.ParameterInCookie:
			im.notes = append(im.notes, fmt.Sprintf("cookie parameter %s is not sent", p.Name))
			continue
		}
		if p.Schema == nil || p.Schema.Value == nil {
			continue
		}
		props[p.Name] = im.schema(p.Name, p.Schema.Value, p.Description, 0)
		if p.Required || p.In == openapi3.ParameterInPath {
			required = append(required, p.Name)
		}
		if p.In == openapi3.ParameterInQuery {
			if !p.Required {
				im.notes = append(im.notes, fmt.Sprintf("optional query parameter %s is required here: a URL placeholder must always have a value", p.Name))
				required = append(required, p.Name)
			}
			query = append(query, p.Name+"={"+p.Name+"}")
		}
	}
	body := map[string]string{}
	var amount, currency string
	if rb := op.RequestBody; rb != nil && rb.Value != nil {
		mt := rb.Value.Content.Get("application/json")
		if mt == nil || mt.Schema == nil || mt.Schema.Value == nil {
			return errors.New("the request body is not application/json")
		}
		s := mt.Schema.Value
		if !s.Type.Is("object") {
			return errors.New("the JSON request body is not an object")
		}
		var names []string
		for n := range s.Properties {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			ps := s.Properties[n].Value
			if ps == nil || ps.ReadOnly {
				continue
			}
			if _, clash := props[n]; clash {
				return fmt.Errorf("body field %s has the name of a parameter", n)
			}
			props[n] = im.schema(n, ps, "", 0)
			body[n] = "/" + n
			low := strings.ToLower(n)
			if amount == "" && ps.Type.Is("integer") && strings.Contains(low, "amount") {
				amount = "/" + n
			}
			if currency == "" && ps.Type.Is("string") && low == "currency" {
				currency = "/" + n
			}
		}
		required = append(required, s.Required...)
	}
	schema := map[string]any{"type": "object", "additionalProperties": false, "properties": props}
	if len(required) > 0 {
		sort.Strings(required)
		schema["required"] = dedupe(required)
	}
	sb, err := json.MarshalIndent(schema, "", "  ")
	if err != nil {
		return err
	}
	title := op.Summary
	if title == "" {
		title = id
	}
	desc := op.Description
	if desc == "" {
		desc = title
	}
	noun := name
	if _, rest, ok := strings.Cut(name, "_"); ok {
		noun = rest
	}
	rawURL := im.base + path
	if len(query) > 0 {
		rawURL += "?" + strings.Join(query, "&")
	}

	fmt.Fprintf(b, "\n# %s %s (operationId %s)\n[[tools]]\n", method, path, id)
	fmt.Fprintf(b, "name = %s\ntitle = %s\ndescription = %s\nnoun = %s\n", q(name), q(title), q(desc), q(noun))
	fmt.Fprintf(b, "destructive = %v # review: a %s\nopen_world = true\n", method != "POST", method)
	if id := responseID(op); id != "" {
		fmt.Fprintf(b, "id = %s\n", q(id))
	}
	if keyHeader != "" {
		b.WriteString("safe_retry = true # the document declares Idempotency-Key: review that the API answers a repeated key with its first outcome\n")
	}
	if strings.Contains(string(sb), "'''") {
		fmt.Fprintf(b, "input_schema = %s\n", q(string(sb)))
	} else {
		fmt.Fprintf(b, "input_schema = '''\n%s\n'''\n", sb)
	}
	fmt.Fprintf(b, "\n[tools.request]\nmethod = %s\nurl = %s\n", q(method), q(rawURL))
	if method != "DELETE" && len(body) > 0 {
		b.WriteString("body = { ")
		var fields []string
		for _, n := range sortedKeys(body) {
			fields = append(fields, fmt.Sprintf("%s = %s", q(n), q(body[n])))
		}
		b.WriteString(strings.Join(fields, ", "))
		b.WriteString(" }\n")
	}
	b.WriteString("# headers = { Authorization = \"Bearer {secret:api_token}\" } # and [tools.secrets] api_token = { env = \"API_TOKEN\" }\n")
	b.WriteString("\n[tools.operation_key]\n")
	if keyHeader != "" {
		fmt.Fprintf(b, "header = %s\n", q(keyHeader))
	} else {
		b.WriteString("none = true # review: the document declares no Idempotency-Key; if the API takes a client reference in the body, use body_field = \"…\" and a lookup by it\n")
	}
	if lk := lookupOf(all, keyHeader != ""); lk != "" {
		fmt.Fprintf(b, "\n[tools.lookup] # a GET of the document that takes an idempotency key\nurl = %s\nabsent_status = [404]\n", q(im.base+lk))
	} else {
		b.WriteString("\n# [tools.lookup] — none found: an unknown outcome waits for an approver's resolve_operation until you add one\n# url = \"" + im.base + "/…?idempotency_key={operation_key}\"\n")
	}
	if amount != "" {
		fmt.Fprintf(b, "\n[tools.policy]\namount = %s\n", q(amount))
		if currency != "" {
			fmt.Fprintf(b, "currency = %s\n", q(currency))
		}
		b.WriteString("# approval_threshold_minor = 100000 # review: calls at or above this amount wait for an approver\n")
	}
	for _, n := range im.notes {
		fmt.Fprintf(b, "# review: %s\n", n)
	}
	return nil
}

// schema converts an OpenAPI schema to the house's JSON Schema: closed
// objects, bounded strings and arrays (bounds added are noted).
func (im *importer) schema(path string, s *openapi3.Schema, desc string, depth int) map[string]any {
	out := map[string]any{}
	if d := s.Description; d != "" {
		desc = d
	}
	if desc != "" {
		out["description"] = desc
	}
	if depth > schemas.MaxSchemaDepth-2 {
		im.notes = append(im.notes, path+" nests too deeply: taken as a bounded string")
		out["type"], out["maxLength"] = "string", importMaxLength
		return out
	}
	typ := "string"
	if s.Type != nil && len(*s.Type) > 0 {
		typ = (*s.Type)[0]
	}
	out["type"] = typ
	if len(s.Enum) > 0 {
		out["enum"] = s.Enum
	}
	switch typ {
	case "string":
		if s.Format != "" {
			out["format"] = s.Format
		}
		if s.MinLength > 0 {
			out["minLength"] = s.MinLength
		}
		if s.Pattern != "" {
			out["pattern"] = s.Pattern
		}
		if s.MaxLength != nil {
			out["maxLength"] = *s.MaxLength
		} else if len(s.Enum) == 0 {
			out["maxLength"] = importMaxLength
			im.notes = append(im.notes, fmt.Sprintf("%s: maxLength %d added (the document sets none)", path, importMaxLength))
		}
	case "integer", "number":
		if s.Min != nil {
			out["minimum"] = *s.Min
		}
		if s.Max != nil {
			out["maximum"] = *s.Max
		}
	case "array":
		if s.MaxItems != nil {
			out["maxItems"] = *s.MaxItems
		} else {
			out["maxItems"] = importMaxItems
			im.notes = append(im.notes, fmt.Sprintf("%s: maxItems %d added (the document sets none)", path, importMaxItems))
		}
		if s.MinItems > 0 {
			out["minItems"] = s.MinItems
		}
		if s.Items != nil && s.Items.Value != nil {
			out["items"] = im.schema(path+"[]", s.Items.Value, "", depth+1)
		} else {
			out["items"] = map[string]any{"type": "string", "maxLength": importMaxLength}
		}
	case "object":
		props := map[string]any{}
		for n, p := range s.Properties {
			if p.Value != nil && !p.Value.ReadOnly {
				props[n] = im.schema(path+"."+n, p.Value, "", depth+1)
			}
		}
		out["properties"] = props
		out["additionalProperties"] = false
		if len(s.Required) > 0 {
			out["required"] = s.Required
		}
	}
	return out
}

// responseID is "/id" when the operation's 2xx JSON answer has an id.
func responseID(op *openapi3.Operation) string {
	if op.Responses == nil {
		return ""
	}
	for code, r := range op.Responses.Map() {
		if !strings.HasPrefix(code, "2") || r.Value == nil {
			continue
		}
		if mt := r.Value.Content.Get("application/json"); mt != nil && mt.Schema != nil && mt.Schema.Value != nil {
			if _, ok := mt.Schema.Value.Properties["id"]; ok {
				return "/id"
			}
		}
	}
	return ""
}

// lookupOf finds a GET of the document whose query takes an idempotency
// key: its path and query, with {operation_key} for the key.
func lookupOf(all map[string]found, keyed bool) string {
	if !keyed {
		return ""
	}
	var ids []string
	for id := range all {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		f := all[id]
		if f.method != "GET" || strings.Contains(f.path, "{") {
			continue
		}
		for _, pr := range f.op.Parameters {
			if p := pr.Value; p != nil && p.In == openapi3.ParameterInQuery && strings.ReplaceAll(strings.ReplaceAll(strings.ToLower(p.Name), "_", ""), "-", "") == "idempotencykey" {
				return f.path + "?" + p.Name + "={operation_key}"
			}
		}
	}
	return ""
}

// snake is an operationId in snake_case ("createRefund" → "create_refund").
func snake(id string) string {
	var b strings.Builder
	prevLower := false
	for _, r := range id {
		switch {
		case unicode.IsUpper(r):
			if prevLower {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(r))
			prevLower = false
		case unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(unicode.ToLower(r))
			prevLower = true
		default:
			if b.Len() > 0 {
				b.WriteByte('_')
			}
			prevLower = false
		}
	}
	s := strings.Trim(b.String(), "_")
	if s == "" || !unicode.IsLetter(rune(s[0])) {
		s = "op_" + s
	}
	if len(s) > 64 {
		s = s[:64]
	}
	return s
}

// q is s as a TOML basic string (JSON's escapes are TOML's).
func q(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func dedupe(s []string) []string {
	var out []string
	for i, x := range s {
		if i == 0 || x != s[i-1] {
			out = append(out, x)
		}
	}
	return out
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
