package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// strictConfig writes a configuration file setting require_approver_token
// into dir and returns its path.
func strictConfig(t *testing.T, dir string) string {
	t.Helper()
	cfg := filepath.Join(dir, "idemgate.toml")
	if err := os.WriteFile(cfg, []byte("require_approver_token = true\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// transitionActor returns the principal and role of the audit entry that
// moved key out of state from, or fails the test.
func transitionActor(t *testing.T, db, key, from string) (principal, role string) {
	t.Helper()
	exp := runCLI(t, 20*time.Second, "audit", "export", "--db", db)
	if exp.Code != 0 {
		t.Fatalf("audit export: exit %d: %s", exp.Code, exp.Stderr)
	}
	for _, line := range strings.Split(strings.TrimSpace(exp.Stdout), "\n") {
		var e struct {
			Key   string `json:"key"`
			Actor struct {
				Principal string `json:"principal"`
				Role      string `json:"role"`
			} `json:"actor"`
			StateBefore string `json:"state_before"`
			StateAfter  string `json:"state_after"`
		}
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("audit line %q: %v", line, err)
		}
		if e.Key == key && e.StateBefore == from && e.StateAfter != from {
			return e.Actor.Principal, e.Actor.Role
		}
	}
	t.Fatalf("no audit entry moves %s out of %s in:\n%s", key, from, exp.Stdout)
	return "", ""
}

// TestRequireApproverTokenReject: under require_approver_token, `idemgate
// approvals reject` is refused without a token — with the configuration,
// and without it (the ledger keeps the rule) — and with an agent's token;
// the approval stays pending. With an approver's token it rejects, and
// the audit log names the token's principal.
func TestRequireApproverTokenReject(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	cfg := strictConfig(t, dir)
	tokens := filepath.Join(dir, "tokens.json")
	bossTok := addToken(t, tokens, "boss", aprTenant, "approver")
	agentTok := addToken(t, tokens, "alice-assistant", aprTenant, "agent")

	agent := startServer(t, mcpGoModern, serverConfig{DB: db, Tenant: aprTenant, Principal: "alice-assistant", Args: []string{"--config", cfg}})
	o := placeOrder(t, agent, "cust-tok-reject")
	key := newKey()
	id := agent.mustHold(t, "cancel_order", cancelArgs(key, o.OrderID, 1)).Approval.ApprovalID
	reject := []string{"approvals", "reject", id, "--db", db, "--tenant", aprTenant, "--tokens", tokens, "--comment", "not now"}

	mustRefuseWithoutApproverToken(t, reject, cfg, agentTok, func() { agent.mustBeState(t, key, "awaiting_approval") })

	ok := runCLI(t, 20*time.Second, append(reject, "--config", cfg, "--token", bossTok)...)
	if ok.Code != 0 || !strings.Contains(ok.Stdout, `"status": "rejected"`) {
		t.Fatalf("reject with boss's token: exit %d, want rejected\nstdout: %s\nstderr: %s", ok.Code, ok.Stdout, ok.Stderr)
	}
	agent.mustBeState(t, key, "rejected")
	if got := getOrder(t, agent, o.OrderID); got.Status != "placed" {
		t.Errorf("order %+v after the rejected cancel, want placed", got)
	}
	if p, role := transitionActor(t, db, key, "awaiting_approval"); p != "boss" || role != "approver" {
		t.Errorf("the rejection is audited as %s (%s), want the token's principal boss (approver)", p, role)
	}
}

// TestRequireApproverTokenResolve: under require_approver_token, `idemgate
// resolve` of an unknown operation is refused without a token — with the
// configuration, and without it (the ledger keeps the rule) — and with an
// agent's token; the operation stays unknown and nothing is sent. With an
// approver's token it settles the operation, the audit log names the
// token's principal, and the agent's retry replays the resolution.
func TestRequireApproverTokenResolve(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	cfg := strictConfig(t, dir)
	tokens := filepath.Join(dir, "tokens.json")
	bossTok := addToken(t, tokens, "boss", aprTenant, "approver")
	agentTok := addToken(t, tokens, "alice-assistant", aprTenant, "agent")

	api := newFakeAPI(t)
	agent := startAPIServer(t, mcpGoModern, api, serverConfig{DB: db, Tenant: aprTenant, Principal: "alice-assistant", Args: []string{"--config", cfg}})
	key := newKey()
	args := faOrder(key, "cust-tok-resolve")
	api.Inject(fault{Kind: DropReplyAfterCommit, Match: matchCreate})
	api.SetLookupUnavailable(true) // nothing but a person can settle it
	agent.mustFail(t, "create_order", args, "outcome_unknown")
	o := api.OrderForKey(idemKey(aprTenant, key))
	if o == nil {
		t.Fatal("the fake API has no order for the key")
	}
	resolve := append([]string{"resolve", key, "--outcome", "succeeded", "--downstream-ref", o.OrderID,
		"--evidence", "found " + o.OrderID + " in the order system's admin screen", "--tenant", aprTenant, "--tokens", tokens},
		apiArgs(api, "--db", db)...)

	mustRefuseWithoutApproverToken(t, resolve, cfg, agentTok, func() { agent.mustBeState(t, key, "unknown") })

	ok := runCLI(t, 20*time.Second, append(resolve, "--config", cfg, "--token", bossTok)...)
	if ok.Code != 0 || !strings.Contains(ok.Stdout, `"status": "succeeded"`) {
		t.Fatalf("resolve with boss's token: exit %d, want succeeded\nstdout: %s\nstderr: %s", ok.Code, ok.Stdout, ok.Stderr)
	}
	if p, role := transitionActor(t, db, key, "unknown"); p != "boss" || role != "approver" {
		t.Errorf("the resolution is audited as %s (%s), want the token's principal boss (approver)", p, role)
	}
	if e := agent.mustSucceed(t, "create_order", args); !e.Replayed || e.orderID() != o.OrderID {
		t.Errorf("the agent's retry after the resolution: %s, want a replay of %s", e, o.OrderID)
	}
	if w := api.WritesFor(idemKey(aprTenant, key)); w != 1 {
		t.Errorf("the API received %d writes for the key, want 1", w)
	}
	api.SetLookupUnavailable(false)
}

// mustRefuseWithoutApproverToken runs the command line cmd (an approver's
// command, under require_approver_token) the three ways the rule refuses
// — no token with the configuration, no token and no configuration (the
// ledger keeps the rule), an agent's token — and checks each is refused
// as forbidden, naming why, and that unchanged holds after it.
func mustRefuseWithoutApproverToken(t *testing.T, cmd []string, cfg, agentTok string, unchanged func()) {
	t.Helper()
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no token, with the configuration", []string{"--config", cfg, "--principal", "boss"}, "require_approver_token"},
		// The command runs in the agent's owner, whose configuration it
		// takes (TestApproverTokenRuleKeptByTheLedger: the ledger's rule).
		{"no token, no configuration", []string{"--principal", "boss"}, "require_approver_token"},
		{"an agent's token", []string{"--config", cfg, "--token", agentTok}, "role approver"},
	} {
		r := runCLI(t, 20*time.Second, slices.Concat(cmd, c.args)...)
		if r.Code == 0 || !strings.Contains(r.Stderr, "forbidden") || !strings.Contains(r.Stderr, c.want) {
			t.Errorf("%s with %s: exit %d, want refused (forbidden, naming %q)\nstdout: %s\nstderr: %s", cmd[0], c.name, r.Code, c.want, r.Stdout, r.Stderr)
		}
		unchanged()
	}
}
