package schemas

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"strconv"

	"github.com/gowebpki/jcs"
)

// Canonical returns the RFC 8785 (JSON Canonicalization Scheme) form of v:
// v is marshalled with encoding/json and then canonicalized, so object keys
// are sorted by UTF-16 code units, insignificant whitespace is gone, and
// every number is written the way ECMAScript prints an IEEE 754 double
// (1, 1.0 and 1e0 are all 1). Strings are kept exactly as given: there is
// no Unicode normalization, so "é" (U+00E9) and "e" + U+0301 differ.
// Invalid UTF-8 in a Go string is replaced by U+FFFD when marshalled.
func Canonical(v any) ([]byte, error) {
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
	business := make(map[string]any, len(args))
	for k, v := range args {
		if k != "operation_key" {
			business[k] = v
		}
	}
	canon, err := Canonical(map[string]any{"tool": tool, "arguments": business})
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
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return v
		}
		s, err := jcs.NumberToJSON(f)
		if err != nil {
			return v
		}
		return json.Number(s)
	}
	return v
}
