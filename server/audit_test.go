package server

import (
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"idemgate/ledger"
)

func TestTraceparent(t *testing.T) {
	const good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	tests := []struct {
		in, want string
		ok       bool
	}{
		{good, good, true},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", true},
		{good + "-x", "", false}, // version 00 has exactly four fields
		{"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "", false},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "", false}, // uppercase
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "", false}, // zero trace id
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "", false}, // zero parent id
		{"00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01", "", false},
		{"00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01", "", false},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", "", false},
		{"", "", false},
		{strings.Repeat("a", 4096), "", false},
	}
	for _, tt := range tests {
		got, ok := Traceparent(tt.in)
		if got != tt.want || ok != tt.ok {
			t.Errorf("Traceparent(%.70q) = %q, %v; want %q, %v", tt.in, got, ok, tt.want, tt.ok)
		}
	}
}

func TestRequestOf(t *testing.T) {
	long := strings.Repeat("é", 100) // 200 bytes
	meta := &mcp.Meta{AdditionalFields: map[string]any{
		MetaOnBehalfOf:  "  bob\n\x00 ",
		MetaModel:       long,
		MetaTraceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		requestIDField:  "forged-by-client", // a string, not the hook's mark
	}}
	var a ledger.Actor
	requestOf(&a, meta)
	if a.RequestID != "" {
		t.Errorf("request id %q taken from a client-sent _meta key", a.RequestID)
	}
	if a.ClientStated == nil || a.ClientStated.OnBehalfOf != "bob\uFFFD\uFFFD" {
		t.Fatalf("client_stated = %+v, want bob with its control characters replaced", a.ClientStated)
	}
	if m := a.ClientStated.Model; len(m) > maxStated || !utf8.ValidString(m) || !strings.HasPrefix(long, m) {
		t.Errorf("client-stated model %q (%d bytes): want a valid prefix of at most %d bytes", m, len(m), maxStated)
	}
	if a.OnBehalfOf != "" || a.Model != "" {
		t.Errorf("client statements landed in the configured fields: %+v", a)
	}
	if a.Trace == "" {
		t.Error("a well-formed traceparent was not recorded")
	}

	// The hook's mark wins over anything the client sent under its key.
	req := &mcp.CallToolRequest{}
	req.Params.Meta = &mcp.Meta{AdditionalFields: map[string]any{requestIDField: "forged"}}
	s := mcpserver.NewMCPServer("t", "1")
	addRequestIDHook(s)
	for _, hook := range s.GetHooks().OnBeforeCallTool {
		hook(t.Context(), float64(42), req)
	}
	var b ledger.Actor
	requestOf(&b, req.Params.Meta)
	if b.RequestID != "42" {
		t.Errorf("request id = %q, want 42 from the hook", b.RequestID)
	}
	if b.ClientStated != nil {
		t.Errorf("client_stated = %+v with nothing stated", b.ClientStated)
	}
}

func TestFormatRequestID(t *testing.T) {
	for in, want := range map[any]string{
		float64(7): "7", float64(1.5): "1.5", "abc": "abc", nil: "", int64(9): "9",
		strings.Repeat("x", 200): strings.Repeat("x", maxRequestID), "a\tb": "a\uFFFDb",
	} {
		if got := formatRequestID(in); got != want {
			t.Errorf("formatRequestID(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestTokensCarryDelegation(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.json")
	id := Identity{Principal: "alice", Tenant: "acme", Role: "agent", OnBehalfOf: "田中 由紀", Model: "model-a"}
	token, err := AddToken(path, id, "")
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := LoadTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok, err := tokens.Lookup(token); !ok || err != nil || got != id {
		t.Errorf("Lookup = %+v, %v, %v; want %+v", got, ok, err, id)
	}
	for _, bad := range []Identity{
		{Principal: "a", Tenant: "t", Role: "agent", OnBehalfOf: strings.Repeat("u", maxStated+1)},
		{Principal: "a", Tenant: "t", Role: "agent", Model: "m\nx"},
		{Principal: "a", Tenant: "t", Role: "agent", OnBehalfOf: " padded"},
	} {
		if _, err := AddToken(path, bad, ""); err == nil {
			t.Errorf("AddToken(%+v) accepted", bad)
		}
	}
}
