package schemas

import (
	"encoding/json"
	"slices"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// TokenSource yields a JSON text's tokens as json.Decoder.Token does with
// UseNumber: json.Delim, string, json.Number, bool, nil; io.EOF at the
// end.
type TokenSource interface {
	Token() (json.Token, error)
}

// Screened is a tool call's arguments that Screen refused before anything
// decoded them. Prepare, given one as the arguments, returns its Err.
type Screened struct {
	// Err lists the problems Screen found.
	Err *ValidationError
	// OperationKey is the top-level operation_key when it is a string of
	// at most 64 characters, else "".
	OperationKey string
}

// screenMaxProblems bounds the problems Screen keeps; any more are only
// counted (ValidationError.Omitted).
const screenMaxProblems = 4 * maxProblems

// Screen reads a tool call's arguments token by token from src, holding
// nothing of them but the path it is at, and returns the problems the
// tool's schema finds that need no decoded value to tell: a value of a
// JSON type the schema does not allow, a string longer than its
// maxLength or not among its enum, an array with more items than its
// maxItems, a member a closed object does not define. A value found wrong is skipped, not
// read further, so no problem is reported inside it. Screen refuses only
// what Prepare refuses, with the same messages, but not everything: it
// returns nil when it finds nothing (or the tool has no schema), and
// Prepare then decides. Its cost is a walk of the tokens; its memory the
// depth of the value and at most 80 problems. src must yield one valid
// JSON value (JSON null: no arguments).
func (v *Validator) Screen(tool string, src TokenSource) *Screened {
	sch, ok := v.tools[tool]
	if !ok {
		return nil
	}
	s := &screen{v: v, src: src}
	tok, err := src.Token()
	if err != nil || tok == nil { // null: a call without arguments
		return nil
	}
	s.value(sch, tok)
	if s.err != nil || (len(s.problems) == 0 && s.omitted == 0) {
		return nil
	}
	verr := finish(tool, s.problems)
	verr.Omitted += s.omitted
	return &Screened{Err: verr, OperationKey: s.key}
}

// screen is one walk of Screen.
type screen struct {
	v        *Validator
	src      TokenSource
	loc      []pathElem // where the walk is; copied only into a problem
	problems []problem
	omitted  int
	key      string // the top-level operation_key, when short
	err      error  // the source failed: the walk says nothing
}

// next returns the next token, noting a failure of the source.
func (s *screen) next() json.Token {
	tok, err := s.src.Token()
	if err != nil && s.err == nil {
		s.err = err
	}
	return tok
}

func (s *screen) refuse(msg string) {
	if len(s.problems) == screenMaxProblems {
		s.omitted++
		return
	}
	s.problems = append(s.problems, problem{loc: slices.Clone(s.loc), msg: msg})
}

// screenable reports whether sch decides a value by the keywords Screen
// reads, with no other applicator (a $ref, allOf, if, patternProperties
// and the like) that could allow what those alone refuse.
func screenable(sch *jsonschema.Schema) bool {
	return sch != nil && sch.Bool == nil && sch.Ref == nil && sch.RecursiveRef == nil && sch.DynamicRef == nil &&
		sch.Not == nil && sch.AllOf == nil && sch.AnyOf == nil && sch.OneOf == nil && sch.If == nil &&
		sch.PatternProperties == nil && sch.PropertyNames == nil && sch.DependentSchemas == nil && sch.Dependencies == nil &&
		sch.UnevaluatedProperties == nil && sch.UnevaluatedItems == nil && sch.PrefixItems == nil && sch.Items == nil &&
		sch.AdditionalItems == nil && sch.Contains == nil
}

// value screens the value that begins with tok against sch (nil: any
// value), reading it to its end.
func (s *screen) value(sch *jsonschema.Schema, tok json.Token) {
	if !screenable(sch) {
		s.skip(tok)
		return
	}
	if sch.Types != nil {
		got := jsonType(tok)
		want := sch.Types.ToStrings()
		if !slices.Contains(want, got) && !(got == "number" && slices.Contains(want, "integer")) {
			if got == "number" {
				got = echo(tok)
			}
			s.refuse(typeMessage(want, got, len(s.loc) == 0))
			s.skip(tok)
			return
		}
	}
	switch t := tok.(type) {
	case string:
		if len(s.loc) == 1 && s.loc[0].name == "operation_key" && len(t) <= 64 {
			s.key = t
		}
		if sch.MaxLength != nil && len(t) > *sch.MaxLength { // bytes ≥ characters
			if n := utf8.RuneCountInString(t); n > *sch.MaxLength {
				s.refuse(maxLengthMessage(*sch.MaxLength, n))
			}
		}
		if sch.Enum != nil && !slices.Contains(sch.Enum.Values, any(t)) {
			s.refuse(enumMessage(sch.Enum.Values, echo(t)))
		}
	case json.Delim:
		if t == '[' {
			s.array(sch)
		} else {
			s.object(sch)
		}
	}
}

// array screens an array's items, after its '['.
func (s *screen) array(sch *jsonschema.Schema) {
	n := 0
	for {
		tok := s.next()
		if s.err != nil || tok == json.Delim(']') {
			break
		}
		if sch.MaxItems != nil && n >= *sch.MaxItems {
			// The array is refused whole: its other items are counted,
			// not read.
			s.skip(tok)
			if sk, ok := s.src.(ContainerSkipper); ok {
				commas, err := sk.SkipContainer()
				if err != nil && s.err == nil {
					s.err = err
				}
				n += 1 + commas
				break
			}
		} else {
			s.loc = append(s.loc, pathElem{index: n, isIndex: true})
			s.value(sch.Items2020, tok)
			s.loc = s.loc[:len(s.loc)-1]
		}
		n++
	}
	if sch.MaxItems != nil && n > *sch.MaxItems {
		s.refuse(maxItemsMessage(*sch.MaxItems, n))
	}
}

// object screens an object's members, after its '{'.
func (s *screen) object(sch *jsonschema.Schema) {
	for {
		tok := s.next()
		name, ok := tok.(string)
		if s.err != nil || !ok { // '}'
			return
		}
		val := s.next()
		if s.err != nil {
			return
		}
		s.loc = append(s.loc, pathElem{name: name})
		switch ps, known := sch.Properties[name]; {
		case known:
			s.value(ps, val)
		case sch.AdditionalProperties == false:
			// Reported at the object, as Prepare reports it.
			s.loc = s.loc[:len(s.loc)-1]
			s.refuse(s.v.unknownPropertyMessage(sch.Location, name, len(s.loc) == 0))
			s.loc = append(s.loc, pathElem{name: name})
			s.skip(val)
		default:
			ap, _ := sch.AdditionalProperties.(*jsonschema.Schema)
			s.value(ap, val)
		}
		s.loc = s.loc[:len(s.loc)-1]
	}
}

// ContainerSkipper is a TokenSource that can read past the end of the
// innermost open array or object without yielding its tokens, and say
// how many commas separate that container's own elements in the part it
// skipped; Screen uses it to skip what it refused.
type ContainerSkipper interface {
	SkipContainer() (commas int, err error)
}

// skip reads the rest of the value that begins with tok.
func (s *screen) skip(tok json.Token) {
	if d, ok := tok.(json.Delim); !ok || (d != '{' && d != '[') {
		return
	}
	if sk, ok := s.src.(ContainerSkipper); ok {
		if _, err := sk.SkipContainer(); err != nil && s.err == nil {
			s.err = err
		}
		return
	}
	for depth := 1; depth > 0 && s.err == nil; {
		if d, ok := s.next().(json.Delim); ok {
			if d == '{' || d == '[' {
				depth++
			} else {
				depth--
			}
		}
	}
}

// jsonType is the JSON Schema type name of the value tok begins.
func jsonType(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '{' {
			return "object"
		}
		return "array"
	case string:
		return "string"
	case json.Number:
		return "number"
	case bool:
		return "boolean"
	}
	return "null"
}
