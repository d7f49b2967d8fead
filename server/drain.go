package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
)

// StdioDrain sits between a stdio client and the stdio server. Every line
// it reads is checked once by the strict envelope (examine): a line
// it refuses is answered with its JSON-RPC error on the output and never
// reaches the server; lines longer than MaxMessageBytes are replaced by a
// line that is not JSON (the server answers a parse error). And so that
// a shutdown answers what was asked, it counts the requests passed to the
// server and the answers written back: Drain stops passing new input,
// waits until every request read has its answer, and only then ends the
// server's input. (mcp-go's stdio server cancels every call in flight the
// moment its input ends.) Its Writer makes each Write atomic with respect
// to the others, so refusals and the server's answers never interleave
// (mcp-go writes each message with one Write call).
type StdioDrain struct {
	lines     chan []byte
	inputDone chan struct{}
	stopping  chan struct{}
	released  chan struct{}
	stopOnce  sync.Once
	drainOnce sync.Once

	cur []byte // the rest of the line being read

	mu      sync.Mutex
	stopped bool
	pending map[string]int
	npend   int
	idle    chan struct{} // closed when npend reaches 0 while stopped

	wmu  sync.Mutex
	out  io.Writer
	part []byte // an answer line not yet complete
}

// NewStdioDrain reads newline-delimited messages from in (each at most
// MaxMessageBytes; a longer one is replaced as by the stdio server) and
// passes answers on to out.
func NewStdioDrain(in io.Reader, out io.Writer) *StdioDrain {
	d := &StdioDrain{lines: make(chan []byte), inputDone: make(chan struct{}), stopping: make(chan struct{}),
		released: make(chan struct{}), pending: map[string]int{}, idle: make(chan struct{}), out: out}
	go d.pump(newBoundedLines(in, MaxMessageBytes))
	return d
}

// pump reads lines until in ends; it exits then, or when the drain is
// released. A pump blocked reading a client that never writes again stays
// so until the process exits.
func (d *StdioDrain) pump(in *boundedLines) {
	defer close(d.inputDone)
	for {
		line, err := in.readLine() // a new slice for every line
		if len(line) > 0 {
			select {
			case d.lines <- line:
			case <-d.released:
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// InputDone is closed when the client's input has ended.
func (d *StdioDrain) InputDone() <-chan struct{} { return d.inputDone }

// Reader is the stdio server's input.
func (d *StdioDrain) Reader() io.Reader { return drainReader{d} }

// Writer is the stdio server's output.
func (d *StdioDrain) Writer() io.Writer { return drainWriter{d} }

type drainReader struct{ d *StdioDrain }

func (r drainReader) Read(p []byte) (int, error) {
	d := r.d
	if len(d.cur) == 0 {
		line, _, err := d.next()
		if err != nil {
			return 0, err
		}
		d.cur = line
	}
	n := copy(p, d.cur)
	d.cur = d.cur[n:]
	return n, nil
}

// next returns the next line to serve, with its newline, and what its
// envelope said of it; io.EOF once the input ended or the drain released
// it. A refused line is answered here and never returned. One reader at
// a time.
func (d *StdioDrain) next() ([]byte, envelope, error) {
	for {
		select {
		case <-d.stopping:
			<-d.released
			return nil, envelope{}, io.EOF
		case line := <-d.lines:
			env := examine(line)
			rawID := env.requestID
			if env.refused != nil {
				rawID = env.refused.ID // its refusal answers it under this id
			}
			d.mu.Lock()
			if d.stopped {
				// Read after the shutdown began: not served, as if it had
				// arrived a moment later.
				d.mu.Unlock()
				continue
			}
			if id, ok := normalizeID(rawID); ok {
				d.pending[id]++
				d.npend++
			}
			d.mu.Unlock()
			if env.refused != nil {
				if _, err := d.Writer().Write(append(env.refused.response(), '\n')); err != nil {
					return nil, envelope{}, err
				}
				continue
			}
			return line, env, nil
		}
	}
}

type drainWriter struct{ d *StdioDrain }

func (w drainWriter) Write(p []byte) (int, error) {
	d := w.d
	d.wmu.Lock()
	defer d.wmu.Unlock()
	n, err := d.out.Write(p)
	// Lines are read where they lie: in p, or, after a partial line, in
	// part. Only a partial line's bytes are kept (copied: p is the
	// caller's), so an answer written whole is never copied.
	rest := p[:n]
	if len(d.part) > 0 {
		d.part = append(d.part, rest...)
		rest = d.part
	}
	for {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			break
		}
		if id, ok := responseID(rest[:i]); ok {
			d.answered(id)
		}
		rest = rest[i+1:]
	}
	if len(rest) > 2*MaxMessageBytes {
		rest = nil
	}
	d.part = append([]byte(nil), rest...)
	return n, err
}

func (d *StdioDrain) answered(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.pending[id] == 0 {
		return
	}
	if d.pending[id]--; d.pending[id] == 0 {
		delete(d.pending, id)
	}
	d.npend--
	if d.npend == 0 && d.stopped {
		close(d.idle)
	}
}

// Drain stops passing input to the server, waits until every request
// already passed has been answered or ctx is done, then ends the server's
// input. It returns how many requests were still unanswered.
func (d *StdioDrain) Drain(ctx context.Context) int {
	d.drainOnce.Do(func() {
		d.mu.Lock()
		d.stopped = true
		if d.npend == 0 {
			close(d.idle)
		}
		d.mu.Unlock()
		close(d.stopping)
	})
	select {
	case <-d.idle:
	case <-ctx.Done():
	}
	d.stopOnce.Do(func() { close(d.released) })
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.npend
}

// responsePrefix is how every answer mcp-go writes begins (the
// marshalled JSONRPCResponse or JSONRPCError: jsonrpc, id, then result or
// error).
var responsePrefix = []byte(`{"jsonrpc":"2.0","id":`)

// responseID is the normalized id of a response (an id without a method).
// An answer shaped as mcp-go writes them (responsePrefix, a number or a
// string without escapes, then result or error, and a closing brace at
// the end) is read from its first bytes, not decoded whole: a replay's
// answer is kilobytes, and what lies between is mcp-go's own encoding.
func responseID(line []byte) (string, bool) {
	if rest, ok := bytes.CutPrefix(line, responsePrefix); ok && bytes.HasSuffix(bytes.TrimRight(line, " \r"), []byte("}")) {
		if n := plainIDLen(rest); n > 0 {
			if after := rest[n:]; bytes.HasPrefix(after, []byte(`,"result":`)) || bytes.HasPrefix(after, []byte(`,"error":`)) {
				if id, ok := normalizeID(rest[:n]); ok {
					return id, true
				}
			}
		}
	}
	return decodeResponseID(line)
}

// decodeResponseID is responseID for any message, decoded whole.
func decodeResponseID(line []byte) (string, bool) {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method *string         `json:"method"`
	}
	if json.Unmarshal(line, &m) != nil || m.Method != nil {
		return "", false
	}
	return normalizeID(m.ID)
}

// normalizeID is the id raw as json.Marshal writes the value it decodes
// to (a string or a float64), so that ids written differently but equal
// as mcp-go reads them are one; false for null, anything else, and text
// that is not JSON.
func normalizeID(raw json.RawMessage) (string, bool) {
	if plainID(raw) {
		return string(raw), true
	}
	var v any
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil || v == nil {
		return "", false
	}
	switch v.(type) {
	case string, float64:
	default:
		return "", false
	}
	b, _ := json.Marshal(v)
	return string(b), true
}

// plainID reports whether raw is written as json.Marshal writes the value
// it decodes to: a string of printable ASCII that has nothing to escape
// (no quote, backslash, <, > or &), or an integer of at most 15 digits
// without a leading zero or a minus sign, which a float64 holds exactly.
func plainID(raw []byte) bool {
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		for _, c := range raw[1 : len(raw)-1] {
			if c < 0x20 || c > 0x7E || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
				return false
			}
		}
		return true
	}
	if len(raw) == 0 || len(raw) > 15 || (raw[0] == '0' && len(raw) > 1) {
		return false
	}
	for _, c := range raw {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// plainIDLen is the length of the JSON number, or string without
// escapes, that b begins with; 0 for anything else.
func plainIDLen(b []byte) int {
	if len(b) == 0 {
		return 0
	}
	if b[0] == '"' {
		for i := 1; i < len(b) && i <= maxIDLen+1; i++ {
			switch c := b[i]; {
			case c == '"':
				return i + 1
			case c == '\\' || c < 0x20:
				return 0
			}
		}
		return 0
	}
	i := 0
	for i < len(b) && i < maxNumberLen && strings.IndexByte("-+.0123456789eE", b[i]) >= 0 {
		i++
	}
	return i
}

// RequestIDOf returns the id under which the stdio server answers line,
// as ResponseIDOf reads it back from the answer; ok is false when the
// server answers line under no id: a notification, a response, text that
// is not JSON, or a message it refuses with id null (a duplicate id, say).
func RequestIDOf(line []byte) (id string, ok bool) {
	env := examine(line)
	raw := env.requestID
	if env.refused != nil {
		raw = env.refused.ID
	}
	return normalizeID(raw)
}

// ResponseIDOf returns the id of an answer line, in RequestIDOf's form.
func ResponseIDOf(line []byte) (id string, ok bool) { return responseID(line) }

// NormalizeID returns a JSON-RPC id as written (a string or a number) in
// RequestIDOf's form.
func NormalizeID(raw json.RawMessage) (string, bool) { return normalizeID(raw) }
