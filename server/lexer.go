package server

import (
	"bytes"
	"encoding/json"
	"io"
	"strconv"
	"unicode/utf8"
)

// tokenSource yields a JSON text's tokens as json.Decoder.Token does
// with UseNumber: json.Delim, string, json.Number, bool, nil; io.EOF at
// the end.
type tokenSource interface {
	Token() (json.Token, error)
}

// lexer is the envelope walker's tokenSource: the tokens json.Decoder
// yields for a valid JSON text, without a decoder's cost per token (it
// allocates an error for every scalar it reads). It checks each token's
// own syntax (strings, numbers, literals) and how the tokens are arranged
// (commas, colons, brackets, one value), so that it reads to io.EOF
// exactly the texts json.Valid accepts and returns an error for any
// other: the walk needs no json.Valid pass before it.
type lexer struct {
	b     []byte
	i     int
	start int    // where the last token returned begins in b
	open  []byte // '{' or '[' for each container open
	// quiet has string and number values (not member names) checked but
	// returned as "" and 0, without the allocation a token's value
	// costs, when the walk needs no more than their type: a tool call's
	// arguments, which may hold millions of them. A number longer than
	// maxNumberLen or beyond float64 range is returned whole all the
	// same, for the walk to refuse it. quietNames has member names
	// returned as "" too, when only the syntax matters any more.
	quiet, quietNames bool
	want              lexWant // what may come next
}

// lexWant is what the lexer accepts next.
type lexWant uint8

const (
	wantValue        lexWant = iota // a value: at the start, after a colon or an array's comma
	wantValueOrClose                // after '['
	wantKeyOrClose                  // after '{'
	wantKey                         // after an object's comma
	wantColon                       // after a member name
	wantCommaOrClose                // after a value in a container
	wantEnd                         // after the whole value: only whitespace
)

// Token returns the next token, skipping whitespace, commas and colons
// where they belong; errSyntax where the text stops being JSON, and
// io.EOF after one whole value.
func (l *lexer) Token() (json.Token, error) {
	for l.i < len(l.b) {
		c := l.b[l.i]
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			l.i++
			continue
		}
		l.start = l.i
		switch l.want {
		case wantEnd:
			return nil, errSyntax
		case wantColon:
			if c != ':' {
				return nil, errSyntax
			}
			l.i++
			l.want = wantValue
			continue
		case wantCommaOrClose:
			top := l.open[len(l.open)-1]
			switch {
			case c == ',':
				l.i++
				l.want = wantValue
				if top == '{' {
					l.want = wantKey
				}
				continue
			case c == '}' && top == '{', c == ']' && top == '[':
				return l.close(c)
			}
			return nil, errSyntax
		case wantKeyOrClose, wantKey:
			if c == '}' && l.want == wantKeyOrClose {
				return l.close(c)
			}
			if c != '"' {
				return nil, errSyntax
			}
			l.want = wantColon
			if l.quietNames {
				return l.quietStr()
			}
			return l.str()
		case wantValueOrClose:
			if c == ']' {
				return l.close(c)
			}
		}
		return l.value(c)
	}
	if l.want != wantEnd {
		return nil, errSyntax // the text ends before its value does
	}
	return nil, io.EOF
}

// value reads the value that begins with c.
func (l *lexer) value(c byte) (json.Token, error) {
	switch c {
	case '{', '[':
		l.i++
		l.open = append(l.open, c)
		l.want = wantKeyOrClose
		if c == '[' {
			l.want = wantValueOrClose
		}
		return json.Delim(c), nil
	}
	l.valueDone()
	switch c {
	case '"':
		if l.quiet {
			return l.quietStr()
		}
		return l.str()
	case 't':
		return l.literal("true", true)
	case 'f':
		return l.literal("false", false)
	case 'n':
		return l.literal("null", nil)
	}
	return l.number()
}

// close reads the bracket c that closes the innermost container.
func (l *lexer) close(c byte) (json.Token, error) {
	l.i++
	l.open = l.open[:len(l.open)-1]
	l.valueDone()
	return json.Delim(c), nil
}

// valueDone notes that a value was read.
func (l *lexer) valueDone() {
	l.want = wantEnd
	if len(l.open) > 0 {
		l.want = wantCommaOrClose
	}
}

func (l *lexer) literal(word string, v json.Token) (json.Token, error) {
	if len(l.b)-l.i < len(word) || string(l.b[l.i:l.i+len(word)]) != word {
		return nil, errSyntax
	}
	l.i += len(word)
	return v, nil
}

// str reads a string. One of plain ASCII without escapes is its bytes;
// any other is decoded by encoding/json, so that escapes and invalid
// UTF-8 come out exactly as mcp-go will read them.
func (l *lexer) str() (json.Token, error) {
	start := l.i
	escaped, ascii, err := l.skipString()
	switch {
	case err != nil:
		return nil, err
	case !escaped && ascii:
		return string(l.b[start+1 : l.i-1]), nil
	}
	var s string
	if err := json.Unmarshal(l.b[start:l.i], &s); err != nil {
		return nil, errSyntax
	}
	return s, nil
}

// quietStr reads a string as str does, and returns "" for it: a
// constant, which costs no allocation as a json.Token.
func (l *lexer) quietStr() (json.Token, error) {
	start := l.i
	escaped, _, err := l.skipString()
	if err == nil && escaped && !json.Valid(l.b[start:l.i]) {
		err = errSyntax
	}
	return "", err
}

// skipString moves past the string that begins at l.i, checking that it
// ends and holds no control character, and reports whether it holds an
// escape (left for the caller to check) and whether it is all ASCII.
func (l *lexer) skipString() (escaped, ascii bool, err error) {
	ascii = true
	for j := l.i + 1; j < len(l.b); j++ {
		switch c := l.b[j]; {
		case c == '"':
			l.i = j + 1
			return escaped, ascii, nil
		case c == '\\':
			escaped = true
			j++ // the escaped byte cannot end the string
		case c < 0x20:
			return false, false, errSyntax
		case c >= utf8.RuneSelf:
			ascii = false
		}
	}
	return false, false, errSyntax
}

// number reads a number by JSON's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func (l *lexer) number() (json.Token, error) {
	b, j := l.b, l.i
	digits := func() bool {
		k := j
		for j < len(b) && b[j] >= '0' && b[j] <= '9' {
			j++
		}
		return j > k
	}
	if j < len(b) && b[j] == '-' {
		j++
	}
	switch {
	case j < len(b) && b[j] == '0':
		j++
	case !digits():
		return nil, errSyntax
	}
	if j < len(b) && b[j] == '.' {
		j++
		if !digits() {
			return nil, errSyntax
		}
	}
	if j < len(b) && (b[j] == 'e' || b[j] == 'E') {
		j++
		if j < len(b) && (b[j] == '+' || b[j] == '-') {
			j++
		}
		if !digits() {
			return nil, errSyntax
		}
	}
	text := b[l.i:j]
	l.i = j
	if l.quiet && len(text) <= maxNumberLen && (!bytes.ContainsAny(text, "eE") || inFloatRange(text)) {
		return json.Number("0"), nil // a constant: no allocation
	}
	return json.Number(text), nil
}

// inFloatRange reports whether the number text is within float64's range
// (without an exponent, a number of at most maxNumberLen characters
// always is).
func inFloatRange(text []byte) bool {
	_, err := strconv.ParseFloat(string(text), 64)
	return err == nil
}

// span is the byte range of b that the last token returned covers: a
// container's bracket, or a whole string, number or literal.
func (l *lexer) span() (start, end int) { return l.start, l.i }

// SkipContainer reads past the end of the innermost open array or object
// without returning its tokens, for text already known to be valid JSON
// (a value the envelope walk has read whole): a screen that has refused
// a value skips the rest of it without a token's cost per element. It
// returns how many commas separate the container's own elements in the
// part skipped.
func (l *lexer) SkipContainer() (commas int, err error) {
	depth := 1
	for l.i < len(l.b) {
		switch l.b[l.i] {
		case '"':
			for l.i++; l.i < len(l.b) && l.b[l.i] != '"'; l.i++ {
				if l.b[l.i] == '\\' {
					l.i++
				}
			}
		case '{', '[':
			depth++
		case ',':
			if depth == 1 {
				commas++
			}
		case '}', ']':
			if depth--; depth == 0 {
				_, err := l.close(l.b[l.i])
				return commas, err
			}
		}
		l.i++
	}
	return commas, errSyntax
}
