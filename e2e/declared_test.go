package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Declared tools end to end: the built binary serves MCP over Streamable
// HTTP with tools declared in its configuration (and a tools_dir), over
// two fake APIs that really commit and really lose replies; a real MCP
// client calls them.

const (
	paymentsToken = "pk_test_e2e-payments-5ecret"
	deskToken     = "desk-e2e-5ecret-token"
)

// declaredGate is one serve --http with declared tools, an agent (alice)
// and an approver (boss) connected.
type declaredGate struct {
	db, base, tokens string
	toks             map[string]string
	agent, agent2    *session
	approver         *session
}

// startDeclaredGate writes config (the main configuration's text) and
// each of dir's files (name → text, in tools.d) and serves them.
func startDeclaredGate(t *testing.T, config string, toolsDir map[string]string) *declaredGate {
	t.Helper()
	dir := t.TempDir()
	if len(toolsDir) > 0 {
		if err := os.Mkdir(filepath.Join(dir, "tools.d"), 0o755); err != nil {
			t.Fatal(err)
		}
		config = "tools_dir = \"tools.d\"\n" + config
		for name, text := range toolsDir {
			if err := os.WriteFile(filepath.Join(dir, "tools.d", name), []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	cfg := filepath.Join(dir, "idemgate.toml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, toks := consoleTokens(t, dir)
	g := &declaredGate{db: newLedger(t), tokens: tokens, toks: toks}
	g.base = startHTTPEnv(t, []string{"E2E_PAYMENTS_TOKEN=" + paymentsToken}, g.db, tokens, 0, "--config", cfg).base
	g.agent = httpSession(t, g.base, toks["alice"])
	g.agent2 = httpSession(t, g.base, toks["alice"])
	g.approver = httpSession(t, g.base, toks["boss"])
	return g
}

func refundArgs(key string, amount int) map[string]any {
	return map[string]any{"operation_key": key, "payment_id": "pay_e2e1", "amount_minor": amount, "currency": "EUR", "reason": "damaged"}
}

func ticketArgs(key, subject string) map[string]any {
	return map[string]any{"operation_key": key, "subject": subject, "body": "The parcel arrived open.", "priority": "high"}
}

// concurrentDuplicates calls tool with args 8 times at once, from two
// client sessions, and checks every answer succeeded with the same
// result, byte for byte; it returns that result.
func concurrentDuplicates(t *testing.T, g *declaredGate, tool string, args map[string]any) json.RawMessage {
	t.Helper()
	var wg sync.WaitGroup
	answers := make([]envelope, 8)
	errs := make([]error, 8)
	for i := range answers {
		s := g.agent
		if i%2 == 1 {
			s = g.agent2
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			answers[i], errs[i] = s.call(ctx, tool, args)
		}()
	}
	wg.Wait()
	for i, e := range answers {
		if errs[i] != nil {
			t.Fatalf("duplicate %d: %v", i, errs[i])
		}
		if e.IsError || e.Status != "succeeded" {
			t.Fatalf("duplicate %d: %s", i, e)
		}
		if !bytes.Equal(e.Result, answers[0].Result) {
			t.Fatalf("duplicate %d answered another result:\n%s\n%s", i, e.Result, answers[0].Result)
		}
	}
	return answers[0].Result
}

// settledByLookup: the write loses its reply after committing (fault);
// the call answers unknown; while the lookup is down the retry stays
// unknown and nothing is re-sent; once it is up the retry is settled by
// the lookup with the committed resource, and a replay answers it byte
// for byte. One effect.
func settledByLookup(t *testing.T, g *declaredGate, api *declAPI, tool string, args map[string]any, fault declFault) {
	t.Helper()
	key := args["operation_key"].(string)
	api.queue(fault)
	first := g.agent.callTool(t, tool, args)
	if first.Status != "unknown" || first.code() != "outcome_unknown" {
		t.Fatalf("%s: the first call answered %s, want unknown", fault, first)
	}
	posts := api.postCount()
	api.setDown(true)
	if e := g.agent.callTool(t, tool, args); e.Status != "unknown" {
		t.Fatalf("%s: with the lookup down the retry answered %s, want unknown", fault, e)
	}
	api.setDown(false)
	settled := g.agent.mustSucceed(t, tool, args)
	replay := g.agent.mustSucceed(t, tool, args)
	if !replay.Replayed || !bytes.Equal(replay.Result, settled.Result) {
		t.Errorf("%s: the replay %s is not the settled result %s", fault, replay, settled.Result)
	}
	if n := api.effectsOf(key); n != 1 {
		t.Errorf("%s: %d effects for one key, want 1", fault, n)
	}
	if p := api.postCount(); p != posts {
		t.Errorf("%s: %d writes re-sent after the unknown outcome, want none", fault, p-posts)
	}
}

// consolePage logs principal into the console and returns the page at
// path.
func consolePage(t *testing.T, base, token, path string) string {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar, Timeout: 10 * time.Second}
	resp, err := c.PostForm(base+"/ui/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	resp, err = c.Get(base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("console %s: %d\n%s", path, resp.StatusCode, b)
	}
	return string(b)
}

// auditOf exports the audit log and returns the entries of key (every
// line checked not to hold any of secrets).
func auditOf(t *testing.T, db, key string, secrets ...string) []map[string]any {
	t.Helper()
	x := runCLI(t, 30*time.Second, "audit", "export", "--db", db)
	if x.Code != 0 {
		t.Fatalf("audit export: exit %d: %s", x.Code, x.Stderr)
	}
	for _, s := range secrets {
		if strings.Contains(x.Stdout, s) {
			t.Errorf("the audit log holds a secret (%s…)", s[:6])
		}
	}
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(x.Stdout), "\n") {
		var e map[string]any
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		if e["key"] == key {
			out = append(out, e)
		}
	}
	return out
}

// noDuplicates checks `idemgate stats`: no duplicate side effect.
func noDuplicates(t *testing.T, db string) {
	t.Helper()
	r := runCLI(t, 30*time.Second, "stats", "--db", db, "--tenant", aprTenant, "--json")
	if r.Code != 0 {
		t.Fatalf("stats: exit %d: %s", r.Code, r.Stderr)
	}
	var st struct {
		Operations int `json:"operations"`
		Duplicates int `json:"duplicate_side_effects"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("stats: %v\n%s", err, r.Stdout)
	}
	if st.Duplicates != 0 || st.Operations == 0 {
		t.Errorf("stats = %+v, want operations and no duplicate side effect", st)
	}
}

// TestDeclaredPayments: create_refund, declared by hand over a payments
// API that honours Idempotency-Key: one refund under concurrent
// duplicates (one request reaches the API), a changed request refused,
// every lost reply settled by the lookup (never re-sent), a not-sent or
// in-progress answer re-sent under the same key once the lookup proved
// it absent, a refund at the policy's amount held for another approver
// who sees the amount in the console, the audit complete and free of the
// API token, stats with no duplicate.
func TestDeclaredPayments(t *testing.T) {
	t.Parallel()
	api := paymentsAPI(t, paymentsToken)
	g := startDeclaredGate(t, paymentsDecl(api.srv.URL), nil)

	if names := toolNamesOf(t, g.agent); !strings.Contains(strings.Join(names, ","), "create_refund") {
		t.Fatalf("tools/list: %v, want create_refund", names)
	}

	key := newKey()
	result := concurrentDuplicates(t, g, "create_refund", refundArgs(key, 2500))
	if n, p := api.effectsOf(key), api.postCount(); n != 1 || p != 1 {
		t.Fatalf("concurrent duplicates: %d refunds, %d requests at the API; want 1 and 1", n, p)
	}
	var r struct {
		Refund struct {
			ID          string `json:"id"`
			AmountMinor int    `json:"amount_minor"`
		} `json:"refund"`
	}
	if err := json.Unmarshal(result, &r); err != nil || r.Refund.ID == "" || r.Refund.AmountMinor != 2500 {
		t.Fatalf("result %s: want the API's refund", result)
	}
	e := g.agent.mustFail(t, "create_refund", refundArgs(key, 2600), "key_reused_with_different_request")
	if e.Status == "succeeded" || api.postCount() != 1 {
		t.Fatalf("changed request: %s, %d requests at the API", e, api.postCount())
	}

	// (Each operation its own amount: the same request under a new key
	// would be held as a suspected duplicate.)
	for i, f := range []declFault{fResetAfterCommit, f500AfterCommit, fTimeoutAfter, fGarbage2xx} {
		settledByLookup(t, g, api, "create_refund", refundArgs(newKey(), 1200+i), f)
	}
	// Not done, or not known to be done: a 500 before the commit and a
	// 409 are unknown, the lookup proves them absent, and the API honours
	// the key, so the same key runs again; a 429 was never taken.
	for i, f := range []declFault{f500BeforeCommit, f409, f429} {
		k, amount := newKey(), 1300+i
		api.queue(f)
		first := g.agent.callTool(t, "create_refund", refundArgs(k, amount))
		want := "unknown"
		if f == f429 {
			want = "retryable"
		}
		if first.Status != want {
			t.Fatalf("%s: first call %s, want %s", f, first, want)
		}
		g.agent.mustSucceed(t, "create_refund", refundArgs(k, amount))
		if n := api.effectsOf(k); n != 1 {
			t.Errorf("%s: %d refunds, want 1", f, n)
		}
	}

	// At the approval threshold: held; the approver sees the amount.
	big := newKey()
	held := g.agent.mustHold(t, "create_refund", refundArgs(big, 150000))
	id := held.Approval.ApprovalID
	page := consolePage(t, g.base, g.toks["boss"], "/ui/approvals/"+id)
	for _, want := range []string{"create_refund", "1500.00 EUR", "pay_e2e1"} {
		if !strings.Contains(page, want) {
			t.Errorf("the console's approval page does not show %q", want)
		}
	}
	if api.effectsOf(big) != 0 {
		t.Fatal("a held refund reached the API")
	}
	approved := g.approver.decide(t, id, "approve", "checked the parcel photos")
	if approved.Status != "succeeded" {
		t.Fatalf("approve: %s", approved)
	}
	replay := g.agent.mustSucceed(t, "create_refund", refundArgs(big, 150000))
	if !bytes.Equal(replay.Result, approved.Result) || api.effectsOf(big) != 1 {
		t.Errorf("after approval: replay %s, approved %s, %d refunds", replay.Result, approved.Result, api.effectsOf(big))
	}

	// The audit: the call, its downstream request, its approval.
	entries := auditOf(t, g.db, big, paymentsToken)
	var sawCall, sawApproval bool
	for _, e := range entries {
		if c, ok := e["downstream_call"].(map[string]any); ok && c["system"] == "declared" && c["method"] == "POST" && c["path"] == "/payments/pay_e2e1/refunds" && c["status"] == float64(201) {
			sawCall = true
		}
		if e["approver"] == "boss" {
			sawApproval = true
		}
	}
	if !sawCall || !sawApproval {
		t.Errorf("audit of %s: downstream call %v, approval %v; entries %v", big, sawCall, sawApproval, entries)
	}
	if v := runCLI(t, 30*time.Second, "audit", "verify", "--db", g.db); v.Code != 0 {
		t.Errorf("audit verify: %s%s", v.Stdout, v.Stderr)
	}
	noDuplicates(t, g.db)
	if _, most := api.totalEffects(); most != 1 {
		t.Errorf("some key has %d refunds", most)
	}
}

// TestDeclaredTickets: open_ticket over a ticketing API that takes no
// idempotency key — every POST opens a ticket — with the key sent as the
// body's client_reference and a search by it: one ticket under
// concurrent duplicates, a changed request refused, lost replies settled
// by the search, and a request the search proves absent re-sent only
// after an approver allows it (the API would not dedupe a repeat), once.
func TestDeclaredTickets(t *testing.T) {
	t.Parallel()
	api := ticketsAPI(t, deskToken)
	g := startDeclaredGate(t, "", map[string]string{"tickets.toml": ticketsDecl(api.srv.URL), "desk.token": deskToken + "\n"})

	key := newKey()
	result := concurrentDuplicates(t, g, "open_ticket", ticketArgs(key, "Parcel damaged"))
	if n, p := api.effectsOf(key), api.postCount(); n != 1 || p != 1 {
		t.Fatalf("concurrent duplicates: %d tickets, %d requests; want 1 and 1", n, p)
	}
	if !strings.Contains(string(result), `"ticket"`) || !strings.Contains(string(result), "T-1") {
		t.Fatalf("result %s: want the ticket", result)
	}
	g.agent.mustFail(t, "open_ticket", ticketArgs(key, "Parcel lost"), "key_reused_with_different_request")

	for _, f := range []declFault{fResetAfterCommit, fTimeoutAfter, f500AfterCommit} {
		settledByLookup(t, g, api, "open_ticket", ticketArgs(newKey(), "Lost reply "+string(f)), f)
	}

	// Absent by the search: re-sent only once a person approves.
	k := newKey()
	args := ticketArgs(k, "Never arrived")
	api.queue(f500BeforeCommit)
	if e := g.agent.callTool(t, "open_ticket", args); e.Status != "unknown" {
		t.Fatalf("500 before commit: %s, want unknown", e)
	}
	held := g.agent.callTool(t, "open_ticket", args)
	if held.Status != "awaiting_approval" || held.Approval == nil {
		t.Fatalf("absent at the API: %s, want a re-run held for approval", held)
	}
	if api.effectsOf(k) != 0 {
		t.Fatal("re-sent before approval")
	}
	if e := g.approver.decide(t, held.Approval.ApprovalID, "approve", "desk shows nothing"); e.Status != "succeeded" {
		t.Fatalf("approve the re-run: %s", e)
	}
	g.agent.mustSucceed(t, "open_ticket", args)
	if n := api.effectsOf(k); n != 1 {
		t.Errorf("re-run: %d tickets, want 1", n)
	}

	// A change of an existing ticket: held, shown as a diff from the
	// ticket as it is, and sent with If-Match of the version the approver
	// saw; a ticket changed meanwhile fails the approved change.
	ticket := "T-1"
	change := map[string]any{"operation_key": newKey(), "ticket_id": ticket, "priority": "low"}
	h := g.agent.mustHold(t, "update_ticket", change)
	pa := pendingByID(t, g.approver.pending(t), h.Approval.ApprovalID)
	if page := consolePage(t, g.base, g.toks["boss"], "/ui/approvals/"+h.Approval.ApprovalID); !strings.Contains(page, "update_ticket") || !strings.Contains(page, "priority") {
		t.Errorf("the console's approval page does not show the change of priority")
	}
	if len(pa.Diff) != 1 || pa.Diff[0].Path != "priority" || pa.Diff[0].Before != "high" || pa.Diff[0].After != "low" {
		t.Fatalf("the change's diff: %+v (%s), want priority high → low", pa.Diff, pa.DiffText)
	}
	if e := g.approver.decide(t, h.Approval.ApprovalID, "approve", ""); e.Status != "succeeded" {
		t.Fatalf("approve the change: %s", e)
	}
	api.mu.Lock()
	sent := append([]string(nil), api.ifMatch...)
	api.mu.Unlock()
	if len(sent) != 1 || sent[0] != `"v1"` {
		t.Errorf("If-Match sent: %q, want the version the approver saw", sent)
	}
	stale := g.agent.mustHold(t, "update_ticket", map[string]any{"operation_key": newKey(), "ticket_id": ticket, "state": "closed"})
	other := g.agent.mustHold(t, "update_ticket", map[string]any{"operation_key": newKey(), "ticket_id": ticket, "priority": "normal"})
	if e := g.approver.decide(t, other.Approval.ApprovalID, "approve", ""); e.Status != "succeeded" {
		t.Fatalf("approve the other change: %s", e)
	}
	if e := g.approver.decide(t, stale.Approval.ApprovalID, "approve", ""); e.Status != "failed" || e.code() != "precondition_failed" {
		t.Fatalf("approving a change of a ticket changed since: %s, want failed precondition_failed", e)
	}

	// Every call of the key is audited with what it was answered: the 8
	// duplicates and the changed request.
	entries := auditOf(t, g.db, key, deskToken)
	answered, posted := 0, 0
	for _, e := range entries {
		if e["response_sha256"] != nil && e["response_sha256"] != "" {
			answered++
		}
		if c, ok := e["downstream_call"].(map[string]any); ok && c["system"] == "declared" && c["path"] == "/tickets" {
			posted++
		}
	}
	if answered != 9 || posted != 1 {
		t.Errorf("audit of %s: %d answers recorded for 9 calls, %d requests sent (want 1); entries %v", key, answered, posted, entries)
	}
	noDuplicates(t, g.db)
	if _, most := api.totalEffects(); most != 1 {
		t.Errorf("some key has %d tickets", most)
	}
}

// TestDeclaredImportedOpenAPI: `idemgate tools import` writes
// create_refund from the payments API's OpenAPI document (Idempotency-Key
// and the keyed GET found in it), `tools check` accepts it, and served it
// keeps the guarantees: one refund under concurrent duplicates, a lost
// reply settled by the lookup.
func TestDeclaredImportedOpenAPI(t *testing.T) {
	t.Parallel()
	api := paymentsAPI(t, "")
	root, err := findModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	imp := runCLI(t, 20*time.Second, "tools", "import", filepath.Join(root, "e2e", "testdata", "declared", "payments-openapi.yaml"),
		"--operation", "createRefund", "--base-url", api.srv.URL)
	if imp.Code != 0 {
		t.Fatalf("tools import: exit %d: %s", imp.Code, imp.Stderr)
	}
	for _, want := range []string{`header = "Idempotency-Key"`, "/refunds?idempotency_key={operation_key}", "safe_retry = true"} {
		if !strings.Contains(imp.Stdout, want) {
			t.Errorf("the import lacks %q:\n%s", want, imp.Stdout)
		}
	}
	cfg := filepath.Join(t.TempDir(), "imported.toml")
	if err := os.WriteFile(cfg, []byte(imp.Stdout), 0o600); err != nil {
		t.Fatal(err)
	}
	chk := runCLI(t, 20*time.Second, "tools", "check", "--config", cfg)
	if chk.Code != 0 || !strings.Contains(chk.Stdout, `"name": "create_refund"`) || !strings.Contains(chk.Stdout, `"operation_key"`) {
		t.Fatalf("tools check: exit %d\n%s\n%s", chk.Code, chk.Stdout, chk.Stderr)
	}

	g := startDeclaredGate(t, imp.Stdout, nil)
	key := newKey()
	concurrentDuplicates(t, g, "create_refund", refundArgs(key, 900))
	if n, p := api.effectsOf(key), api.postCount(); n != 1 || p != 1 {
		t.Fatalf("concurrent duplicates: %d refunds, %d requests; want 1 and 1", n, p)
	}
	settledByLookup(t, g, api, "create_refund", refundArgs(newKey(), 901), fResetAfterCommit)
	noDuplicates(t, g.db)
}
