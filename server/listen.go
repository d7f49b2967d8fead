package server

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// A subscriptions/listen request (protocol 2026-07-28) must be answered by
// a stream whose first message is notifications/subscriptions/acknowledged.
// idemgate establishes nothing on such a stream (its tool list never
// changes; it offers no resources or prompts), so mcp-go v1.2.1 queues the
// acknowledgement on the request's session and returns the result at once.
// Its Streamable HTTP transport (server/streamable_http.go, handlePost)
// then has two consumers of that queue: the notification forwarder, which
// takes the acknowledgement off the channel and only then waits for the
// response lock, and the response path, which takes the lock, drains the
// (now empty) channel, closes done and writes the result. When the
// response path wins, the forwarder finds done closed and drops the
// acknowledgement it holds: the client sees the result alone — now and
// then on a quiet machine, in about a third of the requests under the race
// detector. Upstream this is mark3labs/mcp-go pull request 969 (open),
// which makes the forwarder the only consumer until it has exited. The
// same race can lose a progress notification sent just before a tool's
// result; that one is advisory (the result follows), so only the
// acknowledgement, which the specification requires, is waited for.
//
// Until mcp-go has that fix, awaitListenAcks holds each HTTP
// subscriptions/listen result back until the acknowledgement has been
// written: the request's after-hook waits for the first write to its
// response (a listenAck the session gate put on the request's context),
// which is the forwarder writing the acknowledgement. It waits at most
// listenAckWait, and not at all once the client has gone.

// listenAckWait bounds how long a subscriptions/listen result waits for
// its acknowledgement to be written: long enough for a loaded machine to
// schedule the forwarder, short enough that a stream mcp-go could not
// upgrade (nothing is ever written) is still answered promptly.
const listenAckWait = 2 * time.Second

// listenAck is closed (written) at the first write of a subscriptions/listen
// response.
type listenAck struct {
	once    sync.Once
	written chan struct{}
}

type listenAckKey struct{}

// awaitListenAcks adds to s the hook that holds a subscriptions/listen
// result until the acknowledgement before it has been written (see above).
// Requests without a listenAck on their context (stdio; HTTP requests the
// session gate did not see as subscriptions/listen) are not held.
func awaitListenAcks(s *mcpserver.MCPServer) {
	h := s.GetHooks()
	if h == nil {
		h = &mcpserver.Hooks{}
		mcpserver.WithHooks(h)(s)
	}
	h.AddAfterSubscriptionsListen(func(ctx context.Context, _ any, _ *mcp.SubscriptionsListenRequest, _ *mcp.SubscriptionsListenResult) {
		a, ok := ctx.Value(listenAckKey{}).(*listenAck)
		if !ok {
			return
		}
		t := time.NewTimer(listenAckWait)
		defer t.Stop()
		select {
		case <-a.written:
		case <-ctx.Done():
		case <-t.C:
		}
	})
}

// withListenAck returns w and r for a subscriptions/listen request: w
// reports its first write to the listenAck that r's context now carries.
func withListenAck(w http.ResponseWriter, r *http.Request) (http.ResponseWriter, *http.Request) {
	a := &listenAck{written: make(chan struct{})}
	return &listenAckWriter{ResponseWriter: w, ack: a}, r.WithContext(context.WithValue(r.Context(), listenAckKey{}, a))
}

// listenAckWriter passes a response on and closes its listenAck at the
// first write of a body.
type listenAckWriter struct {
	http.ResponseWriter
	ack *listenAck
}

func (w *listenAckWriter) Write(b []byte) (int, error) {
	n, err := w.ResponseWriter.Write(b)
	w.ack.once.Do(func() { close(w.ack.written) })
	return n, err
}

func (w *listenAckWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (w *listenAckWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
