package server

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// MaxMessageBytes bounds one JSON-RPC message on stdio. A larger line is
// dropped whole and replaced by a line that is not JSON, so the MCP layer
// answers it with a parse error and the server keeps serving, without
// ever holding the oversized message in memory.
const MaxMessageBytes = 8 << 20

// oversized is what replaces a dropped line.
var oversized = []byte("idemgate: message larger than the limit was dropped\n")

// boundedLines passes newline-delimited messages from r through, replacing
// any line longer than max bytes by a short non-JSON line.
type boundedLines struct {
	r       *bufio.Reader
	max     int
	pending []byte // bytes of the current output not yet returned
}

func newBoundedLines(r io.Reader, max int) *boundedLines {
	return &boundedLines{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// Read passes the lines on as a stream.
func (b *boundedLines) Read(p []byte) (int, error) {
	for len(b.pending) == 0 {
		line, err := b.readLine()
		if len(line) == 0 && err != nil {
			return 0, err
		}
		b.pending = line
		if err != nil && !errors.Is(err, io.EOF) {
			return 0, err
		}
	}
	n := copy(p, b.pending)
	b.pending = b.pending[n:]
	return n, nil
}

// readLine returns the next line with its newline, or the replacement for
// an overlong one; at EOF without a newline it returns what is left.
func (b *boundedLines) readLine() ([]byte, error) {
	// A long line is kept as copies of the buffer's chunks, joined once
	// at the end: appending would reallocate it at every quarter of its
	// growth, leaving four times its size to the garbage collector.
	var chunks [][]byte
	n := 0
	line := func() []byte {
		out := make([]byte, 0, n)
		for _, c := range chunks {
			out = append(out, c...)
		}
		return out
	}
	for {
		chunk, err := b.r.ReadSlice('\n')
		if n+len(chunk) > b.max {
			// Drop the rest of this line without keeping it.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = b.r.ReadSlice('\n')
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			return bytes.Clone(oversized), nil
		}
		if chunks == nil && !errors.Is(err, bufio.ErrBufferFull) {
			return bytes.Clone(chunk), err // the line fits the buffer: most do
		}
		chunks = append(chunks, bytes.Clone(chunk))
		n += len(chunk)
		switch {
		case err == nil:
			return line(), nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return line(), err
		}
	}
}

// LineReader reads newline-delimited messages as the stdio server does: a
// line over MaxMessageBytes comes back as a short line that is not JSON,
// and is never held whole in memory.
type LineReader struct{ b *boundedLines }

// NewLineReader reads the messages of r.
func NewLineReader(r io.Reader) *LineReader {
	return &LineReader{newBoundedLines(r, MaxMessageBytes)}
}

// ReadLine returns the next message with its newline (a new slice each
// time); at the end of r, what is left without one, and the error.
func (l *LineReader) ReadLine() ([]byte, error) { return l.b.readLine() }
