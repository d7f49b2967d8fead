package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"

	"idemgate/schemas"
)

// StdioConfig is how ServeStdio serves one process's client.
type StdioConfig struct {
	// In and Out are the client's stream (the process's stdin and stdout).
	In  io.Reader
	Out io.Writer
	// Workers bounds concurrent tool calls.
	Workers int
	// Grace is how long a shutdown waits for the calls in flight to be
	// answered; it must exceed the longest call (see cmd serve).
	Grace  time.Duration
	Logger *slog.Logger
	// Screen, when set, refuses a tool call's wide arguments before they
	// are decoded (screenArguments): set it to the tool service's Screen.
	Screen Screener
}

// ServeStdio serves s on cfg.In and cfg.Out until the input ends or ctx
// is done (a signal); then it stops reading, waits up to cfg.Grace for
// every request already read to be answered (StdioDrain), and returns.
// The error is the stdio server's (io.EOF or context.Canceled on an
// ordinary end).
func ServeStdio(ctx context.Context, s *mcpserver.MCPServer, cfg StdioConfig) error {
	logger := cfg.Logger
	drain := NewStdioDrain(cfg.In, cfg.Out)
	// Not cancelled by the signal: mcp-go would cancel the calls in flight.
	listen, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- listenStdio(listen, s, drain, cfg, logger) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		logger.Info("shutting down: answering the calls in flight", "grace", cfg.Grace)
	case <-drain.InputDone():
	}
	wait, stopWait := context.WithTimeout(context.Background(), cfg.Grace)
	defer stopWait()
	if left := drain.Drain(wait); left > 0 {
		logger.Error("shutdown: calls still running after the grace were not answered (their operations are recorded and reconciled)", "calls", left, "grace", cfg.Grace)
	}
	select {
	case err := <-errc:
		return err
	case <-time.After(5 * time.Second):
		cancel()
		return <-errc
	}
}

// listenStdio serves s on the drain's lines until its input ends or ctx
// is done, through mcp-go's public API (MCPServer.HandleMessage, with a
// session of its own) rather than mcp-go's StdioServer, whose reading of
// a line decodes it five more times (a raw copy, three probes for answers
// to server-sent requests idemgate never sends, the method and id) and
// starts a goroutine per line. The drain's walk of each line (examine)
// already knows what those decodes find, so a line is decoded once, by
// HandleMessage. It serves as mcp-go's StdioServer does: tools/call on
// workers goroutines (a queue of 1000; when it is full, in the reading
// loop), other requests each on a goroutine, notifications in the
// reading loop, answers written one line per Write; a panic becomes an
// internal error answer. When the input ends, the calls' context is
// cancelled and listenStdio returns once every worker has.
//
// A tool call's wide arguments are screened first (screenArguments), and
// a message over largeMessage bytes is served only within the message
// budget, from when it is read until it is answered: over it, a request
// is answered at once with a retryable error (busyMessage) and a
// notification is dropped.
func listenStdio(ctx context.Context, s *mcpserver.MCPServer, drain *StdioDrain, cfg StdioConfig, logger *slog.Logger) error {
	sess := newStdioSession()
	if err := s.RegisterSession(ctx, sess); err != nil {
		return fmt.Errorf("register the stdio session: %w", err)
	}
	defer s.UnregisterSession(ctx, sess.SessionID())
	ctx, cancel := context.WithCancel(s.WithContext(ctx, sess))
	defer cancel()
	l := &stdioLoop{s: s, out: drain.Writer(), drain: drain, logger: logger}
	go l.notifications(ctx, sess.notifications)

	calls := make(chan stdioMessage, 1000)
	var running sync.WaitGroup
	for range max(cfg.Workers, 1) {
		running.Go(func() {
			for m := range calls {
				l.serve(ctx, m)
			}
		})
	}
	var err error
	for {
		line, env, rerr := drain.next()
		if rerr != nil {
			if !errors.Is(rerr, io.EOF) {
				err = rerr
			}
			break
		}
		m := stdioMessage{msg: bytes.TrimRight(line, " \t\r\n"), id: env.requestID}
		m.msg, m.screened = screenArguments(m.msg, env, cfg.Screen)
		if env.serve != serveParseError && !l.budget.take(len(m.msg)) {
			if m.id != nil {
				busy := envelopeError{ID: m.id, Code: codeServerBusy, Message: busyMessage}
				_, _ = l.out.Write(append(busy.response(), '\n'))
			}
			logger.Warn("stdio: message budget spent, a large message was refused", "bytes", len(m.msg))
			continue
		}
		switch env.serve {
		case serveParseError:
			l.write(parseError)
		case serveToolCall:
			select {
			case calls <- m:
			default:
				logger.Warn("stdio: tool call queue full, serving the call in the reading loop")
				l.serve(ctx, m)
			}
		case serveRequest:
			running.Go(func() { l.serve(ctx, m) })
		default:
			l.serve(ctx, m)
		}
	}
	cancel()
	close(calls)
	running.Wait()
	return err
}

// stdioMessage is a message to serve, with what the reading loop
// learned of it.
type stdioMessage struct {
	msg []byte
	// id is the request's id as written (envelope.requestID); nil for a
	// notification.
	id json.RawMessage
	// screened is the refusal of a tool call's arguments when the screen
	// refused them (msg then carries {} in their place).
	screened *schemas.Screened
}

// parseError answers a line that is not one JSON value, as mcp-go's stdio
// server does.
var parseError = mcp.JSONRPCError{JSONRPC: mcp.JSONRPC_VERSION, ID: mcp.NewRequestId(nil),
	Error: mcp.NewJSONRPCErrorDetails(mcp.PARSE_ERROR, "Parse error", nil)}

// stdioLoop serves messages of the stdio session and writes their
// answers.
type stdioLoop struct {
	s      *mcpserver.MCPServer
	out    io.Writer // atomic per Write (the drain's writer)
	drain  *StdioDrain
	logger *slog.Logger
	lines  sync.Pool // *[]byte buffers to encode answers in (write)
	// budget holds the bytes of the large messages being served; serve
	// gives a message's back once it is answered.
	budget messageBudget
}

// serve handles one message and writes its answer, if any: not the
// answer of a tool call the client cancelled (notifications/cancelled)
// while it ran. The call's notifications are written as it sends them,
// ahead of its answer. A panic escaping mcp-go becomes an internal error
// answer under the message's id. The message's bytes go back to the
// budget once it is served.
func (l *stdioLoop) serve(ctx context.Context, m stdioMessage) {
	defer l.budget.give(len(m.msg))
	st := &requestStream{transport: ctx, send: func(n mcp.JSONRPCNotification) { l.write(n) }}
	resp := func() (resp mcp.JSONRPCMessage) {
		defer func() {
			if r := recover(); r != nil {
				l.logger.Error("stdio: panic serving a message", "panic", r)
				resp = nil
				if m.id != nil {
					failed := envelopeError{ID: m.id, Code: mcp.INTERNAL_ERROR, Message: fmt.Sprintf("internal panic: %v", r)}
					_, _ = l.out.Write(append(failed.response(), '\n'))
				}
			}
		}()
		return l.s.HandleMessage(withRequestStream(withScreened(ctx, m.screened), st), m.msg)
	}()
	if st.answerWithheld() {
		l.logger.Debug("stdio: the client cancelled a call; its answer is not sent")
		// Settled all the same: a shutdown must not wait for it.
		if id, ok := normalizeID(m.id); ok {
			l.drain.answered(id)
		}
		return
	}
	if resp != nil {
		l.write(resp)
	}
}

// write sends one message as one line, with one Write: the bytes
// json.Marshal writes for it (appendMessage), and a newline.
func (l *stdioLoop) write(msg any) {
	buf, _ := l.lines.Get().(*[]byte)
	if buf == nil {
		buf = new([]byte)
	}
	defer l.lines.Put(buf)
	b, err := appendMessage((*buf)[:0], msg)
	if err != nil {
		l.logger.Error("stdio: encode an answer", "err", err)
		return
	}
	b = append(b, '\n')
	if cap(b) <= maxPooledLine {
		*buf = b
	}
	if _, err := l.out.Write(b); err != nil {
		l.logger.Warn("stdio: write an answer", "err", err)
	}
}

// maxPooledLine bounds the buffers stdioLoop keeps for its answers.
const maxPooledLine = 64 << 10

// notifications writes the session's notifications until ctx is done
// (a tool call's own are written by its requestStream).
func (l *stdioLoop) notifications(ctx context.Context, ch <-chan mcp.JSONRPCNotification) {
	for {
		select {
		case n := <-ch:
			l.write(n)
		case <-ctx.Done():
			return
		}
	}
}

// stdioSession is the one client session of a stdio server: its
// notifications, log level and the client's self-description. It sends
// the client no requests (sampling, elicitation, roots): idemgate asks
// none.
type stdioSession struct {
	// id names the session in the audit log: "stdio-" and a new UUID for
	// each stream served (a process's stdin, or a client of the ledger's
	// owner).
	id            string
	notifications chan mcp.JSONRPCNotification
	initialized   atomic.Bool
	mu            sync.Mutex
	level         mcp.LoggingLevel
	info          mcp.Implementation
	caps          mcp.ClientCapabilities
}

var (
	_ mcpserver.SessionWithLogging    = (*stdioSession)(nil)
	_ mcpserver.SessionWithClientInfo = (*stdioSession)(nil)
)

func newStdioSession() *stdioSession {
	return &stdioSession{id: "stdio-" + uuid.NewString(), notifications: make(chan mcp.JSONRPCNotification, 100), level: mcp.LoggingLevelError}
}

func (s *stdioSession) SessionID() string { return s.id }

func (s *stdioSession) NotificationChannel() chan<- mcp.JSONRPCNotification {
	return s.notifications
}

func (s *stdioSession) Initialize() { s.initialized.Store(true) }

func (s *stdioSession) Initialized() bool { return s.initialized.Load() }

func (s *stdioSession) SetLogLevel(level mcp.LoggingLevel) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.level = level
}

func (s *stdioSession) GetLogLevel() mcp.LoggingLevel {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.level
}

func (s *stdioSession) GetClientInfo() mcp.Implementation {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info
}

func (s *stdioSession) SetClientInfo(info mcp.Implementation) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.info = info
}

func (s *stdioSession) GetClientCapabilities() mcp.ClientCapabilities {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.caps
}

func (s *stdioSession) SetClientCapabilities(caps mcp.ClientCapabilities) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.caps = caps
}
