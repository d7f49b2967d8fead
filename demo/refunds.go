package demo

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
)

// refundsAPI is the demo's own HTTP API behind a declared tool: it makes
// a refund once per Idempotency-Key, finds one by its key, and loses the
// reply to the first refund it makes (the connection is cut after the
// refund is recorded), as a network does.
type refundsAPI struct {
	mu    sync.Mutex
	byKey map[string]map[string]any
	made  int
	srv   *http.Server
	url   string
}

func startRefundsAPI() (*refundsAPI, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	a := &refundsAPI{byKey: map[string]map[string]any{}, url: "http://" + ln.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /refunds", func(w http.ResponseWriter, r *http.Request) {
		var in map[string]any
		key := r.Header.Get("Idempotency-Key")
		if key == "" || json.NewDecoder(r.Body).Decode(&in) != nil {
			http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
			return
		}
		a.mu.Lock()
		res, seen := a.byKey[key]
		if !seen {
			a.made++
			res = map[string]any{"id": fmt.Sprintf("re_%d", a.made), "payment_id": in["payment_id"], "amount_minor": in["amount_minor"], "currency": in["currency"]}
			a.byKey[key] = res
		}
		first := a.made == 1 && !seen
		a.mu.Unlock()
		if first { // the refund is made; its reply is lost
			if hj, ok := w.(http.Hijacker); ok {
				if conn, _, err := hj.Hijack(); err == nil {
					conn.Close()
					return
				}
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		json.NewEncoder(w).Encode(res)
	})
	mux.HandleFunc("GET /refunds", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		res, ok := a.byKey[r.URL.Query().Get("idempotency_key")]
		a.mu.Unlock()
		if !ok {
			http.Error(w, `{"error":"no refund for this key"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(res)
	})
	a.srv = &http.Server{Handler: mux}
	go a.srv.Serve(ln) // ends when Close closes the listener
	return a, nil
}

func (a *refundsAPI) refunds() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.made
}

func (a *refundsAPI) Close() { a.srv.Close() }

// declaration is the demo's configuration: create_refund over the
// refunds API at url.
func declaration(url string) string {
	return `# The demo's configuration: one declared tool over the demo's refunds API.
[[tools]]
name = "create_refund"
title = "Refund a payment"
description = "Refunds part or all of a payment."
noun = "refund"
destructive = false
id = "/id"
safe_retry = true
timeout = "2s"
input_schema = '''
{"type": "object", "additionalProperties": false, "required": ["payment_id", "amount_minor", "currency"],
 "properties": {
  "payment_id": {"type": "string", "maxLength": 40},
  "amount_minor": {"type": "integer", "minimum": 1, "maximum": 100000000},
  "currency": {"type": "string", "enum": ["EUR", "USD"]}}}
'''

[tools.request]
method = "POST"
url = "` + url + `/refunds"

[tools.operation_key]
header = "Idempotency-Key"

[tools.lookup]
url = "` + url + `/refunds?idempotency_key={operation_key}"

[tools.policy]
amount = "/amount_minor"
currency = "/currency"
approval_threshold_minor = 50000
`
}
