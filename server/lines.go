package server

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"sync"
)

// MaxMessageBytes bounds one JSON-RPC message on stdio. A larger line is
// dropped whole and replaced by a line that is not JSON, so the MCP layer
// answers it with a parse error and the server keeps serving, without
// ever holding the oversized message in memory.
const MaxMessageBytes = 8 << 20

// oversized is what replaces a dropped line.
var oversized = []byte("idemgate: message larger than the limit was dropped\n")

// boundedLines passes newline-delimited messages from r through, replacing
// any line longer than max bytes by a short non-JSON line. With check set,
// a line check refuses is not passed on: its answer is written to reply
// instead, and the next line is read.
type boundedLines struct {
	r       *bufio.Reader
	max     int
	pending []byte // bytes of the current output not yet returned

	check func(line []byte) (answer []byte) // nil: the line may pass
	reply io.Writer
}

func newBoundedLines(r io.Reader, max int) io.Reader {
	return &boundedLines{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// stdioStreams wraps a stdio server's input and output: lines longer than
// MaxMessageBytes are dropped (mcp-go answers a parse error), and every
// line is read strictly by checkEnvelope before mcp-go sees it; a refused
// one is answered with its JSON-RPC error directly on out and never
// reaches mcp-go. The returned writer serialises whole writes, so these
// answers and mcp-go's never interleave (mcp-go writes each message with
// one Write call); mcp-go must be given it as its output.
func stdioStreams(in io.Reader, out io.Writer) (io.Reader, io.Writer) {
	lw := &lockedWriter{w: out}
	b := &boundedLines{r: bufio.NewReaderSize(in, 64<<10), max: MaxMessageBytes, reply: lw}
	b.check = func(line []byte) []byte {
		if bytes.Equal(line, oversized) {
			return nil
		}
		if e := checkEnvelope(line); e != nil {
			return append(e.response(), '\n')
		}
		return nil
	}
	return b, lw
}

// lockedWriter makes each Write atomic with respect to the others.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (b *boundedLines) Read(p []byte) (int, error) {
	for len(b.pending) == 0 {
		line, err := b.readLine()
		if len(line) == 0 && err != nil {
			return 0, err
		}
		if b.check != nil {
			if answer := b.check(line); answer != nil {
				if _, werr := b.reply.Write(answer); werr != nil {
					return 0, werr
				}
				if err != nil {
					return 0, err
				}
				continue
			}
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
	var line []byte
	for {
		chunk, err := b.r.ReadSlice('\n')
		if len(line)+len(chunk) > b.max {
			// Drop the rest of this line without keeping it.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = b.r.ReadSlice('\n')
			}
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, err
			}
			return bytes.Clone(oversized), nil
		}
		line = append(line, chunk...)
		switch {
		case err == nil:
			return line, nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		default:
			return line, err
		}
	}
}
