package server

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"

	"idemgate/schemas"
)

const call = `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"create_order","arguments":`

func TestCheckEnvelopeRefuses(t *testing.T) {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	tests := []struct {
		name, msg string
		code      int
		id        string // the id the answer carries
		contains  string
	}{
		{"duplicate name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_order","name":"cancel_order","arguments":{}}}`,
			-32600, "1", `member "name" appears twice in params`},
		{"case-variant name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_order","NAME":"cancel_order","arguments":{}}}`,
			-32600, "1", `members "name" and "NAME" in params differ only in case`},
		{"case-variant method", `{"jsonrpc":"2.0","id":"a","method":"tools/list","METHOD":"tools/call"}`,
			-32600, `"a"`, `members "method" and "METHOD" in the message differ only in case`},
		{"Kelvin sign folds to k", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","arguments":{"sku":"a","s\u212Au":"b"}}}`,
			-32600, "1", `in params.arguments differ only in case`},
		{"duplicate in arguments", call + `{"quantity":1,"Quantity":2}}}`,
			-32600, "7", `members "quantity" and "Quantity" in params.arguments differ only in case`},
		{"duplicate deep in arguments", call + `{"items":[{"sku":"a"},{"sku":"a","sku":"b"}]}}}`,
			-32600, "7", `member "sku" appears twice in params.arguments.items[1]`},
		{"method not a string", `{"jsonrpc":"2.0","id":1,"method":5}`,
			-32600, "1", "the method must be a string naming an MCP method, got a number"},
		{"id an object", `{"jsonrpc":"2.0","id":{"a":1},"method":"ping"}`,
			-32600, "null", "the id must be a string or an integer (JSON-RPC 2.0, MCP), got an object"},
		{"id a boolean", `{"jsonrpc":"2.0","id":true,"method":"ping"}`,
			-32600, "null", "got a boolean"},
		{"duplicate id", `{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list"}`,
			-32600, "null", `member "id" appears twice in the message`},
		{"too deep", call + deep(9000) + `}}`,
			-32600, "7", "more than 64 levels deep"},
		{"too deep, id after", `{"params":` + deep(100) + `,"id":3}`,
			-32600, "null", "more than 64 levels deep"},
		{"long number", call + `{"quantity":` + strings.Repeat("1", 100000) + `}}}`,
			-32602, "7", "invalid params: params.arguments.quantity: number is longer than 64 characters (got 111"},
		{"number beyond float64", call + `{"items":[{"quantity":1e400}]}}}`,
			-32602, "7", "params.arguments.items[0].quantity: number is beyond the range of a 64-bit float (got 1e400)"},
		{"wide object in arguments", call + `{"note":{` + members(1001) + `}}}}`,
			-32602, "7", "invalid params: params.arguments.note: object has more than 1000 members"},
		{"wide object in the envelope", `{"jsonrpc":"2.0","id":1,"method":"ping","params":{` + members(1001) + `}}`,
			-32602, "1", "invalid params: params: object has more than 1000 members"},
		{"many values outside the arguments", `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":[` + strings.Repeat("1,", 10000) + `1]}}`,
			-32600, "1", "more than 10000 JSON values outside a tool call's arguments"},
		{"many values in _meta of a call", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_order","arguments":{},"_meta":{"a":[` + strings.Repeat("1,", 10000) + `1]}}}`,
			-32600, "1", "more than 10000 JSON values outside a tool call's arguments"},
		{"number in the envelope", `{"jsonrpc":"2.0","id":1e999,"method":"ping"}`,
			-32600, "null", "invalid request: id: number is beyond the range"},
		{"non-string tool name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":42,"arguments":{}}}`,
			-32602, "1", "params.name must be a string naming a tool (got a number)"},
		{"object tool name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":{"a":1}}}`,
			-32602, "1", "params.name must be a string naming a tool (got an object)"},
		{"no tool name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}`,
			-32602, "1", "tools/call needs params.name"},
		{"long tool name", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + strings.Repeat("x", 100000) + `"}}`,
			-32602, "1", "params.name must be 1 to 64 characters"},
		{"long method", `{"jsonrpc":"2.0","id":1,"method":"` + strings.Repeat("m", 100000) + `"}`,
			-32600, "1", "the method is longer than 64 characters"},
		{"long id", `{"jsonrpc":"2.0","id":"` + strings.Repeat("i", 100000) + `","method":"ping"}`,
			-32600, "null", "the id is longer than 128 characters"},
		// mcp-go reads a numeric id as a 64-bit float: these would be
		// answered under another id, which the client cannot match.
		{"id beyond 2^53", `{"jsonrpc":"2.0","id":9007199254740993,"method":"ping"}`,
			-32600, "9007199254740993", "cannot be answered with exactly that id"},
		{"id beyond int64", `{"jsonrpc":"2.0","id":12345678901234567890,"method":"ping"}`,
			-32600, "12345678901234567890", "cannot be answered with exactly that id"},
		// MCP: an id is a string or an integer.
		{"fractional id", `{"jsonrpc":"2.0","id":1.5,"method":"tools/list"}`,
			-32600, "null", "the id must be a string or an integer (MCP), got the number 1.5"},
		{"id with more digits than a float", `{"jsonrpc":"2.0","id":1.00000000000000001,"method":"ping"}`,
			-32600, "null", "got the number 1.00000000000000001"},
		{"id with a tiny exponent", `{"jsonrpc":"2.0","id":1e-99999999,"method":"ping"}`,
			-32600, "null", "got the number 1e-99999999"},
		{"null id on a request", `{"jsonrpc":"2.0","id":null,"method":"tools/list"}`,
			-32600, "null", "the id must not be null"},
		// JSON that is not a JSON-RPC message: -32600, not a parse error.
		{"top-level string", `"hello"`, -32600, "null", "a message must be a JSON object"},
		{"top-level number", `42`, -32600, "null", "got a number"},
		{"top-level null", `null`, -32600, "null", "got null"},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"ping"}]`, -32600, "null", "batches (a top-level array) are not supported"},
		{"no jsonrpc", `{"id":3,"method":"ping"}`, -32600, "3", `"jsonrpc" must be "2.0" (JSON-RPC 2.0); it is missing`},
		{"jsonrpc a number", `{"jsonrpc":2,"id":3,"method":"ping"}`, -32600, "3", `"jsonrpc" must be "2.0" (JSON-RPC 2.0); got a number`},
		{"jsonrpc 1.0", `{"jsonrpc":"1.0","id":3,"method":"ping"}`, -32600, "3", `got a string "1.0"`},
		{"no method, no result", `{"jsonrpc":"2.0","id":3}`, -32600, "3", "no method"},
		// Params a served method cannot read: -32602.
		{"params a string", `{"jsonrpc":"2.0","id":4,"method":"tools/list","params":"x"}`,
			-32602, "4", "params must be an object (MCP), got a string"},
		{"params an array", `{"jsonrpc":"2.0","id":4,"method":"ping","params":[1]}`,
			-32602, "4", "params must be an object (MCP), got an array"},
		{"tools/call params a string", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":"x"}`,
			-32602, "4", "params must be an object (MCP), got a string"},
		{"notification params a string", `{"jsonrpc":"2.0","method":"notifications/cancelled","params":"x"}`,
			-32602, "null", "params must be an object (MCP), got a string"},
		{"_meta a string", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"get_order","_meta":"x"}}`,
			-32602, "4", "params._meta must be an object (MCP), got a string"},
		{"cursor a number", `{"jsonrpc":"2.0","id":4,"method":"tools/list","params":{"cursor":5}}`,
			-32602, "4", "invalid params: params.cursor must be a string, got number"},
		{"tools/call task a string", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"get_order","arguments":{},"task":"x"}}`,
			-32602, "4", "invalid params: params.task must be an object, got string"},
		{"tools/call requestState a number", `{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"get_order","requestState":5}}`,
			-32602, "4", "invalid params: params.requestState must be a string, got number"},
		{"clientInfo.name a number", `{"jsonrpc":"2.0","id":4,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":1,"version":"1"}}}`,
			-32602, "4", "invalid params: params.clientInfo.name must be a string, got number"},
		{"initialize notification, clientInfo.name a number", `{"jsonrpc":"2.0","method":"initialize","params":{"clientInfo":{"name":0}}}`,
			-32602, "null", "invalid params: params.clientInfo.name must be a string, got number"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := examine([]byte(tt.msg)).refused
			if e == nil {
				t.Fatalf("accepted %.200s", tt.msg)
			}
			var answer struct {
				JSONRPC string          `json:"jsonrpc"`
				ID      json.RawMessage `json:"id"`
				Error   struct {
					Code    int    `json:"code"`
					Message string `json:"message"`
				} `json:"error"`
			}
			if err := json.Unmarshal(e.response(), &answer); err != nil {
				t.Fatalf("answer %s: %v", e.response(), err)
			}
			if answer.JSONRPC != "2.0" || string(answer.ID) != tt.id || answer.Error.Code != tt.code {
				t.Errorf("answer %s, want id %s code %d", e.response(), tt.id, tt.code)
			}
			if !strings.Contains(answer.Error.Message, tt.contains) {
				t.Errorf("message %q, want it to contain %q", answer.Error.Message, tt.contains)
			}
			if n := utf8.RuneCountInString(answer.Error.Message); n > 300 {
				t.Errorf("message is %d characters: %.300s", n, answer.Error.Message)
			}
		})
	}
}

// members is n members of an object, "k0":0,"k1":0,…
func members(n int) string {
	var sb strings.Builder
	for i := range n {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`"k` + strconv.Itoa(i) + `":0`)
	}
	return sb.String()
}

func TestCheckEnvelopeAccepts(t *testing.T) {
	for _, msg := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		call + `{"operation_key":"k","items":[{"sku":"a","quantity":1},{"sku":"a","quantity":2}],"note":"name NAME"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_order","arguments":{"a":{"b":1},"b":{"a":2}},"_meta":{"progressToken":1}}}`,
		`{"jsonrpc":"2.0","id":"x","result":{}}`,
		`{"jsonrpc":"2.0","id":9007199254740992,"method":"ping"}`, // 2^53: exact
		`{"jsonrpc":"2.0","id":-42,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":7.0,"method":"ping"}`, // an integer, answered as 7
		`{"jsonrpc":"2.0","id":1.5e3,"method":"ping"}`,
		`{"jsonrpc":"2.0","id":1,"method":"ping","params":null}`,        // read as no params
		`{"jsonrpc":"2.0","id":1,"method":"nope","params":[1]}`,         // mcp-go: -32601
		`{"jsonrpc":"2.0","id":1,"method":"resources/read","params":1}`, // mcp-go: -32601
		`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}`,
		call + strings.Repeat("[", 62) + strings.Repeat("]", 62) + `}}`,                                 // 64 levels
		call + `{"note":{` + members(1000) + `}}}}`,                                                     // the widest object
		call + `{"note":[` + strings.Repeat("1,", 20000) + `1]}}}`,                                      // arguments are the schema's to bound
		`{"jsonrpc":"2.0","id":1,"method":"ping","params":{"a":[` + strings.Repeat("1,", 9993) + `1]}}`, // 10 000 values
		// Not JSON, or not one value: left to mcp-go's parse error.
		``, `not json`, `{"a":`, `{} {}`, `{"a":1}}`,
	} {
		if e := examine([]byte(msg)).refused; e != nil {
			t.Errorf("refused %.120s: %s", msg, e.Message)
		}
	}
}

// TestCheckEnvelopeMemoryLinear: reading a message strictly costs memory
// proportional to its size, whatever its shape; a deep one is refused by
// the byte scan and a partial walk that stops at the depth limit.
func TestCheckEnvelopeMemoryLinear(t *testing.T) {
	shapes := map[string]func(n int) string{
		"deep arrays": func(n int) string { return call + strings.Repeat("[", n) + strings.Repeat("]", n) + "}}" },
		"deep objects": func(n int) string {
			return call + strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) + "}}"
		},
		"wide object": func(n int) string {
			var sb strings.Builder
			sb.WriteString(call + "{")
			for i := range n {
				if i > 0 {
					sb.WriteByte(',')
				}
				sb.WriteString(`"k` + strconv.Itoa(i) + `":[1.5,"s"]`)
			}
			return sb.String() + "}}}"
		},
	}
	const fixed, perByte = 64 << 10, 64
	for name, shape := range shapes {
		for _, n := range []int{10, 100, 1000, 9000} {
			msg := []byte(shape(n))
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			examine(msg)
			runtime.ReadMemStats(&after)
			got := after.TotalAlloc - before.TotalAlloc
			if limit := uint64(fixed + perByte*len(msg)); got > limit {
				t.Errorf("%s n=%d (%d bytes): allocated %d bytes, want at most %d", name, n, len(msg), got, limit)
			}
			t.Logf("%-12s n=%5d %7d bytes: %8d allocated", name, n, len(msg), got)
		}
	}
}

func TestFoldName(t *testing.T) {
	same := [][2]string{{"name", "NAME"}, {"Name", "nAmE"}, {"k", "\u212A"}, {"s", "\u017F"}, {"ß", "ẞ"}}
	for _, p := range same {
		if foldName(p[0]) != foldName(p[1]) {
			t.Errorf("%q and %q should fold together", p[0], p[1])
		}
		if !bytes.EqualFold([]byte(p[0]), []byte(p[1])) {
			t.Errorf("test is wrong: %q and %q are not EqualFold", p[0], p[1])
		}
	}
	if foldName("name") == foldName("names") || foldName("a") == foldName("b") {
		t.Error("distinct names fold together")
	}
}

// FuzzCheckEnvelope: for any input, examine does not panic; what it
// accepts holds no two member names encoding/json would confuse, and a
// refusal is a bounded JSON-RPC error.
func FuzzCheckEnvelope(f *testing.F) {
	for _, s := range []string{
		call + `{"a":1}}}`, call + `{"a":1,"A":2}}}`, `{"id":1,"id":2}`, `[[[[]]]]`, `{"a":"\"{["}`,
		`{"params":{"name":1}, "method":"tools/call"}`, `{"id":"` + strings.Repeat("x", 200) + `"}`, `1e400`, `"\u212A"`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		e := examine(msg).refused
		if e == nil {
			if json.Valid(msg) && confusable(msg) {
				t.Fatalf("accepted %q, which has member names encoding/json confuses", msg)
			}
			return
		}
		var answer map[string]any
		if err := json.Unmarshal(e.response(), &answer); err != nil {
			t.Fatalf("answer is not JSON: %s", e.response())
		}
		if len(e.Message) > 1200 {
			t.Fatalf("unbounded message: %d bytes", len(e.Message))
		}
	})
}

func TestStrictEnvelopeHTTP(t *testing.T) {
	reached := 0
	// The session gate reads every POST body and checks it strictly
	// before anything decodes it.
	h := &sessionGate{bodyTimeout: time.Second, next: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached++
		b, _ := io.ReadAll(r.Body)
		w.Write(b) // echo: the body is handed on unchanged
	})}
	post := func(body string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodPost, "/mcp", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(mcp.HeaderProtocolVersion, "2026-07-28") // sessionless: the gate hands it on
		h.ServeHTTP(rec, req)
		return rec
	}
	good := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}`
	if rec := post(good); rec.Code != 200 || rec.Body.String() != good || reached != 1 {
		t.Fatalf("good body: %d %q reached=%d", rec.Code, rec.Body, reached)
	}
	rec := post(`{"jsonrpc":"2.0","id":1,"method":"tools/list","Method":"tools/call"}`)
	if rec.Code != 400 || reached != 1 || !strings.Contains(rec.Body.String(), `"code":-32600`) ||
		!strings.Contains(rec.Body.String(), `differ only in case`) || !strings.Contains(rec.Body.String(), `"id":1`) {
		t.Fatalf("case-variant method: %d %s reached=%d", rec.Code, rec.Body, reached)
	}
	rec = post(call + strings.Repeat("[", 9000) + strings.Repeat("]", 9000) + "}}")
	if rec.Code != 400 || reached != 1 || !strings.Contains(rec.Body.String(), "64 levels deep") {
		t.Fatalf("deep body: %d %.200s reached=%d", rec.Code, rec.Body, reached)
	}
}

// confusable reports, the slow and obvious way, whether valid JSON has an
// object with two member names bytes.EqualFold considers equal.
func confusable(msg []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(msg))
	dec.UseNumber() // a number beyond float64 must not end the walk early
	type obj struct {
		names   []string
		wantKey bool
	}
	var stack []*obj
	for {
		tok, err := dec.Token()
		if err != nil {
			return false
		}
		if n := len(stack); n > 0 && stack[n-1] != nil && stack[n-1].wantKey {
			o := stack[n-1]
			if tok == json.Delim('}') {
				stack = stack[:n-1]
			} else {
				name := tok.(string)
				for _, prev := range o.names {
					if bytes.EqualFold([]byte(prev), []byte(name)) {
						return true
					}
				}
				o.names = append(o.names, name)
				o.wantKey = false
				continue
			}
		} else {
			switch tok {
			case json.Delim('{'):
				stack = append(stack, &obj{wantKey: true})
				continue
			case json.Delim('['):
				stack = append(stack, nil)
				continue
			case json.Delim(']'):
				stack = stack[:len(stack)-1]
			}
		}
		if n := len(stack); n > 0 && stack[n-1] != nil {
			stack[n-1].wantKey = true
		}
	}
}

// decoderTokens is the tokens json.Decoder reads from msg: what the
// envelope walk read before it had a lexer of its own, and what the lexer
// must match.
func decoderTokens(msg []byte) tokenSource {
	dec := json.NewDecoder(bytes.NewReader(msg))
	dec.UseNumber()
	return dec
}

// FuzzLexerMatchesDecoder: on any valid JSON the lexer yields exactly the
// tokens json.Decoder does, and the envelope check reads the message as
// it did over the decoder: the same refusal (code, id, message) or none,
// and the same request id.
func FuzzLexerMatchesDecoder(f *testing.F) {
	for _, s := range []string{
		call + `{"a":1}}}`, call + `{"a":1,"A":2}}}`, `{"id":1,"id":2}`, `[[[[]]]]`, `{"a":"\"{["}`,
		`{"params":{"name":1}, "method":"tools/call"}`, `{"id":"` + strings.Repeat("x", 200) + `"}`, `1e400`, `"\u212A"`,
		`{"jsonrpc":"2.0","id":"a\u0062","method":"ping"}`, `{"s":"\ud83d\ude00 é \xff \ud800"}`, ` [ -0 , 0.5e-3 , 1E+2 , true , false , null ] `,
		`{"jsonrpc":"2.0","id":9007199254740993,"method":"ping"}`, `{"k":1,"\u212A":2}`,
		`{"a":1,"b":2,"c":3,"d":4,"e":5,"f":6,"g":7,"h":8,"i":9,"j":10,"A":11}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		if !json.Valid(msg) {
			return
		}
		lex, dec := &lexer{b: msg}, decoderTokens(msg)
		for {
			want, werr := dec.Token()
			got, gerr := lex.Token()
			if (werr == nil) != (gerr == nil) || !reflect.DeepEqual(got, want) {
				t.Fatalf("%q: lexer %#v, %v; decoder %#v, %v", msg, got, gerr, want, werr)
			}
			if werr != nil {
				break
			}
		}
		if schemas.NestingDepth(msg, MaxMessageDepth) > MaxMessageDepth {
			return // walked by a decoder either way
		}
		got, want := examine(msg), examineWalk(decoderTokens(msg), msg)
		gotE, gotID, wantE, wantID := got.refused, got.requestID, want.refused, want.requestID
		if !reflect.DeepEqual(gotE, wantE) || !bytes.Equal(gotID, wantID) {
			t.Fatalf("%q: lexer walk %+v, id %s; decoder walk %+v, id %s", msg, gotE, gotID, wantE, wantID)
		}
	})
}

// FuzzLexerValidates: the lexer reads to io.EOF exactly the texts
// json.Valid accepts, and examine answers the others as not JSON.
func FuzzLexerValidates(f *testing.F) {
	for _, s := range []string{
		`{}`, `[]`, `{"a":1}`, `{"a":1,}`, `{"a" 1}`, `{"a":1 "b":2}`, `[1,]`, `[,1]`, `[1 2]`, `{"a":1},`, `{,}`, `{"a":}`,
		`1 2`, `01`, `-`, `1.`, `1e`, `truex`, `true1`, `nul`, `"a`, `{"a":[1,{"b":null}]}`, ` [ -0 , 0.5e-3 ] `, ``, ` `,
		`{"a":1]`, `[1}`, `}`, `]`, `:`, `,`, `"\u00"`, "\"\x01\"", `{1:2}`, `{"a"::1}`, `[[[]]`, call + `{"a":1}}}`, `{"":"","":`, `{"a":1,"a":2`, `{"id":` + strings.Repeat("9", 70) + `,`,
		`["\u00e9x", "a\"b", 1e400, -0.5E+3, "\ud800"]`, `["\x"]`, `["\u12"]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		for _, quiet := range []bool{false, true} {
			l := &lexer{b: msg, quiet: quiet, quietNames: quiet}
			var err error
			for n := 0; err == nil; n++ {
				if n > len(msg)+1 {
					t.Fatalf("%q: the lexer does not end", msg)
				}
				_, err = l.Token()
			}
			if valid := json.Valid(msg); (err == io.EOF) != valid {
				t.Fatalf("%q: lexer (quiet %v) ends with %v, json.Valid %v", msg, quiet, err, valid)
			}
		}
		if !json.Valid(msg) && schemas.NestingDepth(msg, MaxMessageDepth) <= MaxMessageDepth {
			if e := examine(msg); e.refused != nil || e.requestID != nil || e.serve != serveParseError {
				t.Fatalf("%q: not JSON, examined as %+v", msg, e)
			}
		}
	})
}

// FuzzGateAsUnmarshal: for any message the envelope check lets through,
// the walk reads what the HTTP gate needs exactly as
// json.Unmarshal(msg, &gateEnvelope) does when it succeeds; when it
// fails, the gate reads the method alone, and the message is none the
// gate acts on by its params (an initialize, or one naming a protocol
// version).
func FuzzGateAsUnmarshal(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"x","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`,
		`{"METHOD":"ping","PARAMS":{"_META":{"io.modelcontextprotocol/protocolVersion":"x"},"ClientInfo":{"NAME":"n","Version":null}}}`,
		`{"params":{"_meta":{"IO.MODELCONTEXTPROTOCOL/PROTOCOLVERSION":"2026-07-28"}}}`, `{"params":{"_meta":{"io.modelcontextprotocol/protocolVersion":7}}}`,
		`null`, `1`, `"x"`, `{"method":1}`, `{"method":null}`, `{"params":[]}`, `{"params":{"_meta":"x"}}`, `{"params":{"_meta":null}}`,
		`{"params":{"clientInfo":1}}`, `{"params":{"clientInfo":{"name":1}}}`, `{"params":{"clientInfo":{"version":[]}}}`, `{"params":{"clientInfo":null}}`,
		`{"method":"a\u0062","params":{"clientInfo":{"name":"\ud83d\ude00 \xff"}}}`, `{"k":1,"params":{"name":"\u212A"}}`, `not json`, `{"a":`,
		`{"jsonrpc":"2.0","id":1,"method":"nope","params":[1]}`, `{"jsonrpc":"2.0","id":1,"method":"ping","params":{"clientInfo":{"name":1}}}`,
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":1,"version":"1"}}}`,
		`{"jsonrpC":"2.0","method":"initialize","pArAms":{"ClientInfo":{"nAme":0}}}`, // found by the fuzzer: a notification
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		e := examine(msg)
		if e.refused != nil {
			return
		}
		var want gateEnvelope
		if json.Unmarshal(msg, &want) == nil {
			if !reflect.DeepEqual(e.gate, want) {
				t.Fatalf("%q: walk %+v, json.Unmarshal %+v", msg, e.gate, want)
			}
			return
		}
		var method struct{ Method string }
		json.Unmarshal(msg, &method)
		if e.gate.Method != method.Method || e.gate.Params.ClientInfo != nil || e.gate.Params.Meta != "" || e.gate.Method == "initialize" {
			t.Fatalf("%q: json.Unmarshal fails, the walk read %+v", msg, e.gate)
		}
	})
}
