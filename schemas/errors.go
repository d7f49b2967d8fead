package schemas

import (
	"errors"
	"strconv"
	"strings"
)

// ErrUnknownTool is returned by Prepare when no input schema exists for the
// tool name. It is a programming or routing error, not a problem with the
// caller's arguments.
var ErrUnknownTool = errors.New("schemas: unknown tool")

// maxProblems bounds how many problems a ValidationError reports, so a
// hostile or confused caller cannot produce an unbounded error text.
const maxProblems = 20

// maxEcho bounds, in characters, any part of the caller's input that is
// repeated in a message.
const maxEcho = 64

// ValidationError reports arguments that do not satisfy a tool's schema or
// the operation key rules. Its messages are written for a model to act on:
// each names the argument and says what is expected. Nothing was claimed or
// executed when it is returned, so the caller may fix the arguments and
// retry with the same operation key.
type ValidationError struct {
	// Tool is the tool whose arguments were refused; empty for
	// CheckOperationKey and ValidateResult.
	Tool string
	// Problems are sorted by path, free of duplicates, and at most 20.
	Problems []Problem
	// Omitted counts problems beyond the first 20 that were dropped.
	Omitted int
	// Missing names the required top-level arguments that were absent,
	// all of them (also those among the omitted problems), for callers
	// that act on a particular one: never parse the messages.
	Missing []string
}

// Problem is one reason arguments were refused.
type Problem struct {
	// Path locates the offending value, like items[0].quantity; "" is the
	// arguments object itself.
	Path string `json:"path"`
	// Message says what is wrong and what is expected. It never repeats
	// more than 64 characters of the caller's input.
	Message string `json:"message"`
}

// String renders the problem as "PATH: MESSAGE", or MESSAGE at the root.
func (p Problem) String() string {
	if p.Path == "" {
		return p.Message
	}
	return p.Path + ": " + p.Message
}

// Error joins the problems with "; ", ending with "and N more problems"
// when some were omitted.
func (e *ValidationError) Error() string {
	parts := make([]string, 0, len(e.Problems)+1)
	for _, p := range e.Problems {
		parts = append(parts, p.String())
	}
	if e.Omitted > 0 {
		parts = append(parts, "and "+strconv.Itoa(e.Omitted)+" more problems")
	}
	return strings.Join(parts, "; ")
}
