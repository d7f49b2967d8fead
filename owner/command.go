package owner

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// A command connection is one whose hello names a Command: the owner runs
// that idemgate command itself, over its ledger, and sends what the
// command writes and then its exit status as frames: a kind byte, a length
// (4 bytes, big-endian) and that many bytes. The client sends nothing
// after its hello; closing its side of the connection asks the command to
// stop (a long-running one, serve --http or the console, ends as it does on
// SIGTERM).
const (
	frameStdout byte = 'o'
	frameStderr byte = 'e'
	frameExit   byte = 'x' // 4 bytes: the exit status
)

// maxFrame bounds one frame; a longer write is sent as several.
const maxFrame = 1 << 20

// frameTimeout bounds the sending of one frame: a client that stops
// reading (a stopped process) fails its command's writes rather than hold
// what the command holds in the ledger.
const frameTimeout = 10 * time.Second

// Output is the owner's side of a command connection: the command's
// standard output and error, and its exit status.
type Output struct {
	mu sync.Mutex
	c  net.Conn
}

// NewOutput sends a command's output on c.
func NewOutput(c net.Conn) *Output { return &Output{c: c} }

// Stdout is the command's standard output.
func (o *Output) Stdout() io.Writer { return frameWriter{o, frameStdout} }

// Stderr is the command's standard error.
func (o *Output) Stderr() io.Writer { return frameWriter{o, frameStderr} }

// Exit sends the command's exit status, its last frame.
func (o *Output) Exit(code int) error {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(code))
	return o.send(frameExit, b[:])
}

func (o *Output) send(kind byte, p []byte) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.c.SetWriteDeadline(time.Now().Add(frameTimeout))
	var head [5]byte
	head[0] = kind
	binary.BigEndian.PutUint32(head[1:], uint32(len(p)))
	if _, err := o.c.Write(head[:]); err != nil {
		return err
	}
	_, err := o.c.Write(p)
	return err
}

type frameWriter struct {
	o    *Output
	kind byte
}

func (w frameWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		chunk := p[:min(len(p), maxFrame)]
		if err := w.o.send(w.kind, chunk); err != nil {
			return n, err
		}
		n += len(chunk)
		p = p[len(chunk):]
	}
	return n, nil
}

// ErrOwnerGone is Relay's error when the connection ended before the
// command's exit status came: the owner ended (killed, or crashed) while
// the command ran.
var ErrOwnerGone = errors.New("the ledger's owner ended before the command did")

// Relay copies a command connection's output to stdout and stderr until
// the command's exit status, which it returns.
func Relay(r io.Reader, stdout, stderr io.Writer) (int, error) {
	var head [5]byte
	for {
		if _, err := io.ReadFull(r, head[:]); err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) {
				return 0, ErrOwnerGone
			}
			return 0, err
		}
		n := binary.BigEndian.Uint32(head[1:])
		if n > maxFrame {
			return 0, fmt.Errorf("owner: a frame of %d bytes (at most %d)", n, maxFrame)
		}
		var w io.Writer
		switch head[0] {
		case frameStdout:
			w = stdout
		case frameStderr:
			w = stderr
		case frameExit:
			if n != 4 {
				return 0, fmt.Errorf("owner: an exit frame of %d bytes", n)
			}
			var b [4]byte
			if _, err := io.ReadFull(r, b[:]); err != nil {
				return 0, ErrOwnerGone
			}
			return int(int32(binary.BigEndian.Uint32(b[:]))), nil
		default:
			return 0, fmt.Errorf("owner: a frame of unknown kind %q", head[0])
		}
		if _, err := io.CopyN(w, r, int64(n)); err != nil {
			if errors.Is(err, io.EOF) {
				return 0, ErrOwnerGone
			}
			return 0, err
		}
	}
}
