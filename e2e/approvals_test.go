package e2e

// Approvals end to end (DESIGN §5, docs/approvals.md): the agent and the
// approver are separate `idemgate serve` processes — or the `idemgate
// approvals` command line — on one ledger file, as they are in real use.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// ---------------------------------------------------------------------------
// Helpers

const aprTenant = "acme"

// aprPair is an agent's server and an approver's server on one ledger.
type aprPair struct {
	db       string
	agent    *session
	approver *session
}

// startAgent starts an agent's server (principal alice, tenant acme) on db
// with the further flags extra.
func startAgent(t *testing.T, f flavor, db string, extra ...string) *session {
	t.Helper()
	return startServer(t, f, serverConfig{DB: db, Tenant: aprTenant, Principal: "alice", Args: extra})
}

// startApprover starts an approver's server for principal in tenant on db.
func startApprover(t *testing.T, f flavor, db, tenant, principal string) *session {
	t.Helper()
	return startServer(t, f, serverConfig{DB: db, Tenant: tenant, Principal: principal, Args: []string{"--role", "approver"}})
}

// newPair starts alice's agent server (flavor a) and boss's approver
// server (flavor b) on a new ledger file, both with the extra flags (the
// servers of one ledger have one configuration: its owner's).
func newPair(t *testing.T, a, b flavor, extra ...string) aprPair {
	t.Helper()
	db := newLedger(t)
	approver := startServer(t, b, serverConfig{DB: db, Tenant: aprTenant, Principal: "boss", Args: append([]string{"--role", "approver"}, extra...)})
	return aprPair{db: db, agent: startAgent(t, a, db, extra...), approver: approver}
}

// aprOrder is the part of an order these tests look at.
type aprOrder struct {
	OrderID      string `json:"order_id"`
	Version      int    `json:"version"`
	Status       string `json:"status"`
	Note         string `json:"note"`
	CancelReason string `json:"cancel_reason"`
	TotalMinor   int64  `json:"total_minor"`
}

// resultOrder decodes result.order of an answer.
func resultOrder(t testing.TB, e envelope) aprOrder {
	t.Helper()
	var r struct {
		Order *aprOrder `json:"order"`
	}
	if err := json.Unmarshal(e.Result, &r); err != nil || r.Order == nil {
		t.Fatalf("no result.order in %s (%v)", e, err)
	}
	return *r.Order
}

// placeOrder creates a small order (below every threshold) for customer
// and returns it at version 1.
func placeOrder(t testing.TB, s *session, customer string) aprOrder {
	t.Helper()
	o := resultOrder(t, s.mustSucceed(t, "create_order", orderArgs(newKey(), customer, coffee, map[string]any{"notify_customer": false})))
	if o.Version != 1 || o.Status != "placed" {
		t.Fatalf("new order %+v, want placed at version 1", o)
	}
	return o
}

// getOrder reads an order through s.
func getOrder(t testing.TB, s *session, id string) aprOrder {
	t.Helper()
	return resultOrder(t, s.mustSucceed(t, "get_order", map[string]any{"order_id": id}))
}

func cancelArgs(key, orderID string, version int) map[string]any {
	return map[string]any{"operation_key": key, "order_id": orderID, "expected_version": version, "reason": "customer asked"}
}

func updateArgs(key, orderID string, version int, note string) map[string]any {
	return map[string]any{"operation_key": key, "order_id": orderID, "expected_version": version, "changes": map[string]any{"note": note}}
}

// mustHold calls tool and fails the test unless the call was held for
// approval: isError, awaiting_approval, approval_required, a pending
// approval id, next_action await_approval and no result.
func (s *session) mustHold(t testing.TB, tool string, args any) envelope {
	t.Helper()
	e := s.mustFail(t, tool, args, "approval_required")
	if e.Status != "awaiting_approval" || e.Approval == nil || e.Approval.ApprovalID == "" ||
		e.Approval.Status != "pending" || e.NextAction != "await_approval" || len(e.Result) != 0 {
		t.Fatalf("[%s] %s: want a pending approval, got %s", s.flavor.Name, tool, e)
	}
	return e
}

// approvalField reads approval.<name> from the answer as sent (the
// harness's envelope does not decode every field of the approval).
func approvalField(t testing.TB, e envelope, name string) json.RawMessage {
	t.Helper()
	var r struct {
		Approval map[string]json.RawMessage `json:"approval"`
	}
	if err := json.Unmarshal([]byte(e.Text), &r); err != nil {
		t.Fatalf("answer %s: %v", e, err)
	}
	return r.Approval[name]
}

func approvalString(t testing.TB, e envelope, name string) string {
	t.Helper()
	var s string
	if raw := approvalField(t, e, name); raw != nil {
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatalf("approval.%s = %s: %v", name, raw, err)
		}
	}
	return s
}

// pendingApproval is one entry of list_pending_approvals.
type pendingApproval struct {
	ApprovalID      string `json:"approval_id"`
	Status          string `json:"status"`
	OperationKey    string `json:"operation_key"`
	Tool            string `json:"tool"`
	RequestedBy     string `json:"requested_by"`
	Rule            string `json:"rule"`
	ResourceVersion int    `json:"resource_version"`
	EarlierKey      string `json:"earlier_operation_key"`
	Diff            []struct {
		Path   string `json:"path"`
		Before any    `json:"before"`
		After  any    `json:"after"`
	} `json:"diff"`
	DiffText string `json:"diff_text"`
}

// pending is list_pending_approvals of an approver's session.
func (s *session) pending(t testing.TB) []pendingApproval {
	t.Helper()
	e := s.mustSucceed(t, "list_pending_approvals", map[string]any{"limit": 100})
	var r struct {
		Approvals []pendingApproval `json:"approvals"`
		Count     int               `json:"count"`
	}
	if err := json.Unmarshal(e.Result, &r); err != nil {
		t.Fatalf("list_pending_approvals result: %v: %s", err, e)
	}
	if r.Count != len(r.Approvals) {
		t.Fatalf("list_pending_approvals: count %d but %d approvals", r.Count, len(r.Approvals))
	}
	return r.Approvals
}

// pendingByID finds approval id in list, or fails the test.
func pendingByID(t testing.TB, list []pendingApproval, id string) pendingApproval {
	t.Helper()
	for _, a := range list {
		if a.ApprovalID == id {
			return a
		}
	}
	t.Fatalf("approval %s is not among the pending %+v", id, list)
	return pendingApproval{}
}

func decideArgs(id, decision, comment string) map[string]any {
	m := map[string]any{"approval_id": id, "decision": decision}
	if comment != "" {
		m["comment"] = comment
	}
	return m
}

// decide calls decide_approval on an approver's session and returns the
// answer, whatever it is.
func (s *session) decide(t testing.TB, id, decision, comment string) envelope {
	t.Helper()
	return s.callTool(t, "decide_approval", decideArgs(id, decision, comment))
}

// mustBeState fails the test unless the record of key is in state want.
func (s *session) mustBeState(t testing.TB, key, want string) {
	t.Helper()
	st, e, found := s.status(t, key)
	if !found || st.State != want {
		t.Fatalf("get_operation_status(%s): found=%v state %q, want %q: %s", key, found, st.State, want, e)
	}
}

// toolNamesOf is the names tools/list shows a session.
func toolNamesOf(t testing.TB, s *session) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var names []string
	switch {
	case s.mc != nil:
		res, err := s.mc.ListTools(ctx, mcpListToolsRequest())
		if err != nil {
			t.Fatalf("[%s] tools/list: %v", s.flavor.Name, err)
		}
		for _, tl := range res.Tools {
			names = append(names, tl.Name)
		}
	case s.gs != nil:
		res, err := s.gs.ListTools(ctx, nil)
		if err != nil {
			t.Fatalf("[%s] tools/list: %v", s.flavor.Name, err)
		}
		for _, tl := range res.Tools {
			names = append(names, tl.Name)
		}
	}
	return names
}

// cliResult is one run of the idemgate command line.
type cliResult struct {
	Stdout, Stderr string
	Code           int
}

// runCLI runs the built idemgate binary with args (stdin empty) and a
// timeout, and returns its output and exit code.
func runCLI(t testing.TB, timeout time.Duration, args ...string) cliResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	stopOwnerAtEnd(t, args)
	cmd := exec.CommandContext(ctx, idemgate, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("idemgate %v did not finish within %v\nstdout: %s\nstderr: %s", args, timeout, stdout.String(), stderr.String())
	}
	r := cliResult{Stdout: stdout.String(), Stderr: stderr.String()}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.Code = exit.ExitCode()
	case err != nil:
		t.Fatalf("idemgate %v: %v", args, err)
	}
	return r
}

// ---------------------------------------------------------------------------
// Tests

// TestApprovalCancelFlow: a cancel is held for approval; the agent's retry
// while pending names the same approval (never a second one); a separate
// approver process sees it with its diff and approves it; the order is
// cancelled once (version 2); the agent's retry replays the outcome byte
// for byte. Run with both client libraries on either side.
func TestApprovalCancelFlow(t *testing.T) {
	for _, pair := range [][2]flavor{{mcpGoModern, goSDKLegacy}, {goSDKModern, mcpGoLegacy}} {
		t.Run(pair[0].Name+"+"+pair[1].Name, func(t *testing.T) {
			p := newPair(t, pair[0], pair[1])
			o := placeOrder(t, p.agent, "cust-cancel")
			key := newKey()
			args := cancelArgs(key, o.OrderID, 1)

			held := p.agent.mustHold(t, "cancel_order", args)
			id := held.Approval.ApprovalID
			if held.OperationKey != key {
				t.Errorf("held answer names key %q, want %q", held.OperationKey, key)
			}
			if rule := approvalString(t, held, "rule"); rule != "always_approve" {
				t.Errorf("approval.rule = %q, want always_approve", rule)
			}
			// The agent's retries while pending: the same approval, nothing run.
			for i := range 2 {
				again := p.agent.mustHold(t, "cancel_order", args)
				if again.Approval.ApprovalID != id {
					t.Fatalf("retry %d while pending: approval %q, want the same %q: %s", i, again.Approval.ApprovalID, id, again)
				}
			}
			p.agent.mustBeState(t, key, "awaiting_approval")
			if got := getOrder(t, p.agent, o.OrderID); got.Status != "placed" || got.Version != 1 {
				t.Fatalf("order while pending = %+v, want placed at version 1", got)
			}

			list := p.approver.pending(t)
			if len(list) != 1 {
				t.Fatalf("the approver sees %d pending approvals, want exactly 1 (no second approval for retries): %+v", len(list), list)
			}
			a := pendingByID(t, list, id)
			if a.Status != "pending" || a.OperationKey != key || a.Tool != "cancel_order" || a.RequestedBy != "alice" ||
				a.Rule != "always_approve" || a.ResourceVersion != 1 {
				t.Errorf("pending approval = %+v", a)
			}
			if len(a.Diff) != 2 || a.Diff[0].Path != "status" || a.Diff[0].Before != "placed" || a.Diff[0].After != "cancelled" ||
				a.Diff[1].Path != "cancel_reason" || a.Diff[1].Before != nil || a.Diff[1].After != "customer asked" {
				t.Errorf("diff = %+v, want exactly [{status placed cancelled} {cancel_reason <nil> customer asked}]", a.Diff)
			}
			if a.DiffText == "" || !strings.Contains(a.DiffText, o.OrderID) || !strings.Contains(a.DiffText, "customer asked") {
				t.Errorf("diff_text does not show the order and the reason: %q", a.DiffText)
			}

			done := p.approver.decide(t, id, "approve", "refund issued")
			if done.IsError || done.Status != "succeeded" || done.Replayed || done.OperationKey != key {
				t.Fatalf("approve: want succeeded, not replayed, got %s", done)
			}
			if got := resultOrder(t, done); got.OrderID != o.OrderID || got.Status != "cancelled" || got.Version != 2 || got.CancelReason != "customer asked" {
				t.Errorf("approved outcome order = %+v, want %s cancelled at version 2", got, o.OrderID)
			}
			if n := len(p.approver.pending(t)); n != 0 {
				t.Errorf("%d approvals still pending after the decision", n)
			}

			replay := p.agent.mustSucceed(t, "cancel_order", args)
			if !replay.Replayed || !bytes.Equal(replay.Result, done.Result) {
				t.Errorf("agent retry: want replayed with the approved result\n got  %s\n want %s", replay, done.Result)
			}
			if got := getOrder(t, p.agent, o.OrderID); got.Status != "cancelled" || got.Version != 2 {
				t.Errorf("get_order after approval = %+v, want cancelled at version 2", got)
			}
			p.agent.mustBeState(t, key, "succeeded")
		})
	}
}

// TestApprovalAuthority: key possession is never authority. An agent
// neither sees nor can call the approver tools; the requester cannot
// approve its own request even with the approver role; an approver of
// another tenant does not see the approval and cannot decide it. After all
// that, the approval is still pending and the order untouched.
func TestApprovalAuthority(t *testing.T) {
	db := newLedger(t)
	agentMC := startAgent(t, mcpGoModern, db)
	agentSDK := startAgent(t, goSDKLegacy, db)
	o := placeOrder(t, agentMC, "cust-authority")
	key := newKey()
	held := agentMC.mustHold(t, "cancel_order", cancelArgs(key, o.OrderID, 1))
	id := held.Approval.ApprovalID
	approverOnly := []string{"list_pending_approvals", "decide_approval"}

	for _, agent := range []*session{agentMC, agentSDK} {
		t.Run("agent "+agent.flavor.Name, func(t *testing.T) {
			names := toolNamesOf(t, agent)
			if !slices.Contains(names, "cancel_order") {
				t.Fatalf("tools/list of an agent lacks cancel_order: %v", names)
			}
			for _, n := range approverOnly {
				if slices.Contains(names, n) {
					t.Errorf("tools/list of an agent shows %s: %v", n, names)
				}
			}
			for _, tool := range approverOnly {
				var args map[string]any
				if tool == "decide_approval" {
					args = decideArgs(id, "approve", "")
				} else {
					args = map[string]any{}
				}
				r, err := agent.callRaw(testContext(t), tool, args, nil)
				if err != nil { // a JSON-RPC error: the tool does not exist for agents
					t.Logf("agent calling %s: %v", tool, err)
					continue
				}
				// Otherwise it must be an isError answer refusing the call.
				e, derr := decodeEnvelope(tool, r)
				if derr != nil || !e.IsError || (e.code() != "forbidden" && e.code() != "invalid_arguments") {
					t.Errorf("agent calling %s: want an error, got %+v %s (%v)", tool, r, e, derr)
				}
			}
		})
	}

	t.Run("self approval", func(t *testing.T) {
		self := startApprover(t, goSDKModern, db, aprTenant, "alice")
		if names := toolNamesOf(t, self); !slices.Contains(names, "decide_approval") || !slices.Contains(names, "list_pending_approvals") {
			t.Errorf("tools/list of an approver lacks the approver tools: %v", names)
		}
		e := self.decide(t, id, "approve", "")
		if !e.IsError || e.code() != "forbidden" {
			t.Errorf("requester approving its own request: want forbidden, got %s", e)
		}
	})

	t.Run("other tenant", func(t *testing.T) {
		other := startApprover(t, mcpGoLegacy, db, "other", "boss")
		if list := other.pending(t); len(list) != 0 {
			t.Errorf("an approver of tenant other sees %+v, want nothing", list)
		}
		e := other.decide(t, id, "approve", "")
		if !e.IsError || e.code() != "not_found" {
			t.Errorf("other tenant's approver deciding: want not_found, got %s", e)
		}
		e = other.decide(t, id, "reject", "not mine")
		if !e.IsError || e.code() != "not_found" {
			t.Errorf("other tenant's approver rejecting: want not_found, got %s", e)
		}
	})

	// Nothing of the above decided anything.
	agentSDK.mustBeState(t, key, "awaiting_approval")
	boss := startApprover(t, mcpGoModern, db, aprTenant, "boss")
	if a := pendingByID(t, boss.pending(t), id); a.Status != "pending" {
		t.Errorf("approval after the refused attempts: %+v, want pending", a)
	}
	if got := getOrder(t, agentSDK, o.OrderID); got.Status != "placed" || got.Version != 1 {
		t.Errorf("order after the refused attempts = %+v, want placed at version 1", got)
	}
}

// TestApprovalRaceTwoApprovers: two approver processes approve the same
// request at the same moment, round after round. Each time exactly one
// execution happens (the order ends at version 2, not 3), exactly one
// answer says replayed:false, and the other carries the recorded outcome.
func TestApprovalRaceTwoApprovers(t *testing.T) {
	const rounds = 5
	db := newLedger(t)
	agent := startAgent(t, mcpGoModern, db)
	boss1 := startApprover(t, mcpGoLegacy, db, aprTenant, "boss1")
	boss2 := startApprover(t, goSDKModern, db, aprTenant, "boss2")
	ctx := testContext(t)
	for round := range rounds {
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			o := placeOrder(t, agent, fmt.Sprintf("cust-race-%d", round))
			key := newKey()
			args := cancelArgs(key, o.OrderID, 1)
			id := agent.mustHold(t, "cancel_order", args).Approval.ApprovalID

			var (
				answers [2]envelope
				errs    [2]error
				wg      sync.WaitGroup
				start   = make(chan struct{})
			)
			for i, s := range []*session{boss1, boss2} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					answers[i], errs[i] = s.call(ctx, "decide_approval", decideArgs(id, "approve", fmt.Sprintf("boss%d", i+1)))
				}()
			}
			close(start)
			wg.Wait()

			executed := 0
			for i, e := range answers {
				if errs[i] != nil {
					t.Fatalf("boss%d: %v", i+1, errs[i])
				}
				if e.IsError || e.Status != "succeeded" {
					t.Errorf("boss%d: want succeeded (executed or the recorded outcome), got %s", i+1, e)
					continue
				}
				if got := resultOrder(t, e); got.Status != "cancelled" || got.Version != 2 {
					t.Errorf("boss%d: outcome order %+v, want cancelled at version 2", i+1, got)
				}
				if !e.Replayed {
					executed++
				}
			}
			if executed != 1 {
				t.Errorf("%d answers say replayed:false, want exactly 1: %s | %s", executed, answers[0], answers[1])
			}
			by0, by1 := approvalString(t, answers[0], "decided_by"), approvalString(t, answers[1], "decided_by")
			if by0 != by1 || (by0 != "boss1" && by0 != "boss2") {
				t.Errorf("approval.decided_by = %q and %q, want the one winner named in both answers", by0, by1)
			}
			if !bytes.Equal(answers[0].Result, answers[1].Result) {
				t.Errorf("the two approvers got different results:\n%s\n%s", answers[0].Result, answers[1].Result)
			}
			if got := getOrder(t, agent, o.OrderID); got.Status != "cancelled" || got.Version != 2 {
				t.Errorf("get_order = %+v, want cancelled at version 2 (one execution)", got)
			}
			replay := agent.mustSucceed(t, "cancel_order", args)
			if !replay.Replayed || !bytes.Equal(replay.Result, answers[0].Result) {
				t.Errorf("agent retry: %s", replay)
			}
		})
	}
}

// TestApprovalPreconditionFailed: an approval is bound to the version its
// diff was computed from. Two changes requested on version 1: approving
// the first applies it (version 2); approving the second then fails with
// precondition_failed and applies nothing. A change requested with a stale
// version is refused at once with the current version and leaves no record.
func TestApprovalPreconditionFailed(t *testing.T) {
	p := newPair(t, goSDKLegacy, mcpGoModern)
	o := placeOrder(t, p.agent, "cust-stale")
	k1, k2 := newKey(), newKey()
	first := p.agent.mustHold(t, "update_order", updateArgs(k1, o.OrderID, 1, "first"))
	second := p.agent.mustHold(t, "update_order", updateArgs(k2, o.OrderID, 1, "second"))
	if first.Approval.ApprovalID == second.Approval.ApprovalID {
		t.Fatalf("two requests share approval %s", first.Approval.ApprovalID)
	}
	a := pendingByID(t, p.approver.pending(t), second.Approval.ApprovalID)
	if a.ResourceVersion != 1 || len(a.Diff) != 1 || a.Diff[0].Path != "note" || a.Diff[0].After != "second" {
		t.Errorf("update diff = %+v (version %d), want only note → second at version 1", a.Diff, a.ResourceVersion)
	}

	ok := p.approver.decide(t, first.Approval.ApprovalID, "approve", "")
	if ok.IsError || ok.Status != "succeeded" {
		t.Fatalf("approve first: %s", ok)
	}
	if got := resultOrder(t, ok); got.Note != "first" || got.Version != 2 {
		t.Errorf("first change applied = %+v, want note first at version 2", got)
	}

	stale := p.approver.decide(t, second.Approval.ApprovalID, "approve", "")
	if !stale.IsError || stale.Status != "failed" || stale.code() != "precondition_failed" || stale.Replayed {
		t.Fatalf("approve second (order moved to version 2): want failed precondition_failed, got %s", stale)
	}
	if got := getOrder(t, p.agent, o.OrderID); got.Note != "first" || got.Version != 2 {
		t.Errorf("get_order = %+v, want only the first change (note first, version 2)", got)
	}
	retry := p.agent.callTool(t, "update_order", updateArgs(k2, o.OrderID, 1, "second"))
	if !retry.Replayed || retry.Status != "failed" || retry.code() != "precondition_failed" {
		t.Errorf("agent retry of the stale change: want the failure replayed, got %s", retry)
	}

	t.Run("stale at request time", func(t *testing.T) {
		key := newKey()
		e := p.agent.mustFail(t, "update_order", updateArgs(key, o.OrderID, 1, "third"), "precondition_failed")
		if e.Approval != nil {
			t.Errorf("a stale request was held for approval: %s", e)
		}
		var d struct {
			CurrentVersion int `json:"current_version"`
		}
		if err := json.Unmarshal(e.Error.Details, &d); err != nil || d.CurrentVersion != 2 {
			t.Errorf("error.details.current_version = %d, want 2 (%s, %v)", d.CurrentVersion, e.Error.Details, err)
		}
		if _, se, found := p.agent.status(t, key); found {
			t.Errorf("a refused stale request left a record: %s", se)
		}
		for _, a := range p.approver.pending(t) {
			if a.OperationKey == key {
				t.Errorf("a refused stale request is pending approval: %+v", a)
			}
		}
		if got := getOrder(t, p.agent, o.OrderID); got.Note != "first" || got.Version != 2 {
			t.Errorf("get_order = %+v, want unchanged (note first, version 2)", got)
		}
	})
}

// TestApprovalExpiry: with --approval-ttl 300ms on the ledger's servers, a
// pending cancel expires: the approver no longer sees it, a late approve
// is refused (status rejected), the agent's retry replays the rejection,
// and the order is not cancelled.
func TestApprovalExpiry(t *testing.T) {
	p := newPair(t, mcpGoLegacy, goSDKModern, "--approval-ttl", "300ms")
	o := placeOrder(t, p.agent, "cust-expiry")
	key := newKey()
	args := cancelArgs(key, o.OrderID, 1)
	held := p.agent.mustHold(t, "cancel_order", args)
	id := held.Approval.ApprovalID
	if exp, err := time.Parse(time.RFC3339Nano, held.Approval.ExpiresAt); err != nil || time.Until(exp) > time.Second {
		t.Errorf("expires_at %q: want within the 300ms TTL (%v)", held.Approval.ExpiresAt, err)
	}
	time.Sleep(600 * time.Millisecond)

	if list := p.approver.pending(t); len(list) != 0 {
		t.Errorf("an expired approval is still listed as pending: %+v", list)
	}
	late := p.approver.decide(t, id, "approve", "too late")
	if !late.IsError || late.Status != "rejected" {
		t.Fatalf("late approve: want an error with status rejected, got %s", late)
	}
	if late.Approval != nil && late.Approval.Status != "expired" {
		t.Errorf("late approve: approval.status %q, want expired", late.Approval.Status)
	}
	if !strings.Contains(late.Error.Message, "expired") {
		t.Errorf("late approve message does not say it expired: %s", late.Error.Message)
	}

	retry := p.agent.callTool(t, "cancel_order", args)
	if !retry.IsError || retry.Status != "rejected" || !retry.Replayed || retry.NextAction != "do_not_retry" {
		t.Errorf("agent retry after expiry: want rejected, replayed, got %s", retry)
	}
	if !strings.Contains(retry.Error.Message, "approval_expired") {
		t.Errorf("agent retry does not say approval_expired: %s", retry.Error.Message)
	}
	if got := getOrder(t, p.agent, o.OrderID); got.Status != "placed" || got.Version != 1 {
		t.Errorf("get_order = %+v, want placed at version 1 (nothing cancelled)", got)
	}
	// The record says rejected. (get_operation_status answers about a
	// failed or rejected operation must also satisfy the envelope rule
	// every answer obeys: error present exactly when isError.)
	t.Run("get_operation_status", func(t *testing.T) {
		p.agent.mustBeState(t, key, "rejected")
	})
}

// TestApprovalSuspectedDuplicate: a create_order under a new key with the
// payload of a recent order is held, naming the earlier key. Approving it
// creates the second order; rejecting it (in a separate case) creates
// nothing and the agent's retry replays the rejection with the comment.
func TestApprovalSuspectedDuplicate(t *testing.T) {
	setup := func(t *testing.T) (aprPair, string, string, envelope) {
		p := newPair(t, mcpGoModern, goSDKLegacy)
		firstKey := newKey()
		p.agent.mustSucceed(t, "create_order", orderArgs(firstKey, "cust-dup", coffee, nil))
		dupKey := newKey()
		held := p.agent.mustHold(t, "create_order", orderArgs(dupKey, "cust-dup", coffee, nil))
		var d struct {
			EarlierKey string `json:"earlier_operation_key"`
		}
		if err := json.Unmarshal(held.Error.Details, &d); err != nil || d.EarlierKey != firstKey {
			t.Fatalf("error.details.earlier_operation_key = %q, want %q (%s)", d.EarlierKey, firstKey, held.Error.Details)
		}
		a := pendingByID(t, p.approver.pending(t), held.Approval.ApprovalID)
		if a.EarlierKey != firstKey || a.Tool != "create_order" || a.OperationKey != dupKey || a.DiffText == "" {
			t.Errorf("pending suspected duplicate = %+v, want it to name %s", a, firstKey)
		}
		if n := p.agent.orderCount(t, "cust-dup"); n != 1 {
			t.Fatalf("%d orders while the duplicate is held, want 1", n)
		}
		return p, firstKey, dupKey, held
	}

	t.Run("approve", func(t *testing.T) {
		p, _, dupKey, held := setup(t)
		done := p.approver.decide(t, held.Approval.ApprovalID, "approve", "customer really wants two")
		if done.IsError || done.Status != "succeeded" || done.Replayed {
			t.Fatalf("approve: %s", done)
		}
		if n := p.agent.orderCount(t, "cust-dup"); n != 2 {
			t.Errorf("%d orders after approving the second, want 2", n)
		}
		replay := p.agent.mustSucceed(t, "create_order", orderArgs(dupKey, "cust-dup", coffee, nil))
		if !replay.Replayed || replay.orderID() != done.orderID() || !bytes.Equal(replay.Result, done.Result) {
			t.Errorf("agent retry: want the approved order replayed, got %s", replay)
		}
		if n := p.agent.orderCount(t, "cust-dup"); n != 2 {
			t.Errorf("%d orders after the retry, want 2", n)
		}
	})

	t.Run("reject", func(t *testing.T) {
		p, _, dupKey, held := setup(t)
		const comment = "duplicate of the earlier order"
		no := p.approver.decide(t, held.Approval.ApprovalID, "reject", comment)
		if !no.IsError || no.Status != "rejected" || no.Replayed {
			t.Fatalf("reject: want status rejected, got %s", no)
		}
		if n := p.agent.orderCount(t, "cust-dup"); n != 1 {
			t.Errorf("%d orders after rejecting the duplicate, want 1", n)
		}
		retry := p.agent.callTool(t, "create_order", orderArgs(dupKey, "cust-dup", coffee, nil))
		if !retry.IsError || retry.Status != "rejected" || !retry.Replayed || retry.Error == nil || !strings.Contains(retry.Error.Message, comment) {
			t.Errorf("agent retry after rejection: want rejected, replayed, with the comment, got %s", retry)
		}
		if n := p.agent.orderCount(t, "cust-dup"); n != 1 {
			t.Errorf("%d orders after the retry, want 1", n)
		}
	})
}

// TestApprovalThreshold: a create_order at or above the amount threshold
// (default 100 000 minor units) is held with rule amount_threshold; below
// it runs at once; --approval-threshold 0 disables the rule.
func TestApprovalThreshold(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		p := newPair(t, goSDKModern, mcpGoModern)
		big := orderArgs(newKey(), "cust-big", []item{{"coffee-1kg", 100, 1850}}, nil) // 185 000
		held := p.agent.mustHold(t, "create_order", big)
		if rule := approvalString(t, held, "rule"); rule != "amount_threshold" {
			t.Errorf("approval.rule = %q, want amount_threshold: %s", rule, held)
		}
		at := p.agent.mustHold(t, "create_order", orderArgs(newKey(), "cust-at", []item{{"grinder", 50, 2000}}, nil)) // exactly 100 000
		if rule := approvalString(t, at, "rule"); rule != "amount_threshold" {
			t.Errorf("an order of exactly the threshold: approval.rule = %q, want amount_threshold", rule)
		}
		small := p.agent.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-small", []item{{"grinder", 49, 2000}}, nil)) // 98 000
		if small.Replayed || resultOrder(t, small).TotalMinor != 98000 {
			t.Errorf("small order: %s", small)
		}
		if n := p.agent.orderCount(t, "cust-big"); n != 0 {
			t.Errorf("%d orders while the large one is held, want 0", n)
		}
		done := p.approver.decide(t, held.Approval.ApprovalID, "approve", "")
		if done.IsError || done.Status != "succeeded" || resultOrder(t, done).TotalMinor != 185000 {
			t.Fatalf("approve large order: %s", done)
		}
		if n := p.agent.orderCount(t, "cust-big"); n != 1 {
			t.Errorf("%d orders after approval, want 1", n)
		}
	})
	t.Run("disabled", func(t *testing.T) {
		s := startAgent(t, mcpGoLegacy, newLedger(t), "--approval-threshold", "0")
		e := s.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-big", []item{{"coffee-1kg", 1000, 1850}}, nil))
		if e.Approval != nil || resultOrder(t, e).TotalMinor != 1_850_000 {
			t.Errorf("with --approval-threshold 0: %s", e)
		}
	})
}

// TestApprovalCommandLine: while the agent's server runs, `idemgate
// approvals list` on the same ledger shows the approval and its diff;
// `approvals approve` by the requester is refused (forbidden), by boss it
// runs the operation and prints the outcome; the agent's retry replays it.
func TestApprovalCommandLine(t *testing.T) {
	db := newLedger(t)
	agent := startAgent(t, mcpGoModern, db)
	o := placeOrder(t, agent, "cust-cli")
	key := newKey()
	args := cancelArgs(key, o.OrderID, 1)
	held := agent.mustHold(t, "cancel_order", args)
	id := held.Approval.ApprovalID
	ledgerArgs := []string{"--db", db, "--tenant", aprTenant}

	list := runCLI(t, 20*time.Second, append([]string{"approvals", "list", "--principal", "boss"}, ledgerArgs...)...)
	if list.Code != 0 {
		t.Fatalf("approvals list exited %d: %s", list.Code, list.Stderr)
	}
	for _, want := range []string{id, key, "cancel_order", "alice", o.OrderID, `status "placed" → cancelled`, "reason: customer asked"} {
		if !strings.Contains(list.Stdout, want) {
			t.Errorf("approvals list output lacks %q:\n%s", want, list.Stdout)
		}
	}

	self := runCLI(t, 20*time.Second, append([]string{"approvals", "approve", id, "--principal", "alice", "--comment", "mine"}, ledgerArgs...)...)
	if self.Code == 0 || !strings.Contains(self.Stdout+self.Stderr, "forbidden") {
		t.Errorf("approvals approve by the requester: exit %d, want non-zero with forbidden\nstdout: %s\nstderr: %s", self.Code, self.Stdout, self.Stderr)
	}
	agent.mustBeState(t, key, "awaiting_approval")

	approve := runCLI(t, 20*time.Second, append([]string{"approvals", "approve", id, "--principal", "boss", "--comment", "ok"}, ledgerArgs...)...)
	if approve.Code != 0 {
		t.Fatalf("approvals approve exited %d\nstdout: %s\nstderr: %s", approve.Code, approve.Stdout, approve.Stderr)
	}
	var out struct {
		OperationKey string          `json:"operation_key"`
		Status       string          `json:"status"`
		Replayed     bool            `json:"replayed"`
		Result       json.RawMessage `json:"result"`
	}
	if err := json.Unmarshal([]byte(approve.Stdout), &out); err != nil {
		t.Fatalf("approvals approve printed no JSON outcome: %v\n%s", err, approve.Stdout)
	}
	if out.OperationKey != key || out.Status != "succeeded" || out.Replayed {
		t.Errorf("approvals approve outcome: %s", approve.Stdout)
	}
	if got := resultOrder(t, envelope{Result: out.Result}); got.Status != "cancelled" || got.Version != 2 {
		t.Errorf("approvals approve outcome order = %+v, want cancelled at version 2", got)
	}

	replay := agent.mustSucceed(t, "cancel_order", args)
	if !replay.Replayed || !jsonEqual(replay.Result, out.Result) {
		t.Errorf("agent retry: want the CLI's outcome replayed\n got  %s\n want %s", replay, out.Result)
	}
	if got := getOrder(t, agent, o.OrderID); got.Status != "cancelled" || got.Version != 2 {
		t.Errorf("get_order = %+v, want cancelled at version 2", got)
	}
	if after := runCLI(t, 20*time.Second, append([]string{"approvals", "list", "--principal", "boss"}, ledgerArgs...)...); after.Code != 0 || strings.Contains(after.Stdout, id) {
		t.Errorf("approvals list after the decision (exit %d) still shows %s:\n%s", after.Code, id, after.Stdout)
	}
}

// TestPolicyFile: --policy with allowed_currencies refuses other
// currencies with forbidden and no record; a policy file with an unknown
// key stops `idemgate serve` at startup with a message naming the key.
func TestPolicyFile(t *testing.T) {
	dir := t.TempDir()
	t.Run("allowed currencies", func(t *testing.T) {
		policy := filepath.Join(dir, "policy.toml")
		if err := os.WriteFile(policy, []byte("allowed_currencies = [\"USD\"]\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		s := startAgent(t, goSDKLegacy, newLedger(t), "--config", policy)
		key := newKey()
		e := s.mustFail(t, "create_order", orderArgs(key, "cust-policy", coffee, nil), "forbidden")
		if e.Approval != nil || e.NextAction != "do_not_retry" || !strings.Contains(e.Error.Message, "EUR") {
			t.Errorf("EUR order under a USD-only policy: %s", e)
		}
		if _, se, found := s.status(t, key); found {
			t.Errorf("a denied call left a record: %s", se)
		}
		usd := s.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-policy", coffee, map[string]any{"currency": "USD"}))
		if usd.Replayed {
			t.Errorf("USD order: %s", usd)
		}
		if n := s.orderCount(t, "cust-policy"); n != 1 {
			t.Errorf("%d orders, want only the USD one", n)
		}
	})
	t.Run("unknown key", func(t *testing.T) {
		policy := filepath.Join(dir, "typo.toml")
		if err := os.WriteFile(policy, []byte("alowed_currencies = [\"USD\"]\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		// stdin is empty: a server that started would serve until EOF and
		// exit 0, so a non-zero exit means it refused to start.
		r := runCLI(t, 10*time.Second, "serve", "--db", filepath.Join(dir, "typo.db"), "--config", policy)
		if r.Code == 0 || !strings.Contains(r.Stderr, "alowed_currencies") {
			t.Errorf("serve with an unknown policy key: exit %d, want non-zero naming the key\nstderr: %s", r.Code, r.Stderr)
		}
		if r.Stdout != "" {
			t.Errorf("serve wrote to stdout (the protocol channel) while failing: %q", r.Stdout)
		}
	})
}
