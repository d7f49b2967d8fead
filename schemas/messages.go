package schemas

import (
	"encoding/json"
	"fmt"
	"math/big"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// patternHints explains, in words a model can act on, the patterns our
// schema files use. A pattern missing here is reported as the regular
// expression itself (TestEveryPatternHasAHint keeps this list complete).
var patternHints = map[string]string{
	`^[A-Za-z0-9][A-Za-z0-9_.:-]*$`: "must start with a letter or digit and contain only letters, digits and _ . : -",
	`^[A-Za-z0-9_-]+$`:              "must contain only letters, digits, _ and -",
	`^[A-Z]{3}$`:                    "must be a 3-letter ISO 4217 currency code in capitals, such as USD or EUR",
	`^[A-Z]{2}$`:                    "must be a 2-letter ISO 3166-1 country code in capitals, such as US or DE",
	`^[A-Za-z0-9_.:-]+$`:            "must contain only letters, digits and _ . : -",
	`^apr_[0-9a-f-]+$`:              "must be an approval id as list_pending_approvals shows it, like apr_0f8c…",
}

// englishPrinter renders the library's own messages for the rare error
// kinds this file does not translate.
var englishPrinter = message.NewPrinter(language.English)

// pathElem is one step of an instance location: a property name or an
// array index.
type pathElem struct {
	name    string
	index   int
	isIndex bool
}

// problem is a Problem before rendering, kept with its structured location
// so problems sort by position (items[2] before items[10]).
type problem struct {
	loc []pathElem
	msg string
	// missing is the absent required property this problem reports.
	missing string
}

// locate turns the library's instance location into path elements, using
// the instance itself to tell array indexes from property names.
func locate(doc any, tokens []string) []pathElem {
	elems := make([]pathElem, 0, len(tokens))
	cur := doc
	for _, tok := range tokens {
		switch c := cur.(type) {
		case []any:
			i, err := strconv.Atoi(tok)
			if err == nil && i >= 0 && i < len(c) {
				elems = append(elems, pathElem{index: i, isIndex: true})
				cur = c[i]
				continue
			}
			cur = nil
		case map[string]any:
			cur = c[tok]
		default:
			cur = nil
		}
		elems = append(elems, pathElem{name: tok})
	}
	return elems
}

// lookup returns the instance value at the library's instance location.
func lookup(doc any, tokens []string) any {
	cur := doc
	for _, tok := range tokens {
		switch c := cur.(type) {
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return nil
			}
			cur = c[i]
		case map[string]any:
			cur = c[tok]
		default:
			return nil
		}
	}
	return cur
}

var identifier = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// renderPath renders a location as items[0].quantity; odd property names
// are quoted: notes["a b"].
func renderPath(loc []pathElem) string {
	var sb strings.Builder
	for i, e := range loc {
		switch {
		case e.isIndex:
			sb.WriteString("[" + strconv.Itoa(e.index) + "]")
		case identifier.MatchString(e.name) && len(e.name) <= maxEcho:
			if i > 0 {
				sb.WriteByte('.')
			}
			sb.WriteString(e.name)
		default:
			sb.WriteString("[" + strconv.Quote(truncate(e.name)) + "]")
		}
	}
	return sb.String()
}

func compareLoc(a, b []pathElem) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		x, y := a[i], b[i]
		switch {
		case x.isIndex && y.isIndex:
			if x.index != y.index {
				return x.index - y.index
			}
		case x.isIndex != y.isIndex:
			if x.isIndex {
				return 1
			}
			return -1
		default:
			if c := strings.Compare(x.name, y.name); c != 0 {
				return c
			}
		}
	}
	return len(a) - len(b)
}

// finish sorts, dedupes and bounds problems into a ValidationError.
func finish(tool string, ps []problem) *ValidationError {
	sort.SliceStable(ps, func(i, j int) bool {
		if c := compareLoc(ps[i].loc, ps[j].loc); c != 0 {
			return c < 0
		}
		return ps[i].msg < ps[j].msg
	})
	verr := &ValidationError{Tool: tool}
	var last Problem
	for i, p := range ps {
		if p.missing != "" && len(p.loc) == 0 && !slices.Contains(verr.Missing, p.missing) {
			verr.Missing = append(verr.Missing, p.missing)
		}
		out := Problem{Path: renderPath(p.loc), Message: p.msg}
		if i > 0 && out == last {
			continue
		}
		last = out
		if len(verr.Problems) == maxProblems {
			verr.Omitted++
			continue
		}
		verr.Problems = append(verr.Problems, out)
	}
	return verr
}

// truncate caps s at maxEcho characters, marking the cut with "…".
func truncate(s string) string {
	if utf8.RuneCountInString(s) <= maxEcho {
		return s
	}
	runes := []rune(s)
	return string(runes[:maxEcho-1]) + "…"
}

// echo renders a piece of the caller's input for a message, bounded.
func echo(v any) string {
	switch v := v.(type) {
	case string:
		return strconv.Quote(truncate(v))
	case json.Number:
		return truncate(string(v))
	case float64:
		return truncate(strconv.FormatFloat(v, 'g', -1, 64))
	case bool:
		return strconv.FormatBool(v)
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	default:
		return truncate(fmt.Sprint(v))
	}
}

// plain renders an enum or const value from our own schema: strings bare.
func plain(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return echo(v)
}

func article(typ string) string {
	switch typ {
	case "integer", "object", "array":
		return "an " + typ
	case "null":
		return "null"
	default:
		return "a " + typ
	}
}

// plural renders "1 item" or "3 items"; words ending in y take "ies".
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	if strings.HasSuffix(word, "y") {
		word = strings.TrimSuffix(word, "y") + "ie"
	}
	return strconv.Itoa(n) + " " + word + "s"
}

func ratString(r *big.Rat) string {
	if r.IsInt() {
		return truncate(r.Num().String())
	}
	f, _ := r.Float64()
	return strconv.FormatFloat(f, 'g', -1, 64)
}

// collect walks the library's error tree and turns every leaf into
// problems with model-readable messages.
func (v *Validator) collect(e *jsonschema.ValidationError, doc any, out []problem) []problem {
	if len(e.Causes) > 0 {
		for _, c := range e.Causes {
			out = v.collect(c, doc, out)
		}
		return out
	}
	loc := locate(doc, e.InstanceLocation)
	msgs := v.messages(e, doc)
	req, _ := e.ErrorKind.(*kind.Required)
	for i, msg := range msgs {
		p := problem{loc: loc, msg: msg}
		if req != nil && len(req.Missing) == len(msgs) {
			p.missing = req.Missing[i]
		}
		out = append(out, p)
	}
	return out
}

// The messages Screen gives too, in the same words (see Screen).

// typeMessage: a value of JSON type got (or, for a number, its text)
// where the schema wants one of want; atRoot when it is the arguments.
func typeMessage(want []string, got string, atRoot bool) string {
	words := make([]string, len(want))
	for i, w := range want {
		words[i] = article(w)
	}
	msg := "must be " + strings.Join(words, " or ") + ", got " + got
	if atRoot {
		return "arguments " + msg
	}
	return msg
}

// unknownPropertyMessage: a member name that the closed object of the
// schema at schemaURL does not define; atRoot when it is the arguments.
func (v *Validator) unknownPropertyMessage(schemaURL, name string, atRoot bool) string {
	allowed := "this object takes no properties"
	if props := v.info[schemaURL].props; len(props) > 0 {
		allowed = "allowed: " + strings.Join(props, ", ")
	} else if atRoot {
		allowed = "this tool takes no arguments"
	}
	return "unknown property " + strconv.Quote(truncate(name)) + " (" + allowed + ")"
}

// enumMessage: a value (got, echoed) not among values.
func enumMessage(values []any, got string) string {
	want := make([]string, len(values))
	for i, w := range values {
		want[i] = plain(w)
	}
	return "must be one of " + strings.Join(want, ", ") + " (got " + got + ")"
}

// maxLengthMessage: a string of got characters over the schema's want.
func maxLengthMessage(want, got int) string {
	return fmt.Sprintf("must be at most %s (got %d)", plural(want, "character"), got)
}

// maxItemsMessage: an array of got items over the schema's want.
func maxItemsMessage(want, got int) string {
	return fmt.Sprintf("must contain at most %s (got %d)", plural(want, "item"), got)
}

// messages renders one leaf error; most kinds yield one message, missing
// and unknown properties one per property.
func (v *Validator) messages(e *jsonschema.ValidationError, doc any) []string {
	got := func() string { return echo(lookup(doc, e.InstanceLocation)) }
	switch k := e.ErrorKind.(type) {
	case *kind.Type:
		gotType := k.Got
		if gotType == "number" {
			gotType = got() // "got 1.5" says more than "got number"
		}
		return []string{typeMessage(k.Want, gotType, len(e.InstanceLocation) == 0)}
	case *kind.Required:
		msgs := make([]string, len(k.Missing))
		for i, name := range k.Missing {
			msgs[i] = "missing required property " + strconv.Quote(name)
		}
		return msgs
	case *kind.AdditionalProperties:
		msgs := make([]string, len(k.Properties))
		for i, name := range k.Properties {
			msgs[i] = v.unknownPropertyMessage(e.SchemaURL, name, len(e.InstanceLocation) == 0)
		}
		return msgs
	case *kind.Enum:
		return []string{enumMessage(k.Want, got())}
	case *kind.Const:
		return []string{"must be " + plain(k.Want) + " (got " + got() + ")"}
	case *kind.Format:
		return []string{formatMessage(k.Want) + " (got " + got() + ")"}
	case *kind.MinLength:
		if k.Want == 1 && k.Got == 0 {
			return []string{"must not be empty"}
		}
		return []string{fmt.Sprintf("must be at least %s (got %d)", plural(k.Want, "character"), k.Got)}
	case *kind.MaxLength:
		return []string{maxLengthMessage(k.Want, k.Got)}
	case *kind.Pattern:
		hint, ok := patternHints[k.Want]
		if !ok {
			hint = "must match the pattern " + k.Want
		}
		return []string{hint + " (got " + got() + ")"}
	case *kind.MinItems:
		return []string{fmt.Sprintf("must contain at least %s (got %d)", plural(k.Want, "item"), k.Got)}
	case *kind.MaxItems:
		return []string{maxItemsMessage(k.Want, k.Got)}
	case *kind.UniqueItems:
		return []string{fmt.Sprintf("must not contain duplicates (entries %d and %d are equal)", k.Duplicates[0], k.Duplicates[1])}
	case *kind.Minimum:
		return []string{fmt.Sprintf("must be %s ≥ %s (got %s)", v.numberWord(e), ratString(k.Want), got())}
	case *kind.Maximum:
		return []string{fmt.Sprintf("must be %s ≤ %s (got %s)", v.numberWord(e), ratString(k.Want), got())}
	case *kind.ExclusiveMinimum:
		return []string{fmt.Sprintf("must be %s > %s (got %s)", v.numberWord(e), ratString(k.Want), got())}
	case *kind.ExclusiveMaximum:
		return []string{fmt.Sprintf("must be %s < %s (got %s)", v.numberWord(e), ratString(k.Want), got())}
	case *kind.MultipleOf:
		return []string{fmt.Sprintf("must be a multiple of %s (got %s)", ratString(k.Want), got())}
	case *kind.MinProperties:
		return []string{fmt.Sprintf("must have at least %s (got %d)", plural(k.Want, "property"), k.Got)}
	case *kind.MaxProperties:
		return []string{fmt.Sprintf("must have at most %s (got %d)", plural(k.Want, "property"), k.Got)}
	case *kind.FalseSchema:
		return []string{"is not allowed"}
	default:
		return []string{k.LocalizedString(englishPrinter)}
	}
}

// numberWord says "an integer" for integer-typed schemas, else "a number".
func (v *Validator) numberWord(e *jsonschema.ValidationError) string {
	for _, t := range v.info[e.SchemaURL].types {
		if t == "integer" {
			return "an integer"
		}
	}
	return "a number"
}

func formatMessage(format string) string {
	switch format {
	case "uuid":
		return "must be a UUID such as the one new_operation_key returns"
	case "date":
		return "must be a date in the form YYYY-MM-DD, e.g. 2025-03-31"
	case "date-time":
		return "must be a date and time in RFC 3339 form, e.g. 2025-03-31T09:30:00Z"
	default:
		return "must be a valid " + format
	}
}
