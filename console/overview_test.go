package console

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"idemgate/ledger"
)

// heldVerify is a store whose VerifyAudit waits until released (or its
// context ends) before it verifies.
type heldVerify struct {
	ledger.Store
	once    sync.Once
	started chan struct{} // closed when the first VerifyAudit starts
	release chan struct{}
}

func (h *heldVerify) VerifyAudit(ctx context.Context) (int, error) {
	h.once.Do(func() { close(h.started) })
	select {
	case <-h.release:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	return h.Store.VerifyAudit(ctx)
}

// placeOne records one create_order in acme: the audit log has entries.
func placeOne(t *testing.T, tc *testConsole) {
	t.Helper()
	r := tc.cfg.Service.Call(t.Context(), ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}, "create_order", map[string]any{
		"operation_key": newKey(t), "customer_id": "cust-1", "currency": "EUR", "notify_customer": false,
		"items": []any{map[string]any{"sku": "COFFEE", "quantity": 1, "unit_price_minor": 3700}}}, nil)
	if r.Status != ledger.StateSucceeded {
		t.Fatalf("create_order: %+v", r)
	}
}

// TestVerifyAtStart: the console verifies the audit chain by itself when
// it starts, in the background — the Overview, opened while the check
// runs, answers at once and says a check is under way — and then shows
// the chain intact, checked when the console started. A press of Verify
// afterwards checks again (the start's check does not count against the
// once-a-minute limit of presses).
func TestVerifyAtStart(t *testing.T) {
	h := &heldVerify{started: make(chan struct{}), release: make(chan struct{})}
	tc := newTestConsoleWith(t, testOptions{wrap: func(s ledger.Store) ledger.Store { h.Store = s; return h }})
	placeOne(t, tc)
	cookie := tc.login(t, "boss-token")
	done := make(chan struct{})
	go func() {
		defer close(done)
		tc.VerifyAtStart(t.Context())
	}()
	<-h.started
	start := time.Now()
	status, body := tc.get(t, "/ui/overview", cookie)
	if status != http.StatusOK || time.Since(start) > 5*time.Second {
		t.Fatalf("the overview during the check: status %d after %s", status, time.Since(start))
	}
	if !strings.Contains(body, `id="verify-running"`) || strings.Contains(body, "Intact") || strings.Contains(body, "Not verified since") {
		t.Errorf("the overview during the check does not say it is under way:\n%s", section(body, "audit-chain"))
	}
	if r := tc.do("POST", "/ui/overview/verify", url.Values{}, cookie); r.Header.Get("Location") != "/ui/overview?verified=running&window=48h" {
		t.Errorf("a press during the check: to %q, want the running check's result", r.Header.Get("Location"))
	}
	close(h.release)
	<-done
	_, body = tc.get(t, "/ui/overview", cookie)
	chain := section(body, "audit-chain")
	if !regexp.MustCompile(`Intact: .*\([1-9][0-9]* entries\)\. Checked [^<]* when the console started`).MatchString(chain) || strings.Contains(chain, "verify-running") {
		t.Errorf("after the start's check the overview does not show the chain intact, checked at the start:\n%s", chain)
	}
	if r := tc.do("POST", "/ui/overview/verify", url.Values{}, cookie); r.Header.Get("Location") != "/ui/overview?verified=1&window=48h" {
		t.Errorf("the first press after the start's check: to %q, want a new check", r.Header.Get("Location"))
	}
	if _, body = tc.get(t, "/ui/overview", cookie); !strings.Contains(section(body, "audit-chain"), "for boss") {
		t.Errorf("the pressed check does not name who asked:\n%s", section(body, "audit-chain"))
	}
}

// TestVerifyByTenant: the chain is every tenant's, so a check one
// tenant's approver asked for is shown to every tenant — but who asked is
// named only to that tenant: acme's approvers never see globex's
// principal, nor globex's acme's.
func TestVerifyByTenant(t *testing.T) {
	tc := newTestConsole(t)
	placeOne(t, tc)
	boss, zed := tc.login(t, "boss-token"), tc.login(t, "zed-token")
	chain := func(c *http.Cookie) string {
		t.Helper()
		_, body := tc.get(t, "/ui/overview", c)
		return section(body, "audit-chain")
	}
	press := func(c *http.Cookie) {
		t.Helper()
		if r := tc.do("POST", "/ui/overview/verify", url.Values{}, c); r.Header.Get("Location") != "/ui/overview?verified=1&window=48h" {
			t.Fatalf("a press of Verify: to %q, want a new check", r.Header.Get("Location"))
		}
	}
	press(boss)
	if got := chain(boss); !strings.Contains(got, "Intact") || !strings.Contains(got, "for boss") {
		t.Errorf("acme's overview after boss's check does not name boss:\n%s", got)
	}
	if got := chain(zed); !strings.Contains(got, "Intact") || strings.Contains(got, "boss") || !strings.Contains(got, "for an approver of another tenant") {
		t.Errorf("globex's overview after acme's check: want it intact, checked for another tenant, without acme's principal:\n%s", got)
	}
	tc.setNow(tc.cfg.Now().Add(2 * verifyEvery))
	press(zed)
	if got := chain(zed); !strings.Contains(got, "for zed") {
		t.Errorf("globex's overview after zed's check does not name zed:\n%s", got)
	}
	if got := chain(boss); strings.Contains(got, "zed") || !strings.Contains(got, "for an approver of another tenant") {
		t.Errorf("acme's overview after globex's check shows globex's principal:\n%s", got)
	}
}

// TestVerifyAtStartBounded: a check at the start that cannot finish in
// its time (here: its context has ended before it reads the log) stops
// and proves nothing; the Overview says so and does not call the chain
// intact, and a press of Verify then checks it.
func TestVerifyAtStartBounded(t *testing.T) {
	tc := newTestConsole(t)
	placeOne(t, tc)
	cookie := tc.login(t, "boss-token")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	tc.VerifyAtStart(ctx)
	_, body := tc.get(t, "/ui/overview", cookie)
	chain := section(body, "audit-chain")
	if !strings.Contains(chain, "Not verified: the check made when the console started stopped") || strings.Contains(chain, "Intact") {
		t.Errorf("an unfinished check is not shown as such:\n%s", chain)
	}
	if r := tc.do("POST", "/ui/overview/verify", url.Values{}, cookie); r.Header.Get("Location") != "/ui/overview?verified=1&window=48h" {
		t.Errorf("a press after the unfinished check: to %q, want a new check", r.Header.Get("Location"))
	}
	if _, body = tc.get(t, "/ui/overview", cookie); !strings.Contains(section(body, "audit-chain"), "Intact") {
		t.Errorf("the pressed check does not show the chain intact:\n%s", section(body, "audit-chain"))
	}
}

// TestOverviewSettledTable: an unknown outcome that an approver resolved
// from the console shows in "How unknown outcomes were settled" as
// resolved by a person, counted once, and the unknown tile says none is
// left unsettled.
func TestOverviewSettledTable(t *testing.T) {
	ac := newAPIConsole(t)
	boss := ac.login(t, "boss-token")
	if _, body := ac.get(t, "/ui/overview", boss); strings.Contains(body, `id="settled"`) {
		t.Fatalf("the settled table shows before anything was settled")
	}
	r := ac.do("POST", "/ui/operations/"+ac.unknownKey+"/settle", url.Values{"action": {"resolve"}, "outcome": {"not_executed"}, "evidence": {"checked the order screen: no such order"}}, boss)
	if r.StatusCode != http.StatusOK {
		t.Fatalf("resolve: status %d", r.StatusCode)
	}
	_, body := ac.get(t, "/ui/overview", boss)
	table := section(body, "settled")
	rows := regexp.MustCompile(`<tr data-how="([a-z_]+)"><th scope="row">([^<]+)</th><td class="n">(\d+)</td></tr>`).FindAllStringSubmatch(table, -1)
	if len(rows) != 1 || rows[0][1] != string(ledger.SettledResolvedByHand) || rows[0][2] != "resolved by a person, with evidence" || rows[0][3] != "1" {
		t.Errorf("settled table rows = %q, want one: resolved by a person, 1\n%s", rows, table)
	}
	for id, want := range map[string]string{"n-unknown": "1", "n-unsettled": "0"} {
		if !strings.Contains(body, `id="`+id+`">`+want+`<`) {
			t.Errorf("the overview does not show %s = %s", id, want)
		}
	}
}

// section is the element of body with the id, up to its end tag (or the
// page's rest): enough to look at one part of a page.
func section(body, id string) string {
	i := strings.Index(body, `id="`+id+`"`)
	if i < 0 {
		return ""
	}
	rest := body[i:]
	for _, end := range []string{"</section>", "</table>"} {
		if j := strings.Index(rest, end); j >= 0 {
			return rest[:j]
		}
	}
	return rest
}
