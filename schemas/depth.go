package schemas

// MaxDepth bounds how deeply a tool's arguments may nest arrays and
// objects. The arguments object itself is level 1; the deepest published
// schema (create_order: arguments → items → an item) needs 3. Deeper
// arguments are refused with invalid_arguments before any other work, so
// no walk over them ever sees more than MaxDepth levels.
const MaxDepth = 32

// NestingDepth returns how deeply raw nests arrays and objects, reading
// bytes only: strings (with their escapes) are skipped, nothing is
// allocated and the time is O(len(raw)). It stops at the first level
// deeper than max and returns max+1, so a caller tests
// NestingDepth(raw, max) > max. raw need not be valid JSON: unbalanced
// closing brackets are ignored, and the count is only meaningful for
// valid JSON.
func NestingDepth(raw []byte, max int) int {
	depth, deepest := 0, 0
	inString, escaped := false, false
	for _, c := range raw {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '[', '{':
			depth++
			if depth > deepest {
				deepest = depth
				if deepest > max {
					return deepest
				}
			}
		case ']', '}':
			if depth > 0 {
				depth--
			}
		}
	}
	return deepest
}

// deeperThan reports whether a decoded JSON value nests arrays and objects
// more than max levels deep. It visits at most the first max+1 levels.
func deeperThan(v any, max int) bool {
	switch v := v.(type) {
	case map[string]any:
		if max == 0 {
			return true
		}
		for _, e := range v {
			if deeperThan(e, max-1) {
				return true
			}
		}
	case []any:
		if max == 0 {
			return true
		}
		for _, e := range v {
			if deeperThan(e, max-1) {
				return true
			}
		}
	}
	return false
}
