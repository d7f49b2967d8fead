package server

import (
	"encoding/json"
	"io"
	"unicode/utf8"
)

// tokenSource yields a JSON text's tokens as json.Decoder.Token does
// with UseNumber: json.Delim, string, json.Number, bool, nil; io.EOF at
// the end.
type tokenSource interface {
	Token() (json.Token, error)
}

// lexer is the envelope walker's tokenSource for text json.Valid
// accepted: the tokens json.Decoder yields for the same text, without a
// decoder's cost per token (it allocates an error for every scalar it
// reads). It checks each token's own syntax (strings, numbers, literals)
// but not how tokens are arranged, which is why it is only given valid
// JSON.
type lexer struct {
	b []byte
	i int
}

// Token returns the next token, skipping whitespace, commas and colons.
func (l *lexer) Token() (json.Token, error) {
	for l.i < len(l.b) {
		switch c := l.b[l.i]; c {
		case ' ', '\t', '\n', '\r', ',', ':':
			l.i++
		case '{', '}', '[', ']':
			l.i++
			return json.Delim(c), nil
		case '"':
			return l.str()
		case 't':
			return l.literal("true", true)
		case 'f':
			return l.literal("false", false)
		case 'n':
			return l.literal("null", nil)
		default:
			return l.number()
		}
	}
	return nil, io.EOF
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
	plain := true
	for j := start + 1; j < len(l.b); j++ {
		switch c := l.b[j]; {
		case c == '"':
			l.i = j + 1
			if plain {
				return string(l.b[start+1 : j]), nil
			}
			var s string
			if err := json.Unmarshal(l.b[start:l.i], &s); err != nil {
				return nil, errSyntax
			}
			return s, nil
		case c == '\\':
			plain = false
			j++ // the escaped byte cannot end the string
		case c < 0x20:
			return nil, errSyntax
		case c >= utf8.RuneSelf:
			plain = false
		}
	}
	return nil, errSyntax
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
	n := json.Number(b[l.i:j])
	l.i = j
	return n, nil
}
