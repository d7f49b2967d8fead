package server

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"idemgate/ledger"
)

// What the audit log records about the request of a tool call beside the
// caller's identity: its MCP session and JSON-RPC id, the W3C trace
// context, and what the client states about the user and the model.

// The _meta keys a client may send with tools/call. Their values are
// recorded as client-stated (ledger.ClientStated): nobody verifies them.
const (
	MetaOnBehalfOf  = "idemgate/on_behalf_of"
	MetaModel       = "idemgate/model"
	MetaTraceparent = "traceparent"
)

// maxStated bounds a recorded user, model or session id, in bytes.
const maxStated = 128

// maxRequestID bounds a recorded JSON-RPC id, in bytes.
const maxRequestID = 64

// sessionID is the MCP session of ctx: the Streamable HTTP session id, or the
// stdio session's own (see stdioSession); "" when the request has none
// (stateless).
func sessionID(ctx context.Context) string {
	cs := mcpserver.ClientSessionFromContext(ctx)
	if cs == nil {
		return ""
	}
	return clipText(cs.SessionID(), maxStated)
}

// requestIDMark carries the JSON-RPC id of a tools/call from the server's
// hook to the tool handler, inside the request's _meta. It is a Go value a
// client cannot send in JSON, and the hook overwrites the key every time.
type requestIDMark struct{ id string }

const requestIDField = "idemgate/internal.request_id"

// addRequestIDHook makes s hand every tool call's JSON-RPC id to its
// handler (mcp-go gives it only to hooks).
func addRequestIDHook(s *mcpserver.MCPServer) {
	h := s.GetHooks()
	if h == nil {
		h = &mcpserver.Hooks{}
		mcpserver.WithHooks(h)(s)
	}
	h.AddBeforeCallTool(func(_ context.Context, id any, req *mcp.CallToolRequest) {
		if req.Params.Meta == nil {
			req.Params.Meta = &mcp.Meta{}
		}
		if req.Params.Meta.AdditionalFields == nil {
			req.Params.Meta.AdditionalFields = map[string]any{}
		}
		req.Params.Meta.AdditionalFields[requestIDField] = requestIDMark{formatRequestID(id)}
	})
}

// formatRequestID renders a JSON-RPC id: numbers in decimal, strings as
// sent, at most maxRequestID bytes.
func formatRequestID(id any) string {
	var s string
	switch v := id.(type) {
	case nil:
		return ""
	case string:
		s = v
	case float64:
		s = strconv.FormatFloat(v, 'f', -1, 64)
	case int64:
		s = strconv.FormatInt(v, 10)
	case mcp.RequestId:
		return formatRequestID(v.Value())
	default:
		s = fmt.Sprint(v)
	}
	return clipText(s, maxRequestID)
}

// requestOf fills the request's part of actor from the tool call's _meta:
// its JSON-RPC id, a well-formed traceparent, and the client-stated user
// and model.
func requestOf(actor *ledger.Actor, meta *mcp.Meta) {
	if meta == nil {
		return
	}
	if m, ok := meta.AdditionalFields[requestIDField].(requestIDMark); ok {
		actor.RequestID = m.id
	}
	if tp, ok := meta.AdditionalFields[MetaTraceparent].(string); ok {
		if tp, ok := Traceparent(tp); ok {
			actor.Trace = tp
		}
	}
	var st ledger.ClientStated
	if v, ok := meta.AdditionalFields[MetaOnBehalfOf].(string); ok {
		st.OnBehalfOf = clipText(strings.TrimSpace(v), maxStated)
	}
	if v, ok := meta.AdditionalFields[MetaModel].(string); ok {
		st.Model = clipText(strings.TrimSpace(v), maxStated)
	}
	if st != (ledger.ClientStated{}) {
		actor.ClientStated = &st
	}
}

// Traceparent validates a W3C traceparent header value
// (version-traceid-parentid-flags, lowercase hex) and returns the part
// that is recorded: the whole value for version 00, the first four fields
// for a later version (whose extra fields this build cannot read). The
// invalid version ff and all-zero ids are refused.
func Traceparent(s string) (string, bool) {
	if len(s) < 55 {
		return "", false
	}
	version := s[0:2]
	if !isLowerHex(version) || version == "ff" {
		return "", false
	}
	if version == "00" && len(s) != 55 {
		return "", false
	}
	if len(s) > 55 && s[55] != '-' {
		return "", false
	}
	s = s[:55]
	if s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return "", false
	}
	trace, parent, flags := s[3:35], s[36:52], s[53:55]
	if !isLowerHex(trace) || !isLowerHex(parent) || !isLowerHex(flags) ||
		strings.Trim(trace, "0") == "" || strings.Trim(parent, "0") == "" {
		return "", false
	}
	return s, true
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return s != ""
}

// clipText makes s safe to record: valid UTF-8, control characters
// replaced by U+FFFD, at most n bytes (cut at a character boundary).
func clipText(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return utf8.RuneError
		}
		return r
	}, s)
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// validateDelegation refuses an operator-configured user or model that
// cannot be recorded as given: at most maxStated bytes of printable UTF-8.
func validateDelegation(onBehalfOf, model string) error {
	for _, f := range []struct{ name, v string }{{"on-behalf-of", onBehalfOf}, {"model", model}} {
		if len(f.v) > maxStated {
			return fmt.Errorf("%s: at most %d bytes, got %d", f.name, maxStated, len(f.v))
		}
		if f.v != clipText(f.v, maxStated) || strings.TrimSpace(f.v) != f.v {
			return fmt.Errorf("%s %q: must be printable text without control characters or surrounding spaces", f.name, f.v)
		}
	}
	return nil
}
