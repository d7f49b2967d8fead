package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// gatewayRequest is one request as the fake gateway saw it.
type gatewayRequest struct {
	Method, Key, ContentType string
	Payload                  deliveryPayload
	DecodeErr                error
}

// gatewayAnswer is what the fake gateway does with one request: answer
// Status, or with Lost, store the message and then drop the connection
// without answering (the response is lost on the way back).
type gatewayAnswer struct {
	Status int
	Lost   bool
	Body   string
}

// idemGateway is a fake notification gateway that behaves as a real
// idempotent one: it stores at most one message per Idempotency-Key, and
// answers a repeated key that it already stored with 200 and no new
// message. Script decides the answer to the n-th request (0-based); past
// its end, or without it, requests are accepted.
type idemGateway struct {
	t   *testing.T
	srv *httptest.Server

	mu       sync.Mutex
	script   []gatewayAnswer
	requests []gatewayRequest
	stored   map[string]deliveryPayload // Idempotency-Key → the message stored
	accepted int                        // 2xx answers given
	conns    int                        // connections opened
}

func newIdemGateway(t *testing.T, script ...gatewayAnswer) *idemGateway {
	t.Helper()
	g := &idemGateway{t: t, script: script, stored: map[string]deliveryPayload{}}
	g.srv = httptest.NewUnstartedServer(http.HandlerFunc(g.serve))
	g.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			g.mu.Lock()
			g.conns++
			g.mu.Unlock()
		}
	}
	g.srv.Start()
	t.Cleanup(g.srv.Close)
	return g
}

func (g *idemGateway) serve(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	req := gatewayRequest{Method: r.Method, Key: r.Header.Get("Idempotency-Key"), ContentType: r.Header.Get("Content-Type")}
	req.DecodeErr = json.Unmarshal(raw, &req.Payload)
	g.mu.Lock()
	n := len(g.requests)
	g.requests = append(g.requests, req)
	ans := gatewayAnswer{Status: http.StatusOK}
	if n < len(g.script) {
		ans = g.script[n]
	}
	store := ans.Lost || (ans.Status >= 200 && ans.Status <= 299)
	if store && req.Key != "" {
		if _, dup := g.stored[req.Key]; !dup {
			g.stored[req.Key] = req.Payload
		}
	}
	if !ans.Lost && store {
		g.accepted++
	}
	g.mu.Unlock()
	if ans.Lost {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			g.t.Errorf("hijack: %v", err)
			return
		}
		conn.Close()
		return
	}
	w.WriteHeader(ans.Status)
	io.WriteString(w, ans.Body)
}

func (g *idemGateway) Requests() []gatewayRequest {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]gatewayRequest(nil), g.requests...)
}

func (g *idemGateway) Stored() map[string]deliveryPayload {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]deliveryPayload, len(g.stored))
	for k, v := range g.stored {
		out[k] = v
	}
	return out
}

func (g *idemGateway) Accepted() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.accepted
}

func (g *idemGateway) Conns() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.conns
}

func mustWebhook(t *testing.T, url string, timeout time.Duration) *WebhookSink {
	t.Helper()
	w, err := NewWebhookSink(url, timeout)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func testMessage(step string) *Message {
	m := &Message{Tenant: "t1", OperationKey: "op-1", Step: step, Channel: "email", To: []string{"a@example.com", "b@example.com"},
		Subject: "Order confirmed", Body: "Your order ord_1 is confirmed.", OrderID: "ord_1"}
	m.MessageID = MessageID(m.Tenant, m.OperationKey, m.Step)
	return m
}

func TestNewWebhookSinkValidatesURL(t *testing.T) {
	for _, tc := range []struct {
		name, url string
		ok        bool
	}{
		{"https", "https://gateway.example.com/hooks/notify", true},
		{"http with port", "http://127.0.0.1:8080/notify?token=x", true},
		{"no scheme", "gateway.example.com/notify", false},
		{"ftp", "ftp://gateway.example.com/notify", false},
		{"no host", "https:///notify", false},
		{"port only", "http://:8080/notify", false},
		{"empty", "", false},
		{"unparseable", "http://[::1/notify", false},
		{"fragment", "https://gateway.example.com/notify#x", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, err := NewWebhookSink(tc.url, time.Second)
			if tc.ok && (err != nil || w == nil) {
				t.Fatalf("NewWebhookSink(%q) = %v, %v; want a sink", tc.url, w, err)
			}
			if !tc.ok && err == nil {
				t.Fatalf("NewWebhookSink(%q) accepted the URL, want an error", tc.url)
			}
		})
	}
}

// The request carries the message as JSON, the message id as the
// Idempotency-Key, and a JSON content type.
func TestWebhookSinkRequest(t *testing.T) {
	g := newIdemGateway(t)
	w := mustWebhook(t, g.srv.URL+"/notify", 5*time.Second)
	m := testMessage("confirmation")
	if err := w.Deliver(context.Background(), m); err != nil {
		t.Fatalf("Deliver: %v", err)
	}
	if err := w.Flush(); err != nil {
		t.Fatalf("Flush: %v", err)
	}
	reqs := g.Requests()
	if len(reqs) != 1 {
		t.Fatalf("gateway saw %d requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r.Method != http.MethodPost || r.Key != m.MessageID || r.ContentType != "application/json" || r.DecodeErr != nil {
		t.Errorf("request = %s key=%q content-type=%q decode=%v; want POST key=%q application/json", r.Method, r.Key, r.ContentType, r.DecodeErr, m.MessageID)
	}
	want := deliveryPayload{MessageID: m.MessageID, Channel: "email", To: m.To, Subject: m.Subject, Body: m.Body,
		OrderID: "ord_1", OperationKey: "op-1", Step: "confirmation"}
	got, _ := json.Marshal(r.Payload)
	wantJSON, _ := json.Marshal(want)
	if string(got) != string(wantJSON) {
		t.Errorf("payload = %s\nwant %s", got, wantJSON)
	}
}

// How each answer of the gateway is classified.
func TestWebhookSinkClassifiesAnswers(t *testing.T) {
	const (
		delivered = "delivered"
		transient = "transient"
		permanent = "permanent"
	)
	for _, tc := range []struct {
		name   string
		answer gatewayAnswer
		want   string
	}{
		{"200", gatewayAnswer{Status: 200}, delivered},
		{"201", gatewayAnswer{Status: 201}, delivered},
		{"202", gatewayAnswer{Status: 202}, delivered},
		{"204", gatewayAnswer{Status: 204}, delivered},
		{"400", gatewayAnswer{Status: 400, Body: `{"error":"bad recipient"}`}, permanent},
		{"401", gatewayAnswer{Status: 401}, permanent},
		{"403", gatewayAnswer{Status: 403}, permanent},
		{"404", gatewayAnswer{Status: 404}, permanent},
		{"410", gatewayAnswer{Status: 410}, permanent},
		{"413", gatewayAnswer{Status: 413}, permanent},
		{"422", gatewayAnswer{Status: 422}, permanent},
		{"408", gatewayAnswer{Status: 408}, transient},
		{"409", gatewayAnswer{Status: 409}, transient},
		{"425", gatewayAnswer{Status: 425}, transient},
		{"429", gatewayAnswer{Status: 429}, transient},
		{"500", gatewayAnswer{Status: 500}, transient},
		{"502", gatewayAnswer{Status: 502}, transient},
		{"503", gatewayAnswer{Status: 503}, transient},
		{"504", gatewayAnswer{Status: 504}, transient},
		{"302 not followed", gatewayAnswer{Status: 302}, transient},
		{"connection dropped", gatewayAnswer{Lost: true}, transient},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newIdemGateway(t, tc.answer)
			w := mustWebhook(t, g.srv.URL, 5*time.Second)
			err := w.Deliver(context.Background(), testMessage("notification"))
			got := delivered
			if err != nil {
				got = transient
				if IsPermanent(err) {
					got = permanent
				}
			}
			if got != tc.want {
				t.Fatalf("answer %+v: Deliver = %v (%s), want %s", tc.answer, err, got, tc.want)
			}
			if n := len(g.Requests()); n != 1 {
				t.Errorf("gateway saw %d requests, want 1 (no redirect followed, no transport retry)", n)
			}
			if tc.answer.Status >= 300 {
				var se *WebhookStatusError
				if !errors.As(err, &se) || se.StatusCode != tc.answer.Status {
					t.Errorf("error %v does not carry status %d", err, tc.answer.Status)
				}
				if !strings.Contains(err.Error(), tc.name[:3]) {
					t.Errorf("error %q does not name the status", err)
				}
			}
		})
	}
}

// A gateway that does not answer in time is a transient failure, after
// about the timeout.
func TestWebhookSinkTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	w := mustWebhook(t, srv.URL, 100*time.Millisecond)
	start := time.Now()
	err := w.Deliver(context.Background(), testMessage("notification"))
	if err == nil || IsPermanent(err) {
		t.Fatalf("Deliver to a silent gateway = %v, want a transient error", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Deliver took %v with a 100ms timeout", d)
	}
}

// A refused connection is transient, and the error shows the gateway's
// host but not its path or query, which may hold a secret.
func TestWebhookSinkErrorHidesURLSecrets(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	w := mustWebhook(t, "http://"+addr+"/hooks/s3cr3t-path?token=s3cr3t-query", time.Second)
	err = w.Deliver(context.Background(), testMessage("notification"))
	if err == nil || IsPermanent(err) {
		t.Fatalf("Deliver to a closed port = %v, want a transient error", err)
	}
	if strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("error %q shows the URL's secret parts", err)
	}
	if !strings.Contains(err.Error(), addr) {
		t.Errorf("error %q does not name the gateway host %s", err, addr)
	}
}

// A huge error body is read only up to the bound, and the error quotes a
// short excerpt of it.
func TestWebhookSinkBoundsResponseBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		chunk := []byte(strings.Repeat("x", 32<<10))
		for range 1 << 10 { // 32 MiB, if anyone read it all
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	w := mustWebhook(t, srv.URL, 5*time.Second)
	err := w.Deliver(context.Background(), testMessage("notification"))
	var se *WebhookStatusError
	if !errors.As(err, &se) || se.StatusCode != 503 {
		t.Fatalf("Deliver = %v, want a 503 status error", err)
	}
	if len(se.Body) > 200 {
		t.Errorf("error body excerpt is %d bytes, want at most 200", len(se.Body))
	}
}

// Every attempt goes over its own connection, so the transport never
// replays a request by itself: when the gateway drops the connection of
// the second request (which would be a reused connection with
// keep-alives), Deliver fails and the gateway has seen exactly two
// requests, not a silent third.
func TestWebhookSinkNoTransportRetry(t *testing.T) {
	g := newIdemGateway(t, gatewayAnswer{Status: 200}, gatewayAnswer{Lost: true})
	w := mustWebhook(t, g.srv.URL, 5*time.Second)
	if err := w.Deliver(context.Background(), testMessage("first")); err != nil {
		t.Fatalf("first Deliver: %v", err)
	}
	if err := w.Deliver(context.Background(), testMessage("second")); err == nil || IsPermanent(err) {
		t.Fatalf("second Deliver = %v, want a transient error", err)
	}
	if n := len(g.Requests()); n != 2 {
		t.Errorf("gateway saw %d requests, want 2", n)
	}
	if n := g.Conns(); n != 2 {
		t.Errorf("gateway saw %d connections for 2 requests, want one each", n)
	}
}
