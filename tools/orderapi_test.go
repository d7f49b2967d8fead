package tools

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"idemgate/ledger"
)

// TestOrderAPIClassification: every way a call can fail maps to the class
// that decides whether the operation is retryable, failed or unknown, and
// each request reaches the API exactly once (no hidden transport retry).
func TestOrderAPIClassification(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		class   string // "" means success
		state   ledger.State
		code    string
	}{
		{"created", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(201)
			w.Write([]byte(`{"order_id":"o1","version":1,"status":"placed"}`))
		}, "", ledger.StateSucceeded, ""},
		{"400 is definitive", status(400), Definitive, ledger.StateFailed, "downstream_error"},
		{"404 is definitive", status(404), Definitive, ledger.StateFailed, "not_found"},
		{"412 is a stale version", status(412), Definitive, ledger.StateFailed, "precondition_failed"},
		{"422 is definitive", status(422), Definitive, ledger.StateFailed, "downstream_error"},
		{"429 was not acted on", status(429), NotSent, ledger.StateRetryable, "downstream_error"},
		{"409 in progress is indeterminate", status(409), Indeterminate, ledger.StateUnknown, "outcome_unknown"},
		{"500 is indeterminate", status(500), Indeterminate, ledger.StateUnknown, "outcome_unknown"},
		{"503 is indeterminate", status(503), Indeterminate, ledger.StateUnknown, "outcome_unknown"},
		{"garbled 2xx is indeterminate", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"order_id":`)) }, Indeterminate, ledger.StateUnknown, "outcome_unknown"},
		{"timeout after the request was written", func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(400 * time.Millisecond)
		}, Indeterminate, ledger.StateUnknown, "outcome_unknown"},
		{"connection reset after the request", func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.(*net.TCPConn).SetLinger(0)
				conn.Close()
			}
		}, Indeterminate, ledger.StateUnknown, "outcome_unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hits atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				hits.Add(1)
				if got := r.Header.Get("Idempotency-Key"); got != "t1:k1" {
					t.Errorf("Idempotency-Key = %q, want t1:k1", got)
				}
				tt.handler(w, r)
			}))
			defer srv.Close()
			api, err := NewOrderAPI(srv.URL, 200*time.Millisecond, false)
			if err != nil {
				t.Fatal(err)
			}
			o, err := api.Create(context.Background(), "t1", "k1", createOrderArgs{CustomerID: "c"})
			var ae *APIError
			switch {
			case tt.class == "" && err != nil:
				t.Fatalf("Create error %v, want success", err)
			case tt.class != "" && (!errors.As(err, &ae) || ae.Class != tt.class):
				t.Fatalf("Create error %v, want class %s", err, tt.class)
			}
			out := outcomeOf(o, err, "order")
			if out.State != tt.state || (tt.code != "" && (out.Error == nil || out.Error.Code != tt.code)) {
				t.Errorf("outcome %s %+v, want %s %s", out.State, out.Error, tt.state, tt.code)
			}
			if n := hits.Load(); n != 1 {
				t.Errorf("the API saw %d requests, want exactly 1 (no hidden retries)", n)
			}
		})
	}
}

func status(code int) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) { http.Error(w, http.StatusText(code), code) }
}

func TestOrderAPIRefusedConnectionIsNotSent(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens here now
	api, err := NewOrderAPI("http://"+addr, time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = api.Create(context.Background(), "t1", "k1", createOrderArgs{})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Class != NotSent {
		t.Fatalf("Create to a closed port: %v, want class %s", err, NotSent)
	}
	if out := outcomeOf(nil, err, "order"); out.State != ledger.StateRetryable {
		t.Errorf("outcome %s, want retryable", out.State)
	}
}

func TestOrderAPILookup(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("idempotency_key") {
		case "t1:found":
			w.Write([]byte(`{"order_id":"o9","version":2,"status":"placed"}`))
		case "t1:absent":
			http.NotFound(w, r)
		default:
			http.Error(w, "down", http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	api, _ := NewOrderAPI(srv.URL, time.Second, false)
	ctx := context.Background()
	if o, err := api.Lookup(ctx, "t1", "found"); err != nil || o.OrderID != "o9" {
		t.Errorf("Lookup(found) = %+v, %v", o, err)
	}
	if _, err := api.Lookup(ctx, "t1", "absent"); !errors.Is(err, errAbsent) {
		t.Errorf("Lookup(absent) error %v, want errAbsent", err)
	}
	if _, err := api.Lookup(ctx, "t1", "other"); err == nil || errors.Is(err, errAbsent) {
		t.Errorf("Lookup with the API down = %v, want an error that is not errAbsent", err)
	}
}

func TestNewOrderAPIRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "orders", "ftp://x", "http://", "://x"} {
		if _, err := NewOrderAPI(u, time.Second, false); err == nil {
			t.Errorf("NewOrderAPI(%q) accepted", u)
		}
	}
}
