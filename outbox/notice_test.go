package outbox

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestNoticeSinkPostsBodySigned: the notice's body goes out byte for byte,
// with the message id as Idempotency-Key and a signature the receiver can
// recompute; a body that is not JSON is refused for good.
func TestNoticeSinkPostsBodySigned(t *testing.T) {
	type got struct {
		body            string
		key, sig, ctype string
	}
	gotc := make(chan got, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		gotc <- got{string(b), r.Header.Get("Idempotency-Key"), r.Header.Get(SignatureHeader), r.Header.Get("Content-Type")}
	}))
	defer srv.Close()
	ns, err := NewNoticeSink(srv.URL, time.Second, "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Unix(1_800_000_000, 0)
	ns.Now = func() time.Time { return at }
	body := `{"type":"approval_requested","version":1}`
	if err := ns.Deliver(context.Background(), &Message{MessageID: "msg_1", Channel: ChannelApprovalNotice, Body: body}); err != nil {
		t.Fatal(err)
	}
	g := <-gotc
	if g.body != body || g.key != "msg_1" || g.ctype != "application/json" {
		t.Errorf("posted %q key %q type %q", g.body, g.key, g.ctype)
	}
	if want := Sign([]byte("s3cret"), at, []byte(body)); g.sig != want || !strings.HasPrefix(g.sig, "t=1800000000,v1=") {
		t.Errorf("signature %q, want %q", g.sig, want)
	}
	err = ns.Deliver(context.Background(), &Message{MessageID: "msg_2", Body: "not json"})
	if !IsPermanent(err) {
		t.Errorf("non-JSON body: %v, want a permanent error", err)
	}
}

// TestRouterByChannel: notices go to their sink, everything else to the
// default; a channel routed to an UnconfiguredSink fails (retryably)
// instead of reaching the default sink.
func TestRouterByChannel(t *testing.T) {
	def, notices := &recordingSink{}, &recordingSink{}
	r := &Router{Default: def, Channels: map[string]Sink{ChannelApprovalNotice: notices}}
	r.Deliver(context.Background(), &Message{MessageID: "a", Channel: "email"})
	r.Deliver(context.Background(), &Message{MessageID: "b", Channel: ChannelApprovalNotice})
	if len(def.ids) != 1 || def.ids[0] != "a" || len(notices.ids) != 1 || notices.ids[0] != "b" {
		t.Errorf("default got %v, notices got %v", def.ids, notices.ids)
	}
	r = &Router{Default: def, Channels: map[string]Sink{ChannelApprovalNotice: UnconfiguredSink{What: "[approvals] notify_webhook"}}}
	err := r.Deliver(context.Background(), &Message{MessageID: "c", Channel: ChannelApprovalNotice})
	if err == nil || IsPermanent(err) || !strings.Contains(err.Error(), "notify_webhook") {
		t.Errorf("unconfigured: %v", err)
	}
	if len(def.ids) != 1 {
		t.Errorf("a notice reached the default sink: %v", def.ids)
	}
}

type recordingSink struct{ ids []string }

func (s *recordingSink) Deliver(_ context.Context, m *Message) error {
	s.ids = append(s.ids, m.MessageID)
	return nil
}

func (s *recordingSink) Flush() error { return nil }
