package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// Canonical returns the RFC 8785 (JSON Canonicalization Scheme) form of v,
// the bytes encoding v with encoding/json and canonicalizing the result
// would give: object keys are sorted by UTF-16 code units, insignificant
// whitespace is gone, and every number is written the way ECMAScript
// prints an IEEE 754 double (1, 1.0 and 1e0 are all 1). Strings are kept
// exactly as given: there is no Unicode normalization, so "é" (U+00E9)
// and "e" + U+0301 differ. Invalid UTF-8 in a Go string is replaced by
// U+FFFD, one per invalid byte, as encoding/json does.
//
// A JSON value as decoded (map[string]any, []any, string, json.Number,
// float64, bool, nil) is written in one pass; any other Go value takes
// the encoding/json round trip.
func Canonical(v any) ([]byte, error) {
	var w canonWriter
	err := w.value(v, 0)
	if errors.Is(err, errNotJSONValue) {
		return canonicalByMarshal(v)
	}
	if err != nil {
		return nil, err
	}
	return w.buf, nil
}

// canonicalByMarshal is Canonical by its definition: encoding/json, then
// jcs.Transform. Canonical writes the same bytes in one pass for decoded
// JSON values (FuzzCanonicalOnePass compares the two).
func canonicalByMarshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	return jcs.Transform(b)
}

// Fingerprint identifies a tool call's business request: the lowercase hex
// SHA-256 of Canonical({"tool": tool, "arguments": args}) with the
// "operation_key" argument left out. It also returns the canonical bytes
// that were hashed.
//
// Key order, whitespace and the spelling of a number (1, 1.0, 1e0) never
// change it; any other change to a value, or another tool name, does.
// It hashes args as given: Prepare applies schema defaults first, so an
// omitted notify_customer and notify_customer:true give the same
// fingerprint. Nil and empty args are the same request.
func Fingerprint(tool string, args map[string]any) (string, []byte, error) {
	// "arguments" sorts before "tool": the envelope is written around the
	// arguments rather than built as a map and sorted.
	w := canonWriter{buf: make([]byte, 0, 256)}
	w.buf = append(w.buf, `{"arguments":`...)
	err := w.object(args, "operation_key", 2) // inside the envelope, as jcs counts
	if err == nil {
		w.buf = append(w.buf, `,"tool":`...)
		w.str(tool)
		w.buf = append(w.buf, '}')
	}
	canon := w.buf
	if errors.Is(err, errNotJSONValue) {
		business := make(map[string]any, len(args))
		for k, v := range args {
			if k != "operation_key" {
				business[k] = v
			}
		}
		canon, err = canonicalByMarshal(map[string]any{"tool": tool, "arguments": business})
	}
	if err != nil {
		return "", nil, err
	}
	sum := sha256.Sum256(canon)
	return hex.EncodeToString(sum[:]), canon, nil
}

// canonicalNumbers rewrites, in place, every json.Number in a decoded JSON
// value into its RFC 8785 spelling, so Args and the fingerprint agree and
// "1.0" decodes into an int field. Numbers must be within float64 range
// (checkNumbers); valid arguments only hold integers up to 2^53, which
// float64 represents exactly.
func canonicalNumbers(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			v[k] = canonicalNumbers(e)
		}
	case []any:
		for i, e := range v {
			v[i] = canonicalNumbers(e)
		}
	case json.Number:
		s, err := canonicalNumber(string(v))
		if err != nil {
			return v
		}
		return json.Number(s)
	}
	return v
}

// errNotJSONValue is canonWriter's report of a Go value that is not one
// of the types a decoded JSON value is made of.
var errNotJSONValue = errors.New("schemas: not a decoded JSON value")

// errCanonDepth refuses values nested deeper than jcs.Transform accepts
// (and a cyclic map, which would nest forever).
var errCanonDepth = errors.New("schemas: value nested too deeply to canonicalize")

// maxCanonDepth is jcs.Transform's nesting limit.
const maxCanonDepth = 10000

// canonWriter appends the RFC 8785 form of decoded JSON values to buf.
type canonWriter struct {
	buf []byte
}

func (w *canonWriter) value(v any, depth int) error {
	switch v := v.(type) {
	case nil:
		w.buf = append(w.buf, "null"...)
	case bool:
		w.buf = strconv.AppendBool(w.buf, v)
	case string:
		w.str(v)
	case json.Number:
		s := string(v)
		if s == "" { // encoding/json writes an empty Number as 0
			s = "0"
		}
		n, err := canonicalNumber(s)
		if err != nil {
			return err
		}
		w.buf = append(w.buf, n...)
	case float64:
		n, err := jcs.NumberToJSON(v)
		if err != nil {
			return err
		}
		w.buf = append(w.buf, n...)
	case map[string]any:
		if v == nil {
			w.buf = append(w.buf, "null"...)
			return nil
		}
		return w.object(v, "", depth+1)
	case []any:
		if v == nil {
			w.buf = append(w.buf, "null"...)
			return nil
		}
		if depth+1 > maxCanonDepth {
			return errCanonDepth
		}
		w.buf = append(w.buf, '[')
		for i, e := range v {
			if i > 0 {
				w.buf = append(w.buf, ',')
			}
			if err := w.value(e, depth+1); err != nil {
				return err
			}
		}
		w.buf = append(w.buf, ']')
	default:
		return errNotJSONValue
	}
	return nil
}

// object writes m, without its member skip when skip is not "", at
// nesting depth depth.
func (w *canonWriter) object(m map[string]any, skip string, depth int) error {
	if depth > maxCanonDepth {
		return errCanonDepth
	}
	var small [16]string
	keys := small[:0]
	valid := true
	for k := range m {
		if skip != "" && k == skip {
			continue
		}
		keys = append(keys, k)
		valid = valid && utf8.ValidString(k)
	}
	if !valid {
		return w.objectSanitized(m, keys, depth)
	}
	slices.SortFunc(keys, compareUTF16)
	w.buf = append(w.buf, '{')
	for i, k := range keys {
		if i > 0 {
			w.buf = append(w.buf, ',')
		}
		w.str(k)
		w.buf = append(w.buf, ':')
		if err := w.value(m[k], depth); err != nil {
			return err
		}
	}
	w.buf = append(w.buf, '}')
	return nil
}

// objectSanitized is object for keys of which some are not valid UTF-8:
// they are written, sorted and compared with every invalid byte replaced
// by U+FFFD, as encoding/json writes them, and two keys that become equal
// so are an error, as jcs.Transform refuses the duplicate.
func (w *canonWriter) objectSanitized(m map[string]any, keys []string, depth int) error {
	type member struct{ name, key string }
	members := make([]member, len(keys))
	for i, k := range keys {
		members[i] = member{name: sanitizeUTF8(k), key: k}
	}
	slices.SortFunc(members, func(a, b member) int { return compareUTF16(a.name, b.name) })
	w.buf = append(w.buf, '{')
	for i, mb := range members {
		if i > 0 {
			if members[i-1].name == mb.name {
				return errors.New("schemas: two object keys are equal once invalid UTF-8 is replaced")
			}
			w.buf = append(w.buf, ',')
		}
		w.str(mb.name)
		w.buf = append(w.buf, ':')
		if err := w.value(m[mb.key], depth); err != nil {
			return err
		}
	}
	w.buf = append(w.buf, '}')
	return nil
}

// sanitizeUTF8 replaces every byte of s that is not part of a valid UTF-8
// sequence by U+FFFD.
func sanitizeUTF8(s string) string {
	out := make([]byte, 0, len(s)+8)
	for _, r := range s { // an invalid byte ranges as utf8.RuneError, width 1
		out = utf8.AppendRune(out, r)
	}
	return string(out)
}

const hexDigits = "0123456789abcdef"

// str writes s as RFC 8785 writes a string: \" \\ \b \f \n \r \t, other
// control characters as \u00xx, everything else as its UTF-8 bytes, with
// invalid bytes replaced by U+FFFD.
func (w *canonWriter) str(s string) {
	w.buf = append(w.buf, '"')
	start := 0 // bytes of s from start to i are still to be copied
	for i := 0; i < len(s); {
		c := s[i]
		if c >= utf8.RuneSelf {
			r, size := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && size == 1 {
				w.buf = append(w.buf, s[start:i]...)
				w.buf = append(w.buf, "\uFFFD"...)
				start = i + 1
			}
			i += size
			continue
		}
		if c >= 0x20 && c != '"' && c != '\\' {
			i++
			continue
		}
		w.buf = append(w.buf, s[start:i]...)
		switch c {
		case '"', '\\':
			w.buf = append(w.buf, '\\', c)
		case '\b':
			w.buf = append(w.buf, '\\', 'b')
		case '\f':
			w.buf = append(w.buf, '\\', 'f')
		case '\n':
			w.buf = append(w.buf, '\\', 'n')
		case '\r':
			w.buf = append(w.buf, '\\', 'r')
		case '\t':
			w.buf = append(w.buf, '\\', 't')
		default:
			w.buf = append(w.buf, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
		}
		i++
		start = i
	}
	w.buf = append(w.buf, s[start:]...)
	w.buf = append(w.buf, '"')
}

// compareUTF16 orders valid UTF-8 strings by their UTF-16 code units, as
// RFC 8785 sorts object keys. It differs from byte order only where a
// character beyond U+FFFF (a surrogate pair in UTF-16) meets one from
// U+E000 to U+FFFF.
func compareUTF16(a, b string) int {
	n := min(len(a), len(b))
	i := 0
	for i < n && a[i] == b[i] {
		i++
	}
	if i == n {
		return len(a) - len(b) // one is a prefix of the other
	}
	if a[i] < utf8.RuneSelf && b[i] < utf8.RuneSelf {
		return int(a[i]) - int(b[i])
	}
	for i > 0 && !utf8.RuneStart(a[i]) { // the same in b: the bytes before agree
		i--
	}
	ra, _ := utf8.DecodeRuneInString(a[i:])
	rb, _ := utf8.DecodeRuneInString(b[i:])
	ua, ub := utf16Unit(ra), utf16Unit(rb)
	if ua != ub {
		return ua - ub
	}
	return int(ra) - int(rb) // two surrogate pairs with one high surrogate: the low ones decide
}

// utf16Unit is the first UTF-16 code unit of r.
func utf16Unit(r rune) int {
	if r < 0x10000 {
		return int(r)
	}
	return 0xD800 + int(r-0x10000)>>10
}

// canonicalNumber is the RFC 8785 spelling of the JSON number s, or an
// error when s is not a JSON number or is beyond float64 range. An
// integer of at most 15 digits is its own spelling, without parsing.
func canonicalNumber(s string) (string, error) {
	if plainInt(s) {
		return s, nil
	}
	if !isJSONNumber(s) {
		return "", errors.New("schemas: invalid number literal " + strconv.Quote(truncate(s)))
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return "", errors.New("schemas: number out of range " + strconv.Quote(truncate(s)))
	}
	return jcs.NumberToJSON(f)
}

// plainInt reports whether s is 0 or an integer without leading zeros of
// 1 to 15 digits, optionally negative: exact in a float64 and printed by
// ECMAScript as written.
func plainInt(s string) bool {
	d := s
	if len(d) > 0 && d[0] == '-' {
		d = d[1:]
	}
	if len(d) == 0 || len(d) > 15 || (d[0] == '0' && (len(d) > 1 || len(s) > 1)) {
		return false // "-0" is written 0
	}
	for i := 0; i < len(d); i++ {
		if d[i] < '0' || d[i] > '9' {
			return false
		}
	}
	return true
}

// isJSONNumber reports whether s follows JSON's number grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func isJSONNumber(s string) bool {
	i := 0
	digits := func() bool {
		j := i
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
		}
		return i > j
	}
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case !digits():
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if !digits() {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if !digits() {
			return false
		}
	}
	return i == len(s)
}
