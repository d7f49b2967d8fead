package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"math/big"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/mark3labs/mcp-go/mcp"

	"idemgate/schemas"
)

// MaxMessageDepth bounds how deeply one JSON-RPC message may nest arrays
// and objects, on stdio and over HTTP. The message and its params take two
// levels and tool arguments at most schemas.MaxDepth (32) more; the rest
// is room for _meta. Arguments between 33 and 62 levels deep reach the
// tool and get an invalid_arguments tool error; a message deeper than
// this is refused before it is decoded.
const MaxMessageDepth = 64

// maxMethodLen and maxToolNameLen bound the method and a tools/call's
// params.name: mcp-go repeats both in its "not found" errors. Every
// MCP method and every idemgate tool name is far shorter.
const (
	maxMethodLen   = 64
	maxToolNameLen = 64
	// maxIDLen bounds a request id, which every answer repeats.
	maxIDLen = 128
	// maxNumberLen bounds the text of any number in a message: mcp-go
	// decodes numbers as float64 and repeats a number it cannot decode
	// whole in its error.
	maxNumberLen = 64
	// maxEcho bounds any piece of the message repeated in a refusal.
	maxEcho = 64
	// maxMessageValues bounds the JSON values of a message outside a
	// tool call's arguments (which the tool's schema bounds: see
	// screenArguments). mcp-go decodes a message into trees of any,
	// about a hundred bytes per value; no MCP request idemgate serves
	// needs more than a few dozen values.
	maxMessageValues = 10_000
	// maxObjectMembers bounds the members of one object anywhere in a
	// message: the walk keeps every member name of the objects it is in,
	// to refuse duplicates, and no MCP message or tool argument has more
	// than a few dozen.
	maxObjectMembers = 1000
)

// JSON-RPC error codes used for refused messages.
const (
	codeInvalidRequest = -32600
	codeInvalidParams  = -32602
)

// envelopeError is a message refused by examine: the JSON-RPC error
// to answer it with.
type envelopeError struct {
	// ID is the request's id as written, or null when the message has
	// none or it could not be read unambiguously.
	ID      json.RawMessage
	Code    int
	Message string
}

func (e *envelopeError) Error() string { return e.Message }

// response renders the JSON-RPC error answer, one line without newline.
func (e *envelopeError) response() []byte {
	id := e.ID
	if id == nil {
		id = json.RawMessage("null")
	}
	b, err := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{e.Code, e.Message}})
	if err != nil { // unreachable: every field is plain data
		return []byte(`{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"invalid request"}}`)
	}
	return b
}

// envelope is what one walk of a message learned of it.
type envelope struct {
	// refused, when not nil, is the message's refusal.
	refused *envelopeError
	// requestID is the request's id as written, for a message let
	// through that is one JSON object with a method and a string or
	// numeric id; nil for a notification, a response, and text that is
	// not one JSON value.
	requestID json.RawMessage
	// serve is how the stdio transport hands the message to mcp-go,
	// decided as mcp-go's own stdio server decides it from the decoded
	// method and id.
	serve serveKind
	// gate is what the HTTP gate reads of a message the walk let
	// through (see gateOf).
	gate gateEnvelope
	// tool is a tools/call's params.name, and args the byte range of
	// its params.arguments in the message (args[1] is 0 when absent or
	// not known: see screenArguments).
	tool string
	args [2]int
}

// serveKind is how the transports serve a message examine lets through.
type serveKind int

const (
	// serveNone: a refused message, which is not served.
	serveNone serveKind = iota
	// serveParseError: not one JSON value, answered with a parse error.
	serveParseError
	// serveToolCall: a tools/call, run on the tool workers.
	serveToolCall
	// serveRequest: another message with an id (not null), served on
	// its own goroutine.
	serveRequest
	// serveInline: no id (a notification), handled in the reading loop.
	serveInline
)

// examine reads one JSON-RPC message strictly, before mcp-go does, and
// refuses what encoding/json would read differently from a strict reader
// or answer with an unbounded echo:
//
//   - nesting deeper than MaxMessageDepth (checked by a byte scan first);
//   - a member name repeated in one object, or two names equal under
//     Unicode case folding (encoding/json matches names case-insensitively
//     and keeps the last value, so {"name":"a","NAME":"b"} would call b
//     while a proxy reading the first value sees a) — anywhere in the
//     message, tool arguments included;
//   - a number longer than 64 characters or beyond float64 range;
//   - a method longer than 64 characters, an id longer than 128, and for
//     tools/call a params.name that is not a string of 1 to 64 characters;
//   - more than 10 000 JSON values outside a tools/call's arguments, or
//     an object of more than 1000 members anywhere;
//   - what is not a JSON-RPC 2.0 message, and params a served method
//     cannot read (see verdict).
//
// Refusals are -32600 (invalid request), or -32602 (invalid params) for
// what lies under params; their messages name the member and repeat at
// most 64 characters of the input. Text that is not one JSON value is
// not refused: its serve is serveParseError, which both transports
// answer with the same parse error (parseError). For a message it lets
// through, examine also says how to serve it and what the HTTP gate and
// the screen of tool arguments need of it: one walk serves the check,
// the stdio drain's count of requests in flight, the gate and the
// screen. Time and memory are O(len(msg)).
func examine(msg []byte) envelope {
	if schemas.NestingDepth(msg, MaxMessageDepth) > MaxMessageDepth {
		// Not known to be JSON: a decoder checks how the tokens are
		// arranged.
		dec := json.NewDecoder(bytes.NewReader(msg))
		dec.UseNumber()
		w := &walker{dec: dec}
		w.run() // reads up to the deep part, for the id
		return envelope{refused: &envelopeError{ID: w.id, Code: codeInvalidRequest,
			Message: "invalid request: the message nests arrays and objects more than " + strconv.Itoa(MaxMessageDepth) +
				" levels deep (the limit; tool arguments may nest at most " + strconv.Itoa(schemas.MaxDepth) + ")"}}
	}
	return examineWalk(&lexer{b: msg}, msg) // it reads only valid JSON to its end
}

// examineWalk is examine's walk of the message msg read from src; for
// text that is not one JSON value, no refusal and serveParseError.
func examineWalk(src tokenSource, msg []byte) envelope {
	w := &walker{dec: src}
	if err := w.run(); err != nil {
		if errors.Is(err, errSyntax) || !validRest(src) {
			// Not JSON, even when the part walked had a flaw: answered
			// as mcp-go answers it.
			return envelope{serve: serveParseError}
		}
		return envelope{refused: &envelopeError{ID: w.id, Code: w.code, Message: err.Error()}}
	}
	e := envelope{refused: w.verdict()}
	// A notification under a method idemgate serves (an initialize
	// without an id, say) is checked too: the gate acts on it by its
	// method.
	if e.refused == nil && (w.method != string(mcp.MethodToolsCall) || w.callExtras) {
		e.refused = checkParams(w.method, w.id, msg)
	}
	if e.refused == nil && w.methodKind == "a string" {
		e.requestID = w.id
	}
	e.gate = w.gateOf()
	if w.method == "tools/call" {
		e.tool, e.args = w.name, [2]int{w.argsStart, w.argsEnd}
	}
	switch {
	case w.methodKind == "a string" && w.method == "tools/call":
		e.serve = serveToolCall
	case w.idKind == "a string" || w.idKind == "a number":
		e.serve = serveRequest
	default:
		e.serve = serveInline
	}
	return e
}

// validRest reports whether the rest of src, after a refusal stopped the
// walk, reads to the end of one JSON value.
func validRest(src tokenSource) bool {
	if l, ok := src.(*lexer); ok {
		l.quiet, l.quietNames = true, true // only the syntax matters now
	}
	for {
		if _, err := src.Token(); err != nil {
			return err == io.EOF
		}
	}
}

// verdict is the refusal of a message walked whole without one, from
// what the walk noted of it; nil to let it through. What is not a
// JSON-RPC 2.0 request, notification or response is -32600 (invalid
// request) — answered with id null when the id itself is at fault (null
// on a request, not a string or an integer); params that are not an
// object, or an object mcp-go cannot read, for a method idemgate serves
// are -32602 (invalid params). A request for a method idemgate does not
// serve is let through: mcp-go answers it -32601 (method not found).
func (w *walker) verdict() *envelopeError {
	switch w.topKind {
	case "an object":
	case "an array":
		return &envelopeError{Code: codeInvalidRequest, Message: "invalid request: JSON-RPC batches (a top-level array) are not supported: MCP removed them in protocol version 2025-06-18; send each request on its own"}
	default:
		return &envelopeError{Code: codeInvalidRequest, Message: `invalid request: a message must be a JSON object, a JSON-RPC request such as {"jsonrpc":"2.0","id":1,"method":"ping"}; got ` + w.topKind}
	}
	switch w.idKind {
	case "", "a string", "a number", "null":
	default:
		return &envelopeError{Code: codeInvalidRequest, Message: "invalid request: the id must be a string or an integer (JSON-RPC 2.0, MCP), got " + w.idKind}
	}
	if w.versionKind != "a string" || w.version != "2.0" {
		got := "it is missing"
		if w.versionKind != "" {
			got = "got " + w.versionKind
			if w.versionKind == "a string" {
				got += " " + strconv.Quote(clipEcho(w.version))
			}
		}
		return &envelopeError{ID: w.id, Code: codeInvalidRequest, Message: `invalid request: the member "jsonrpc" must be "2.0" (JSON-RPC 2.0); ` + got}
	}
	if w.methodKind != "" && w.methodKind != "a string" {
		return &envelopeError{ID: w.id, Code: codeInvalidRequest, Message: "invalid request: the method must be a string naming an MCP method, got " + w.methodKind}
	}
	if w.methodKind == "" && !w.answer {
		return &envelopeError{ID: w.id, Code: codeInvalidRequest, Message: "invalid request: the message has no method (a request or notification names one) and no result or error (a response carries one)"}
	}
	if w.idKind == "null" && w.methodKind != "" {
		// JSON-RPC 2.0 lets a request's id be null but discourages it;
		// MCP forbids it. Answered rather than served as a notification,
		// so that the caller is not left waiting for an answer.
		return &envelopeError{Code: codeInvalidRequest, Message: "invalid request: the id must not be null: a request's id is a string or an integer (MCP); leave the id out to send a notification"}
	}
	if w.longID {
		return &envelopeError{Code: codeInvalidRequest, Message: "invalid request: the id is longer than " + strconv.Itoa(maxIDLen) + " characters"}
	}
	if w.fractionalID {
		return &envelopeError{Code: codeInvalidRequest, Message: "invalid request: the id must be a string or an integer (MCP), got the number " + clipEcho(string(w.id))}
	}
	if w.inexactID {
		return &envelopeError{ID: w.id, Code: codeInvalidRequest, Message: "invalid request: the numeric id " + clipEcho(string(w.id)) +
			" cannot be answered with exactly that id (ids are read as 64-bit floats): use a string, or an integer of at most 2^53"}
	}
	if w.longMethod {
		return &envelopeError{ID: w.id, Code: codeInvalidRequest, Message: "invalid request: the method is longer than " + strconv.Itoa(maxMethodLen) + " characters; no method has that name"}
	}
	if w.values > maxMessageValues || (w.method != "tools/call" && w.values+w.argValues > maxMessageValues) {
		return &envelopeError{ID: w.id, Code: codeInvalidRequest, Message: "invalid request: the message holds more than " + strconv.Itoa(maxMessageValues) +
			" JSON values outside a tool call's arguments (the limit; no MCP request needs that many)"}
	}
	if w.methodKind == "" {
		return nil // a response: idemgate sends no requests, mcp-go drops it
	}
	_, served := paramsOf[w.method]
	notification := w.idKind == ""
	switch w.paramsKind {
	case "", "null", "an object":
		// null is read as no params, as mcp-go reads it: some clients
		// send it.
	default:
		if served || notification {
			return &envelopeError{ID: w.id, Code: codeInvalidParams, Message: "invalid params: params must be an object (MCP), got " + w.paramsKind}
		}
	}
	switch w.metaKind {
	case "", "null", "an object":
	default:
		return &envelopeError{ID: w.id, Code: codeInvalidParams, Message: "invalid params: params._meta must be an object (MCP), got " + w.metaKind}
	}
	if w.method == "tools/call" {
		switch {
		case w.nameKind == "":
			return &envelopeError{ID: w.id, Code: codeInvalidParams, Message: "invalid params: tools/call needs params.name, the name of a tool (see tools/list)"}
		case w.nameKind != "a string":
			return &envelopeError{ID: w.id, Code: codeInvalidParams, Message: "invalid params: params.name must be a string naming a tool (got " + w.nameKind + ")"}
		case w.nameLen == 0 || w.nameLen > maxToolNameLen:
			return &envelopeError{ID: w.id, Code: codeInvalidParams, Message: "invalid params: params.name must be 1 to " + strconv.Itoa(maxToolNameLen) + " characters; no tool has that name (see tools/list)"}
		}
	}
	return nil
}

// paramsOf maps each method idemgate serves to the type mcp-go decodes
// its request into: checkParams reads the request as mcp-go will, so
// that params it cannot read are -32602 (mcp-go answers them -32600).
// Methods of capabilities idemgate does not declare (resources, prompts,
// logging, completions, tasks) are answered -32601 by mcp-go before it
// reads their params, and are left out.
var paramsOf = map[string]func() any{
	string(mcp.MethodInitialize):          func() any { return new(mcp.InitializeRequest) },
	string(mcp.MethodPing):                func() any { return new(mcp.PingRequest) },
	string(mcp.MethodToolsList):           func() any { return new(mcp.ListToolsRequest) },
	string(mcp.MethodToolsCall):           func() any { return new(callExtras) },
	string(mcp.MethodServerDiscover):      func() any { return new(mcp.DiscoverRequest) },
	string(mcp.MethodSubscriptionsListen): func() any { return new(mcp.SubscriptionsListenRequest) },
}

// callExtras is what mcp-go decodes of a tools/call's params besides the
// name, which the walk checks, and the arguments, which the tool
// validates. tools/call is the hot path: it is decoded here only when
// the walk saw one of these members, which a plain call does not carry.
type callExtras struct {
	Params struct {
		Task           *mcp.TaskParams    `json:"task"`
		InputResponses mcp.InputResponses `json:"inputResponses"`
		RequestState   string             `json:"requestState"`
	} `json:"params"`
}

// checkParams is the refusal of a request for a method of paramsOf whose
// message mcp-go cannot decode into its request type, naming the member
// at fault; nil when it can.
func checkParams(method string, id json.RawMessage, msg []byte) *envelopeError {
	newRequest := paramsOf[method]
	if newRequest == nil {
		return nil
	}
	err := json.Unmarshal(msg, newRequest())
	if err == nil {
		return nil
	}
	e := &envelopeError{ID: id, Code: codeInvalidParams}
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) {
		e.Message = "invalid params: " + paramsPath(typeErr.Field) + " must be " + jsonKindOf(typeErr.Type) + ", got " + clipEcho(typeErr.Value)
	} else {
		e.Message = "invalid params: " + clipEcho(err.Error())
	}
	return e
}

// paramsPath is a decoding error's field path from params on: the path
// encoding/json reports also names the embedded Go structs on the way.
func paramsPath(field string) string {
	parts := strings.Split(field, ".")
	for i, p := range parts {
		if p == "params" {
			return clipEcho(strings.Join(parts[i:], "."))
		}
	}
	return "params"
}

// jsonKindOf names the JSON values encoding/json decodes into t.
func jsonKindOf(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Pointer:
		return jsonKindOf(t.Elem())
	default:
		return "an object"
	}
}

// integerLiteral reports whether the JSON number lit is an integer, as
// JSON Schema counts them: 7, 7.0 and 7e2, not 7.5.
func integerLiteral(lit string) bool {
	if !strings.ContainsAny(lit, ".eE") {
		return true
	}
	if !smallExponent(lit) {
		return false
	}
	r, ok := new(big.Rat).SetString(lit)
	return ok && r.IsInt()
}

// smallExponent reports whether the JSON number lit has no exponent or
// one within ±400: big.Rat would spend time and memory on a larger one,
// and no id needs an exponent beyond a float64's.
func smallExponent(lit string) bool {
	i := strings.IndexAny(lit, "eE")
	if i < 0 {
		return true
	}
	e, err := strconv.Atoi(strings.TrimPrefix(lit[i+1:], "+"))
	return err == nil && e >= -400 && e <= 400
}

// errSyntax marks text that is not one JSON value.
var errSyntax = errors.New("not one JSON value")

// frame is one open array or object of the walk.
type frame struct {
	object bool
	// names are the object's member names so far, as written; byFold
	// indexes them by foldName once there are more than a few.
	names   []string
	byFold  map[string]string
	members int    // an object's members so far
	wantKey bool   // an object's next token is a member name
	key     string // the member being read
	index   int    // an array's current element
}

// walker reads a message token by token, keeping only the stack of open
// containers and, per open object, its member names.
type walker struct {
	dec   tokenSource
	stack []frame
	code  int // the JSON-RPC code of the refusal run returned

	id       json.RawMessage // the top-level id, when unambiguous
	method   string
	nameKind string // JSON type of params.name; "" when absent
	nameLen  int    // its length in characters when a string
	name     string // params.name when a string of at most 64 characters

	// argsStart and argsEnd are the byte range of params.arguments, when
	// the walk reads from a lexer (argsEnd 0 otherwise); inArgs is true
	// while the walk is inside it.
	argsStart, argsEnd int
	inArgs             bool
	// values and argValues count the message's JSON values outside
	// params.arguments and inside it.
	values, argValues int

	longID, longMethod bool   // the id or method is over its bound
	idKind, methodKind string // JSON types of the top-level id and method; "" when absent
	inexactID          bool   // a numeric id mcp-go would answer under another value
	fractionalID       bool   // a numeric id that is not an integer
	versionKind        string // JSON type of the top-level jsonrpc; "" when absent
	version            string // its value when a string
	answer             bool   // the message has a top-level result or error
	callExtras         bool   // params has a task, inputResponses or requestState

	// The JSON types of what gateEnvelope decodes ("" when absent): the
	// message, its params, params._meta, params.clientInfo and its name
	// and version; and the values of the strings among them.
	topKind, paramsKind, metaKind, infoKind string
	infoNameKind, infoVersionKind           string
	infoName, infoVersion                   string
	protocolVersion                         string // params._meta's, when a string
}

// gateOf is what the HTTP gate reads of the message walked, from what
// the walk noted: what json.Unmarshal(msg, &g) gives when it succeeds
// (encoding/json matches member names ignoring case; _meta's members are
// a map's, matched exactly). A member of a JSON type other than
// gateEnvelope's is read as absent; verdict and checkParams have refused
// every such message the gate acts on (an initialize with a clientInfo
// that is not an object of strings, a _meta that is not an object), and
// the others are answered by mcp-go.
func (w *walker) gateOf() (g gateEnvelope) {
	g.Method = w.method
	if w.paramsKind != "an object" {
		return g
	}
	g.Params.Meta = metaVersion(w.protocolVersion)
	if w.infoKind == "an object" && (w.infoNameKind == "" || w.infoNameKind == "null" || w.infoNameKind == "a string") &&
		(w.infoVersionKind == "" || w.infoVersionKind == "null" || w.infoVersionKind == "a string") {
		g.Params.ClientInfo = &gateClientInfo{Name: w.infoName, Version: w.infoVersion}
	}
	return g
}

// echoedExactly reports whether mcp-go answers a request whose id is the
// number lit under an id of the same value: it reads a numeric id as a
// 64-bit float and writes it back as an integer when it is integral, so
// 9007199254740993 would come back as 9007199254740992, which the client
// cannot match to its request.
func echoedExactly(lit string) bool {
	if plainID([]byte(lit)) {
		return true // an integer a float64 holds exactly
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil || math.IsInf(f, 0) {
		return false
	}
	if !smallExponent(lit) {
		return false
	}
	var echo []byte
	if f == float64(int64(f)) {
		echo = strconv.AppendInt(nil, int64(f), 10)
	} else if echo, err = json.Marshal(f); err != nil {
		return false
	}
	want, ok1 := new(big.Rat).SetString(lit)
	got, ok2 := new(big.Rat).SetString(string(echo))
	return ok1 && ok2 && want.Cmp(got) == 0
}

// run walks the whole value. It returns errSyntax (wrapped) for text that
// is not one JSON value, or a refusal with w.code set.
func (w *walker) run() error {
	for {
		tok, err := w.dec.Token()
		if err != nil {
			return errSyntax // including EOF before a whole value
		}
		if err := w.token(tok); err != nil {
			return err
		}
		if len(w.stack) == 0 {
			// The value is complete; only whitespace may follow.
			if _, err := w.dec.Token(); err != io.EOF {
				return errSyntax
			}
			return nil
		}
	}
}

func (w *walker) token(tok json.Token) error {
	if n := len(w.stack); n > 0 && w.stack[n-1].object && w.stack[n-1].wantKey {
		if d, ok := tok.(json.Delim); ok && d == '}' {
			w.stack = w.stack[:n-1]
			w.valueDone()
			return nil
		}
		name, _ := tok.(string)
		return w.member(name)
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{', '[':
			if len(w.stack) >= MaxMessageDepth {
				w.code = codeInvalidRequest
				return errors.New("invalid request: the message nests arrays and objects more than " + strconv.Itoa(MaxMessageDepth) + " levels deep (the limit)")
			}
			w.note(nil, kindOf(t))
			w.stack = append(w.stack, frame{object: t == '{', wantKey: t == '{'})
		default: // ']'; '}' is handled above
			w.stack = w.stack[:len(w.stack)-1]
			w.valueDone()
		}
	case json.Number:
		if len(t) > maxNumberLen {
			return w.refuse("number is longer than " + strconv.Itoa(maxNumberLen) + " characters (got " + clipEcho(string(t)) + ")")
		}
		if _, err := strconv.ParseFloat(string(t), 64); err != nil {
			return w.refuse("number is beyond the range of a 64-bit float (got " + clipEcho(string(t)) + ")")
		}
		w.note(t, "a number")
		w.valueDone()
	case string:
		w.note(t, "a string")
		w.valueDone()
	case bool:
		w.note(t, "a boolean")
		w.valueDone()
	case nil:
		w.note(nil, "null")
		w.valueDone()
	}
	return nil
}

func kindOf(d json.Delim) string {
	if d == '{' {
		return "an object"
	}
	return "an array"
}

// member handles a member name of the innermost object.
func (w *walker) member(name string) error {
	f := &w.stack[len(w.stack)-1]
	if prev, dup := f.seen(name); dup {
		where := w.path()
		if where == "" {
			where = "the message"
		}
		if len(w.stack) == 1 && strings.EqualFold(name, "id") {
			w.id = nil // ambiguous
		}
		w.code = codeInvalidRequest
		if prev == name {
			return errors.New("invalid request: member " + strconv.Quote(clipEcho(name)) + " appears twice in " + where +
				" (member names must be unique)")
		}
		return errors.New("invalid request: members " + strconv.Quote(clipEcho(prev)) + " and " + strconv.Quote(clipEcho(name)) +
			" in " + where + " differ only in case (member names must be unique, ignoring case)")
	}
	if f.members++; f.members > maxObjectMembers {
		return w.refuse("object has more than " + strconv.Itoa(maxObjectMembers) + " members (the limit; no MCP message or tool argument needs that many)")
	}
	f.add(name)
	f.key = name
	f.wantKey = false
	return nil
}

// frameIndexAt is how many member names an object holds before they are
// indexed by a map rather than searched.
const frameIndexAt = 8

// seen returns the member name as written that equals name under Unicode
// case folding, if any: strings.EqualFold while the names are few, their
// foldName in the index after.
func (f *frame) seen(name string) (string, bool) {
	if f.byFold != nil {
		prev, ok := f.byFold[foldName(name)]
		return prev, ok
	}
	for _, prev := range f.names {
		if strings.EqualFold(prev, name) {
			return prev, true
		}
	}
	return "", false
}

// add notes a member name not seen before.
func (f *frame) add(name string) {
	if f.byFold != nil {
		f.byFold[foldName(name)] = name
		return
	}
	f.names = append(f.names, name)
	if len(f.names) > frameIndexAt {
		f.byFold = make(map[string]string, 2*len(f.names))
		for _, n := range f.names {
			f.byFold[foldName(n)] = n
		}
		f.names = nil
	}
}

// valueDone moves the innermost container past the value just read.
func (w *walker) valueDone() {
	if w.inArgs && len(w.stack) == 2 { // params.arguments closed
		w.inArgs = false
		if l, ok := w.dec.(*lexer); ok {
			_, w.argsEnd = l.span()
			l.quiet = false
		}
	}
	if n := len(w.stack); n > 0 {
		f := &w.stack[n-1]
		if f.object {
			f.wantKey = true
		} else {
			f.index++
		}
	}
}

// note records the top-level id and method and params.name as they are
// read; v is the scalar value (nil for containers and null), kind its
// JSON type.
func (w *walker) note(v any, kind string) {
	if w.inArgs {
		w.argValues++
		return // nothing under params.arguments is noted
	}
	w.values++
	str, _ := v.(string)
	switch {
	case len(w.stack) == 0:
		w.topKind = kind
	case len(w.stack) == 3 && w.stack[0].object && strings.EqualFold(w.stack[0].key, "params") && w.stack[1].object && w.stack[2].object:
		switch in, key := w.stack[1].key, w.stack[2].key; {
		case strings.EqualFold(in, "_meta") && key == mcp.MetaKeyProtocolVersion:
			w.protocolVersion = str
		case strings.EqualFold(in, "clientInfo") && strings.EqualFold(key, "name"):
			w.infoNameKind, w.infoName = kind, str
		case strings.EqualFold(in, "clientInfo") && strings.EqualFold(key, "version"):
			w.infoVersionKind, w.infoVersion = kind, str
		}
	case len(w.stack) == 1 && w.stack[0].object:
		// mcp-go, like encoding/json, matches these names ignoring case.
		switch key := w.stack[0].key; {
		case strings.EqualFold(key, "id"):
			w.idKind = kind
			switch v := v.(type) {
			case string:
				if len(v) <= maxIDLen {
					w.id, _ = json.Marshal(v)
				} else {
					w.longID = true
				}
			case json.Number:
				w.id = json.RawMessage(v)
				w.fractionalID = !integerLiteral(string(v))
				w.inexactID = !echoedExactly(string(v))
			}
		case strings.EqualFold(key, "params"):
			w.paramsKind = kind
		case strings.EqualFold(key, "jsonrpc"):
			w.versionKind, w.version = kind, str
		case strings.EqualFold(key, "result"), strings.EqualFold(key, "error"):
			w.answer = true
		case strings.EqualFold(key, "method"):
			w.methodKind = kind
			if s, ok := v.(string); ok {
				w.method = s
				w.longMethod = len(s) > maxMethodLen
			}
		}
	case len(w.stack) == 2 && w.stack[0].object && strings.EqualFold(w.stack[0].key, "params") && w.stack[1].object:
		switch key := w.stack[1].key; {
		case strings.EqualFold(key, "name"):
			w.nameKind = kind
			if s, ok := v.(string); ok {
				w.nameLen = utf8.RuneCountInString(s)
				if w.nameLen <= maxToolNameLen {
					w.name = s
				}
			}
		case strings.EqualFold(key, "arguments"):
			if l, ok := w.dec.(*lexer); ok {
				w.argsStart, w.argsEnd = l.span()
			}
			if kind == "an object" || kind == "an array" {
				w.argsEnd = 0 // known when it closes
				w.inArgs = true
				if l, ok := w.dec.(*lexer); ok {
					l.quiet = true // nothing under arguments is noted
				}
			}
		case strings.EqualFold(key, "_meta"):
			w.metaKind = kind
		case strings.EqualFold(key, "clientInfo"):
			w.infoKind = kind
		case strings.EqualFold(key, "task"), strings.EqualFold(key, "inputResponses"), strings.EqualFold(key, "requestState"):
			w.callExtras = true
		}
	}
}

// refuse returns a refusal about the value at the current path: -32602
// under params, -32600 elsewhere.
func (w *walker) refuse(msg string) error {
	where := w.path()
	w.code = codeInvalidRequest
	prefix := "invalid request: "
	if len(w.stack) > 0 && w.stack[0].object && strings.EqualFold(w.stack[0].key, "params") {
		w.code = codeInvalidParams
		prefix = "invalid params: "
	}
	if where != "" {
		return errors.New(prefix + where + ": " + msg)
	}
	return errors.New(prefix + msg)
}

// path renders where the walk is, like params.arguments.items[0]; only
// called for a refusal, so the walk stays linear.
func (w *walker) path() string {
	var sb strings.Builder
	for _, f := range w.stack {
		if !f.object {
			sb.WriteString("[" + strconv.Itoa(f.index) + "]")
			continue
		}
		if f.wantKey { // the innermost object, between members
			break
		}
		if isIdentifier(f.key) {
			if sb.Len() > 0 {
				sb.WriteByte('.')
			}
			sb.WriteString(f.key)
		} else {
			sb.WriteString("[" + strconv.Quote(clipEcho(f.key)) + "]")
		}
	}
	return sb.String()
}

func isIdentifier(s string) bool {
	if s == "" || len(s) > maxEcho {
		return false
	}
	for i, r := range s {
		if r != '_' && !(r >= 'a' && r <= 'z') && !(r >= 'A' && r <= 'Z') && !(i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// foldName maps s to a key equal for exactly the names encoding/json
// matches to each other (bytes.EqualFold: Unicode simple folding): every
// rune becomes the smallest rune of its folding orbit.
func foldName(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			ascii = false
			break
		}
	}
	if ascii {
		// The smallest rune of an ASCII letter's orbit is its upper case
		// (k's and s's hold the Kelvin and long-s signs, which are larger).
		return strings.ToUpper(s)
	}
	return strings.Map(func(r rune) rune {
		m := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			m = min(m, f)
		}
		return m
	}, s)
}

// clipEcho bounds a piece of the input repeated in a message to 64
// characters, marking a cut with "…".
func clipEcho(s string) string {
	if utf8.RuneCountInString(s) <= maxEcho {
		return s
	}
	r := []rune(s)
	return string(r[:maxEcho-1]) + "…"
}

func writeEnvelopeError(w http.ResponseWriter, status int, e *envelopeError) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(e.response(), '\n'))
}
