package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"sync"
)

// StdioDrain sits between a stdio client and the stdio server so that a
// shutdown answers what was asked: it counts the requests passed to the
// server and the answers written back, and Drain stops passing new input,
// waits until every request read has its answer, and only then ends the
// server's input. (mcp-go's stdio server cancels every call in flight the
// moment its input ends.)
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
func (d *StdioDrain) pump(in io.Reader) {
	defer close(d.inputDone)
	r := newLineReader(in)
	for {
		line, err := r()
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

// newLineReader returns a function yielding whole lines of in.
func newLineReader(in io.Reader) func() ([]byte, error) {
	buf := make([]byte, 0, 64<<10)
	chunk := make([]byte, 64<<10)
	return func() ([]byte, error) {
		for {
			if i := bytes.IndexByte(buf, '\n'); i >= 0 {
				line := bytes.Clone(buf[:i+1])
				buf = append(buf[:0], buf[i+1:]...)
				return line, nil
			}
			n, err := in.Read(chunk)
			buf = append(buf, chunk[:n]...)
			if err != nil {
				line := bytes.Clone(buf)
				buf = buf[:0]
				return line, err
			}
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
	for len(d.cur) == 0 {
		select {
		case <-d.stopping:
			<-d.released
			return 0, io.EOF
		case line := <-d.lines:
			d.mu.Lock()
			if d.stopped {
				// Read after the shutdown began: not served, as if it had
				// arrived a moment later.
				d.mu.Unlock()
				continue
			}
			if id, ok := requestID(line); ok {
				d.pending[id]++
				d.npend++
			}
			d.mu.Unlock()
			d.cur = line
		}
	}
	n := copy(p, d.cur)
	d.cur = d.cur[n:]
	return n, nil
}

type drainWriter struct{ d *StdioDrain }

func (w drainWriter) Write(p []byte) (int, error) {
	d := w.d
	d.wmu.Lock()
	defer d.wmu.Unlock()
	n, err := d.out.Write(p)
	d.part = append(d.part, p[:n]...)
	for {
		i := bytes.IndexByte(d.part, '\n')
		if i < 0 {
			break
		}
		if id, ok := responseID(d.part[:i]); ok {
			d.answered(id)
		}
		d.part = d.part[i+1:]
	}
	if len(d.part) > 2*MaxMessageBytes {
		d.part = nil
	}
	d.part = append([]byte(nil), d.part...)
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

// requestID is the normalized id of a request (a message with a method
// and an id); notifications and responses have none. A message the strict
// envelope refuses is answered, before mcp-go, with the id its refusal
// names: none (null) when the id is ambiguous or too long.
func requestID(line []byte) (string, bool) {
	if e := checkEnvelope(line); e != nil {
		return normalizeID(e.ID)
	}
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method *string         `json:"method"`
	}
	if json.Unmarshal(line, &m) != nil || m.Method == nil {
		return "", false
	}
	return normalizeID(m.ID)
}

// responseID is the normalized id of a response (an id without a method).
func responseID(line []byte) (string, bool) {
	var m struct {
		ID     json.RawMessage `json:"id"`
		Method *string         `json:"method"`
	}
	if json.Unmarshal(line, &m) != nil || m.Method != nil {
		return "", false
	}
	return normalizeID(m.ID)
}

func normalizeID(raw json.RawMessage) (string, bool) {
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
