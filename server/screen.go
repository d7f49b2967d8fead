package server

import (
	"context"

	"idemgate/schemas"
)

// Screener reads a tool call's arguments before anything decodes them
// and returns the refusal the tool's schema gives them, or nil when it
// finds none (tools.Service.Screen).
type Screener func(tool string, args schemas.TokenSource) *schemas.Screened

// screenFrom is how long a tool call's arguments must be, in bytes, to be
// screened before mcp-go decodes them. mcp-go and the validation decode
// arguments several times into trees of any, each about a hundred times
// the size of wide arguments (an 8 MiB array of numbers peaked at 600-860
// MiB); arguments up to this size cost a few MiB at most, and are decoded
// and validated whole so that their refusal lists every problem.
const screenFrom = 64 << 10

// screenArguments returns the message mcp-go is to read for msg, which
// env describes: when msg is a tools/call whose arguments are at least
// screenFrom bytes long and screen refuses them, msg with its arguments
// replaced by {}, and the refusal, which the tool's handler answers with
// the invalid_arguments result validation gives (see handler); otherwise
// msg itself and nil. The arguments are never decoded: the screen reads
// their tokens in place.
func screenArguments(msg []byte, env envelope, screen Screener) ([]byte, *schemas.Screened) {
	start, end := env.args[0], env.args[1]
	if screen == nil || env.refused != nil || env.tool == "" || end-start < screenFrom {
		return msg, nil
	}
	sc := screen(env.tool, &lexer{b: msg[start:end]})
	if sc == nil {
		return msg, nil
	}
	out := make([]byte, 0, len(msg)-(end-start)+2)
	out = append(append(append(out, msg[:start]...), "{}"...), msg[end:]...)
	return out, sc
}

type screenedKey struct{}

// withScreened returns ctx carrying the refusal of the arguments of the
// tool call served under it.
func withScreened(ctx context.Context, sc *schemas.Screened) context.Context {
	if sc == nil {
		return ctx
	}
	return context.WithValue(ctx, screenedKey{}, sc)
}

// screenedOf is the refusal withScreened put on ctx, or nil.
func screenedOf(ctx context.Context) *schemas.Screened {
	sc, _ := ctx.Value(screenedKey{}).(*schemas.Screened)
	return sc
}
