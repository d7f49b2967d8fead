package console

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/orders"
	"idemgate/outbox"
	"idemgate/tools"
)

// get serves one GET and returns its status and body.
func (tc *testConsole) get(t *testing.T, path string, cookie *http.Cookie) (int, string) {
	t.Helper()
	r := tc.do("GET", path, nil, cookie)
	b, _ := io.ReadAll(r.Body)
	return r.StatusCode, string(b)
}

// sessionCookie is the session cookie r sets, or nil.
func sessionCookie(r *http.Response) *http.Cookie {
	for _, c := range r.Cookies() {
		if c.Name == CookieName {
			return c
		}
	}
	return nil
}

// TestSecureCookie: the session cookie is Secure when the request came
// over TLS, and when the configured public URL is https — a console behind
// a TLS-terminating proxy gets plain-HTTP requests — on login, on a
// one-time link and on logout; with an http public URL or none, a
// plain-HTTP request gets no Secure cookie (a browser would drop it).
func TestSecureCookie(t *testing.T) {
	for _, c := range []struct {
		name      string
		publicURL string
		overTLS   bool
		want      bool
	}{
		{"https public URL, plain request", "https://gate.example.com", false, true},
		{"https public URL with a path", "https://example.com/idemgate", false, true},
		{"http public URL", "http://gate.example.com:8081", false, false},
		{"none, plain request", "", false, false},
		{"none, over TLS", "", true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			tc := newTestConsoleWith(t, testOptions{publicURL: c.publicURL})
			send := func(method, path string, form url.Values) *http.Response {
				req := httptest.NewRequest(method, path, strings.NewReader(form.Encode()))
				if form != nil {
					req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				}
				if c.overTLS {
					req.TLS = &tls.ConnectionState{}
				}
				w := httptest.NewRecorder()
				tc.ServeHTTP(w, req)
				return w.Result()
			}
			link := tc.LoginLink(Identity{Principal: "boss", Tenant: "acme", Role: RoleApprover}, time.Minute)
			for what, r := range map[string]*http.Response{
				"login":         send("POST", "/ui/login", url.Values{"token": {"boss-token"}}),
				"one-time link": send("GET", link, nil),
				"logout":        send("POST", "/ui/logout", url.Values{}),
			} {
				ck := sessionCookie(r)
				if ck == nil {
					t.Fatalf("%s: no session cookie (status %d)", what, r.StatusCode)
				}
				if ck.Secure != c.want {
					t.Errorf("%s: cookie Secure = %v, want %v", what, ck.Secure, c.want)
				}
			}
		})
	}
}

// TestHostCheck: on a loopback listener the console answers a loopback
// Host (and the public URL's host, for a proxy in front) and refuses any
// other with 403 (DNS rebinding: a name the attacker controls that
// resolves to 127.0.0.1); on another listener, or without the check, the
// Host is not its business.
func TestHostCheck(t *testing.T) {
	v4 := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8081}
	v6 := &net.TCPAddr{IP: net.IPv6loopback, Port: 8081}
	lan := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 5), Port: 8081}
	for _, c := range []struct {
		name      string
		checkHost bool
		publicURL string
		local     net.Addr
		host      string
		want      int
	}{
		{"127.0.0.1", true, "", v4, "127.0.0.1:8081", http.StatusOK},
		{"localhost", true, "", v4, "localhost:8081", http.StatusOK},
		{"LOCALHOST without port", true, "", v4, "LOCALHOST", http.StatusOK},
		{"[::1] on IPv6", true, "", v6, "[::1]:8081", http.StatusOK},
		{"127.0.0.2", true, "", v4, "127.0.0.2:8081", http.StatusOK},
		{"a foreign name", true, "", v4, "attacker.example:8081", http.StatusForbidden},
		{"a foreign name on IPv6", true, "", v6, "attacker.example", http.StatusForbidden},
		{"a loopback-looking subdomain", true, "", v4, "127.0.0.1.attacker.example", http.StatusForbidden},
		{"localhost as a subdomain", true, "", v4, "localhost.attacker.example:8081", http.StatusForbidden},
		{"empty", true, "", v4, "", http.StatusForbidden},
		{"the public URL's host", true, "https://gate.example.com", v4, "gate.example.com", http.StatusOK},
		{"the public URL's host in capitals", true, "https://gate.example.com", v4, "Gate.Example.COM", http.StatusOK},
		{"the public URL's host on another port", true, "https://gate.example.com", v4, "gate.example.com:8443", http.StatusForbidden},
		{"another host beside a public URL", true, "https://gate.example.com", v4, "attacker.example", http.StatusForbidden},
		{"a LAN listener", true, "", lan, "attacker.example:8081", http.StatusOK},
		{"no local address known", true, "", nil, "attacker.example", http.StatusOK},
		{"check off", false, "", v4, "attacker.example:8081", http.StatusOK},
	} {
		t.Run(c.name, func(t *testing.T) {
			tc := newTestConsoleWith(t, testOptions{checkHost: c.checkHost, publicURL: c.publicURL})
			req := httptest.NewRequest("GET", "/ui/login", nil)
			req.Host = c.host
			if c.local != nil {
				req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, c.local))
			}
			w := httptest.NewRecorder()
			tc.ServeHTTP(w, req)
			if w.Code != c.want {
				t.Errorf("Host %q on %v: status %d, want %d", c.host, c.local, w.Code, c.want)
			}
			if w.Code == http.StatusForbidden && !strings.Contains(w.Body.String(), "DNS rebinding") {
				t.Errorf("the refusal does not say why: %s", w.Body.String())
			}
		})
	}
}

// orderAPI is a small order API (the contract orders.API speaks) for
// the console's tests: an order is created at once, except for customer
// cust-lost, whose create answers 500 (indeterminate: the operation
// becomes unknown); the lookup by key is down (503), so nothing settles
// an unknown operation but a person. It answers an order it created by
// id until vanish removes it; a change or a cancel finds no order (404).
type orderAPI struct {
	mu     sync.Mutex
	posts  int
	placed map[string]orders.Order
}

// vanish removes an order, as another system deleting it would.
func (a *orderAPI) vanish(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.placed, id)
}

func (a *orderAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/orders":
		a.posts++
		var req orders.CreateRequest
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		if req.CustomerID == "cust-lost" {
			http.Error(w, "upstream reset", http.StatusInternalServerError)
			return
		}
		total, _ := orders.Total(req.Items)
		now := time.Now().UTC()
		o := orders.Order{OrderID: "ext-" + strconv.Itoa(a.posts), Version: 1, Status: orders.StatusPlaced, CustomerID: req.CustomerID,
			Items: req.Items, Currency: req.Currency, TotalMinor: total, CreatedAt: now, UpdatedAt: now}
		if a.placed == nil {
			a.placed = map[string]orders.Order{}
		}
		a.placed[o.OrderID] = o
		json.NewEncoder(w).Encode(o)
	case r.Method == http.MethodGet && r.URL.Query().Get("idempotency_key") != "":
		http.Error(w, "lookup is down", http.StatusServiceUnavailable)
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/orders/"):
		o, ok := a.placed[strings.TrimPrefix(r.URL.Path, "/orders/")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(o)
	default:
		http.NotFound(w, r)
	}
}

func (a *orderAPI) postCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.posts
}

// refusingSink refuses every message for good: each is dead-lettered at
// its first delivery.
type refusingSink struct{}

func (refusingSink) Deliver(context.Context, *outbox.Message) error {
	return &outbox.PermanentError{Err: errors.New("recipient blocked")}
}
func (refusingSink) Flush() error { return nil }

// apiConsole is a test console whose orders live behind an orderAPI and
// whose notifications are all refused. It holds, in tenant acme: a
// pending approval (a suspected duplicate of an order), an unknown
// operation and a dead-lettered message.
type apiConsole struct {
	*testConsole
	api                   *orderAPI
	approvalID            string
	unknownKey, noticeKey string
	deadID                string
}

func newAPIConsole(t *testing.T) *apiConsole {
	t.Helper()
	ctx := t.Context()
	fake := &orderAPI{}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	api, err := orders.NewAPI(srv.URL, 2*time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	tc := newTestConsoleWith(t, testOptions{tools: tools.Options{OrdersAPI: api, Sink: refusingSink{}}})
	ac := &apiConsole{testConsole: tc, api: fake}
	svc := tc.cfg.Service
	alice := ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}
	order := func(key, customer string) map[string]any {
		return map[string]any{"operation_key": key, "customer_id": customer, "currency": "EUR", "notify_customer": false,
			"items": []any{map[string]any{"sku": "COFFEE", "quantity": 1, "unit_price_minor": 3700}}}
	}
	if r := svc.Call(ctx, alice, "create_order", order(newKey(t), "cust-1"), nil); r.Status != ledger.StateSucceeded {
		t.Fatalf("first order: %+v", r)
	}
	held := svc.Call(ctx, alice, "create_order", order(newKey(t), "cust-1"), nil)
	if held.Status != ledger.StateAwaitingApproval || held.Approval == nil {
		t.Fatalf("the same order under a new key: %+v, want held as a suspected duplicate", held)
	}
	ac.approvalID = held.Approval.ID
	ac.unknownKey = newKey(t)
	if r := svc.Call(ctx, alice, "create_order", order(ac.unknownKey, "cust-lost"), nil); r.Status != ledger.StateUnknown {
		t.Fatalf("the lost order: %+v, want unknown", r)
	}
	ac.noticeKey = newKey(t)
	if r := svc.Call(ctx, alice, "send_notification", map[string]any{"operation_key": ac.noticeKey, "channel": "email", "to": []any{"ops@example.com"}, "subject": "hi", "body": "shipped"}, nil); r.Status != ledger.StateSucceeded {
		t.Fatalf("notification: %+v", r)
	}
	svc.Deliverer().DeliverPending(ctx)
	dead := ac.dead(t)
	if len(dead) != 1 {
		t.Fatalf("%d dead letters, want the refused notification's", len(dead))
	}
	ac.deadID = dead[0].MessageID
	return ac
}

// dead is acme's dead-lettered messages.
func (ac *apiConsole) dead(t *testing.T) []*outbox.Message {
	t.Helper()
	var out []*outbox.Message
	if err := ac.cfg.Store.View(t.Context(), func(tx ledger.Tx) error {
		var err error
		var list *outbox.DeadLetterList
		list, err = outbox.DeadLetters(tx, "acme", 10, 1000)
		if list != nil {
			out = list.Messages
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

// auditCount is how many audit entries acme's key has.
func (ac *apiConsole) auditCount(t *testing.T, key string) int {
	t.Helper()
	_, n, err := ac.cfg.Store.AuditForKey(t.Context(), "acme", key, 1)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func newKey(t *testing.T) string {
	t.Helper()
	return uuid.NewString()
}

// TestCrossTenantPostsChangeNothing: globex's approver, logged in, posts
// every state change the console has — approve and reject, reconcile and
// resolve, requeue — naming acme's approval, operation and message. Each
// answers 404, shows nothing of them, and changes nothing: the approval
// stays pending, the operation unknown, the message dead; the order API
// sees no new request and acme's audit log no new entry. The same posts
// by acme's approver do act (so the 404s are the tenant's doing).
func TestCrossTenantPostsChangeNothing(t *testing.T) {
	ac := newAPIConsole(t)
	ctx := t.Context()
	zed := ac.login(t, "zed-token")
	heldKey := func() string {
		a, err := ac.cfg.Service.ShowApproval(ctx, ledger.Actor{Tenant: "acme", Principal: "boss", Role: RoleApprover}, ac.approvalID)
		if err != nil {
			t.Fatal(err)
		}
		return a.OperationKey
	}()
	posts, audits := ac.api.postCount(), map[string]int{}
	for _, k := range []string{heldKey, ac.unknownKey, ac.noticeKey} {
		audits[k] = ac.auditCount(t, k)
	}
	for _, c := range []struct {
		what, path string
		form       url.Values
	}{
		{"approve", "/ui/approvals/" + ac.approvalID + "/decide", url.Values{"decision": {"approve"}, "comment": {"zed was here"}}},
		{"reject", "/ui/approvals/" + ac.approvalID + "/decide", url.Values{"decision": {"reject"}, "comment": {"zed was here"}}},
		{"reconcile", "/ui/operations/" + ac.unknownKey + "/settle", url.Values{"action": {"reconcile"}}},
		{"resolve", "/ui/operations/" + ac.unknownKey + "/settle", url.Values{"action": {"resolve"}, "outcome": {"not_executed"}, "evidence": {"zed looked"}}},
		{"requeue", "/ui/messages/" + ac.deadID + "/requeue", url.Values{}},
	} {
		r := ac.do("POST", c.path, c.form, zed)
		b, _ := io.ReadAll(r.Body)
		if r.StatusCode != http.StatusNotFound {
			t.Errorf("globex's %s of acme's: status %d, want 404\n%s", c.what, r.StatusCode, b)
		}
		for _, leak := range []string{heldKey, ac.unknownKey, ac.noticeKey, "alice", "cust-1", "ops@example.com"} {
			if strings.Contains(string(b), leak) {
				t.Errorf("globex's %s answer shows acme's %q", c.what, leak)
			}
		}
	}
	if a, err := ac.cfg.Service.ShowApproval(ctx, ledger.Actor{Tenant: "acme", Principal: "boss", Role: RoleApprover}, ac.approvalID); err != nil || a.Status != ledger.ApprovalPending || a.DecidedBy != "" {
		t.Errorf("acme's approval after globex's posts: %+v (%v), want pending, undecided", a, err)
	}
	if rec, err := ac.cfg.Store.Get(ctx, "acme", ac.unknownKey); err != nil || rec.State != ledger.StateUnknown {
		t.Errorf("acme's unknown operation after globex's posts: %+v (%v), want unknown", rec, err)
	}
	if dead := ac.dead(t); len(dead) != 1 || dead[0].MessageID != ac.deadID {
		t.Errorf("acme's dead letters after globex's posts: %d, want the one still dead", len(dead))
	}
	if n := ac.api.postCount(); n != posts {
		t.Errorf("the order API got %d more requests, want none", n-posts)
	}
	for k, n := range audits {
		if got := ac.auditCount(t, k); got != n {
			t.Errorf("acme's audit log of %s: %d entries, want still %d", k, got, n)
		}
	}

	// The control: acme's approver does the same and it acts.
	boss := ac.login(t, "boss-token")
	if r := ac.do("POST", "/ui/messages/"+ac.deadID+"/requeue", url.Values{}, boss); r.StatusCode != http.StatusSeeOther {
		t.Errorf("acme's requeue: status %d, want 303", r.StatusCode)
	}
	if r := ac.do("POST", "/ui/operations/"+ac.unknownKey+"/settle", url.Values{"action": {"resolve"}, "outcome": {"not_executed"}, "evidence": {"checked the order screen"}}, boss); r.StatusCode != http.StatusOK {
		t.Errorf("acme's resolve: status %d, want 200", r.StatusCode)
	}
	if r := ac.do("POST", "/ui/approvals/"+ac.approvalID+"/decide", url.Values{"decision": {"reject"}}, boss); r.StatusCode != http.StatusOK {
		t.Errorf("acme's reject: status %d, want 200", r.StatusCode)
	}
	if rec, _ := ac.cfg.Store.Get(ctx, "acme", ac.unknownKey); rec == nil || rec.State == ledger.StateUnknown {
		t.Errorf("acme's resolve did not settle the operation: %+v", rec)
	}
}

// TestDecideVanishedOrder: an approved change whose order vanished from
// the order API meanwhile fails with not_found (the API's 404). The
// approver sees that outcome — the approval used, the operation failed,
// nothing applied — not the "no such approval" page a missing approval
// gets, and the console's after-decision work runs. Another tenant's
// approver posting the same decision still gets 404 and decides nothing.
func TestDecideVanishedOrder(t *testing.T) {
	ac := newAPIConsole(t)
	ctx := t.Context()
	after := 0
	ac.cfg.AfterDecide = func(context.Context) { after++ }
	alice := ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}
	key := newKey(t)
	held := ac.cfg.Service.Call(ctx, alice, "update_order", map[string]any{"operation_key": key, "order_id": "ext-1", "expected_version": 1,
		"changes": map[string]any{"note": "leave at the door"}}, nil)
	if held.Status != ledger.StateAwaitingApproval || held.Approval == nil {
		t.Fatalf("update_order: %+v, want held for approval", held)
	}
	ac.api.vanish("ext-1")

	zed := ac.login(t, "zed-token")
	if r := ac.do("POST", "/ui/approvals/"+held.Approval.ID+"/decide", url.Values{"decision": {"approve"}}, zed); r.StatusCode != http.StatusNotFound {
		t.Errorf("globex's approve of acme's approval: status %d, want 404", r.StatusCode)
	}
	if after != 0 {
		t.Errorf("a refused cross-tenant decision ran the after-decision work %d times", after)
	}

	boss := ac.login(t, "boss-token")
	r := ac.do("POST", "/ui/approvals/"+held.Approval.ID+"/decide", url.Values{"decision": {"approve"}, "comment": {"ok"}}, boss)
	b, _ := io.ReadAll(r.Body)
	body := string(b)
	if r.StatusCode != http.StatusConflict || !strings.Contains(body, `id="outcome-status">failed<`) || !strings.Contains(body, "<code>not_found</code>") || !strings.Contains(body, key) {
		t.Errorf("approving the change of a vanished order: status %d, want 409 and the failed outcome (not_found) of %s\n%s", r.StatusCode, key, body)
	}
	if strings.Contains(body, "no approval") || strings.Contains(body, "There is no approval") {
		t.Errorf("the outcome says there is no such approval:\n%s", body)
	}
	if after != 1 {
		t.Errorf("the after-decision work ran %d times, want once", after)
	}
	rec, err := ac.cfg.Store.Get(ctx, "acme", key)
	if err != nil || rec.State != ledger.StateFailed || rec.Approval == nil || rec.Approval.Status != ledger.ApprovalApproved || !ledger.CodeNotFound.Is(rec.Error) {
		t.Errorf("the operation after the approval: %+v (%v), want failed with not_found and the approval approved", rec, err)
	}
}

// TestAttentionDeadLetters: "Needs a person" lists the tenant's dead
// letters although a message of the outbox is not valid JSON (it is
// skipped and logged; the page fails for no tenant), and reads at most its
// bound of messages, saying so on the page when the bound cut it short.
func TestAttentionDeadLetters(t *testing.T) {
	ac := newAPIConsole(t)
	var logs strings.Builder
	var logMu sync.Mutex
	ac.cfg.Logger = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		logMu.Lock()
		defer logMu.Unlock()
		return logs.Write(p)
	}), nil))
	if err := ac.cfg.Store.Update(t.Context(), func(tx ledger.Tx) error {
		return tx.Put(outbox.Collection, "msg_0000", []byte(`{"message_id":`))
	}); err != nil {
		t.Fatal(err)
	}
	boss, zed := ac.login(t, "boss-token"), ac.login(t, "zed-token")
	status, body := ac.get(t, "/ui/attention", boss)
	if status != http.StatusOK || !strings.Contains(body, `id="msg-`+ac.deadID+`"`) || strings.Contains(body, `id="dead-truncated"`) {
		t.Errorf("acme's page with an undecodable message in the outbox: status %d, want 200 with %s listed and nothing cut short\n%s", status, ac.deadID, body)
	}
	if status, body := ac.get(t, "/ui/attention", zed); status != http.StatusOK || !strings.Contains(body, `id="no-dead"`) {
		t.Errorf("globex's page with an undecodable message in the outbox: status %d, want 200 with no dead letters\n%s", status, body)
	}
	logMu.Lock()
	if !strings.Contains(logs.String(), "not valid JSON") || !strings.Contains(logs.String(), "msg_0000") {
		t.Errorf("the skipped message was not logged:\n%s", logs.String())
	}
	logMu.Unlock()

	// Two messages in the outbox, a bound of one: the page says it read
	// only the first.
	ac.deadScan = 1
	status, body = ac.get(t, "/ui/attention", boss)
	if note := section(body, "dead-truncated"); status != http.StatusOK || !strings.Contains(note, "Only the first 1 messages") {
		t.Errorf("a dead-letter list cut short by its bound: status %d, want it said on the page\n%s", status, body)
	}
	ac.deadScan = 2
	if _, body = ac.get(t, "/ui/attention", boss); strings.Contains(body, `id="dead-truncated"`) || !strings.Contains(body, `id="msg-`+ac.deadID+`"`) {
		t.Errorf("a bound that reads the whole outbox: the page says it was cut short, or misses %s\n%s", ac.deadID, body)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
