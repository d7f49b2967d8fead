package tools

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"strings"
)

// MaxCursorLen bounds a paging cursor, as a client sends it back.
const MaxCursorLen = 1024

// A paging cursor is opaque to clients: base64url (no padding) of a small
// JSON object holding the position after which the next page starts and a
// digest of the query it continues (the listing, the tenant and the
// filter). A cursor is only valid for the query that produced it: one from
// another listing, tenant, customer or filter is refused, so a cursor can
// never widen what a caller sees (the tenant comes from the caller's
// identity in any case). A cursor is not signed: a client that forges one
// can only move within its own listing, which it may page through anyway.
// Cursors do not expire; a position whose record is gone still orders
// correctly. S is a checksum of Q and P, so that a cursor copied back with
// a character changed is refused rather than read as another position
// (cursors handed out before it existed have none and are still read).
type cursorBody struct {
	V int    `json:"v"`
	Q string `json:"q"`
	P []byte `json:"p"`
	S string `json:"s,omitempty"`
}

// cursorSum is the checksum of a cursor's query digest and position.
func cursorSum(q string, p []byte) string {
	sum := sha256.Sum256(append([]byte(q+"\x00"), p...))
	return base64.RawURLEncoding.EncodeToString(sum[:9])
}

// ErrCursor is wrapped by DecodeCursor's errors; their text says what to
// do.
var ErrCursor = errors.New("cursor")

type cursorError string

func (e cursorError) Error() string { return string(e) }
func (e cursorError) Unwrap() error { return ErrCursor }

func queryDigest(query []string) string {
	sum := sha256.Sum256([]byte(strings.Join(query, "\x00")))
	return base64.RawURLEncoding.EncodeToString(sum[:12])
}

// EncodeCursor returns the cursor that continues query after position pos.
func EncodeCursor(query []string, pos []byte) string {
	q := queryDigest(query)
	b, _ := json.Marshal(cursorBody{V: 1, Q: q, P: pos, S: cursorSum(q, pos)})
	return base64.RawURLEncoding.EncodeToString(b)
}

// DecodeCursor returns the position of a cursor made by EncodeCursor for
// the same query. Its errors wrap ErrCursor and tell the caller what to do.
func DecodeCursor(s string, query []string) ([]byte, error) {
	if len(s) > MaxCursorLen {
		return nil, cursorError("cursor is longer than any cursor idemgate hands out; pass the next_cursor of the previous page unchanged, or omit cursor to start from the first page")
	}
	raw, err := base64.RawURLEncoding.Strict().DecodeString(s)
	var b cursorBody
	if err == nil {
		err = json.Unmarshal(raw, &b)
	}
	if err != nil || b.V != 1 || len(b.P) == 0 || (b.S != "" && b.S != cursorSum(b.Q, b.P)) {
		return nil, cursorError("cursor is not one idemgate handed out; pass the next_cursor of the previous page unchanged, or omit cursor to start from the first page")
	}
	if b.Q != queryDigest(query) {
		return nil, cursorError("cursor belongs to another listing (another customer, filter or tenant); page with the next_cursor of this same query, or omit cursor to start from the first page")
	}
	return b.P, nil
}
