package server

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/mark3labs/mcp-go/mcp"
)

// answerCases are messages the stdio transport writes, of every shape
// appendToolAnswer writes or declines.
func answerCases() map[string]any {
	structured := func(text string) *mcp.CallToolResult {
		return mcp.NewToolResultStructured(json.RawMessage(text), text)
	}
	modern := structured(`{"status":"completed"}`)
	modern.ResultType = mcp.ResultTypeComplete
	modern.Meta = mcp.NewMetaFromMap(map[string]any{mcp.MetaKeyServerInfo: mcp.Implementation{Name: "idemgate", Version: "1"}})
	failed := structured(`{"error":{"code":"x","message":"a <b> & c"}}`)
	failed.IsError = true
	raw := &mcp.CallToolResult{RawStructuredContent: json.RawMessage(`{"a" : 1}`)}
	typed := mcp.NewToolResultStructuredOnly(map[string]any{"b": []int{1, 2}, "a": "<"})
	inputs := structured(`{}`)
	inputs.RequestState = "s"
	resp := func(id any, result any) mcp.JSONRPCResponse {
		return mcp.NewJSONRPCResultResponse(mcp.NewRequestId(id), result)
	}
	return map[string]any{
		"replay":            resp(float64(7), structured(`{"status":"completed","replayed":true,"result":{"order_id":"ord_1","note":"leave it"}}`)),
		"string id":         resp("k-1", structured(`[1,2]`)),
		"modern":            resp(float64(1), modern),
		"error":             resp(float64(2), failed),
		"by value":          resp(float64(3), *structured(`{"a":"\u2028"}`)),
		"whitespace":        resp(float64(4), structured("{\n \"a\": [1, 2]\n}")),
		"escapes":           resp(float64(5), structured(`{"a":"\"\\\/\u00e9é"}`)),
		"raw field":         resp(float64(6), raw),
		"typed":             resp(float64(8), typed),
		"text only":         resp(float64(9), mcp.NewToolResultText("hé <x>")),
		"no content":        resp(float64(10), &mcp.CallToolResult{}),
		"null raw":          resp(float64(11), &mcp.CallToolResult{StructuredContent: json.RawMessage(nil)}),
		"request state":     resp(float64(12), inputs),
		"nil result":        resp(float64(13), (*mcp.CallToolResult)(nil)),
		"other result":      resp(float64(14), mcp.EmptyResult{}),
		"error answer":      parseError,
		"notification":      mcp.JSONRPCNotification{JSONRPC: mcp.JSONRPC_VERSION, Notification: mcp.Notification{Method: "notifications/progress"}},
		"invalid structure": resp(float64(15), structured(`{"a":`)),
	}
}

// TestAppendMessageAsMarshal: every message is written exactly as
// json.Marshal writes it, or fails to encode where json.Marshal fails.
func TestAppendMessageAsMarshal(t *testing.T) {
	for name, msg := range answerCases() {
		t.Run(name, func(t *testing.T) {
			got, gotErr := appendMessage([]byte("x"), msg)
			want, wantErr := json.Marshal(msg)
			if (gotErr != nil) != (wantErr != nil) {
				t.Fatalf("error %v, json.Marshal's %v", gotErr, wantErr)
			}
			if wantErr != nil {
				return
			}
			if !bytes.Equal(got, append([]byte("x"), want...)) {
				t.Errorf("got  %s\nwant x%s", got, want)
			}
		})
	}
}

// TestAppendToolAnswerWritesTheAnswer: a tool's answer is written by
// appendToolAnswer, not left to json.Marshal.
func TestAppendToolAnswerWritesTheAnswer(t *testing.T) {
	for _, name := range []string{"replay", "string id", "modern", "error", "by value", "whitespace", "raw field", "typed", "text only", "no content"} {
		if _, ok := appendToolAnswer(nil, answerCases()[name].(mcp.JSONRPCResponse)); !ok {
			t.Errorf("%s: declined", name)
		}
	}
}

// FuzzAppendToolAnswer: an answer with any structured content is written
// as json.Marshal writes it, or declined.
func FuzzAppendToolAnswer(f *testing.F) {
	for _, s := range []string{`{"a":1}`, `{ "a" : "<>" }`, "\"\u2028\"", `[1,2.5e3,null,true]`, `{"a":"\u00e9\\n"}`, `{`, ``, `"\xff"`} {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, text string, isError bool) {
		r := mcp.NewToolResultStructured(json.RawMessage(text), text)
		r.IsError = isError
		msg := mcp.NewJSONRPCResultResponse(mcp.NewRequestId(float64(1)), r)
		got, ok := appendToolAnswer(nil, msg)
		want, err := json.Marshal(msg)
		if ok && (err != nil || !bytes.Equal(got, want)) {
			t.Fatalf("got  %s\nwant %s (%v)", got, want, err)
		}
	})
}
