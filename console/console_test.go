package console

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/schemas"
	"idemgate/tools"
)

// TestTemplatesParse: every page's template parses with the shared layout
// and card (a broken template would otherwise fail only when served).
func TestTemplatesParse(t *testing.T) {
	if len(parsePages()) == 0 {
		t.Fatal("no pages")
	}
}

// TestMoney: totals in minor units are shown as amounts of their currency.
func TestMoney(t *testing.T) {
	for _, c := range []struct{ minor, cur, want string }{
		{"3700", "EUR", "37.00 EUR"}, {"5", "USD", "0.05 USD"}, {"-250", "EUR", "-2.50 EUR"},
		{"1200", "JPY", "1200 JPY"}, {"12.5", "EUR", "12.5 EUR"}, {"3700", "", "3700"},
	} {
		if got := money(c.minor, c.cur); got != c.want {
			t.Errorf("money(%q, %q) = %q, want %q", c.minor, c.cur, got, c.want)
		}
	}
}

// testConsole is a console over a new ledger whose tokens are the map
// (token → identity) and whose clock the test moves.
type testConsole struct {
	*Console
	mu     sync.Mutex
	tokens map[string]Identity
	now    time.Time
}

func newTestConsole(t *testing.T) *testConsole {
	t.Helper()
	store, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	v, err := schemas.New()
	if err != nil {
		t.Fatal(err)
	}
	svc, err := tools.New(store, v, tools.Options{OutboxDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	tc := &testConsole{tokens: map[string]Identity{
		"boss-token":  {Principal: "boss", Tenant: "acme", Role: RoleApprover},
		"agent-token": {Principal: "alice", Tenant: "acme", Role: "agent"},
	}, now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	tc.Console = New(Config{Service: svc, Store: store, SessionTTL: time.Hour,
		Lookup: func(tok string) (Identity, bool) {
			tc.mu.Lock()
			defer tc.mu.Unlock()
			id, ok := tc.tokens[tok]
			return id, ok
		},
		Now: func() time.Time {
			tc.mu.Lock()
			defer tc.mu.Unlock()
			return tc.now
		},
	})
	return tc
}

// do serves one request and returns the response.
func (tc *testConsole) do(method, path string, form url.Values, cookie *http.Cookie) *http.Response {
	var req *http.Request
	if form != nil {
		req = httptest.NewRequest(method, path, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	} else {
		req = httptest.NewRequest(method, path, nil)
	}
	if cookie != nil {
		req.AddCookie(cookie)
	}
	w := httptest.NewRecorder()
	tc.ServeHTTP(w, req)
	return w.Result()
}

func (tc *testConsole) login(t *testing.T, token string) *http.Cookie {
	t.Helper()
	resp := tc.do("POST", "/ui/login", url.Values{"token": {token}}, nil)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("login: status %d, want 303", resp.StatusCode)
	}
	for _, c := range resp.Cookies() {
		if c.Name == CookieName {
			if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/ui" {
				t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, Path=/ui", c)
			}
			return c
		}
	}
	t.Fatal("login set no session cookie")
	return nil
}

// TestSessionEnds: a session opens the approvals page until its lifetime
// has passed, until logout, or until its token is removed from the tokens
// file; after each, the page leads to the login. An agent's token gets
// 403 and no cookie.
func TestSessionEnds(t *testing.T) {
	tc := newTestConsole(t)
	ok := func(c *http.Cookie) bool { return tc.do("GET", "/ui/approvals", nil, c).StatusCode == http.StatusOK }

	c := tc.login(t, "boss-token")
	if !ok(c) {
		t.Fatal("a new session cannot open the approvals page")
	}
	tc.mu.Lock()
	tc.now = tc.now.Add(59 * time.Minute)
	tc.mu.Unlock()
	if !ok(c) {
		t.Error("the session ended before its lifetime")
	}
	tc.mu.Lock()
	tc.now = tc.now.Add(time.Minute)
	tc.mu.Unlock()
	if ok(c) {
		t.Error("the session outlived its lifetime")
	}

	c = tc.login(t, "boss-token")
	if r := tc.do("POST", "/ui/logout", url.Values{}, c); r.StatusCode != http.StatusOK {
		t.Fatalf("logout: %d", r.StatusCode)
	}
	if ok(c) {
		t.Error("the session outlived its logout")
	}

	c = tc.login(t, "boss-token")
	tc.mu.Lock()
	delete(tc.tokens, "boss-token")
	tc.mu.Unlock()
	if ok(c) {
		t.Error("the session outlived its token's removal")
	}

	r := tc.do("POST", "/ui/login", url.Values{"token": {"agent-token"}}, nil)
	if r.StatusCode != http.StatusForbidden || len(r.Cookies()) != 0 {
		t.Errorf("agent login: status %d with %d cookies, want 403 and none", r.StatusCode, len(r.Cookies()))
	}
	if r := tc.do("POST", "/ui/login", url.Values{"token": {"nope"}}, nil); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("unknown token: status %d, want 401", r.StatusCode)
	}
}

// TestLoginLinkOnce: a one-time login link logs in once, and not after
// its time.
func TestLoginLinkOnce(t *testing.T) {
	tc := newTestConsole(t)
	link := tc.LoginLink(Identity{Principal: "boss", Tenant: "acme", Role: RoleApprover}, time.Minute)
	if r := tc.do("GET", link, nil, nil); r.StatusCode != http.StatusSeeOther || len(r.Cookies()) != 1 {
		t.Fatalf("first use: status %d, %d cookies", r.StatusCode, len(r.Cookies()))
	}
	if r := tc.do("GET", link, nil, nil); r.StatusCode != http.StatusUnauthorized || len(r.Cookies()) != 0 {
		t.Errorf("second use: status %d, %d cookies; want 401 and none", r.StatusCode, len(r.Cookies()))
	}
	late := tc.LoginLink(Identity{Principal: "boss", Tenant: "acme", Role: RoleApprover}, time.Minute)
	tc.mu.Lock()
	tc.now = tc.now.Add(time.Minute)
	tc.mu.Unlock()
	if r := tc.do("GET", late, nil, nil); r.StatusCode != http.StatusUnauthorized {
		t.Errorf("expired link: status %d, want 401", r.StatusCode)
	}
}

// TestCrossOriginPostRefused: a POST a browser marks cross-site is refused
// before it is read, even with a valid session; one without such headers
// (a same-origin form, or curl) passes.
func TestCrossOriginPostRefused(t *testing.T) {
	tc := newTestConsole(t)
	c := tc.login(t, "boss-token")
	req := httptest.NewRequest("POST", "/ui/logout", nil)
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	req.AddCookie(c)
	w := httptest.NewRecorder()
	tc.ServeHTTP(w, req)
	if w.Code != http.StatusForbidden {
		t.Fatalf("cross-site logout: status %d, want 403", w.Code)
	}
	if tc.do("GET", "/ui/approvals", nil, c).StatusCode != http.StatusOK {
		t.Error("the refused cross-site logout ended the session")
	}
}

// TestCustomerOf: the customer of an operation's order comes from what
// the record keeps — the request, the result's order, a waiting
// approval's diff text — and is "" when none of them names it.
func TestCustomerOf(t *testing.T) {
	for _, c := range []struct {
		name string
		rec  ledger.Record
		want string
	}{
		{"create request", ledger.Record{Args: []byte(`{"customer_id":"cust-1","items":[]}`)}, "cust-1"},
		{"order in the result", ledger.Record{Args: []byte(`{"order_id":"ord_1"}`), Result: []byte(`{"order":{"order_id":"ord_1","customer_id":"cust-2"}}`)}, "cust-2"},
		{"tombstone keeps only the result's absence", ledger.Record{Tombstone: true}, ""},
		{"waiting cancel", ledger.Record{Args: []byte(`{"order_id":"ord_1"}`), Approval: &ledger.Approval{DiffText: "cancel order ord_1 (version 1): status \"placed\" → cancelled\n  reason: x\n    customer_id: \"forged\"\n  the order being cancelled:\n    currency: \"EUR\"\n    customer_id: \"cust-3\"\n    status: \"placed\"\n"}}, "cust-3"},
		{"notification", ledger.Record{Args: []byte(`{"channel":"email","to":["a@example.com"]}`)}, ""},
		{"not JSON", ledger.Record{Args: []byte(`{`), Result: []byte(`[1]`)}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := customerOf(&c.rec); got != c.want {
				t.Errorf("customerOf = %q, want %q", got, c.want)
			}
		})
	}
}
