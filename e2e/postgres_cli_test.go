package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"idemgate/ledger/postgres/pgtest"
)

// refusingGateway is a notification webhook that refuses every message
// (400: a definitive failure, so the message is dead-lettered at once)
// and counts the POSTs per message id (Idempotency-Key).
type refusingGateway struct {
	srv *httptest.Server
	mu  sync.Mutex
	n   map[string]int
}

func newRefusingGateway(t *testing.T) *refusingGateway {
	g := &refusingGateway{n: map[string]int{}}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		g.mu.Lock()
		g.n[r.Header.Get("Idempotency-Key")]++
		g.mu.Unlock()
		http.Error(w, `{"error":"recipient blocked"}`, http.StatusBadRequest)
	}))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *refusingGateway) posts(id string) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.n[id]
}

// pgAuditLine is what the tests read of one line of `audit export` or
// `audit tail`.
type pgAuditLine struct {
	Seq   uint64 `json:"seq"`
	Event string `json:"event"`
	Actor struct {
		Principal string `json:"principal"`
		Tenant    string `json:"tenant"`
	} `json:"actor"`
	Tool        string `json:"tool"`
	Key         string `json:"key"`
	Decision    string `json:"decision"`
	StateBefore string `json:"state_before"`
	StateAfter  string `json:"state_after"`
	Approver    string `json:"approver"`
	Call        *struct {
		MessageIDs []string `json:"message_ids"`
	} `json:"downstream_call"`
	PrevHash string `json:"prev_hash"`
	Hash     string `json:"hash"`
}

func parsePGAudit(t *testing.T, what, out string) []pgAuditLine {
	t.Helper()
	var lines []pgAuditLine
	for i, l := range strings.Split(strings.TrimSpace(out), "\n") {
		var e pgAuditLine
		if err := json.Unmarshal([]byte(l), &e); err != nil {
			t.Fatalf("%s, line %d %q: %v", what, i+1, l, err)
		}
		lines = append(lines, e)
	}
	return lines
}

// TestPostgresCommandLine: the operator's commands that read or change a
// ledger, run against a PostgreSQL ledger with real data while an agent's
// server runs on it — an order, a cancel held for approval, a
// notification the webhook refused (dead-lettered) — and checked by what
// they print and what they change: `ops show` (text and JSON), `approvals
// show`, `approvals reject` (the agent's retry then replays the
// rejection, and the order is untouched), `outbox requeue` (the running
// server delivers the message again), `audit tail` and `audit export`
// (the same hash-chained entries, with the rejection and the requeue in
// them), and `audit verify`.
func TestPostgresCommandLine(t *testing.T) {
	db := pgtest.NewDatabase(t)
	gw := newRefusingGateway(t)
	agent := startServer(t, mcpGoModern, serverConfig{DB: db, OutboxDir: filepath.Join(t.TempDir(), "outbox"),
		Tenant: aprTenant, Principal: "alice", Args: []string{"--notify-webhook", gw.srv.URL}})
	ledgerArgs := []string{"--db", db, "--tenant", aprTenant}
	cli := func(args ...string) cliResult {
		t.Helper()
		return runCLI(t, 30*time.Second, append(args, ledgerArgs...)...)
	}

	// The data: an order, its cancel held for approval, a refused message.
	o := placeOrder(t, agent, "cust-pg-cli")
	cancelKey := newKey()
	cancel := cancelArgs(cancelKey, o.OrderID, 1)
	held := agent.mustHold(t, "cancel_order", cancel)
	approvalID := held.Approval.ApprovalID
	noteKey := newKey()
	msgID := messageIDOf(t, agent.mustSucceed(t, "send_notification", map[string]any{
		"operation_key": noteKey, "channel": "email", "to": []string{"ops@example.com"}, "subject": "hello", "body": "your order shipped",
	}))
	if !eventually(20*time.Second, func() bool {
		st, _, _ := agent.status(t, noteKey)
		return len(st.Deliveries) == 1 && st.Deliveries[0].State == "dead"
	}) {
		t.Fatal("the refused message was not dead-lettered within 20 s")
	}

	t.Run("ops show", func(t *testing.T) {
		r := cli("ops", "show", noteKey)
		if r.Code != 0 {
			t.Fatalf("ops show: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
		}
		for _, want := range []*regexp.Regexp{
			regexp.MustCompile(`(?m)^operation\s+` + noteKey + `$`),
			regexp.MustCompile(`(?m)^tool\s+send_notification$`),
			regexp.MustCompile(`(?m)^state\s+succeeded \(attempts 1\)$`),
			regexp.MustCompile(`(?m)^requested by\s+alice$`),
			regexp.MustCompile(`(?m)^\d+\s+\S+\s+transition\s.*succeeded`),
		} {
			if !want.MatchString(r.Stdout) {
				t.Errorf("ops show lacks %s:\n%s", want, r.Stdout)
			}
		}
		j := cli("ops", "show", cancelKey, "--json")
		var h struct {
			Key    string `json:"operation_key"`
			Record *struct {
				Tool     string `json:"tool"`
				State    string `json:"state"`
				Approval *struct {
					ID string `json:"approval_id"`
				} `json:"approval"`
			} `json:"record"`
			Total int           `json:"history_total"`
			Hist  []pgAuditLine `json:"history"`
		}
		if j.Code != 0 || json.Unmarshal([]byte(j.Stdout), &h) != nil || h.Record == nil {
			t.Fatalf("ops show --json: exit %d\n%s%s", j.Code, j.Stdout, j.Stderr)
		}
		if h.Key != cancelKey || h.Record.Tool != "cancel_order" || h.Record.State != "awaiting_approval" || h.Record.Approval == nil || h.Record.Approval.ID != approvalID {
			t.Errorf("ops show --json of the held cancel: %s", j.Stdout)
		}
		if h.Total == 0 || h.Total != len(h.Hist) || h.Hist[len(h.Hist)-1].Key != cancelKey {
			t.Errorf("ops show --json history: %d entries of %d total, want all of this key's", len(h.Hist), h.Total)
		}
		unused := newKey()
		if r := cli("ops", "show", unused); r.Code == 0 || !strings.Contains(r.Stderr, `no operation "`+unused+`"`) {
			t.Errorf("ops show of a key never used: exit %d, want non-zero saying there is no such operation\n%s%s", r.Code, r.Stdout, r.Stderr)
		}
	})

	t.Run("approvals show and reject", func(t *testing.T) {
		r := cli("approvals", "show", approvalID, "--principal", "boss")
		if r.Code != 0 {
			t.Fatalf("approvals show: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
		}
		for _, want := range []string{approvalID + "  pending  cancel_order  requested by alice", "operation_key: " + cancelKey, o.OrderID, `status "placed" → cancelled`, "reason: customer asked"} {
			if !strings.Contains(r.Stdout, want) {
				t.Errorf("approvals show lacks %q:\n%s", want, r.Stdout)
			}
		}
		if r := cli("approvals", "show", "apr_doesnotexist", "--principal", "boss"); r.Code == 0 || !strings.Contains(r.Stdout+r.Stderr, "not_found") {
			t.Errorf("approvals show of an unknown approval: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
		}

		rej := cli("approvals", "reject", approvalID, "--principal", "boss", "--comment", "not this one")
		var out struct {
			OperationKey string `json:"operation_key"`
			Status       string `json:"status"`
			Approval     *struct {
				Status string `json:"status"`
			} `json:"approval"`
		}
		if rej.Code != 0 || json.Unmarshal([]byte(rej.Stdout), &out) != nil {
			t.Fatalf("approvals reject: exit %d\n%s%s", rej.Code, rej.Stdout, rej.Stderr)
		}
		if out.OperationKey != cancelKey || out.Status != "rejected" || out.Approval == nil || out.Approval.Status != "rejected" {
			t.Errorf("approvals reject printed %s, want the operation rejected", rej.Stdout)
		}
		// Rejecting again, as the same approver, is answered with the
		// rejection as it stands (a second transition would show in the
		// audit log, checked below).
		if again := cli("approvals", "reject", approvalID, "--principal", "boss"); again.Code != 0 || !strings.Contains(again.Stdout, `"status": "rejected"`) {
			t.Errorf("a second reject by the same approver: exit %d, want 0 and the rejection\n%s%s", again.Code, again.Stdout, again.Stderr)
		}
		if other := cli("approvals", "approve", approvalID, "--principal", "boss2"); other.Code == 0 {
			t.Errorf("approving a rejected approval exited 0:\n%s", other.Stdout)
		}
		e := agent.callTool(t, "cancel_order", cancel)
		if e.Status != "rejected" || !e.Replayed {
			t.Errorf("the agent's retry after the rejection: %s, want the rejection replayed", e)
		}
		if got := getOrder(t, agent, o.OrderID); got.Status != "placed" || got.Version != 1 {
			t.Errorf("the order after a rejected cancel: %+v, want placed at version 1", got)
		}
		if r := cli("approvals", "show", approvalID, "--principal", "boss"); r.Code != 0 || !strings.Contains(r.Stdout, approvalID+"  rejected  cancel_order") {
			t.Errorf("approvals show after the rejection: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
		}
	})

	t.Run("outbox requeue", func(t *testing.T) {
		before := gw.posts(msgID)
		if before != 1 {
			t.Fatalf("the gateway saw %d POSTs of %s before the requeue, want 1", before, msgID)
		}
		r := runCLI(t, 30*time.Second, "outbox", "requeue", msgID, "--db", db, "--principal", "ops-anna")
		if r.Code != 0 || !strings.Contains(r.Stdout, "requeued "+msgID) {
			t.Fatalf("outbox requeue: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
		}
		// The running server picks it up again (and the gateway refuses it
		// again: dead once more, after one more attempt).
		if !eventually(20*time.Second, func() bool { return gw.posts(msgID) == 2 }) {
			t.Fatalf("after the requeue the gateway saw %d POSTs of %s, want 2", gw.posts(msgID), msgID)
		}
		if !eventually(10*time.Second, func() bool {
			st, _, _ := agent.status(t, noteKey)
			return len(st.Deliveries) == 1 && st.Deliveries[0].State == "dead" && st.Deliveries[0].Attempts == 2
		}) {
			st, _, _ := agent.status(t, noteKey)
			t.Errorf("deliveries after the requeue: %+v, want one dead after 2 attempts", st.Deliveries)
		}
		if r := runCLI(t, 30*time.Second, "outbox", "requeue", "msg_doesnotexist", "--db", db, "--principal", "ops-anna"); r.Code != 2 {
			t.Errorf("requeue of an unknown message: exit %d, want 2\n%s%s", r.Code, r.Stdout, r.Stderr)
		}
	})

	t.Run("audit tail, export, verify", func(t *testing.T) {
		tail := runCLI(t, 30*time.Second, "audit", "tail", "-n", "3", "--db", db)
		if tail.Code != 0 {
			t.Fatalf("audit tail: exit %d\n%s", tail.Code, tail.Stderr)
		}
		last := parsePGAudit(t, "audit tail", tail.Stdout)
		if len(last) != 3 || last[1].Seq != last[0].Seq+1 || last[2].Seq != last[1].Seq+1 || last[1].PrevHash != last[0].Hash || last[2].PrevHash != last[1].Hash {
			t.Fatalf("audit tail -n 3: want 3 consecutive chained entries, got %+v", last)
		}
		x := runCLI(t, 30*time.Second, "audit", "export", "--db", db)
		if x.Code != 0 {
			t.Fatalf("audit export: exit %d\n%s", x.Code, x.Stderr)
		}
		all := parsePGAudit(t, "audit export", x.Stdout)
		prev := ""
		for i, e := range all {
			if e.Seq != uint64(i+1) || e.PrevHash != prev {
				t.Fatalf("audit export line %d: seq %d, prev %.8s; want seq %d, prev %.8s", i+1, e.Seq, e.PrevHash, i+1, prev)
			}
			prev = e.Hash
		}
		if len(all) < int(last[2].Seq) {
			t.Fatalf("audit export has %d entries, the tail ended at %d", len(all), last[2].Seq)
		}
		for _, e := range last { // the tail's entries, as the export has them
			if got := all[e.Seq-1]; got.Hash != e.Hash {
				t.Errorf("entry %d: tail says hash %.8s, export %.8s", e.Seq, e.Hash, got.Hash)
			}
		}
		var requeued, heldCancel bool
		rejected := 0
		for _, e := range all {
			switch {
			case e.Event == "transition" && e.Key == cancelKey && e.StateBefore == "awaiting_approval" && e.StateAfter == "rejected":
				if e.Approver == "boss" || e.Actor.Principal == "boss" {
					rejected++
				}
			case e.Event == "operator" && e.Decision == "requeued" && e.Key == noteKey:
				requeued = e.Actor.Principal == "ops-anna" && e.Call != nil && len(e.Call.MessageIDs) == 1 && e.Call.MessageIDs[0] == msgID
			case e.Event == "transition" && e.Key == cancelKey && e.StateAfter == "awaiting_approval" && e.Tool == "cancel_order":
				heldCancel = true
			}
		}
		if !heldCancel || rejected != 1 || !requeued {
			t.Errorf("audit export: cancel held %v, rejected by boss %d times, requeue by ops-anna of %s %v; want held, rejected once, requeued", heldCancel, rejected, msgID, requeued)
		}
		after := runCLI(t, 30*time.Second, "audit", "export", "--db", db, "--after", fmt.Sprint(last[0].Seq))
		if got := parsePGAudit(t, "audit export --after", after.Stdout); after.Code != 0 || len(got) < 2 || got[0].Seq != last[1].Seq || got[0].Hash != last[1].Hash {
			t.Errorf("audit export --after %d: exit %d, first entry %+v, want entry %d", last[0].Seq, after.Code, got, last[1].Seq)
		}
		if v := runCLI(t, 30*time.Second, "audit", "verify", "--db", db); v.Code != 0 || !strings.Contains(v.Stdout, "intact") {
			t.Errorf("audit verify: exit %d\n%s%s", v.Code, v.Stdout, v.Stderr)
		}
	})
}
