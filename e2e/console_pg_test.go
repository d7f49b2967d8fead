package e2e

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"idemgate/ledger/postgres/pgtest"
)

// TestConsolePostgresApprove: the console over a PostgreSQL ledger (a new
// database in the cluster pgtest starts; the test skips when PostgreSQL
// is not installed, and fails under CI=true). An agent of `serve --http`
// on the database asks to cancel an order and is held; an approver logs
// into `idemgate console` on the same database — another process, as a
// developer whose agents use stdio would run it — sees the diff, approves
// with a comment and sees the outcome; the order is cancelled once, the
// agent's retry replays it, the history names the approver, and the
// Overview counts the replay and verifies the database's audit chain.
func TestConsolePostgresApprove(t *testing.T) {
	db := pgtest.NewDatabase(t)
	ctx := newBrowser(t)
	dir := t.TempDir()
	outbox := filepath.Join(dir, "outbox")
	tokens, toks := consoleTokens(t, dir)
	agent := httpSession(t, httpServer(t, db, tokens, "--outbox-dir", outbox), toks["alice"])

	o := placeOrder(t, agent, "cust-console-pg")
	key := newKey()
	args := cancelArgs(key, o.OrderID, 1)
	id := agent.mustHold(t, "cancel_order", args).Approval.ApprovalID

	base, _ := consoleServer(t, db, tokens, "--outbox-dir", outbox)
	loginWithToken(t, ctx, base, toks["boss"])
	card := "#apr-" + id
	do(t, ctx, "see the approval", chromedp.WaitVisible(chromedp.CSS(card)))
	for css, want := range map[string]string{
		card + " .requester":                    "alice",
		card + " table.diff tbody tr td.path":   "status",
		card + " table.diff tbody tr td.before": "placed",
		card + " table.diff tbody tr td.after":  "cancelled",
	} {
		if got := textOf(t, ctx, css); got != want {
			t.Errorf("%s = %q, want %q", css, got, want)
		}
	}
	do(t, ctx, "approve with a comment",
		chromedp.SendKeys(chromedp.CSS("#comment-"+id), "customer called, refund issued"),
		chromedp.Click(chromedp.CSS(card+" button.approve")),
		chromedp.WaitVisible(chromedp.CSS("#outcome-status")),
	)
	if got := textOf(t, ctx, "#outcome-status"); got != "succeeded" {
		t.Fatalf("outcome = %q, want succeeded\n%s", got, bodyText(t, ctx))
	}
	if res := textOf(t, ctx, "#outcome-summary"); !strings.Contains(res, "Order "+o.OrderID+" cancelled") {
		t.Errorf("the outcome page does not say the order was cancelled: %s", res)
	}

	replay := agent.mustSucceed(t, "cancel_order", args)
	if !replay.Replayed {
		t.Errorf("the agent's retry was not a replay: %s", replay)
	}
	if got := getOrder(t, agent, o.OrderID); got.Status != "cancelled" || got.Version != 2 {
		t.Errorf("order after approval = %+v, want cancelled at version 2 (one execution)", got)
	}

	do(t, ctx, "open the history", chromedp.Navigate(base+"/ui/history"), chromedp.WaitVisible(chromedp.CSS(card)))
	if got := textOf(t, ctx, card+" .decided-by"); !strings.HasPrefix(got, "boss ") {
		t.Errorf("history decided by = %q, want boss", got)
	}
	// The replay's audit entry is buffered by the agent's server and
	// written within its flush interval (200 ms): the page is loaded
	// again until it counts it, and must never count more.
	var replays string
	eventually(10*time.Second, func() bool {
		do(t, ctx, "the overview", chromedp.Navigate(base+"/ui/overview"), chromedp.WaitVisible(chromedp.CSS("#chart-replays")))
		replays = textOf(t, ctx, "#n-replays")
		return replays != "0"
	})
	if replays != "1" {
		t.Errorf("replays served = %s, want 1 (the agent's retry)", replays)
	}
	if got := textOf(t, ctx, "#n-duplicates"); got != "0" {
		t.Errorf("duplicate side effects = %s, want 0", got)
	}
	do(t, ctx, "verify the chain",
		chromedp.Click(chromedp.CSS("#verify")),
		chromedp.WaitVisible(chromedp.CSS("p.notice[role=status]")),
	)
	if got := textOf(t, ctx, "#verify-status"); !strings.HasPrefix(got, "Intact") {
		t.Errorf("the audit chain on PostgreSQL: %q, want Intact", got)
	}
}
