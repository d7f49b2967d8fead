package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestSettleCommandLine: an operator settles an unknown operation from a
// terminal while the agent's server runs: `idemgate reconcile` reports it
// still unknown while the order system's lookup is down, `idemgate
// resolve` by the requester is refused, and by an approver with evidence
// it settles the record; the agent's retry then replays it, and nothing
// was sent twice.
func TestSettleCommandLine(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	db := newLedger(t)
	s := startAPIServer(t, mcpGoModern, api, serverConfig{DB: db, Principal: "alice"})
	key := newKey()
	args := faOrder(key, "cust-settle-cli")
	api.Inject(fault{Kind: DropReplyAfterCommit, Match: matchCreate})
	api.SetLookupUnavailable(true)
	s.mustFail(t, "create_order", args, "outcome_unknown")

	cli := func(extra ...string) cliResult {
		return runCLI(t, 20*time.Second, append(extra, apiArgs(api, "--db", db)...)...)
	}
	if r := cli("reconcile", key); r.Code == 0 || !strings.Contains(r.Stdout, `"status": "unknown"`) {
		t.Fatalf("reconcile with the lookup down: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	o := api.OrderForKey(idemKey("", key))
	resolve := []string{"resolve", key, "--outcome", "succeeded", "--downstream-ref", o.OrderID, "--evidence", "found " + o.OrderID + " in the order system's admin screen"}
	if r := cli(append(resolve, "--principal", "alice")...); r.Code == 0 || !strings.Contains(r.Stderr, "forbidden") {
		t.Fatalf("resolve by the requester: exit %d, want forbidden\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if r := cli(append(resolve, "--principal", "boss")...); r.Code != 0 || !strings.Contains(r.Stdout, `"status": "succeeded"`) {
		t.Fatalf("resolve as boss: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if e := s.mustSucceed(t, "create_order", args); !e.Replayed || e.orderID() != o.OrderID {
		t.Errorf("the agent's retry after the resolution: %s, want a replay of %s", e, o.OrderID)
	}
	if w := api.WritesFor(idemKey("", key)); w != 1 {
		t.Errorf("the API received %d writes for the key, want 1", w)
	}
	api.SetLookupUnavailable(false)
}
