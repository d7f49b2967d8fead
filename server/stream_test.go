package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestAcceptsEventStream(t *testing.T) {
	for _, tc := range []struct {
		accept []string
		want   bool
	}{
		{[]string{"application/json, text/event-stream"}, true},
		{[]string{"application/json", "text/event-stream"}, true},
		{[]string{"text/*"}, true},
		{[]string{"*/*;q=0.1"}, true},
		{[]string{"application/json"}, false},
		{[]string{"application/json, text/event-stream;q=0"}, false},
		{[]string{"text/event-stream;q=0.000"}, false},
		{nil, false},
	} {
		if got := acceptsEventStream(tc.accept); got != tc.want {
			t.Errorf("acceptsEventStream(%q) = %v, want %v", tc.accept, got, tc.want)
		}
	}
}

// answerJSON writes an answer as mcp-go does when it saw no notification
// of its own: a JSON body.
func answerJSON(w http.ResponseWriter, body string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	w.Write([]byte(body + "\n"))
}

func newTestPostStream(accept string) (*postStream, *httptest.ResponseRecorder, context.Context) {
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/mcp", nil)
	r.Header.Set("Accept", accept)
	p, r := newPostStream(rec, r)
	return p, rec, r.Context()
}

// TestPostStream: a call's notification opens an event stream that its
// JSON answer then ends as an event; a cancelled call's answer is
// dropped; a client that accepts no event stream gets the answer alone.
func TestPostStream(t *testing.T) {
	const answer = `{"jsonrpc":"2.0","id":3,"result":{}}`
	n := progressNotification("tok", 1, 2, "waiting")

	t.Run("progress then answer", func(t *testing.T) {
		p, rec, ctx := newTestPostStream("application/json, text/event-stream")
		requestStreamOf(ctx).notify(ctx, n)
		answerJSON(p, answer)
		p.finish()
		body := rec.Body.String()
		if ct := rec.Result().Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Errorf("Content-Type %q", ct)
		}
		want := "event: message\ndata: " + `{"jsonrpc":"2.0","method":"notifications/progress","params":{"message":"waiting","progress":1,"progressToken":"tok","total":2}}` + "\n\n" +
			"event: message\ndata: " + answer + "\n\n"
		if body != want {
			t.Errorf("body\n%q\nwant\n%q", body, want)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		p, rec, ctx := newTestPostStream("application/json, text/event-stream")
		st := requestStreamOf(ctx)
		handler, cancel := context.WithCancel(ctx)
		cancel() // notifications/cancelled
		st.settle(handler)
		st.notify(handler, n)
		answerJSON(p, answer)
		p.finish()
		if ct := rec.Result().Header.Get("Content-Type"); rec.Code != 200 || ct != "text/event-stream" || rec.Body.Len() != 0 {
			t.Errorf("%d %q %q, want an empty event stream", rec.Code, ct, rec.Body.String())
		}
	})
	t.Run("no event stream accepted", func(t *testing.T) {
		p, rec, ctx := newTestPostStream("application/json")
		requestStreamOf(ctx).notify(ctx, n)
		answerJSON(p, answer)
		p.finish()
		if ct := rec.Result().Header.Get("Content-Type"); ct != "application/json" || strings.TrimSpace(rec.Body.String()) != answer {
			t.Errorf("%q %q, want the JSON answer alone", ct, rec.Body.String())
		}
	})
}
