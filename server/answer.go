package server

import (
	"encoding/json"

	"github.com/mark3labs/mcp-go/mcp"

	"idemgate/tools"
)

// appendMessage appends msg encoded as json.Marshal encodes it, byte for
// byte, to dst. An answer to a tools/call (an mcp.JSONRPCResponse whose
// result is an mcp.CallToolResult) is written field by field
// (appendToolAnswer) rather than through CallToolResult.MarshalJSON,
// which builds a map, compacts the structured content and has the whole
// result validated and compacted once more by the encoder around it: a
// replay's answer is kilobytes, and its structured content, already
// encoded by the tool service, need only be checked, not rewritten.
func appendMessage(dst []byte, msg any) ([]byte, error) {
	if r, ok := msg.(mcp.JSONRPCResponse); ok {
		if b, ok := appendToolAnswer(dst, r); ok {
			return b, nil
		}
	}
	b, err := json.Marshal(msg)
	if err != nil {
		return dst, err
	}
	return append(dst, b...), nil
}

// appendToolAnswer appends r as json.Marshal(r) would when r's result is
// an mcp.CallToolResult of the fields this writes (every field but a
// multi round-trip's inputRequests and requestState); it reports false,
// having appended nothing, for any other r or when a field fails to
// encode (json.Marshal(r) then says why). The members come in the order
// CallToolResult.MarshalJSON's map gives them (sorted), each value as
// json.Marshal encodes it; the structured content, when it is JSON text
// that is already compact and has nothing encoding/json escapes
// (plainJSON), as it is.
func appendToolAnswer(dst []byte, r mcp.JSONRPCResponse) ([]byte, bool) {
	var res *mcp.CallToolResult
	switch v := r.Result.(type) {
	case *mcp.CallToolResult:
		res = v
	case mcp.CallToolResult:
		res = &v
	}
	if res == nil || len(res.InputRequests) > 0 || res.RequestState != "" {
		return dst, false
	}
	start := len(dst)
	fail := func() ([]byte, bool) { return dst[:start], false }
	jsonrpc, err := json.Marshal(r.JSONRPC)
	if err != nil {
		return fail()
	}
	id, err := json.Marshal(r.ID)
	if err != nil {
		return fail()
	}
	dst = append(dst, `{"jsonrpc":`...)
	dst = append(dst, jsonrpc...)
	dst = append(dst, `,"id":`...)
	dst = append(dst, id...)
	dst = append(dst, `,"result":{`...)
	if res.Meta != nil {
		b, err := json.Marshal(res.Meta)
		if err != nil {
			return fail()
		}
		dst = append(append(dst, `"_meta":`...), b...)
		dst = append(dst, ',')
	}
	dst = append(dst, `"content":`...)
	if len(res.Content) == 0 {
		dst = append(dst, "[]"...) // MarshalJSON's content is never null
	} else {
		b, err := json.Marshal(res.Content)
		if err != nil {
			return fail()
		}
		dst = append(dst, b...)
	}
	if res.IsError {
		dst = append(dst, `,"isError":true`...)
	}
	if res.ResultType != "" {
		b, err := json.Marshal(res.ResultType)
		if err != nil {
			return fail()
		}
		dst = append(append(dst, `,"resultType":`...), b...)
	}
	var structured any
	switch {
	case len(res.RawStructuredContent) > 0:
		structured = json.RawMessage(res.RawStructuredContent)
	case res.StructuredContent != nil:
		structured = res.StructuredContent
	}
	if structured != nil {
		dst = append(dst, `,"structuredContent":`...)
		if raw, ok := structured.(json.RawMessage); ok && plainJSON(raw) {
			dst = append(dst, raw...)
		} else {
			b, err := json.Marshal(structured)
			if err != nil {
				return fail()
			}
			dst = append(dst, b...)
		}
	}
	return append(dst, "}}"...), true
}

// plainJSON reports whether b is one JSON value that encoding/json writes
// unchanged when it marshals b as a json.RawMessage: valid, without
// whitespace outside strings, and without the characters it escapes
// inside them (<, >, &, U+2028, U+2029).
func plainJSON(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	inString := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '<' || c == '>' || c == '&':
			return false
		case c == 0xE2 && i+2 < len(b) && b[i+1] == 0x80 && (b[i+2] == 0xA8 || b[i+2] == 0xA9):
			return false
		case inString:
			switch c {
			case '\\':
				i++ // the escaped byte cannot end the string
			case '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			return false
		}
	}
	return json.Valid(b)
}

// FailedAnswer is the answer to a request that idemgate could not serve
// (for the pipe to a ledger's owner: one lost with its connection), under
// id in RequestIDOf's form: a tools/call is answered as the tools answer
// an internal error (tools.Internal with its operation key and msg, as a
// tool result), any other request with a JSON-RPC internal error.
func FailedAnswer(id string, toolCall bool, key, msg string) ([]byte, error) {
	var v any
	if err := json.Unmarshal([]byte(id), &v); err != nil {
		return nil, err
	}
	rid := mcp.NewRequestId(v)
	var msgv any = mcp.JSONRPCError{JSONRPC: mcp.JSONRPC_VERSION, ID: rid, Error: mcp.JSONRPCErrorDetails{Code: mcp.INTERNAL_ERROR, Message: msg}}
	if toolCall {
		msgv = mcp.JSONRPCResponse{JSONRPC: mcp.JSONRPC_VERSION, ID: rid, Result: toResult(tools.Internal(key, msg))}
	}
	b, err := appendMessage(nil, msgv)
	return append(b, '\n'), err
}
