package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"
)

// webhookMaxResponse bounds how much of a gateway's response body is read.
const webhookMaxResponse = 64 << 10

// PermanentError is a delivery failure that retrying cannot fix: the
// destination refused the message itself. The deliverer dead-letters a
// message whose delivery fails with one (errors.As finds it through
// wrapping) instead of retrying it. Any Sink may return one.
type PermanentError struct {
	Err error
}

func (e *PermanentError) Error() string { return "permanent: " + e.Err.Error() }

func (e *PermanentError) Unwrap() error { return e.Err }

// IsPermanent reports whether err is, or wraps, a *PermanentError.
func IsPermanent(err error) bool {
	var pe *PermanentError
	return errors.As(err, &pe)
}

// WebhookStatusError is a gateway answer other than 2xx. It is returned
// as is when the status is worth retrying, and inside a *PermanentError
// when it is a refusal.
type WebhookStatusError struct {
	StatusCode int
	Status     string // e.g. "503 Service Unavailable"
	Body       string // the start of the response body, for the operator
}

func (e *WebhookStatusError) Error() string {
	s := "webhook gateway answered HTTP " + e.Status
	if e.Body != "" {
		s += ": " + e.Body
	}
	return s
}

// webhookPermanent reports whether an HTTP status is a refusal of the
// message itself: a 4xx, except those that say "not now" (408 Request
// Timeout, 409 Conflict — e.g. the same Idempotency-Key still in flight —,
// 425 Too Early, 429 Too Many Requests).
func webhookPermanent(code int) bool {
	if code < 400 || code > 499 {
		return false
	}
	switch code {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests:
		return false
	}
	return true
}

// WebhookSink POSTs each message as JSON to one gateway URL, with the
// message id as the Idempotency-Key header; the gateway is expected to
// store one message per key, which makes redelivery harmless.
//
// Every request goes over a fresh connection (keep-alives off, HTTP/1.1
// only), so Go's transport never replays a request on its own — it would
// for a request carrying Idempotency-Key that failed on a reused
// connection — and every attempt is the deliverer's, counted in
// Message.Attempts. Redirects are not followed: a redirected POST may be
// turned into a GET that "succeeds" without delivering anything.
type WebhookSink struct {
	url    string
	shown  string // the URL as errors may show it: scheme and host only
	client *http.Client
}

// NewWebhookSink returns a sink that POSTs to rawURL, an absolute http or
// https URL with a host. timeout bounds one delivery, from connecting to
// reading the answer (10s when <= 0).
func NewWebhookSink(rawURL string, timeout time.Duration) (*WebhookSink, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("webhook URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("webhook URL %q: scheme must be http or https", redactURL(u))
	}
	if u.Hostname() == "" {
		return nil, fmt.Errorf("webhook URL %q: no host", redactURL(u))
	}
	if u.Fragment != "" {
		return nil, fmt.Errorf("webhook URL %q: has a fragment", redactURL(u))
	}
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.DisableKeepAlives = true
	tr.ForceAttemptHTTP2 = false
	tr.Protocols = new(http.Protocols)
	tr.Protocols.SetHTTP1(true)
	tr.ResponseHeaderTimeout = timeout
	return &WebhookSink{
		url:   u.String(),
		shown: redactURL(u),
		client: &http.Client{
			Transport:     tr,
			Timeout:       timeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}, nil
}

// WrapTransport wraps the sink's HTTP transport with wrap (a tracing
// transport: see telemetry.Provider.Transport). Call it before the first
// delivery.
func (w *WebhookSink) WrapTransport(wrap func(http.RoundTripper) http.RoundTripper) {
	w.client.Transport = wrap(w.client.Transport)
}

// redactURL keeps the scheme and host of u: paths and queries of webhook
// URLs often carry secrets, and delivery errors are shown to agents.
func redactURL(u *url.URL) string {
	return (&url.URL{Scheme: u.Scheme, Host: u.Host}).String()
}

// Deliver implements Sink. nil means the gateway answered 2xx; a
// *PermanentError means it refused the message; any other error is worth
// retrying.
func (w *WebhookSink) Deliver(ctx context.Context, m *Message) error {
	b, err := json.Marshal(payloadOf(m))
	if err != nil {
		return &PermanentError{Err: fmt.Errorf("encode message: %w", err)}
	}
	return w.post(ctx, m.MessageID, b, nil)
}

// post POSTs the JSON body with idempotencyKey, and the further headers
// (nil: none), classifying the answer as Deliver documents.
func (w *WebhookSink) post(ctx context.Context, idempotencyKey string, body []byte, header http.Header) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url, bytes.NewReader(body))
	if err != nil {
		return &PermanentError{Err: fmt.Errorf("webhook request: %w", err)}
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", idempotencyKey)
	req.Header.Set("User-Agent", "idemgate-webhook/1")
	resp, err := w.client.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			// Show the host only: the URL's path or query may be a secret.
			err = &url.Error{Op: ue.Op, URL: w.shown, Err: ue.Err}
		}
		return fmt.Errorf("webhook: %w", err)
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, webhookMaxResponse))
	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		return nil
	}
	serr := &WebhookStatusError{StatusCode: resp.StatusCode, Status: resp.Status, Body: webhookSnippet(answer, 200)}
	if serr.Status == "" {
		serr.Status = fmt.Sprint(resp.StatusCode)
	}
	if loc := resp.Header.Get("Location"); resp.StatusCode >= 300 && resp.StatusCode <= 399 && loc != "" {
		serr.Body = strings.TrimSpace("redirected (not followed); " + serr.Body)
	}
	if webhookPermanent(resp.StatusCode) {
		return &PermanentError{Err: serr}
	}
	return serr
}

// Flush implements Sink: a 2xx answer is the gateway's durability promise,
// so there is nothing left to flush.
func (w *WebhookSink) Flush() error { return nil }

// webhookSnippet is the start of b as one line of valid UTF-8, at most n bytes.
func webhookSnippet(b []byte, n int) string {
	if len(b) > n {
		// Cut at a character boundary, not inside a character.
		k := n
		for k > n-utf8.UTFMax && k > 0 && !utf8.RuneStart(b[k]) {
			k--
		}
		b = b[:k]
	}
	return strings.Join(strings.Fields(strings.ToValidUTF8(string(b), "?")), " ")
}
