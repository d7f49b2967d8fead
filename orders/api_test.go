package orders

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// TestOrderAPIClassification: every way a call can fail maps to the class
// that decides whether the operation is retryable, failed or unknown (and,
// when definitive, to its error code), and each request reaches the API
// exactly once (no hidden transport retry). How tools turns each class
// into the operation's state is TestOutcomeOfClasses in tools.
func TestOrderAPIClassification(t *testing.T) {
	tests := []struct {
		name    string
		handler http.HandlerFunc
		class   string // "" means success
		code    string // the code of a definitive failure
	}{
		{"created", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(201)
			w.Write([]byte(`{"order_id":"o1","version":1,"status":"placed"}`))
		}, "", ""},
		{"400 is definitive", status(400), Definitive, "downstream_error"},
		{"404 is definitive", status(404), Definitive, "not_found"},
		{"412 is a stale version", status(412), Definitive, "precondition_failed"},
		{"422 is definitive", status(422), Definitive, "downstream_error"},
		{"429 was not acted on", status(429), NotSent, ""},
		{"409 in progress is indeterminate", status(409), Indeterminate, ""},
		{"500 is indeterminate", status(500), Indeterminate, ""},
		{"503 is indeterminate", status(503), Indeterminate, ""},
		{"garbled 2xx is indeterminate", func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(`{"order_id":`)) }, Indeterminate, ""},
		{"timeout after the request was written", func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(400 * time.Millisecond)
		}, Indeterminate, ""},
		{"connection reset after the request", func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.(*net.TCPConn).SetLinger(0)
				conn.Close()
			}
		}, Indeterminate, ""},
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
			api, err := NewAPI(srv.URL, 200*time.Millisecond, false)
			if err != nil {
				t.Fatal(err)
			}
			o, err := api.Create(context.Background(), "t1", "k1", CreateRequest{CustomerID: "c"})
			var ae *APIError
			switch {
			case tt.class == "" && err != nil:
				t.Fatalf("Create error %v, want success", err)
			case tt.class != "" && (!errors.As(err, &ae) || ae.Class != tt.class):
				t.Fatalf("Create error %v, want class %s", err, tt.class)
			}
			if tt.class == "" && (o == nil || o.OrderID != "o1") {
				t.Errorf("Create = %+v, want order o1", o)
			}
			if tt.class == Definitive && string(ae.Code) != tt.code {
				t.Errorf("definitive failure code %q, want %q", ae.Code, tt.code)
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
	api, err := NewAPI("http://"+addr, time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = api.Create(context.Background(), "t1", "k1", CreateRequest{})
	var ae *APIError
	if !errors.As(err, &ae) || ae.Class != NotSent {
		t.Fatalf("Create to a closed port: %v, want class %s", err, NotSent)
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
	api, _ := NewAPI(srv.URL, time.Second, false)
	ctx := context.Background()
	if o, err := api.Lookup(ctx, "t1", "found"); err != nil || o.OrderID != "o9" {
		t.Errorf("Lookup(found) = %+v, %v", o, err)
	}
	if _, err := api.Lookup(ctx, "t1", "absent"); !errors.Is(err, ErrAbsent) {
		t.Errorf("Lookup(absent) error %v, want ErrAbsent", err)
	}
	if _, err := api.Lookup(ctx, "t1", "other"); err == nil || errors.Is(err, ErrAbsent) {
		t.Errorf("Lookup with the API down = %v, want an error that is not ErrAbsent", err)
	}
}

func TestNewAPIRefusesBadURLs(t *testing.T) {
	for _, u := range []string{"", "orders", "ftp://x", "http://", "://x"} {
		if _, err := NewAPI(u, time.Second, false); err == nil {
			t.Errorf("NewAPI(%q) accepted", u)
		}
	}
}

func TestRetryAfterParsing(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		header string
		want   time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"-3", 0},
		{"soon", 0},
		{"7", 7 * time.Second},
		{" 120 ", 2 * time.Minute},
		{"999999999999", maxRetryAfter},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Minute).Format(http.TimeFormat), 0},
	}
	for _, tt := range tests {
		if got := retryAfter(tt.header, now); got != tt.want {
			t.Errorf("retryAfter(%q) = %v, want %v", tt.header, got, tt.want)
		}
	}
}
