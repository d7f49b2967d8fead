package owner

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"idemgate/server"
)

// How a pipe watches its owner: while a request waits for its answer, it
// pings the owner every pingEvery; an owner that has said nothing for
// stallAfter (stopped, or hung) is given up, and every request waiting on
// it is answered with an error that says to repeat it. A client's request
// is so answered within StallBound of the owner stopping.
const (
	pingEvery  = time.Second
	stallAfter = 5 * time.Second
	// StallBound is the longest a client waits for an answer from an
	// owner that has stopped (SIGSTOP, a hung process): the stall, and
	// the hello of one attempt to connect again.
	StallBound = stallAfter + pingEvery + helloTimeout
	// redialPause: after a failed attempt to reach the owner, requests are
	// answered at once for this long before the pipe tries again.
	redialPause = time.Second
)

// PipeConfig is what a pipe serves.
type PipeConfig struct {
	// In and Out are the MCP client's stream (the process's stdin and stdout).
	In  io.Reader
	Out io.Writer
	// Connect opens a connection to the owner (starting one if need be).
	Connect func() (*Conn, error)
	// Grace is how long the pipe waits, once its input ends or ctx is
	// done, for the answers to the requests it passed on.
	Grace  time.Duration
	Logger *slog.Logger
}

// pipeIDPrefix marks the ids of the requests the pipe itself sends (its
// pings and the initialize it repeats on a new connection): their answers
// are the pipe's, never the client's.
const pipeIDPrefix = "idemgate-pipe:"

// Pipe carries an MCP client's messages to the owner on first and its
// answers back, until the client's input ends or ctx is done; then it
// waits up to cfg.Grace for the answers still due. When the connection is
// lost (the owner ended, or stalled), each request it carried is answered
// with an error that tells the model to repeat the call with the same
// operation key, and the next message goes over a new connection, which
// the pipe opens with the client's own initialize again.
func Pipe(ctx context.Context, first *Conn, cfg PipeConfig) error {
	p := &pipe{cfg: cfg, log: cfg.Logger, pending: map[string]request{}, idle: make(chan struct{}, 1)}
	p.attach(first)
	inputDone := make(chan error, 1)
	var stopping atomic.Bool // a line read once the shutdown began is not passed on
	go func() {
		r := server.NewLineReader(cfg.In)
		for {
			line, err := r.ReadLine()
			if len(bytes.TrimSpace(line)) > 0 && !stopping.Load() {
				p.fromClient(line)
			}
			if err != nil {
				inputDone <- err
				return
			}
		}
	}()
	select {
	case err := <-inputDone:
		if !errors.Is(err, io.EOF) {
			p.log.Warn("reading the client", "err", err)
		}
	case <-ctx.Done():
	}
	stopping.Store(true)
	p.drain(cfg.Grace)
	p.mu.Lock()
	c := p.conn
	p.conn = nil // not lost: ended
	p.mu.Unlock()
	if c != nil {
		c.Close()
	}
	return nil
}

// request is one request the client sent that awaits its answer. Every
// pending request went over the current connection: lost answers those
// of a connection as it drops it.
type request struct {
	tool bool   // a tools/call
	key  string // its operation_key, when it has one
}

type pipe struct {
	cfg PipeConfig
	log *slog.Logger

	outMu sync.Mutex // the client's output, one line at a time

	mu          sync.Mutex
	conn        *Conn // nil while the owner is unreachable
	n           int   // the current connection's number
	pending     map[string]request
	idle        chan struct{} // signalled when pending empties
	initialize  []byte        // the client's initialize and initialized, for a new connection
	initialized []byte
	retryAt     time.Time // no attempt to reach the owner before
	// Of the current connection:
	heard       time.Time // when the owner last wrote, or a wait began
	pinging     bool      // a ping is out
	pings       int
	initAnswer  chan struct{} // closed when the repeated initialize is answered
	initPending string        // its id, in RequestIDOf's form ("" when none waits)
}

// message is what the pipe reads of a client's line besides its id.
type message struct {
	Method string `json:"method"`
	Params struct {
		Arguments struct {
			OperationKey any `json:"operation_key"`
		} `json:"arguments"`
		RequestID json.RawMessage `json:"requestId"`
	} `json:"params"`
}

// watched are the methods the pipe reads more of than the id: those it
// repeats on a new connection or forgets a request for, and tools/call,
// whose operation key an error answer names.
var watched = [][]byte{[]byte(`"tools/call"`), []byte(`"initialize"`), []byte(`"notifications/initialized"`), []byte(`"notifications/cancelled"`)}

// mentionsWatched reports whether line may be a message of a watched
// method (a cheap test before decoding it).
func mentionsWatched(line []byte) bool {
	for _, w := range watched {
		if bytes.Contains(line, w) {
			return true
		}
	}
	return false
}

func (p *pipe) fromClient(line []byte) {
	// The id as the owner answers under it: a message it refuses with id
	// null is no request that waits.
	id, isRequest := server.RequestIDOf(line)
	var m message
	ok := mentionsWatched(line) && json.Unmarshal(line, &m) == nil
	p.mu.Lock()
	switch {
	case !ok:
	case m.Method == "initialize" && isRequest:
		p.initialize = line
	case m.Method == "notifications/initialized":
		p.initialized = line
	case m.Method == "notifications/cancelled":
		// A cancelled request is not answered.
		if cancelled, ok := server.NormalizeID(m.Params.RequestID); ok {
			p.forget(cancelled)
		}
	}
	conn, n := p.conn, p.n
	p.mu.Unlock()
	key, _ := m.Params.Arguments.OperationKey.(string)
	r := request{tool: m.Method == "tools/call", key: key}
	if conn == nil {
		var err error
		if conn, n, err = p.reconnect(); err != nil {
			if isRequest {
				p.answerError(id, r, fmt.Sprintf("idemgate could not reach the process that keeps its ledger (%v). Repeat this exact call with the same operation_key in a few seconds; do not use a new key.", err))
			}
			return
		}
	}
	if isRequest {
		p.mu.Lock()
		if p.conn != conn {
			// Lost since it was taken: lost answered the requests that
			// went over it, and this one did not go.
			p.mu.Unlock()
			p.answerError(id, r, "idemgate lost the process that keeps its ledger as this call was sent; the call did not reach it. Repeat this exact call with the same operation_key; do not use a new key.")
			return
		}
		if len(p.pending) == 0 {
			p.heard = time.Now()
		}
		p.pending[id] = r
		p.mu.Unlock()
	}
	if err := p.write(conn, line); err != nil {
		p.lost(n, fmt.Sprintf("could not pass the request on: %v", err))
	}
}

// write sends one line to the owner; a write that cannot finish within
// stallAfter (the owner does not read) fails.
func (p *pipe) write(c *Conn, line []byte) error {
	c.SetWriteDeadline(time.Now().Add(stallAfter))
	_, err := c.Write(line)
	if err == nil && (len(line) == 0 || line[len(line)-1] != '\n') {
		_, err = c.Write([]byte{'\n'})
	}
	return err
}

// reconnect opens a new connection and repeats the client's initialize on
// it, unless the last attempt failed less than redialPause ago.
func (p *pipe) reconnect() (*Conn, int, error) {
	p.mu.Lock()
	if time.Now().Before(p.retryAt) {
		p.mu.Unlock()
		return nil, 0, errors.New("it did not answer a moment ago")
	}
	p.mu.Unlock()
	c, err := p.cfg.Connect()
	if err == nil {
		err = p.attach(c)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.retryAt = time.Now().Add(redialPause)
		return nil, 0, err
	}
	return c, p.n, nil
}

// attach makes c the current connection: it starts reading and watching
// it, and repeats the client's initialize and initialized on it when the
// client had sent them.
func (p *pipe) attach(c *Conn) error {
	p.mu.Lock()
	p.n++
	n := p.n
	p.conn, p.heard, p.pinging, p.initPending = c, time.Now(), false, ""
	init, initialized := p.initialize, p.initialized
	p.mu.Unlock()
	go p.fromOwner(c, n)
	go p.watch(c, n)
	if init == nil {
		return nil
	}
	id := pipeIDPrefix + "init:" + strconv.Itoa(n)
	line, err := withID(init, id)
	if err != nil {
		return err
	}
	answered := make(chan struct{})
	p.mu.Lock()
	p.initPending, p.initAnswer = strconv.Quote(id), answered
	p.mu.Unlock()
	if err := p.write(c, line); err != nil {
		p.lost(n, "could not repeat initialize")
		return err
	}
	select {
	case <-answered:
	case <-time.After(helloTimeout):
		p.lost(n, "initialize was not answered")
		return errors.New("it did not answer initialize")
	}
	if initialized != nil {
		if err := p.write(c, initialized); err != nil {
			p.lost(n, "could not repeat initialized")
			return err
		}
	}
	return nil
}

// withID returns the request line with its id replaced.
func withID(line []byte, id string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(line, &m); err != nil {
		return nil, err
	}
	m["id"], _ = json.Marshal(id)
	b, err := json.Marshal(m)
	return append(b, '\n'), err
}

// fromOwner passes the owner's lines on to the client until the
// connection ends, keeping the answers to the pipe's own requests.
func (p *pipe) fromOwner(c *Conn, n int) {
	r := server.NewLineReader(c.R)
	for {
		line, err := r.ReadLine()
		if len(line) > 0 {
			p.mu.Lock()
			if p.n == n {
				p.heard, p.pinging = time.Now(), false
			}
			p.mu.Unlock()
			p.fromOwnerLine(line)
		}
		if err != nil {
			p.lost(n, "the connection ended")
			return
		}
	}
}

func (p *pipe) fromOwnerLine(line []byte) {
	// Without its newline, as the server's own answers are read.
	if id, ok := server.ResponseIDOf(bytes.TrimSuffix(line, []byte("\n"))); ok {
		if strings.HasPrefix(id, `"`+pipeIDPrefix) { // a ping's or a repeated initialize's
			p.mu.Lock()
			if id == p.initPending {
				p.initPending = ""
				close(p.initAnswer)
			}
			p.mu.Unlock()
			return
		}
		p.mu.Lock()
		p.forget(id)
		p.mu.Unlock()
	}
	p.toClient(line)
}

// forget drops a request that has its answer (or needs none); p.mu held.
func (p *pipe) forget(id string) {
	delete(p.pending, id)
	if len(p.pending) == 0 {
		p.signalIdle()
	}
}

// signalIdle wakes drain: no request waits.
func (p *pipe) signalIdle() {
	select {
	case p.idle <- struct{}{}:
	default:
	}
}

// watch pings the owner while requests wait on connection n, and gives the
// connection up when the owner has said nothing for stallAfter.
func (p *pipe) watch(c *Conn, n int) {
	t := time.NewTicker(pingEvery)
	defer t.Stop()
	for range t.C {
		p.mu.Lock()
		if p.n != n || p.conn != c {
			p.mu.Unlock()
			return
		}
		if len(p.pending) == 0 { // fromClient restarts heard with the next request
			p.mu.Unlock()
			continue
		}
		if silent := time.Since(p.heard); silent > stallAfter {
			p.mu.Unlock()
			p.lost(n, fmt.Sprintf("the owner (pid %d) has not answered for %s", c.Welcome.PID, silent.Round(time.Second)))
			return
		}
		ping := !p.pinging
		if ping {
			p.pinging = true
			p.pings++
		}
		id := pipeIDPrefix + "ping:" + strconv.Itoa(p.pings)
		p.mu.Unlock()
		if ping {
			line := fmt.Sprintf(`{"jsonrpc":"2.0","id":%q,"method":"ping"}`+"\n", id)
			if err := p.write(c, []byte(line)); err != nil {
				p.lost(n, "could not ping the owner")
				return
			}
		}
	}
}

// lost ends connection n, if it is still the current one: every request
// that went over it is answered with an error.
func (p *pipe) lost(n int, why string) {
	p.mu.Lock()
	if p.n != n || p.conn == nil {
		p.mu.Unlock()
		return
	}
	c := p.conn
	p.conn = nil
	failed := p.pending
	p.pending = map[string]request{}
	p.signalIdle()
	p.mu.Unlock()
	c.Close()
	p.log.Warn("lost the connection to the ledger's owner", "why", why, "owner_pid", c.Welcome.PID, "unanswered", len(failed))
	msg := "idemgate's ledger process did not answer this call (" + why + "); it may or may not have taken effect. Repeat this exact call with the same operation_key: that is safe (a finished operation is replayed, never run twice). Never use a new key for it."
	for id, r := range failed {
		p.answerError(id, r, msg)
	}
}

// answerError answers request id (in RequestIDOf's form) with msg, as
// server.FailedAnswer words it.
func (p *pipe) answerError(id string, r request, msg string) {
	b, err := server.FailedAnswer(id, r.tool, r.key, msg)
	if err != nil {
		p.log.Error("answering a request the owner did not", "id", id, "err", err)
		return
	}
	p.toClient(b)
}

func (p *pipe) toClient(line []byte) {
	p.outMu.Lock()
	defer p.outMu.Unlock()
	if _, err := p.cfg.Out.Write(line); err != nil {
		p.log.Debug("writing to the client", "err", err)
	}
}

// drain waits up to grace for the answers still due.
func (p *pipe) drain(grace time.Duration) {
	deadline := time.After(grace)
	for {
		p.mu.Lock()
		left := len(p.pending)
		p.mu.Unlock()
		if left == 0 {
			return
		}
		select {
		case <-p.idle:
		case <-deadline:
			p.log.Error("shutdown: calls still running after the grace were not answered (their operations are recorded and reconciled)", "calls", left, "grace", grace)
			return
		}
	}
}
