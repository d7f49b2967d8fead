package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Two fake APIs behind declared tools. Both really commit (the effect is
// counted before any fault strikes) and really lose replies (the
// connection reset, a 500 after the commit, an answer later than the
// gate's timeout, a 2xx that is not JSON), as the order API's fake does.

// declFault is one queued fault of a fake declared API's writes.
type declFault string

const (
	fResetAfterCommit declFault = "reset_after_commit"
	f500BeforeCommit  declFault = "500_before_commit"
	f500AfterCommit   declFault = "500_after_commit"
	fTimeoutAfter     declFault = "timeout_after_commit" // answers after the declared 1s timeout
	f409              declFault = "409"
	f429              declFault = "429"
	fGarbage2xx       declFault = "unreadable_2xx"
)

// declAPI is the state the two fakes share: queued write faults, a
// lookup outage switch, the bearer token it requires ("" none), and what
// was committed.
type declAPI struct {
	t      testing.TB
	token  string
	mu     sync.Mutex
	faults []declFault
	down   bool // lookups answer 503
	posts  int  // write requests that reached the API
	// effects counts what was committed, by the operation's downstream
	// key (payments: Idempotency-Key; tickets: client_reference).
	effects map[string]int
	byKey   map[string]map[string]any
	bodies  map[string]string // payments: the body first sent with a key
	seq     int
	ifMatch []string // tickets: the If-Match of each change applied
	srv     *httptest.Server
}

func newDeclAPI(t testing.TB, token string) *declAPI {
	return &declAPI{t: t, token: token, effects: map[string]int{}, byKey: map[string]map[string]any{}, bodies: map[string]string{}}
}

func (a *declAPI) queue(fs ...declFault) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.faults = append(a.faults, fs...)
}

func (a *declAPI) setDown(down bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.down = down
}

func (a *declAPI) nextFault() declFault {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.faults) == 0 {
		return ""
	}
	f := a.faults[0]
	a.faults = a.faults[1:]
	return f
}

// effectsOf is how many times the effect of key was committed.
func (a *declAPI) effectsOf(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for k, c := range a.effects {
		if strings.HasSuffix(k, ":"+key) || strings.Contains(k, ":"+key+":") {
			n += c
		}
	}
	return n
}

func (a *declAPI) postCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.posts
}

// totalEffects is every commit, and the largest number for one key.
func (a *declAPI) totalEffects() (total, most int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.effects {
		total += c
		most = max(most, c)
	}
	return total, most
}

func (a *declAPI) authorized(w http.ResponseWriter, r *http.Request) bool {
	if a.token != "" && r.Header.Get("Authorization") != "Bearer "+a.token {
		http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
		return false
	}
	return true
}

// write runs one write with the next fault: commit (when the fault lets
// it) and answer resource, or lose the answer.
func (a *declAPI) write(w http.ResponseWriter, commit func() (map[string]any, int)) {
	a.mu.Lock()
	a.posts++
	a.mu.Unlock()
	f := a.nextFault()
	switch f {
	case f500BeforeCommit:
		http.Error(w, `{"error":"internal"}`, http.StatusInternalServerError)
		return
	case f409:
		http.Error(w, `{"error":"a request with this key is in progress"}`, http.StatusConflict)
		return
	case f429:
		http.Error(w, `{"error":"slow down"}`, http.StatusTooManyRequests)
		return
	}
	res, status := commit()
	switch f {
	case fResetAfterCommit:
		hj, ok := w.(http.Hijacker)
		if !ok {
			a.t.Error("no hijacker")
			return
		}
		conn, _, err := hj.Hijack()
		if err != nil {
			return
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			tc.SetLinger(0) // a reset, not a clean close
		}
		conn.Close()
		return
	case f500AfterCommit:
		http.Error(w, `{"error":"internal"}`, http.StatusInternalServerError)
		return
	case fTimeoutAfter:
		time.Sleep(1500 * time.Millisecond)
	case fGarbage2xx:
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "<html>ok</html>")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(res)
}

// paymentsAPI is a payments API that honours Idempotency-Key (a repeated
// key answers its first refund; the key with another body is 422) and
// finds a refund by its key (GET /refunds?idempotency_key=, 404 when
// none).
func paymentsAPI(t testing.TB, token string) *declAPI {
	a := newDeclAPI(t, token)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /payments/{payment_id}/refunds", func(w http.ResponseWriter, r *http.Request) {
		if !a.authorized(w, r) {
			return
		}
		key := r.Header.Get("Idempotency-Key")
		body, _ := io.ReadAll(r.Body)
		var in struct {
			AmountMinor int64  `json:"amount_minor"`
			Currency    string `json:"currency"`
			Reason      string `json:"reason"`
		}
		if key == "" || json.Unmarshal(body, &in) != nil || in.AmountMinor <= 0 {
			http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
			return
		}
		a.mu.Lock()
		first, seen := a.bodies[key]
		a.mu.Unlock()
		if seen && first != string(body) {
			http.Error(w, `{"error":"idempotency key reused with another request"}`, http.StatusUnprocessableEntity)
			return
		}
		a.write(w, func() (map[string]any, int) {
			a.mu.Lock()
			defer a.mu.Unlock()
			if res, ok := a.byKey[key]; ok {
				return res, http.StatusOK // the first outcome, nothing done again
			}
			a.seq++
			res := map[string]any{"id": fmt.Sprintf("re_%d", a.seq), "payment_id": r.PathValue("payment_id"),
				"amount_minor": in.AmountMinor, "currency": in.Currency, "status": "succeeded"}
			a.byKey[key], a.bodies[key] = res, string(body)
			a.effects[key]++
			return res, http.StatusCreated
		})
	})
	mux.HandleFunc("GET /refunds", func(w http.ResponseWriter, r *http.Request) {
		if !a.authorized(w, r) {
			return
		}
		a.mu.Lock()
		down := a.down
		res, ok := a.byKey[r.URL.Query().Get("idempotency_key")]
		a.mu.Unlock()
		switch {
		case down:
			http.Error(w, `{"error":"lookup unavailable"}`, http.StatusServiceUnavailable)
		case !ok:
			http.Error(w, `{"error":"no refund for this key"}`, http.StatusNotFound)
		default:
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(res)
		}
	})
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.srv.Close)
	return a
}

// ticketsAPI is a ticketing API that takes no idempotency key: every POST
// /tickets opens a new ticket. It keeps the client_reference field of the
// body and searches by it (GET /tickets?client_reference=, a list).
func ticketsAPI(t testing.TB, token string) *declAPI {
	a := newDeclAPI(t, token)
	var tickets []map[string]any
	mux := http.NewServeMux()
	mux.HandleFunc("POST /tickets", func(w http.ResponseWriter, r *http.Request) {
		if !a.authorized(w, r) {
			return
		}
		var in map[string]any
		if json.NewDecoder(r.Body).Decode(&in) != nil || in["subject"] == nil {
			http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
			return
		}
		ref, _ := in["client_reference"].(string)
		a.write(w, func() (map[string]any, int) {
			a.mu.Lock()
			defer a.mu.Unlock()
			a.seq++
			tk := map[string]any{"id": fmt.Sprintf("T-%d", a.seq), "subject": in["subject"], "client_reference": ref, "state": "open", "priority": in["priority"], "version": 1}
			tickets = append(tickets, tk)
			a.effects[ref]++
			return tk, http.StatusCreated
		})
	})
	find := func(id string) map[string]any {
		for _, tk := range tickets {
			if tk["id"] == id {
				return tk
			}
		}
		return nil
	}
	etag := func(tk map[string]any) string { return fmt.Sprintf(`"v%d"`, tk["version"]) }
	mux.HandleFunc("GET /tickets/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !a.authorized(w, r) {
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		tk := find(r.PathValue("id"))
		if tk == nil {
			http.Error(w, `{"error":"no such ticket"}`, http.StatusNotFound)
			return
		}
		w.Header().Set("ETag", etag(tk))
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(tk)
	})
	// PATCH /tickets/{id} changes state and priority, at the version
	// If-Match names when it names one (412 otherwise).
	mux.HandleFunc("PATCH /tickets/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !a.authorized(w, r) {
			return
		}
		var in map[string]any
		if json.NewDecoder(r.Body).Decode(&in) != nil {
			http.Error(w, `{"error":"bad request"}`, http.StatusBadRequest)
			return
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		tk := find(r.PathValue("id"))
		if tk == nil {
			http.Error(w, `{"error":"no such ticket"}`, http.StatusNotFound)
			return
		}
		if m := r.Header.Get("If-Match"); m != "" && m != etag(tk) {
			http.Error(w, `{"error":"the ticket changed"}`, http.StatusPreconditionFailed)
			return
		}
		a.ifMatch = append(a.ifMatch, r.Header.Get("If-Match"))
		for _, k := range []string{"state", "priority"} {
			if v, ok := in[k]; ok {
				tk[k] = v
			}
		}
		tk["version"] = tk["version"].(int) + 1
		w.Header().Set("ETag", etag(tk))
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(tk)
	})
	mux.HandleFunc("GET /tickets", func(w http.ResponseWriter, r *http.Request) {
		if !a.authorized(w, r) {
			return
		}
		ref := r.URL.Query().Get("client_reference")
		a.mu.Lock()
		down := a.down
		found := []map[string]any{}
		for _, tk := range tickets {
			if tk["client_reference"] == ref {
				found = append(found, tk)
			}
		}
		a.mu.Unlock()
		if down {
			http.Error(w, `{"error":"search unavailable"}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{"tickets": found})
	})
	a.srv = httptest.NewServer(mux)
	t.Cleanup(a.srv.Close)
	return a
}

// paymentsDecl is the declaration of create_refund over the payments API
// at base, by hand: the key as Idempotency-Key, lookup by it, a bearer
// token from E2E_PAYMENTS_TOKEN, approval from 1000.00.
func paymentsDecl(base string) string {
	return fmt.Sprintf(`
[[tools]]
name = "create_refund"
title = "Refund a payment"
description = "Refunds part or all of a card payment to the customer."
noun = "refund"
destructive = false
id = "/id"
safe_retry = true
timeout = "1s"
input_schema = '''
{"type": "object", "additionalProperties": false, "required": ["payment_id", "amount_minor", "currency"],
 "properties": {
  "payment_id": {"type": "string", "pattern": "^pay_[a-z0-9]{1,32}$", "maxLength": 36},
  "amount_minor": {"type": "integer", "minimum": 1, "maximum": 100000000},
  "currency": {"type": "string", "enum": ["EUR", "USD"]},
  "reason": {"type": "string", "maxLength": 200}}}
'''

[tools.request]
method = "POST"
url = "%[1]s/payments/{payment_id}/refunds"
headers = { Authorization = "Bearer {secret:payments_token}" }
body = { amount_minor = "/amount_minor", currency = "/currency", reason = "/reason" }

[tools.operation_key]
header = "Idempotency-Key"

[tools.lookup]
url = "%[1]s/refunds?idempotency_key={operation_key}"
headers = { Authorization = "Bearer {secret:payments_token}" }

[tools.policy]
amount = "/amount_minor"
currency = "/currency"
recipient = "/payment_id"
approval_threshold_minor = 100000

[tools.secrets]
payments_token = { env = "E2E_PAYMENTS_TOKEN" }
`, base)
}

// ticketsDecl declares open_ticket over the ticketing API at base: no
// key header, the key in the body's client_reference, lookup by a search
// on it; the token from the file desk.token beside the declaration.
func ticketsDecl(base string) string {
	return fmt.Sprintf(`
[[tools]]
name = "open_ticket"
title = "Open a support ticket"
description = "Opens a ticket in the support desk."
noun = "ticket"
destructive = false
id = "/id"
timeout = "1s"
input_schema = '''
{"type": "object", "additionalProperties": false, "required": ["subject", "body"],
 "properties": {
  "subject": {"type": "string", "minLength": 1, "maxLength": 120},
  "body": {"type": "string", "maxLength": 2000},
  "priority": {"type": "string", "enum": ["low", "normal", "high"]}}}
'''

[tools.request]
method = "POST"
url = "%[1]s/tickets"
headers = { Authorization = "Bearer {secret:desk_token}" }

[tools.operation_key]
body_field = "client_reference"

[tools.lookup]
url = "%[1]s/tickets?client_reference={operation_key}"
headers = { Authorization = "Bearer {secret:desk_token}" }
items = "/tickets"
match = "/client_reference"

[tools.secrets]
desk_token = { file = "desk.token" }

[[tools]]
name = "update_ticket"
title = "Change a ticket's state or priority"
description = "Changes the state or priority of one support ticket. Every change waits for an approver, who sees it against the ticket as it is."
noun = "ticket"
destructive = true
id = "/id"
timeout = "1s"
input_schema = '''
{"type": "object", "additionalProperties": false, "required": ["ticket_id"],
 "properties": {
  "ticket_id": {"type": "string", "pattern": "^T-[0-9]{1,9}$", "maxLength": 12},
  "state": {"type": "string", "enum": ["open", "pending", "closed"]},
  "priority": {"type": "string", "enum": ["low", "normal", "high"]}}}
'''

[tools.request]
method = "PATCH"
url = "%[1]s/tickets/{ticket_id}"
headers = { Authorization = "Bearer {secret:desk_token}" }
body = { state = "/state", priority = "/priority" }

[tools.operation_key]
none = true

[tools.current]
url = "%[1]s/tickets/{ticket_id}"
headers = { Authorization = "Bearer {secret:desk_token}" }

[tools.policy]
always_approve = true

[tools.secrets]
desk_token = { file = "desk.token" }
`, base)
}
