package schemas

import "strings"

// placeholderKeys are UUIDs that appear in standards, documentation and
// tool defaults. Models and people copy them into requests, so two
// unrelated intents would share one key; they are refused as operation
// keys. All are lowercase.
var placeholderKeys = map[string]string{
	// Wikipedia, "Universally unique identifier" (the textual example).
	"123e4567-e89b-12d3-a456-426614174000": "Wikipedia",
	// Wikipedia (earlier revisions) and countless API docs: a version 4 example.
	"550e8400-e29b-41d4-a716-446655440000": "Wikipedia and API docs",
	// RFC 4122 section 3 and RFC 9562 section 4: the urn:uuid example.
	"f81d4fae-7dec-11d0-a765-00a0c91e6bf6": "RFC 4122/9562",
	// RFC 4122 appendix C / RFC 9562 section 6.6: the namespace IDs
	// (DNS, URL, OID, X.500).
	"6ba7b810-9dad-11d1-80b4-00c04fd430c8": "RFC 4122/9562 namespace DNS",
	"6ba7b811-9dad-11d1-80b4-00c04fd430c8": "RFC 4122/9562 namespace URL",
	"6ba7b812-9dad-11d1-80b4-00c04fd430c8": "RFC 4122/9562 namespace OID",
	"6ba7b814-9dad-11d1-80b4-00c04fd430c8": "RFC 4122/9562 namespace X.500",
	// RFC 9562 appendices A and B: the test vectors of versions 1 to 8.
	"c232ab00-9414-11ec-b3c8-9f6bdeced846": "RFC 9562 A.1 (v1)",
	"5df41881-3aed-3515-88a7-2f4a814cf09e": "RFC 9562 A.2 (v3)",
	"919108f7-52d1-4320-9bac-f847db4148a8": "RFC 9562 A.3 (v4)",
	"2ed6657d-e927-568b-95e1-2665a8aea6a2": "RFC 9562 A.4 (v5)",
	"1ec9414c-232a-6b00-b3c8-9f6bdeced846": "RFC 9562 A.5 (v6)",
	"017f22e2-79b0-7cc3-98c4-dc0c0c07398f": "RFC 9562 A.6 (v7)",
	"2489e9ad-2ee2-8e00-8ec9-32d5f69181c0": "RFC 9562 B.1 (v8)",
	"5c146b14-3c52-8afd-938a-375d0df1fbf6": "RFC 9562 B.2 (v8)",
	// Swagger UI / Swashbuckle: the generated example for "format": "uuid".
	"3fa85f64-5717-4562-b3fc-2c963f66afa6": "Swagger default",
	// Hand-typed placeholders common in docs, tests and tutorials.
	"00112233-4455-6677-8899-aabbccddeeff": "placeholder",
	"01234567-89ab-cdef-0123-456789abcdef": "placeholder",
	"12345678-1234-1234-1234-123456789012": "placeholder",
	"12345678-90ab-cdef-1234-567890abcdef": "placeholder",
	// Python's uuid module documentation.
	"12345678-1234-5678-1234-567812345678": "Python docs",
	// PostgreSQL documentation, "UUID Type".
	"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11": "PostgreSQL docs",
}

const freshKeyAdvice = "call new_operation_key to get a fresh key for this intent, and reuse it on retries"

// CheckOperationKey reports whether key may name an operation: a UUID in
// the canonical 8-4-4-4-12 hyphenated form, in either case, that is not
// the nil UUID, the max UUID, a UUID whose 32 digits are all the same, or
// a well-known documentation example. It returns nil or a
// *ValidationError (path operation_key) that says why and what to do.
// Keys compare case-insensitively; Prepare stores them in lowercase.
func CheckOperationKey(key string) error {
	refuse := func(msg string) error {
		return &ValidationError{Problems: []Problem{{Path: "operation_key", Message: msg}}}
	}
	if !isUUID(key) {
		return refuse(formatMessage("uuid") + " (got " + echo(key) + ")")
	}
	k := strings.ToLower(key)
	digits := strings.ReplaceAll(k, "-", "")
	switch {
	case digits == strings.Repeat("0", 32):
		return refuse("is the nil UUID (all zeros), a placeholder that names no intent; " + freshKeyAdvice)
	case digits == strings.Repeat("f", 32):
		return refuse("is the max UUID (all f), a placeholder that names no intent; " + freshKeyAdvice)
	case digits == strings.Repeat(digits[:1], 32):
		return refuse("is a placeholder UUID (every digit is " + digits[:1] + "); " + freshKeyAdvice)
	}
	if _, ok := placeholderKeys[k]; ok {
		return refuse("is a well-known documentation example UUID that many callers copy; " + freshKeyAdvice)
	}
	return nil
}

// isUUID reports whether s is 32 hex digits in 8-4-4-4-12 groups.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}
