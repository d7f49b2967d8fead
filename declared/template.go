package declared

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// A template is text with {placeholders}: {name} an argument, {operation_key}
// the key sent downstream, {secret:name} a secret (headers only).
type template struct {
	parts []part
	// query is the index of the first part in the URL's query ("?" and
	// after): arguments there are query-escaped, before it path-escaped.
	// len(parts) for a header or a URL without a query.
	query int
}

type part struct {
	literal string
	kind    placeholder // 0: literal
	name    string
}

type placeholder int

const (
	phNone placeholder = iota
	phArg
	phKey
	phSecret
)

// parseTemplate splits s into its parts. isURL: s is a URL, whose scheme
// and host must be literal (no placeholder before the path), and which
// takes no secret.
func parseTemplate(s string, isURL bool) (*template, error) {
	if len(s) > maxTemplate {
		return nil, fmt.Errorf("longer than %d bytes", maxTemplate)
	}
	t := &template{query: -1}
	rest := s
	for rest != "" {
		i := strings.IndexAny(rest, "{}")
		if i < 0 {
			t.parts = append(t.parts, part{literal: rest})
			break
		}
		if rest[i] == '}' {
			return nil, fmt.Errorf("a lone %q", "}")
		}
		if i > 0 {
			t.parts = append(t.parts, part{literal: rest[:i]})
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return nil, fmt.Errorf("a %q without its %q", "{", "}")
		}
		inner := rest[i+1 : i+j]
		rest = rest[i+j+1:]
		switch {
		case inner == "operation_key":
			t.parts = append(t.parts, part{kind: phKey})
		case strings.HasPrefix(inner, "secret:"):
			if isURL {
				return nil, errors.New("a secret may not stand in a URL (URLs are audited); put it in a header")
			}
			name := strings.TrimPrefix(inner, "secret:")
			if !nameRE.MatchString(name) {
				return nil, fmt.Errorf("{%s}: a secret's name is snake_case", inner)
			}
			t.parts = append(t.parts, part{kind: phSecret, name: name})
		case nameRE.MatchString(inner):
			t.parts = append(t.parts, part{kind: phArg, name: inner})
		default:
			return nil, fmt.Errorf("{%s}: a placeholder is {argument}, {operation_key} or {secret:name}", inner)
		}
	}
	if isURL {
		// Scheme and host literal: the text before the first placeholder
		// must hold "scheme://host/".
		lead := ""
		if len(t.parts) > 0 && t.parts[0].kind == phNone {
			lead = t.parts[0].literal
		}
		u, err := url.Parse(lead)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("%q: want http(s)://host[:port]/path…, with scheme and host written out", s)
		}
		if len(t.parts) > 1 && !strings.Contains(strings.TrimPrefix(lead, u.Scheme+"://"), "/") {
			return nil, fmt.Errorf("%q: no placeholder may stand before the path (the host is fixed by the declaration)", s)
		}
	}
	t.query = len(t.parts)
	for i, p := range t.parts {
		if p.kind == phNone && strings.Contains(p.literal, "?") {
			t.query = i
			break
		}
	}
	return t, nil
}

// names calls f for each placeholder of kind k.
func (t *template) names(k placeholder, f func(name string)) {
	for _, p := range t.parts {
		if p.kind == k {
			f(p.name)
		}
	}
}

// expand fills the template: args are the decoded arguments (numbers as
// json.Number), key the key sent downstream, secrets by name.
func (t *template) expand(args map[string]any, key string, secrets map[string]string, escape bool) (string, error) {
	var b strings.Builder
	for i, p := range t.parts {
		var v string
		switch p.kind {
		case phNone:
			b.WriteString(p.literal)
			continue
		case phKey:
			v = key
		case phSecret:
			v = secrets[p.name]
		case phArg:
			s, err := scalar(args[p.name])
			if err != nil {
				return "", fmt.Errorf("argument %s: %w", p.name, err)
			}
			v = s
		}
		if escape {
			if i > t.query {
				v = url.QueryEscape(v)
			} else {
				v = url.PathEscape(v)
			}
		}
		b.WriteString(v)
	}
	return b.String(), nil
}

// scalar is an argument as template text.
func scalar(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case json.Number:
		return x.String(), nil
	case bool:
		if x {
			return "true", nil
		}
		return "false", nil
	case nil:
		return "", errors.New("missing")
	}
	return "", fmt.Errorf("a %T cannot stand in a URL or header", v)
}

// pointer resolves a JSON pointer (RFC 6901) in v; false when it names
// nothing.
func pointer(v any, ptr string) (any, bool) {
	if ptr == "" {
		return v, true
	}
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch x := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = x[tok]; !ok {
				return nil, false
			}
		case []any:
			var i int
			if _, err := fmt.Sscanf(tok, "%d", &i); err != nil || i < 0 || i >= len(x) || fmt.Sprint(i) != tok {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}
