package server

import (
	"bytes"
	"context"
	"encoding/json"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/mark3labs/mcp-go/mcp"
)

// A request's own stream. The MCP specification puts the notifications
// that relate to a request on that request's stream (Streamable HTTP: the
// response stream of its POST), and a receiver of notifications/cancelled
// SHOULD NOT answer the cancelled request. mcp-go v1.2.1 has one
// notification channel per session, and its Streamable HTTP transport
// drains it into whichever stream of the session happens to read first:
// every POST in flight and the GET stream. Progress sent with
// SendNotificationToClient therefore reached a call's client on any of
// them, and mcp-go sends the answer of a cancelled call like any other.
// So the transports hand each tools/call a requestStream on its context:
// the call's progress is written there directly, never to the session's
// channel, and a call the client cancelled leaves its answer unsent.

// requestStream is where one request's notifications go, and whether its
// answer may be sent. Its methods are safe for concurrent use.
type requestStream struct {
	// transport is the request's context as the transport received it:
	// done when the client went away or the server stops, never by
	// notifications/cancelled, which mcp-go applies to a context it
	// derives from this one for the request alone.
	transport context.Context
	// send writes one notification on the request's own stream.
	send      func(mcp.JSONRPCNotification)
	cancelled atomic.Bool
	// slot keeps the request's span while tracing is on (stdio: see
	// requestSlot).
	slot requestSlot
}

type requestStreamKey struct{}

// withRequestStream returns ctx carrying st.
func withRequestStream(ctx context.Context, st *requestStream) context.Context {
	return context.WithValue(ctx, requestStreamKey{}, st)
}

// requestStreamOf is the stream the transport gave the request of ctx, or
// nil (a transport that gives none: mcp-go's in-process client).
func requestStreamOf(ctx context.Context) *requestStream {
	st, _ := ctx.Value(requestStreamKey{}).(*requestStream)
	return st
}

// notify sends n on the request's stream, unless the request handled
// under ctx has ended: after a cancellation nothing more is sent for it.
func (st *requestStream) notify(ctx context.Context, n mcp.JSONRPCNotification) {
	if ctx.Err() != nil {
		return
	}
	st.send(n)
}

// settle records, when the handler of the request is done with ctx,
// whether the client cancelled it: ctx ended while the transport's
// context did not, which only notifications/cancelled does.
func (st *requestStream) settle(ctx context.Context) {
	if ctx.Err() != nil && st.transport.Err() == nil {
		st.cancelled.Store(true)
	}
}

// answerWithheld reports whether the request's answer must not be sent:
// the client cancelled it.
func (st *requestStream) answerWithheld() bool { return st.cancelled.Load() }

// progressNotification is the notifications/progress of a call that
// passed token.
func progressNotification(token mcp.ProgressToken, done, total float64, msg string) mcp.JSONRPCNotification {
	return mcp.JSONRPCNotification{
		JSONRPC: mcp.JSONRPC_VERSION,
		Notification: mcp.Notification{
			Method: string(mcp.MethodNotificationProgress),
			Params: mcp.NotificationParams{AdditionalFields: map[string]any{
				"progressToken": token, "progress": done, "total": total, "message": msg,
			}},
		},
	}
}

// postStream is the response of one tools/call POST over Streamable HTTP.
// mcp-go writes the call's answer (and any notification of the session it
// drains meanwhile) to it as to any response; the call's own
// notifications are written to it by the handler (its requestStream).
// The first notification opens an event stream (200, text/event-stream),
// when the client accepts one; an answer mcp-go then writes as a JSON body
// goes on that stream as its last event. The answer of a call the client
// cancelled is dropped: the client gets an event stream that ends without
// it. A client that does not accept event streams gets no notifications,
// and its answer is sent even after a cancellation, as the only response
// it accepts is the answer itself.
type postStream struct {
	w      http.ResponseWriter
	events bool // the client accepts text/event-stream
	st     *requestStream

	mu        sync.Mutex
	committed bool // the status line is written
	isEvents  bool // what was committed is an event stream
	ours      bool // this stream opened it, before mcp-go wrote anything
	reframe   bool // mcp-go's answer is a JSON body, held to go out as an event
	held      bytes.Buffer
}

// newPostStream returns the postStream of a tools/call POST r answered on
// w, and r carrying its requestStream.
func newPostStream(w http.ResponseWriter, r *http.Request) (*postStream, *http.Request) {
	p := &postStream{w: w, events: acceptsEventStream(r.Header.Values("Accept"))}
	p.st = &requestStream{transport: r.Context(), send: p.send}
	return p, r.WithContext(withRequestStream(r.Context(), p.st))
}

// acceptsEventStream reports whether Accept header values admit
// text/event-stream (RFC 9110 §12.5.1; a range with q=0 refuses).
func acceptsEventStream(values []string) bool {
	for _, v := range values {
		for part := range strings.SplitSeq(v, ",") {
			mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err != nil {
				continue
			}
			if q, err := strconv.ParseFloat(params["q"], 64); err == nil && q == 0 {
				continue
			}
			switch mt {
			case "text/event-stream", "text/*", "*/*":
				return true
			}
		}
	}
	return false
}

// withholdLocked reports whether mcp-go's writes are dropped: the call was
// cancelled and the client accepts the event stream that replaces its
// answer. When they are, it commits that (empty) event stream unless
// something was committed already. Callers hold mu.
func (p *postStream) withholdLocked() bool {
	if !p.events || !p.st.answerWithheld() {
		return false
	}
	if !p.committed {
		p.openLocked()
	}
	return true
}

// openLocked commits an event stream. Callers hold mu.
func (p *postStream) openLocked() {
	h := p.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Del("Content-Length")
	p.w.WriteHeader(http.StatusOK)
	p.committed, p.isEvents = true, true
}

// commitLocked notes that mcp-go's status line goes out now, and whether
// it begins an event stream. Callers hold mu.
func (p *postStream) commitLocked() {
	p.committed = true
	p.isEvents = strings.HasPrefix(p.w.Header().Get("Content-Type"), "text/event-stream")
}

// writeEventLocked writes one server-sent event carrying data (one line of
// JSON), as mcp-go frames its own. Callers hold mu.
func (p *postStream) writeEventLocked(data []byte) {
	var b bytes.Buffer
	b.Grow(len(data) + 24)
	b.WriteString("event: message\ndata: ")
	b.Write(data)
	b.WriteString("\n\n")
	_, _ = p.w.Write(b.Bytes())
	if f, ok := p.w.(http.Flusher); ok {
		f.Flush()
	}
}

// send writes n as an event of the call's stream, opening it if need be;
// it drops n when the client accepts no event stream or the answer was
// already committed as a JSON body.
func (p *postStream) send(n mcp.JSONRPCNotification) {
	data, err := json.Marshal(n)
	if err != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.events || (p.committed && !p.isEvents) || p.withholdLocked() {
		return
	}
	if !p.committed {
		p.openLocked()
		p.ours = true
	}
	p.writeEventLocked(data)
}

func (p *postStream) Header() http.Header { return p.w.Header() }

func (p *postStream) WriteHeader(status int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.withholdLocked():
	case !p.committed:
		p.commitLocked()
		p.w.WriteHeader(status)
	case p.ours && !strings.HasPrefix(p.w.Header().Get("Content-Type"), "text/event-stream"):
		// mcp-go saw no notification of its own, so it answers with a
		// JSON body; the stream is already an event stream.
		p.reframe = true
	}
}

func (p *postStream) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.withholdLocked():
		return len(b), nil
	case p.reframe:
		return p.held.Write(b)
	case !p.committed:
		p.commitLocked()
	}
	return p.w.Write(b)
}

func (p *postStream) Flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if f, ok := p.w.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (p *postStream) Unwrap() http.ResponseWriter { return p.w }

// finish ends the response once mcp-go is done with it: a JSON answer
// held while the stream was an event stream goes out as its last event,
// and a cancelled call that nothing was written for gets its empty event
// stream.
func (p *postStream) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.withholdLocked():
	case p.reframe && p.held.Len() > 0:
		p.writeEventLocked(bytes.TrimSpace(p.held.Bytes()))
	}
}
