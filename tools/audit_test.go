package tools

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/google/uuid"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/orders"
	"idemgate/outbox"
)

// callerOf is an actor with every request field an audit entry records.
func callerOf(a ledger.Actor, requestID string) ledger.Actor {
	a.SessionID = "sess-1"
	a.RequestID = requestID
	a.Trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	a.OnBehalfOf = "yuki@example.com"
	a.Model = "model-a"
	a.ClientStated = &ledger.ClientStated{OnBehalfOf: "someone-else", Model: "model-b"}
	return a
}

// history is the audit history of key in tenant t1.
func history(t *testing.T, svc *Service, key string) []ledger.AuditEntry {
	t.Helper()
	entries, total, err := svc.ledger.AuditForKey(context.Background(), "t1", key, 0)
	if err != nil {
		t.Fatal(err)
	}
	if total != len(entries) {
		t.Fatalf("AuditForKey total %d, returned %d", total, len(entries))
	}
	return entries
}

// find returns the entries of event with decision ("" matches any).
func find(entries []ledger.AuditEntry, event ledger.AuditEvent, decision ledger.AuditDecision) []ledger.AuditEntry {
	var out []ledger.AuditEntry
	for _, e := range entries {
		if e.Event == event && (decision == "" || e.Decision == decision) {
			out = append(out, e)
		}
	}
	return out
}

func digest(t *testing.T, r *Response) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// checkRequest: the entry carries the request's identity fields as the
// call was made.
func checkRequest(t *testing.T, e ledger.AuditEntry, want ledger.Actor) {
	t.Helper()
	got := e.Actor
	if got.SessionID != want.SessionID || got.RequestID != want.RequestID || got.Trace != want.Trace ||
		got.OnBehalfOf != want.OnBehalfOf || got.Model != want.Model || got.Principal != want.Principal ||
		got.ClientStated == nil || *got.ClientStated != *want.ClientStated {
		t.Errorf("entry %d (%s %s) actor = %+v (client_stated %+v), want %+v", e.Seq, e.Event, e.Decision, got, got.ClientStated, want)
	}
}

// TestAuditFieldsEmbedded: a create on the embedded store, its replay, a
// refused reuse of the key and a refused invalid call each leave entries
// with who (session, request id, user, model, trace), the policy check,
// what the store wrote, and what was answered (digest, error code,
// duration).
func TestAuditFieldsEmbedded(t *testing.T) {
	ctx := context.Background()
	svc := newService(t, nil, nil)
	key := uuid.NewString()
	args := orderArgs(key, 2)
	args["notify_customer"] = true

	first := callerOf(agent, "1")
	created := svc.Call(ctx, first, "create_order", args, nil)
	if created.IsError {
		t.Fatalf("create = %+v", created)
	}
	o := resultOrder(t, created)
	replayer := callerOf(agent, "2")
	replay := svc.Call(ctx, replayer, "create_order", args, nil)
	if !replay.Replayed {
		t.Fatalf("second call = %+v, want a replay", replay)
	}
	changed := orderArgs(key, 3)
	mismatcher := callerOf(agent, "3")
	refused := svc.Call(ctx, mismatcher, "create_order", changed, nil)
	if refused.Error == nil || refused.Error.Code != "key_reused_with_different_request" {
		t.Fatalf("changed request = %+v, want key_reused_with_different_request", refused)
	}
	bad := orderArgs(key, 0) // quantity 0: refused by validation
	invalider := callerOf(agent, "4")
	invalid := svc.Call(ctx, invalider, "create_order", bad, nil)
	if invalid.Error == nil || invalid.Error.Code != "invalid_arguments" {
		t.Fatalf("invalid call = %+v, want invalid_arguments", invalid)
	}

	h := history(t, svc, key)

	executed := find(h, "transition", "executed")
	if len(executed) != 1 {
		t.Fatalf("executed transitions = %d, want 1; history %+v", len(executed), h)
	}
	ex := executed[0]
	checkRequest(t, ex, first)
	if ex.PolicyAction != "allow" || ex.PolicyRule != "default_allow" {
		t.Errorf("executed policy = %q/%q, want allow/default_allow", ex.PolicyAction, ex.PolicyRule)
	}
	c := ex.Call
	rec, err := svc.ledger.Get(ctx, "t1", key)
	if err != nil {
		t.Fatal(err)
	}
	wantMsg := outbox.MessageID("t1", opRef(rec), "confirmation")
	if c == nil || c.System != "embedded" || c.OrderID != o.OrderID || c.Version != 1 || c.Attempt != 1 ||
		len(c.MessageIDs) != 1 || c.MessageIDs[0] != wantMsg || ex.Downstream != "embedded" {
		t.Errorf("executed downstream = %+v (downstream %q), want embedded order %s v1 attempt 1 message %s", c, ex.Downstream, o.OrderID, wantMsg)
	}

	// The create's answer is on its executed transition and the replay's
	// on its call entry; the mismatch's answer (rejected) contradicts its
	// call entry (the operation's state) and has an entry of its own.
	if n := len(h); n != 5 {
		t.Errorf("history has %d entries, want 5 (executed, replay, mismatch and its answer, refusal): %+v", n, h)
	}
	answers := append(append(find(h, "transition", "executed"), find(h, "call", "replay")...), find(h, "answer", "")...)
	if len(answers) != 3 {
		t.Fatalf("answering entries = %d, want 3 (create, replay, mismatch); history %+v", len(answers), h)
	}
	for i, tc := range []struct {
		who      ledger.Actor
		resp     *Response
		replayed bool
		code     string
	}{{first, created, false, ""}, {replayer, replay, true, ""}, {mismatcher, refused, false, "key_reused_with_different_request"}} {
		a := answers[i]
		checkRequest(t, a, tc.who)
		if a.ResponseSHA256 != digest(t, tc.resp) || a.Replayed != tc.replayed || a.ErrorCode != tc.code ||
			a.StateAfter != tc.resp.Status || a.DurationMS <= 0 || a.PolicyAction != "allow" || a.Key != key {
			t.Errorf("answer %d = %+v, want digest %s, replayed %v, code %q, status %s, a duration and the policy", i, a, digest(t, tc.resp), tc.replayed, tc.code, tc.resp.Status)
		}
	}

	replays := find(h, "call", "replay")
	if len(replays) != 1 || replays[0].PolicyRule != "default_allow" || replays[0].StateAfter != ledger.StateSucceeded {
		t.Errorf("replay call entries = %+v, want one with the policy check", replays)
	}
	checkRequest(t, replays[0], replayer)
	mism := find(h, "call", "mismatch")
	if len(mism) != 1 || mism[0].ErrorCode != "key_reused_with_different_request" {
		t.Errorf("mismatch call entries = %+v", mism)
	}

	ref := find(h, "call", "refused")
	if len(ref) != 1 {
		t.Fatalf("refused call entries = %d, want 1", len(ref))
	}
	checkRequest(t, ref[0], invalider)
	if r := ref[0]; r.ErrorCode != "invalid_arguments" || r.ResponseSHA256 != digest(t, invalid) || r.DurationMS <= 0 || r.Detail == "" {
		t.Errorf("refusal entry = %+v, want invalid_arguments with digest %s, a duration and the problem", r, digest(t, invalid))
	}
	// Entries are in order and belong to this key only.
	for i, e := range h {
		if e.Key != key || (i > 0 && e.Seq <= h[i-1].Seq) {
			t.Errorf("history entry %d: key %q seq %d, want key %s in increasing order", i, e.Key, e.Seq, key)
		}
	}
	if _, err := svc.ledger.VerifyAudit(ctx); err != nil {
		t.Errorf("VerifyAudit: %v", err)
	}
}

// TestAuditFieldsApprovalExecuted: an update held by the policy and run
// by an approver records the policy check on the hold and, on the
// execution, the approval that authorised it, who approved, and what the
// store wrote.
func TestAuditFieldsApprovalExecuted(t *testing.T) {
	ctx := context.Background()
	svc := newService(t, nil, nil)
	o := resultOrder(t, svc.Call(ctx, agent, "create_order", orderArgs(uuid.NewString(), 1), nil))
	key := uuid.NewString()
	requester := callerOf(agent, "10")
	held := svc.Call(ctx, requester, "update_order", map[string]any{"operation_key": key, "order_id": o.OrderID, "expected_version": float64(1),
		"changes": map[string]any{"note": "leave at the door"}}, nil)
	if held.Status != ledger.StateAwaitingApproval {
		t.Fatalf("update = %+v, want awaiting_approval", held)
	}
	boss := callerOf(approver, "11")
	boss.OnBehalfOf, boss.ClientStated = "", &ledger.ClientStated{Model: "model-c"}
	done := svc.Call(ctx, boss, "decide_approval", map[string]any{"approval_id": held.Approval.ID, "decision": "approve"}, nil)
	if done.Status != ledger.StateSucceeded {
		t.Fatalf("approve = %+v, want succeeded", done)
	}
	h := history(t, svc, key)

	hold := find(h, "transition", "held: always_approve")
	if len(hold) != 1 || hold[0].PolicyAction != "approve" || hold[0].PolicyRule != "always_approve" || hold[0].ApprovalID != held.Approval.ID || hold[0].ApprovalStatus != "pending" {
		t.Errorf("hold entries = %+v, want one with policy approve/always_approve and the pending approval", hold)
	}
	ex := find(h, "transition", "executed after approval")
	if len(ex) != 1 {
		t.Fatalf("executed-after-approval entries = %d, want 1; history %+v", len(ex), h)
	}
	e := ex[0]
	checkRequest(t, e, boss)
	if e.ApprovalID != held.Approval.ID || e.ApprovalStatus != "approved" || e.Approver != "boss" {
		t.Errorf("execution's approval = %q %q by %q, want %s approved by boss", e.ApprovalID, e.ApprovalStatus, e.Approver, held.Approval.ID)
	}
	if c := e.Call; c == nil || c.System != "embedded" || c.OrderID != o.OrderID || c.Version != 2 || c.Attempt != 1 {
		t.Errorf("execution's downstream = %+v, want embedded order %s v2 attempt 1", c, o.OrderID)
	}
	// The hold's answer is on its transition; the approval's (another
	// tool's call) has an entry of its own.
	if h := hold[0]; h.ResponseSHA256 != digest(t, held) || h.StateAfter != ledger.StateAwaitingApproval || h.ErrorCode != "approval_required" || h.DurationMS <= 0 {
		t.Errorf("hold entry = %+v, want the answer's digest %s, approval_required and a duration", h, digest(t, held))
	}
	ans := find(h, "answer", "")
	if len(ans) != 1 {
		t.Fatalf("answer entries = %d, want 1 (the approval)", len(ans))
	}
	if a := ans[0]; a.Tool != "decide_approval" || a.ResponseSHA256 != digest(t, done) || a.ApprovalID != held.Approval.ID || a.Approver != "boss" || a.Actor.Principal != "boss" {
		t.Errorf("approval's answer entry = %+v", a)
	}
}

// TestAuditFieldsOrderAPI: a call to the order API records its method,
// path, status, attempt and duration, and the order it returned; a failed
// call records the status and the failure class.
func TestAuditFieldsOrderAPI(t *testing.T) {
	ctx := context.Background()
	svc, fake := externalService(t, false)
	key := uuid.NewString()
	caller := callerOf(agent, "20")
	created := svc.Call(ctx, caller, "create_order", orderArgs(key, 1), nil)
	if created.Status != ledger.StateSucceeded {
		t.Fatalf("create = %+v", created)
	}
	o := resultOrder(t, created)
	h := history(t, svc, key)
	done := find(h, "transition", "completed")
	if len(done) != 1 {
		t.Fatalf("completed transitions = %d, want 1; history %+v", len(done), h)
	}
	checkRequest(t, done[0], caller)
	c := done[0].Call
	if c == nil || c.System != "orders_api" || c.Method != "POST" || c.Path != "/orders" || c.Status != 200 ||
		c.Attempt != 1 || c.DurationMS <= 0 || c.OrderID != o.OrderID || c.Version != 1 || c.Failure != "" {
		t.Errorf("downstream call = %+v, want POST /orders → 200, attempt 1, order %s v1", c, o.OrderID)
	}
	if claimed := find(h, "transition", "claimed"); len(claimed) != 1 || claimed[0].PolicyAction != "allow" {
		t.Errorf("claimed transitions = %+v, want one with the policy check", claimed)
	}
	// The answer is built in the completion's transaction: the completed
	// transition carries it, and no answer entry follows (issue 12). A
	// replay's answer is on its call entry.
	if e := done[0]; e.ResponseSHA256 != digest(t, created) || e.DurationMS <= 0 || e.Replayed || e.StateAfter != ledger.StateSucceeded {
		t.Errorf("completed transition = %+v, want it to carry the create's answer (digest %s)", e, digest(t, created))
	}
	replay := svc.Call(ctx, caller, "create_order", orderArgs(key, 1), nil)
	if !replay.Replayed {
		t.Fatalf("second call = %+v, want a replay", replay)
	}
	h = history(t, svc, key)
	ans, rep := find(h, "answer", ""), find(h, "call", "replay")
	if len(h) != 3 || len(ans) != 0 || len(rep) != 1 || rep[0].ResponseSHA256 != digest(t, replay) || !rep[0].Replayed {
		t.Errorf("history %+v: want claimed, completed carrying the create's answer, and one replay entry carrying its answer", h)
	}

	failKey := uuid.NewString()
	fake.mu.Lock()
	fake.absentNext = true
	fake.mu.Unlock()
	failed := svc.Call(ctx, caller, "create_order", orderArgs(failKey, 4), nil)
	if failed.Status != ledger.StateUnknown {
		t.Fatalf("create against a 500 = %+v, want unknown", failed)
	}
	var fc *ledger.DownstreamCall
	fh := history(t, svc, failKey)
	for _, e := range find(fh, "transition", "completed") {
		fc = e.Call
		// An unknown outcome is answered as it is recorded: its entry
		// carries the answer too.
		if e.StateAfter != ledger.StateUnknown || e.ErrorCode != failed.Error.Code || e.ResponseSHA256 != digest(t, failed) {
			t.Errorf("unknown completion = %+v, want it to carry the answer %s (digest %s)", e, failed.Error.Code, digest(t, failed))
		}
	}
	if ans := find(fh, "answer", ""); len(ans) != 0 {
		t.Errorf("answer entries of the unknown create = %+v, want none", ans)
	}
	if fc == nil || fc.Method != "POST" || fc.Status != 500 || fc.Failure != orders.Indeterminate || fc.OrderID != "" {
		t.Errorf("failed downstream call = %+v, want POST → 500 indeterminate, no order", fc)
	}
}

// TestAuditFieldsPolicyDeny: a call the policy denies is audited as a
// refusal with the rule, the deny action and the digest of the answer.
func TestAuditFieldsPolicyDeny(t *testing.T) {
	ctx := context.Background()
	p := approvals.Default()
	p.AllowedCurrencies = []string{"USD"}
	svc := newService(t, nil, &p)
	key := uuid.NewString()
	caller := callerOf(agent, "30")
	r := svc.Call(ctx, caller, "create_order", orderArgs(key, 1), nil)
	if r.Error == nil || r.Error.Code != "forbidden" {
		t.Fatalf("EUR order = %+v, want forbidden", r)
	}
	h := history(t, svc, key)
	if len(h) != 1 {
		t.Fatalf("history = %+v, want exactly the refusal", h)
	}
	e := h[0]
	checkRequest(t, e, caller)
	if e.Event != "call" || e.Decision != "refused" || e.ErrorCode != "forbidden" || e.PolicyAction != "deny" ||
		e.PolicyRule != "currency_not_allowed" || e.ResponseSHA256 != digest(t, r) || e.DurationMS <= 0 {
		t.Errorf("refusal entry = %+v, want forbidden by deny/currency_not_allowed with the answer's digest", e)
	}
}
