package outbox

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// ChannelApprovalNotice is the channel of the messages that tell a
// tenant's approvers an approval waits (docs/approvals.md, "Reaching approvers"). Its
// Body is the notice's JSON document, POSTed as is by a NoticeSink; the
// notification sinks (DirSink, WebhookSink) never see one when the
// deliverer's sink is a Router.
const ChannelApprovalNotice = "approval_notice"

// Router is a Sink that hands each message to the sink of its channel,
// and a message of any other channel to Default. It is as idempotent as
// the sinks it routes to.
type Router struct {
	Default  Sink
	Channels map[string]Sink
}

// Deliver implements Sink.
func (r *Router) Deliver(ctx context.Context, m *Message) error {
	if s, ok := r.Channels[m.Channel]; ok {
		return s.Deliver(ctx, m)
	}
	return r.Default.Deliver(ctx, m)
}

// Flush implements Sink: it flushes every sink it routes to.
func (r *Router) Flush() error {
	errs := []error{r.Default.Flush()}
	for _, s := range r.Channels {
		errs = append(errs, s.Flush())
	}
	return errors.Join(errs...)
}

// UnconfiguredSink stands for a destination this process was not given:
// every delivery fails, worth retrying, with an error saying what to
// configure. A message queued by a process that had the destination, and
// picked up by one that has not, is so kept for (or dead-lettered
// visibly until) a process that can deliver it, never sent elsewhere.
type UnconfiguredSink struct {
	// What names the missing setting, e.g. "[approvals] notify_webhook".
	What string
}

// Deliver implements Sink.
func (u UnconfiguredSink) Deliver(context.Context, *Message) error {
	return fmt.Errorf("this process has no %s configured to deliver this message; configure it the same way in every process that uses this ledger", u.What)
}

// Flush implements Sink.
func (UnconfiguredSink) Flush() error { return nil }

// SignatureHeader is the header that carries a NoticeSink's signature.
const SignatureHeader = "Idemgate-Signature"

// NoticeSink POSTs each message's Body — a JSON document — as is to one
// URL, with the message id as Idempotency-Key, over the WebhookSink's
// transport and with its answer classification (2xx delivered; 4xx other
// than 408/409/425/429 refused, dead-lettered; anything else retried).
//
// With a secret, each request is signed:
//
//	Idemgate-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>.<body>")>
//
// so a receiver can check that the notice comes from this server and is
// recent; the time is that of the attempt, so each retry has its own.
type NoticeSink struct {
	w      *WebhookSink
	secret []byte
	// Now is the clock of the signature's time (default time.Now).
	Now func() time.Time
}

// NewNoticeSink returns a sink that POSTs to rawURL (as NewWebhookSink
// accepts it), signing with secret when it is not empty.
func NewNoticeSink(rawURL string, timeout time.Duration, secret string) (*NoticeSink, error) {
	w, err := NewWebhookSink(rawURL, timeout)
	if err != nil {
		return nil, err
	}
	return &NoticeSink{w: w, secret: []byte(secret), Now: time.Now}, nil
}

// WrapTransport wraps the sink's HTTP transport (WebhookSink.WrapTransport).
func (n *NoticeSink) WrapTransport(wrap func(http.RoundTripper) http.RoundTripper) {
	n.w.WrapTransport(wrap)
}

// Deliver implements Sink.
func (n *NoticeSink) Deliver(ctx context.Context, m *Message) error {
	body := []byte(m.Body)
	if !json.Valid(body) {
		return &PermanentError{Err: fmt.Errorf("message %s: its body is not a JSON document", m.MessageID)}
	}
	var header http.Header
	if len(n.secret) > 0 {
		now := time.Now
		if n.Now != nil {
			now = n.Now
		}
		header = http.Header{SignatureHeader: {Sign(n.secret, now(), body)}}
	}
	return n.w.post(ctx, m.MessageID, body, header)
}

// Flush implements Sink: a 2xx answer is the receiver's durability promise.
func (n *NoticeSink) Flush() error { return nil }

// Sign is the Idemgate-Signature value of body sent at t with secret.
func Sign(secret []byte, t time.Time, body []byte) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(ts))
	mac.Write([]byte("."))
	mac.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}
