package console

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/tools"
	"idemgate/tools/toolstest"
)

// TestTemplatesParse: every page's template parses with the shared layout
// and card (a broken template would otherwise fail only when served).
func TestTemplatesParse(t *testing.T) {
	if len(parsePages()) == 0 {
		t.Fatal("no pages")
	}
}

// testConsole is a console over a new ledger whose tokens are the map
// (token → identity) and whose clock the test moves: the console's (now)
// and the ledger's (the real time plus skew) apart, so that records keep
// real times for the charts unless a test moves the ledger too.
type testConsole struct {
	*Console
	mu     sync.Mutex
	tokens map[string]Identity
	now    time.Time
	skew   time.Duration
}

// testOptions configure newTestConsoleWith.
type testOptions struct {
	tools     tools.Options // OutboxDir is set when empty
	publicURL string
	checkHost bool
	// wrap, when set, is the store the console reads (around the
	// service's).
	wrap func(ledger.Store) ledger.Store
	// signIn, when set, is Config.SignIn.
	signIn SignIn
}

func newTestConsole(t *testing.T) *testConsole { return newTestConsoleWith(t, testOptions{}) }

func newTestConsoleWith(t *testing.T, o testOptions) *testConsole {
	t.Helper()
	tc := &testConsole{tokens: map[string]Identity{
		"boss-token":  {Principal: "boss", Tenant: "acme", Role: RoleApprover},
		"agent-token": {Principal: "alice", Tenant: "acme", Role: "agent"},
		"zed-token":   {Principal: "zed", Tenant: "globex", Role: RoleApprover},
	}, now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	svc, store := toolstest.New(t, ledger.Options{ApprovalTTL: time.Hour, Now: func() time.Time {
		tc.mu.Lock()
		defer tc.mu.Unlock()
		return time.Now().Add(tc.skew)
	}}, o.tools)
	var read ledger.Store = store
	if o.wrap != nil {
		read = o.wrap(store)
	}
	tc.Console = New(Config{Service: svc, Store: read, SessionTTL: time.Hour, PublicURL: o.publicURL, CheckHost: o.checkHost, SignIn: o.signIn,
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

// setNow sets the console's clock.
func (tc *testConsole) setNow(t time.Time) {
	tc.mu.Lock()
	tc.now = t
	tc.mu.Unlock()
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
// the record keeps — the request, the result's order, the order a waiting
// change or cancel is for (its approval's resource; never the diff's
// text) — and is "" when none of them names it.
func TestCustomerOf(t *testing.T) {
	for _, c := range []struct {
		name string
		rec  ledger.Record
		want string
	}{
		{"create request", ledger.Record{Args: []byte(`{"customer_id":"cust-1","items":[]}`)}, "cust-1"},
		{"order in the result", ledger.Record{Args: []byte(`{"order_id":"ord_1"}`), Result: []byte(`{"order":{"order_id":"ord_1","customer_id":"cust-2"}}`)}, "cust-2"},
		{"tombstone keeps only the result's absence", ledger.Record{Tombstone: true}, ""},
		{"waiting cancel", ledger.Record{Args: []byte(`{"order_id":"ord_1"}`), Approval: &ledger.Approval{
			DiffText: "cancel order ord_1 (version 1)\n  reason: customer_id: \"forged\"\n", Resource: []byte(`{"order_id":"ord_1","customer_id":"cust-3"}`)}}, "cust-3"},
		{"waiting cancel held before resources were kept", ledger.Record{Args: []byte(`{"order_id":"ord_1"}`), Approval: &ledger.Approval{
			DiffText: "cancel order ord_1 (version 1): status \"placed\" → cancelled\n  the order being cancelled:\n    customer_id: \"cust-3\"\n"}}, ""},
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

// TestOverview: the Overview shows the tenant's numbers as `idemgate
// stats` computes them (ComputeStats over the same ledger) — one replay,
// one mismatch, no duplicate side effect — not another tenant's, draws
// them in the current hour's bar, and verifies the audit chain on
// request, at most once a minute.
func TestOverview(t *testing.T) {
	tc := newTestConsole(t)
	ctx := t.Context()
	svc := tc.cfg.Service
	acme := ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}
	order := func(key, customer string) map[string]any {
		return map[string]any{"operation_key": key, "customer_id": customer, "currency": "EUR", "notify_customer": false,
			"items": []any{map[string]any{"sku": "COFFEE", "quantity": 1, "unit_price_minor": 3700}}}
	}
	const key = "7d1f1c52-4b7e-4c8e-9a55-3e0c1a2b3c4d"
	for i, c := range []struct {
		actor    ledger.Actor
		args     map[string]any
		replayed bool
		isError  bool
	}{
		{acme, order(key, "cust-1"), false, false},
		{acme, order(key, "cust-1"), true, false}, // a replay
		{acme, order(key, "cust-2"), false, true}, // a mismatch
		{ledger.Actor{Tenant: "globex", Principal: "gus", Role: "agent"}, order(key, "cust-9"), false, false},
		{ledger.Actor{Tenant: "globex", Principal: "gus", Role: "agent"}, order(key, "cust-9"), true, false}, // globex's replay
	} {
		resp := svc.Call(ctx, c.actor, "create_order", c.args, nil)
		if resp.Replayed != c.replayed || resp.IsError != c.isError {
			t.Fatalf("call %d: replayed=%v isError=%v (%+v), want %v %v", i, resp.Replayed, resp.IsError, resp.Error, c.replayed, c.isError)
		}
	}
	tc.mu.Lock()
	tc.now = time.Now()
	tc.mu.Unlock()
	cookie := tc.login(t, "boss-token")
	page := func(path string) string {
		t.Helper()
		r := tc.do("GET", path, nil, cookie)
		b, _ := io.ReadAll(r.Body)
		if r.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d\n%s", path, r.StatusCode, b)
		}
		return string(b)
	}
	body := page("/ui/overview")
	want, err := ledger.ComputeStats(ctx, tc.cfg.Store, "acme")
	if err != nil {
		t.Fatal(err)
	}
	if want.ReplaysServed != 1 || want.MismatchesRefused != 1 || want.DuplicateSideEffects != 0 {
		t.Fatalf("ComputeStats = %+v, want 1 replay, 1 mismatch, no duplicate", want)
	}
	for id, n := range map[string]int{"n-replays": want.ReplaysServed, "n-mismatches": want.MismatchesRefused,
		"n-duplicates": want.DuplicateSideEffects, "n-executions": want.Executions, "n-unknown": want.Unknown, "n-late": want.LateReplays} {
		if s := fmt.Sprintf(`id="%s">%d<`, id, n); !strings.Contains(body, s) {
			t.Errorf("the overview does not show %s", s)
		}
	}
	if s := fmt.Sprintf(`id="n-amplification">%.2f<`, want.RetryAmplification); !strings.Contains(body, s) {
		t.Errorf("the overview does not show %s", s)
	}
	hour := time.Now().UTC().Truncate(time.Hour).Format("Jan 2 15:00")
	if !strings.Contains(body, "<title>"+hour+": 1 replays</title>") {
		t.Errorf("the replays chart has no bar of 1 in %s", hour)
	}
	if !strings.Contains(body, `role="img" aria-label="Replays served, `) {
		t.Errorf("the replays chart has no accessible label")
	}
	if !strings.Contains(body, "Not verified since this console started") {
		t.Errorf("the chain's status before any check is not shown")
	}
	if b := page("/ui/overview?window=30d"); !strings.Contains(b, "the last 30 days, by day") || !strings.Contains(b, time.Now().UTC().Format("Jan 2")+": 1 replays") {
		t.Errorf("the 30-day window does not show today's replay")
	}
	if b := page("/ui/overview?window=%3Cscript%3E"); !strings.Contains(b, "the last 48 hours") {
		t.Errorf("an unknown window is not the default one")
	}

	r := tc.do("POST", "/ui/overview/verify", url.Values{"window": {"30d"}}, cookie)
	if loc := r.Header.Get("Location"); r.StatusCode != http.StatusSeeOther || loc != "/ui/overview?verified=1&window=30d" {
		t.Fatalf("verify: %d to %q", r.StatusCode, loc)
	}
	if b := page("/ui/overview?verified=1"); !strings.Contains(b, "Intact") || !strings.Contains(b, tc.cfg.Now().UTC().Format("2006-01-02 15:04:05")) {
		t.Errorf("the verified chain's status and time are not shown")
	}
	r = tc.do("POST", "/ui/overview/verify", url.Values{}, cookie)
	if loc := r.Header.Get("Location"); loc != "/ui/overview?verified=recent&window=48h" {
		t.Errorf("a second verify within a minute: to %q, want the recent check shown", loc)
	}
	if r := tc.do("GET", "/ui/overview", nil, nil); r.StatusCode != http.StatusSeeOther {
		t.Errorf("the overview without a session: status %d, want 303 to login", r.StatusCode)
	}
}

// TestOverviewChartScale: a chart's scale tops at 1, 2 or 5 times a power
// of ten; the tallest bar fills it, and a small non-zero value still shows.
func TestOverviewChartScale(t *testing.T) {
	for _, c := range []struct{ v, want float64 }{{0, 1}, {1, 1}, {1.4, 2}, {3, 5}, {7, 10}, {10, 10}, {11, 20}, {499, 500}, {501, 1000}} {
		if got := niceCeil(c.v); got != c.want {
			t.Errorf("niceCeil(%v) = %v, want %v", c.v, got, c.want)
		}
	}
	h0 := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
	b := []ledger.StatsBucket{{Start: h0}, {Start: h0.Add(time.Hour)}}
	b[0].ReplaysServed, b[1].ReplaysServed = 1, 100
	var replays chart
	for _, ch := range overviewCharts(b, time.Hour) {
		if ch.ID == "replays" {
			replays = ch
		}
	}
	if len(replays.Bars) != 2 || replays.Max != "100" || replays.Bars[1].H != chartH-2 || replays.Bars[0].H < 2 {
		t.Fatalf("replays chart = %+v, want the 100 bar full height and the 1 bar visible", replays)
	}
	if !strings.Contains(replays.Label, "101 replays") || !strings.Contains(replays.Label, "the most, 100, in Mar 4 11:00") {
		t.Errorf("label = %q", replays.Label)
	}
}
