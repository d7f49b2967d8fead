package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCaseVariantSelfApprovalRefused: the requester cannot approve its own
// cancel from the command line by changing the case or Unicode form of its
// name (issue 8, defect 8).
func TestCaseVariantSelfApprovalRefused(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	agent := startServer(t, mcpGoModern, serverConfig{DB: db, Tenant: aprTenant, Principal: "alice-assistant"})
	o := placeOrder(t, agent, "cust-id")
	key := newKey()
	id := agent.mustHold(t, "cancel_order", cancelArgs(key, o.OrderID, 1)).Approval.ApprovalID
	for _, name := range []string{"ALICE-assistant", "Alice-Assistant"} {
		r := runCLI(t, 20*time.Second, "approvals", "approve", id, "--principal", name, "--db", db, "--tenant", aprTenant)
		if r.Code == 0 || !strings.Contains(r.Stdout+r.Stderr, "forbidden") {
			t.Fatalf("approve by %q: exit %d, want forbidden\nstdout: %s\nstderr: %s", name, r.Code, r.Stdout, r.Stderr)
		}
	}
	agent.mustBeState(t, key, "awaiting_approval")
	if got := getOrder(t, agent, o.OrderID); got.Status != "placed" {
		t.Fatalf("order %+v after refused self-approvals, want placed", got)
	}
}

// TestRequireApproverToken: with require_approver_token in the
// configuration, an approval from the command line or a stdio approver
// needs an approver's token; the token's principal is who decides and is
// named in the audit log, whatever a flag would claim.
func TestRequireApproverToken(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	cfg := filepath.Join(dir, "idemgate.toml")
	if err := os.WriteFile(cfg, []byte("require_approver_token = true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens.json")
	bossTok := addToken(t, tokens, "boss", aprTenant, "approver")
	agentTok := addToken(t, tokens, "alice-assistant", aprTenant, "agent")

	// An agent on stdio needs no token.
	agent := startServer(t, mcpGoModern, serverConfig{DB: db, Tenant: aprTenant, Principal: "alice-assistant", Args: []string{"--config", cfg}})
	o := placeOrder(t, agent, "cust-tok")
	key := newKey()
	id := agent.mustHold(t, "cancel_order", cancelArgs(key, o.OrderID, 1)).Approval.ApprovalID
	base := []string{"approvals", "approve", id, "--db", db, "--tenant", aprTenant, "--config", cfg, "--tokens", tokens}

	noToken := runCLI(t, 20*time.Second, append(base, "--principal", "boss")...)
	if noToken.Code == 0 || !strings.Contains(noToken.Stderr, "require_approver_token") {
		t.Fatalf("approve without a token: exit %d, want refused naming require_approver_token\nstdout: %s\nstderr: %s", noToken.Code, noToken.Stdout, noToken.Stderr)
	}
	withAgent := runCLI(t, 20*time.Second, append(base, "--token", agentTok)...)
	if withAgent.Code == 0 || !strings.Contains(withAgent.Stderr, "role approver") {
		t.Fatalf("approve with an agent's token: exit %d, want refused\nstdout: %s\nstderr: %s", withAgent.Code, withAgent.Stdout, withAgent.Stderr)
	}
	wrongName := runCLI(t, 20*time.Second, append(base, "--token", bossTok, "--principal", "someone-else")...)
	if wrongName.Code == 0 || !strings.Contains(wrongName.Stderr, "token is boss's") {
		t.Fatalf("approve with boss's token as someone-else: exit %d\nstderr: %s", wrongName.Code, wrongName.Stderr)
	}
	agent.mustBeState(t, key, "awaiting_approval")

	// A stdio approver without a token does not start.
	srv := runCLI(t, 20*time.Second, "serve", "--db", db, "--config", cfg, "--role", "approver", "--principal", "boss", "--tenant", aprTenant)
	if srv.Code == 0 || !strings.Contains(srv.Stderr, "require_approver_token") {
		t.Fatalf("serve --role approver without a token: exit %d\nstderr: %s", srv.Code, srv.Stderr)
	}

	ok := runCLI(t, 20*time.Second, append(base, "--token", bossTok, "--comment", "checked")...)
	if ok.Code != 0 {
		t.Fatalf("approve with boss's token: exit %d\nstdout: %s\nstderr: %s", ok.Code, ok.Stdout, ok.Stderr)
	}
	agent.mustBeState(t, key, "succeeded")

	exp := runCLI(t, 20*time.Second, "audit", "export", "--db", db)
	if exp.Code != 0 {
		t.Fatalf("audit export: %s", exp.Stderr)
	}
	found := false
	for _, line := range strings.Split(strings.TrimSpace(exp.Stdout), "\n") {
		var e struct {
			Key    string `json:"key"`
			Detail string `json:"detail"`
			Actor  struct {
				Principal string `json:"principal"`
				Role      string `json:"role"`
			} `json:"actor"`
			StateBefore string `json:"state_before"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		if e.Key == key && e.StateBefore == "awaiting_approval" {
			found = true
			if e.Actor.Principal != "boss" || e.Actor.Role != "approver" {
				t.Fatalf("approval audited as %+v, want the token's principal boss (approver): %s", e.Actor, line)
			}
		}
	}
	if !found {
		t.Fatalf("no audit entry of the approval in:\n%s", exp.Stdout)
	}

	// A stdio approver with the token acts as the token's principal.
	key2 := newKey()
	o2 := placeOrder(t, agent, "cust-tok-2")
	id2 := agent.mustHold(t, "cancel_order", cancelArgs(key2, o2.OrderID, 1)).Approval.ApprovalID
	approver := startServer(t, mcpGoModern, serverConfig{DB: db, Tenant: aprTenant, Args: []string{"--config", cfg, "--role", "approver", "--tokens", tokens, "--token", bossTok}})
	d := approver.mustSucceed(t, "decide_approval", decideArgs(id2, "approve", "ok"))
	if by := approvalString(t, d, "decided_by"); by != "boss" {
		t.Fatalf("decided_by = %q, want the token's principal boss: %s", by, d)
	}
}

// TestApproverTokenRuleKeptByTheLedger: once a process configured with
// require_approver_token has opened the ledger, the ledger keeps the rule:
// an approval from a command given no configuration at all still needs an
// approver's token. Only an approver's token lifts it.
func TestApproverTokenRuleKeptByTheLedger(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	cfg := filepath.Join(dir, "strict.toml")
	if err := os.WriteFile(cfg, []byte("require_approver_token = true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(dir, "tokens.json")
	bossTok := addToken(t, tokens, "boss", aprTenant, "approver")
	agentTok := addToken(t, tokens, "alice-assistant", aprTenant, "agent")

	// The agent's server runs with the strict configuration.
	agent := startServer(t, mcpGoModern, serverConfig{DB: db, Tenant: aprTenant, Principal: "alice-assistant", Args: []string{"--config", cfg}})
	o := placeOrder(t, agent, "cust-rule")
	key := newKey()
	id := agent.mustHold(t, "cancel_order", cancelArgs(key, o.OrderID, 1)).Approval.ApprovalID
	// No owner from now on: a command run in one takes its configuration.
	agent.Close()
	stopOwner(t, db)

	// No --config: the ledger still says a token is needed.
	bare := runCLI(t, 20*time.Second, "approvals", "approve", id, "--db", db, "--tenant", aprTenant, "--principal", "boss")
	if bare.Code == 0 || !strings.Contains(bare.Stderr, "requires approver tokens") {
		t.Fatalf("approve with no config and no token: exit %d, want refused by the ledger's rule\nstdout: %s\nstderr: %s", bare.Code, bare.Stdout, bare.Stderr)
	}
	if r := runCLI(t, 20*time.Second, "ops", "show", key, "--db", db, "--tenant", aprTenant); !strings.Contains(r.Stdout, "awaiting_approval") {
		t.Fatalf("after the refused approval: %s", r.Stdout)
	}

	off := []string{"approvals", "require-token", "off", "--db", db, "--tenant", aprTenant, "--tokens", tokens}
	if r := runCLI(t, 20*time.Second, append(off, "--principal", "boss")...); r.Code == 0 {
		t.Fatalf("require-token off without a token: exit 0\nstdout: %s", r.Stdout)
	}
	if r := runCLI(t, 20*time.Second, append(off, "--token", agentTok)...); r.Code == 0 {
		t.Fatalf("require-token off with an agent's token: exit 0\nstdout: %s", r.Stdout)
	}
	if r := runCLI(t, 20*time.Second, append(off, "--token", bossTok)...); r.Code != 0 {
		t.Fatalf("require-token off with boss's token: exit %d\nstderr: %s", r.Code, r.Stderr)
	}
	// Lifted: an approval without a token and without the strict
	// configuration goes through.
	ok := runCLI(t, 20*time.Second, "approvals", "approve", id, "--db", db, "--tenant", aprTenant, "--principal", "boss")
	if ok.Code != 0 {
		t.Fatalf("approve after the rule was lifted: exit %d\nstderr: %s", ok.Code, ok.Stderr)
	}
	agent = startServer(t, mcpGoModern, serverConfig{DB: db, Tenant: aprTenant, Principal: "alice-assistant"})
	agent.mustBeState(t, key, "succeeded")
}
