package ledgertest

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"idemgate/ledger"
)

// The cases below cover the rest of what ledger.Store promises: approvals
// decided (Decide) and listed (PendingApprovals), settlement (Settle),
// the open-record sweeps (OpenRecords paging, ExpireLeases), the steps
// that commit with an outcome (Outcome.Also) and the injectable clock.

// approver is an actor of tenant who did not request anything.
func approver(tenant string) ledger.Actor {
	return ledger.Actor{Tenant: tenant, Principal: "approver-" + tenant, Role: "approver"}
}

// held creates an operation that awaits approval (Claim.RequireApproval)
// and returns its claim and record.
func (e *env) held(tenant, fp string) (ledger.Claim, *ledger.Record) {
	e.t.Helper()
	c := newClaim(tenant, "create_order", fp)
	c.RequireApproval = true
	c.Proposal = &ledger.Approval{Reason: "policy", Rule: "big_order"}
	d := e.exec(c, e.ap.succeed(ResultOrder))
	wantKind(e.t, d, ledger.DecisionApprovalRequested)
	wantState(e.t, d.Record, ledger.StateAwaitingApproval)
	if d.Record.Approval == nil || d.Record.Approval.Status != ledger.ApprovalPending || d.Record.Approval.ID == "" {
		e.t.Fatalf("held record's approval = %+v, want a pending approval with an id", d.Record.Approval)
	}
	return c, d.Record
}

// contractDecideApprove: an approval is bound to its tenant, cannot be
// granted by its requester, runs the operation exactly once in the
// decision's transaction, and is single-use.
func contractDecideApprove(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c, rec := e.held("t1", "fp-1")
	id := rec.Approval.ID
	e.wantCalls(0)

	// Another tenant's approver cannot see it.
	if _, err := e.s.Decide(e.ctx, ledger.DecideRequest{Approver: approver("t2"), ApprovalID: id, Approve: true}, e.ap.succeed(ResultOrder)); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("Decide from another tenant: err = %v, want ErrNotFound", err)
	}
	// The requester cannot approve their own operation (in any spelling).
	self := c.Actor
	self.Principal = "AGENT-T1"
	if _, err := e.s.Decide(e.ctx, ledger.DecideRequest{Approver: self, ApprovalID: id, Approve: true}, e.ap.succeed(ResultOrder)); !errors.Is(err, ledger.ErrSelfApproval) {
		t.Fatalf("self-approval: err = %v, want ErrSelfApproval", err)
	}
	e.wantCalls(0)
	wantState(t, mustGet(t, e.s, "t1", c.Key), ledger.StateAwaitingApproval)

	e.clock.Advance(time.Minute)
	d, err := e.s.Decide(e.ctx, ledger.DecideRequest{Approver: approver("t1"), ApprovalID: id, Approve: true, Comment: "ok"}, e.ap.succeed(ResultOrder))
	if err != nil {
		t.Fatalf("Decide(approve): %v", err)
	}
	wantKind(t, d, ledger.DecisionExecuted)
	wantState(t, d.Record, ledger.StateSucceeded)
	e.wantCalls(1)
	got := mustGet(t, e.s, "t1", c.Key)
	wantState(t, got, ledger.StateSucceeded)
	if a := got.Approval; a == nil || a.Status != ledger.ApprovalApproved || a.DecidedBy != "approver-t1" || a.Comment != "ok" || !a.DecidedAt.Equal(e.clock.Now()) {
		t.Errorf("approval after the decision = %+v, want approved by approver-t1 at %s with the comment", a, e.clock.Now())
	}
	if string(got.Result) != ResultOrder {
		t.Errorf("Result = %s, want %s", got.Result, ResultOrder)
	}

	// Single use: a second decision, either way, changes nothing.
	for _, approve := range []bool{true, false} {
		d, err := e.s.Decide(e.ctx, ledger.DecideRequest{Approver: approver("t1"), ApprovalID: id, Approve: approve}, e.ap.succeed(ResultOrder))
		if !errors.Is(err, ledger.ErrAlreadyDecided) {
			t.Fatalf("second Decide(approve=%v): err = %v, want ErrAlreadyDecided", approve, err)
		}
		if d.Record == nil || d.Record.State != ledger.StateSucceeded {
			t.Errorf("second Decide: record = %+v, want the succeeded record", d.Record)
		}
	}
	e.wantCalls(1)
	if n := len(effects(t, e.s)); n != 1 {
		t.Errorf("effects = %d, want 1", n)
	}
	// The same call again is a replay of the approved outcome.
	r := e.exec(c, e.ap.succeed(`{}`))
	wantKind(t, r, ledger.DecisionReplay)
	e.wantCalls(1)
	if _, err := e.s.VerifyAudit(e.ctx); err != nil {
		t.Errorf("VerifyAudit: %v", err)
	}
}

// contractDecideReject: a rejection is final, runs nothing, and is what
// the same call gets back.
func contractDecideReject(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c, rec := e.held("t1", "fp-1")
	d, err := e.s.Decide(e.ctx, ledger.DecideRequest{Approver: approver("t1"), ApprovalID: rec.Approval.ID, Approve: false, Comment: "too big"}, e.ap.succeed(ResultOrder))
	if err != nil {
		t.Fatalf("Decide(reject): %v", err)
	}
	wantState(t, d.Record, ledger.StateRejected)
	if d.Record.Error == nil || d.Record.Error.Code != "forbidden" {
		t.Errorf("rejected record's error = %+v, want code forbidden", d.Record.Error)
	}
	if a := d.Record.Approval; a == nil || a.Status != ledger.ApprovalRejected {
		t.Errorf("approval = %+v, want rejected", a)
	}
	e.wantCalls(0)
	r := e.exec(c, e.ap.succeed(ResultOrder))
	wantKind(t, r, ledger.DecisionReplay)
	wantState(t, r.Record, ledger.StateRejected)
	e.wantCalls(0)
	if len(effects(t, e.s)) != 0 {
		t.Error("a rejected operation left an effect")
	}
}

// contractDecideExpired: an approval decided after its expiry is refused
// (ErrApprovalExpired) and the operation is rejected, never run.
func contractDecideExpired(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c, rec := e.held("t1", "fp-1")
	e.clock.Advance(e.opts.ApprovalTTL)
	_, err := e.s.Decide(e.ctx, ledger.DecideRequest{Approver: approver("t1"), ApprovalID: rec.Approval.ID, Approve: true}, e.ap.succeed(ResultOrder))
	if !errors.Is(err, ledger.ErrApprovalExpired) {
		t.Fatalf("Decide after expiry: err = %v, want ErrApprovalExpired", err)
	}
	e.wantCalls(0)
	got := mustGet(t, e.s, "t1", c.Key)
	wantState(t, got, ledger.StateRejected)
	if got.Approval == nil || got.Approval.Status != ledger.ApprovalExpired {
		t.Errorf("approval = %+v, want expired", got.Approval)
	}
}

// contractDecideClaimAndDownstream: approving without an apply hands the
// caller an in_progress claim to Complete, fenced like any claim; an
// approval from a process configured for another downstream is refused.
func contractDecideClaimAndDownstream(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c := newClaim("t1", "create_order", "fp-1")
	c.RequireApproval = true
	c.Downstream = "orders_api https://orders.example"
	d := e.exec(c, nil)
	wantKind(t, d, ledger.DecisionApprovalRequested)
	id := d.Record.Approval.ID

	_, err := e.s.Decide(e.ctx, ledger.DecideRequest{Approver: approver("t1"), ApprovalID: id, Approve: true, Downstream: "embedded"}, nil)
	if !errors.Is(err, ledger.ErrDownstreamMismatch) {
		t.Fatalf("Decide from another downstream: err = %v, want ErrDownstreamMismatch", err)
	}
	wantState(t, mustGet(t, e.s, "t1", c.Key), ledger.StateAwaitingApproval)

	d, err = e.s.Decide(e.ctx, ledger.DecideRequest{Approver: approver("t1"), ApprovalID: id, Approve: true, Downstream: c.Downstream}, nil)
	if err != nil {
		t.Fatalf("Decide(approve, no apply): %v", err)
	}
	wantKind(t, d, ledger.DecisionClaimed)
	wantState(t, d.Record, ledger.StateInProgress)
	gen := d.Record.Generation
	if _, err := e.s.Complete(e.ctx, c.Actor, c.Key, gen+1, ledger.Outcome{State: ledger.StateSucceeded}); !errors.Is(err, ledger.ErrStaleGeneration) {
		t.Fatalf("Complete with a wrong generation: err = %v, want ErrStaleGeneration", err)
	}
	rec, err := e.s.Complete(e.ctx, c.Actor, c.Key, gen, ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(ResultOrder)})
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	wantState(t, rec, ledger.StateSucceeded)
}

// contractPendingApprovals: a tenant's pending approvals, oldest first,
// paged by ApprovalPosition; decided and expired ones are not listed, nor
// another tenant's.
func contractPendingApprovals(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	var keys []string
	var ids []string
	for i := range 5 {
		c, rec := e.held("t1", "fp-"+string(rune('a'+i)))
		keys, ids = append(keys, c.Key), append(ids, rec.Approval.ID)
		e.held("t2", "fp-other-"+string(rune('a'+i)))
		e.clock.Advance(time.Minute)
	}
	var got []string
	after := ""
	for page := 0; ; page++ {
		recs, err := e.s.PendingApprovals(e.ctx, "t1", after, 2)
		if err != nil {
			t.Fatalf("PendingApprovals: %v", err)
		}
		if len(recs) > 2 {
			t.Fatalf("page of %d records, limit 2", len(recs))
		}
		if len(recs) == 0 {
			break
		}
		for _, r := range recs {
			if r.Tenant != "t1" || r.State != ledger.StateAwaitingApproval {
				t.Errorf("listed %s/%s in state %s", r.Tenant, r.Key, r.State)
			}
			got = append(got, r.Key)
		}
		after = ledger.ApprovalPosition(recs[len(recs)-1])
		if page > 5 {
			t.Fatal("paging does not end")
		}
	}
	if !slices.Equal(got, keys) {
		t.Fatalf("pending approvals = %v, want oldest first %v", got, keys)
	}

	// One decided, and the oldest expired: neither is listed.
	if _, err := e.s.Decide(e.ctx, ledger.DecideRequest{Approver: approver("t1"), ApprovalID: ids[2], Approve: false}, nil); err != nil {
		t.Fatalf("Decide: %v", err)
	}
	e.clock.Advance(e.opts.ApprovalTTL - 5*time.Minute + 30*time.Second) // only the first (created 5 minutes ago) is past its TTL
	recs, err := e.s.PendingApprovals(e.ctx, "t1", "", 0)
	if err != nil {
		t.Fatalf("PendingApprovals: %v", err)
	}
	got = nil
	for _, r := range recs {
		got = append(got, r.Key)
	}
	if want := []string{keys[1], keys[3], keys[4]}; !slices.Equal(got, want) {
		t.Errorf("pending after a decision and an expiry = %v, want %v", got, want)
	}
	// ApprovalRecord finds a record by its approval, in its tenant only.
	r, err := e.s.ApprovalRecord(e.ctx, "t1", ids[3])
	if err != nil || r.Key != keys[3] {
		t.Errorf("ApprovalRecord = %v, %v; want %s", r, err, keys[3])
	}
	if _, err := e.s.ApprovalRecord(e.ctx, "t2", ids[3]); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("ApprovalRecord from another tenant: err = %v, want ErrNotFound", err)
	}
}

// contractSettle: an operation whose outcome became unknown is settled by
// reconciliation: succeeded (with the steps of Outcome.Also committed in
// the same transaction), retryable (and then runs again), or held for
// approval; a settlement from a state that is no longer current is
// ErrWrongState.
func contractSettle(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	unknown := func() ledger.Claim {
		c := newClaim("t1", "create_order", "fp-"+time.Duration(e.clock.Elapsed()).String())
		c.OnLeaseExpiry = ledger.StateUnknown
		wantKind(t, e.claim(c), ledger.DecisionClaimed)
		e.clock.Advance(e.opts.Lease)
		wantState(t, mustGet(t, e.s, "t1", c.Key), ledger.StateUnknown)
		e.clock.Advance(time.Second)
		return c
	}
	sweeper := ledger.Actor{Tenant: "t1", Principal: "reconciler"}

	// Found at the downstream: succeeded, and Also's write commits with it.
	c := unknown()
	rec, err := e.s.Settle(e.ctx, ledger.SettleRequest{Actor: sweeper, Key: c.Key, From: []ledger.State{ledger.StateUnknown},
		Outcome: ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(ResultOrder), Summary: "order ord_1",
			Also: func(tx ledger.Tx) error { return tx.Put("confirmations", c.Key, []byte("sent")) }},
		Why: "reconciled: found"})
	if err != nil {
		t.Fatalf("Settle(succeeded): %v", err)
	}
	wantState(t, rec, ledger.StateSucceeded)
	if got := e.readData("confirmations", c.Key); got != "sent" {
		t.Errorf("Also's write = %q, want sent", got)
	}
	wantKind(t, e.exec(c, e.ap.succeed(`{}`)), ledger.DecisionReplay)
	e.wantCalls(0)
	// Settled once: a second settlement from unknown is refused.
	if _, err := e.s.Settle(e.ctx, ledger.SettleRequest{Actor: sweeper, Key: c.Key, From: []ledger.State{ledger.StateUnknown},
		Outcome: ledger.Outcome{State: ledger.StateFailed}}); !errors.Is(err, ledger.ErrWrongState) {
		t.Errorf("second Settle: err = %v, want ErrWrongState", err)
	}
	if _, err := e.s.Settle(e.ctx, ledger.SettleRequest{Actor: sweeper, Key: "no-such-key", From: []ledger.State{ledger.StateUnknown},
		Outcome: ledger.Outcome{State: ledger.StateFailed}}); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("Settle of a missing key: err = %v, want ErrNotFound", err)
	}

	// Proven absent: retryable, and the same call runs it (attempt 2).
	c = unknown()
	rec, err = e.s.Settle(e.ctx, ledger.SettleRequest{Actor: sweeper, Key: c.Key, From: []ledger.State{ledger.StateUnknown},
		Outcome: ledger.Outcome{State: ledger.StateRetryable}, Why: "reconciled: absent"})
	if err != nil {
		t.Fatalf("Settle(retryable): %v", err)
	}
	wantState(t, rec, ledger.StateRetryable)
	d := e.exec(c, e.ap.succeed(ResultOrder))
	wantKind(t, d, ledger.DecisionExecuted)
	if d.Record.Attempts != 2 {
		t.Errorf("attempts after a retryable settlement = %d, want 2", d.Record.Attempts)
	}
	e.wantCalls(1)

	// Absent, but a re-run needs a human: held, with a pending approval.
	c = unknown()
	rec, err = e.s.Settle(e.ctx, ledger.SettleRequest{Actor: sweeper, Key: c.Key, From: []ledger.State{ledger.StateUnknown},
		Outcome: ledger.Outcome{State: ledger.StateAwaitingApproval}, Proposal: &ledger.Approval{Reason: "rerun", Rule: "rerun_after_unknown"}, Why: "re-run needs approval"})
	if err != nil {
		t.Fatalf("Settle(awaiting_approval): %v", err)
	}
	wantState(t, rec, ledger.StateAwaitingApproval)
	if rec.Approval == nil || rec.Approval.Status != ledger.ApprovalPending || rec.Approval.RequestedBy != "reconciler" {
		t.Fatalf("approval = %+v, want pending, requested by reconciler", rec.Approval)
	}
	pending, err := e.s.PendingApprovals(e.ctx, "t1", "", 0)
	if err != nil || len(pending) != 1 || pending[0].Key != c.Key {
		t.Errorf("PendingApprovals = %d records, %v; want the held re-run", len(pending), err)
	}
}

// readData reads one value of a downstream collection.
func (e *env) readData(collection, key string) string {
	e.t.Helper()
	var out string
	if err := e.s.View(e.ctx, func(tx ledger.Tx) error {
		v, err := tx.Get(collection, key)
		out = string(v)
		return err
	}); err != nil {
		e.t.Fatalf("View: %v", err)
	}
	return out
}

// contractOutcomeAlso: Outcome.Also runs in the transaction that records
// a succeeded outcome: its writes commit with it, its error rolls the
// completion back, and it does not run for a failed outcome.
func contractOutcomeAlso(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c := newClaim("t1", "create_order", "fp-1")
	d := e.claim(c)
	errAlso := errors.New("also failed")
	_, err := e.s.Complete(e.ctx, c.Actor, c.Key, d.Record.Generation, ledger.Outcome{State: ledger.StateSucceeded,
		Also: func(tx ledger.Tx) error {
			if err := tx.Put("confirmations", c.Key, []byte("doomed")); err != nil {
				return err
			}
			return errAlso
		}})
	if !errors.Is(err, errAlso) {
		t.Fatalf("Complete with a failing Also: err = %v, want its error", err)
	}
	wantState(t, mustGet(t, e.s, "t1", c.Key), ledger.StateInProgress)
	if got := e.readData("confirmations", c.Key); got != "" {
		t.Errorf("a failed Also's write survived: %q", got)
	}
	_, err = e.s.Complete(e.ctx, c.Actor, c.Key, d.Record.Generation, ledger.Outcome{State: ledger.StateSucceeded,
		Also: func(tx ledger.Tx) error { return tx.Put("confirmations", c.Key, []byte("sent")) }})
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	wantState(t, mustGet(t, e.s, "t1", c.Key), ledger.StateSucceeded)
	if got := e.readData("confirmations", c.Key); got != "sent" {
		t.Errorf("Also's write = %q, want sent", got)
	}

	f := newClaim("t1", "create_order", "fp-2")
	d = e.claim(f)
	ran := false
	if _, err := e.s.Complete(e.ctx, f.Actor, f.Key, d.Record.Generation, ledger.Outcome{State: ledger.StateFailed, Error: &ledger.OpError{Code: "downstream_rejected"},
		Also: func(tx ledger.Tx) error { ran = true; return nil }}); err != nil {
		t.Fatalf("Complete(failed): %v", err)
	}
	if ran {
		t.Error("Also ran for a failed outcome")
	}
}

// contractOpenRecordsPaging: OpenRecords lists one state's records in
// (tenant, key) order, a page at a time from OpenPosition, each exactly
// once; a record that leaves the state leaves the listing.
func contractOpenRecordsPaging(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	var want []string
	gens := map[string]uint64{}
	for _, tenant := range []string{"t2", "t1"} {
		for i := range 4 {
			c := newClaim(tenant, "create_order", "fp-"+tenant+string(rune('a'+i)))
			d := e.claim(c)
			want = append(want, tenant+"/"+c.Key)
			gens[c.Key] = d.Record.Generation
		}
	}
	slices.Sort(want)
	page := func(st ledger.State, limit int) []string {
		t.Helper()
		var got []string
		after := ""
		for n := 0; ; n++ {
			recs, err := e.s.OpenRecords(e.ctx, st, after, limit)
			if err != nil {
				t.Fatalf("OpenRecords: %v", err)
			}
			if len(recs) > limit {
				t.Fatalf("page of %d, limit %d", len(recs), limit)
			}
			if len(recs) == 0 {
				return got
			}
			for _, r := range recs {
				if r.State != st {
					t.Errorf("listed %s in state %s under %s", r.Key, r.State, st)
				}
				got = append(got, r.Tenant+"/"+r.Key)
			}
			after = ledger.OpenPosition(recs[len(recs)-1])
			if n > 20 {
				t.Fatal("paging does not end")
			}
		}
	}
	if got := page(ledger.StateInProgress, 3); !slices.Equal(got, want) {
		t.Fatalf("in_progress pages = %v, want %v", got, want)
	}
	if got := page(ledger.StateUnknown, 3); len(got) != 0 {
		t.Errorf("unknown = %v, want none", got)
	}
	// Completing one removes it.
	first := want[0]
	tenant, key, _ := cut(first)
	if _, err := e.s.Complete(e.ctx, testActor(tenant), key, gens[key], ledger.Outcome{State: ledger.StateSucceeded}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if got := page(ledger.StateInProgress, 100); !slices.Equal(got, want[1:]) {
		t.Errorf("in_progress after a completion = %v, want %v", got, want[1:])
	}
}

func cut(s string) (string, string, bool) {
	for i := range s {
		if s[i] == '/' {
			return s[:i], s[i+1:], true
		}
	}
	return s, "", false
}

// contractExpireLeases: ExpireLeases moves every in_progress record whose
// lease expired (by the injected clock) to its OnLeaseExpiry state, and
// nothing else; a second run moves none.
func contractExpireLeases(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	retry := newClaim("t1", "create_order", "fp-r")
	unk := newClaim("t1", "create_order", "fp-u")
	unk.OnLeaseExpiry = ledger.StateUnknown
	e.claim(retry)
	e.claim(unk)
	e.clock.Advance(e.opts.Lease / 2)
	live := newClaim("t1", "create_order", "fp-l")
	e.claim(live)

	n, err := e.s.ExpireLeases(e.ctx)
	if err != nil || n != 0 {
		t.Fatalf("ExpireLeases before any expiry = %d, %v; want 0", n, err)
	}
	e.clock.Advance(e.opts.Lease / 2)
	n, err = e.s.ExpireLeases(e.ctx)
	if err != nil || n != 2 {
		t.Fatalf("ExpireLeases = %d, %v; want 2", n, err)
	}
	wantState(t, mustGet(t, e.s, "t1", retry.Key), ledger.StateRetryable)
	wantState(t, mustGet(t, e.s, "t1", unk.Key), ledger.StateUnknown)
	wantState(t, mustGet(t, e.s, "t1", live.Key), ledger.StateInProgress)
	if n, err := e.s.ExpireLeases(e.ctx); err != nil || n != 0 {
		t.Errorf("second ExpireLeases = %d, %v; want 0", n, err)
	}
	recs, err := e.s.OpenRecords(e.ctx, ledger.StateUnknown, "", 10)
	if err != nil || len(recs) != 1 || recs[0].Key != unk.Key {
		t.Errorf("OpenRecords(unknown) = %d, %v; want the expired one", len(recs), err)
	}
	// The transitions are audited as lease expiries.
	entries, _, err := e.s.AuditForKey(e.ctx, "t1", unk.Key, 0)
	if err != nil {
		t.Fatalf("AuditForKey: %v", err)
	}
	if last := entries[len(entries)-1]; last.StateBefore != ledger.StateInProgress || last.StateAfter != ledger.StateUnknown {
		t.Errorf("last audit entry = %s → %s, want in_progress → unknown", last.StateBefore, last.StateAfter)
	}
}

// contractInjectedClock: every time the ledger records is the injected
// clock's (Options.Now), also the time a downstream sees in Tx.Now.
func contractInjectedClock(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	e.clock.Advance(37 * time.Hour)
	now := e.clock.Now()
	var seen time.Time
	c := newClaim("t1", "create_order", "fp-1")
	d := e.exec(c, func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		seen = tx.Now()
		return ledger.Outcome{State: ledger.StateSucceeded}, nil
	})
	wantKind(t, d, ledger.DecisionExecuted)
	if !seen.Equal(now) {
		t.Errorf("Tx.Now = %s, want the injected %s", seen, now)
	}
	rec := mustGet(t, e.s, "t1", c.Key)
	if !rec.FirstSeenAt.Equal(now) || !rec.CompletedAt.Equal(now) || !rec.UpdatedAt.Equal(now) {
		t.Errorf("record times = first %s, updated %s, completed %s; want all %s", rec.FirstSeenAt, rec.UpdatedAt, rec.CompletedAt, now)
	}
	entries, _, err := e.s.AuditForKey(e.ctx, "t1", c.Key, 0)
	if err != nil || len(entries) == 0 {
		t.Fatalf("AuditForKey = %d entries, %v", len(entries), err)
	}
	for _, en := range entries {
		if !en.At.Equal(now) {
			t.Errorf("audit entry %d at %s, want %s", en.Seq, en.At, now)
		}
	}
}

// contractSettleHowAudited: a settlement out of unknown writes how it
// settled (SettleRequest.How; SettledOther when not said) on its audit
// entry, and ComputeStats counts settlements by it, not by the reason's
// wording.
func contractSettleHowAudited(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	sweeper := ledger.Actor{Tenant: "t1", Principal: "reconciler"}
	settle := func(how ledger.Settlement, why string, to ledger.State) string {
		c := newClaim("t1", "create_order", "fp-"+why)
		c.OnLeaseExpiry = ledger.StateUnknown
		e.claim(c)
		e.clock.Advance(e.opts.Lease)
		if _, err := e.s.Settle(e.ctx, ledger.SettleRequest{Actor: sweeper, Key: c.Key, From: []ledger.State{ledger.StateUnknown},
			Outcome: ledger.Outcome{State: to}, Why: why, How: how}); err != nil {
			t.Fatalf("Settle(%s): %v", why, err)
		}
		return c.Key
	}
	found := settle(ledger.SettledReconciledFound, "the warehouse has it", ledger.StateSucceeded)
	byHand := settle(ledger.SettledResolvedByHand, "checked the bank statement", ledger.StateSucceeded)
	unsaid := settle("", "reconciled: the order system has order ord_1 for this key", ledger.StateSucceeded)

	for key, want := range map[string]ledger.Settlement{found: ledger.SettledReconciledFound, byHand: ledger.SettledResolvedByHand, unsaid: ledger.SettledOther} {
		entries, _, err := e.s.AuditForKey(e.ctx, "t1", key, 0)
		if err != nil || len(entries) == 0 {
			t.Fatalf("AuditForKey = %d, %v", len(entries), err)
		}
		last := entries[len(entries)-1]
		if last.StateBefore != ledger.StateUnknown || last.Settled != want || last.SettledHow() != want {
			t.Errorf("settling entry of %s: %s → %s, settled %q; want from unknown, settled %q", key, last.StateBefore, last.StateAfter, last.Settled, want)
		}
	}
	st, err := ledger.ComputeStats(e.ctx, e.s, "t1")
	if err != nil {
		t.Fatalf("ComputeStats: %v", err)
	}
	want := map[string]int{"reconciled_found": 1, "resolved_by_hand": 1, "other": 1}
	if len(st.Settled) != len(want) || st.Settled["reconciled_found"] != 1 || st.Settled["resolved_by_hand"] != 1 || st.Settled["other"] != 1 {
		t.Errorf("Stats.Settled = %v, want %v", st.Settled, want)
	}
	if st.Unknown != 3 || st.StillUnsure != 0 {
		t.Errorf("Stats unknown = %d, unsettled %d; want 3, 0", st.Unknown, st.StillUnsure)
	}
}

// contractAuditBufferSurvivesPanic: an entry buffered by Audit is written
// with a later transaction even when the transaction that would have
// carried it panics (a bug in a downstream): the panic reaches its caller,
// and the entry is neither lost nor written twice.
func contractAuditBufferSurvivesPanic(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	e.s.Audit(ledger.AuditEntry{Event: "call", Actor: testActor("t1"), Key: "buffered-key", Decision: ledger.AuditDecision(ledger.DecisionReplay)})
	func() {
		defer func() {
			if r := recover(); r == nil {
				t.Fatal("the panic in Update did not reach its caller")
			}
		}()
		e.s.Update(e.ctx, func(tx ledger.Tx) error { panic("downstream bug") })
	}()
	entries, total, err := e.s.AuditForKey(e.ctx, "t1", "buffered-key", 0)
	if err != nil {
		t.Fatalf("AuditForKey: %v", err)
	}
	if total != 1 || len(entries) != 1 {
		t.Fatalf("buffered entry written %d times, want once", total)
	}
	if _, err := e.s.VerifyAudit(e.ctx); err != nil {
		t.Errorf("VerifyAudit: %v", err)
	}
}

// contractAuditHistoryOfKey: AuditForKey returns exactly the entries of
// the whole log that name the key, in order — through more transitions
// than a record numbers itself (Record.AuditSeqs is bounded), replays,
// and after the record was compacted to a tombstone and then deleted.
func contractAuditHistoryOfKey(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c := newClaim("t1", "create_order", "fp-history")
	c.OnLeaseExpiry = ledger.StateRetryable
	other := newClaim("t1", "create_order", "fp-other")
	var d ledger.Decision
	for range 12 { // 23 transitions (claimed, then retryable and claimed again) and 12 answers
		d = e.claim(c)
		wantKind(t, d, ledger.DecisionClaimed)
		// The call's answer, as the tools write it, and entries of
		// another key between.
		e.s.Audit(ledger.AuditEntry{Event: ledger.EventAnswer, Actor: c.Actor, Tool: c.Tool, Key: c.Key, StateAfter: ledger.StateInProgress})
		e.exec(other, e.ap.succeed(ResultOrder))
		e.clock.Advance(e.opts.Lease)
	}
	d = e.claim(c)
	if _, err := e.s.Complete(e.ctx, c.Actor, c.Key, d.Record.Generation, ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(ResultOrder)}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	wantKind(t, e.exec(c, e.ap.succeed(ResultOrder)), ledger.DecisionReplay)
	check := func(when string, atLeast int) {
		t.Helper()
		log, err := e.s.AuditLog(e.ctx, 0, 0)
		if err != nil {
			t.Fatalf("AuditLog: %v", err)
		}
		var want []uint64
		for _, en := range log {
			if en.Key == c.Key && en.Actor.Tenant == "t1" {
				want = append(want, en.Seq)
			}
		}
		got, total, err := e.s.AuditForKey(e.ctx, "t1", c.Key, 0)
		if err != nil {
			t.Fatalf("%s: AuditForKey: %v", when, err)
		}
		var seqs []uint64
		for _, en := range got {
			seqs = append(seqs, en.Seq)
		}
		if total != len(want) || !slices.Equal(seqs, want) || len(want) < atLeast {
			t.Errorf("%s: AuditForKey = %v (total %d), want the log's %v (at least %d)", when, seqs, total, want, atLeast)
		}
		if newest, total2, err := e.s.AuditForKey(e.ctx, "t1", c.Key, 3); err != nil || total2 != total || len(newest) != 3 || newest[2].Seq != want[len(want)-1] {
			t.Errorf("%s: AuditForKey limit 3 = %d entries (total %d), %v; want the newest 3 of %d", when, len(newest), total2, err, total)
		}
	}
	check("succeeded", 38)
	// A journaling ledger's records number none: the sealer indexes them.
	if rec := mustGet(t, e.s, "t1", c.Key); (len(rec.AuditSeqs) == 0 && !reruns(e.s)) || len(rec.AuditSeqs) > 16 {
		t.Errorf("the record numbers %d audit entries, want 1 to 16 (bounded)", len(rec.AuditSeqs))
	}
	e.clock.Advance(e.opts.Retention)
	if n, _, err := e.s.Sweep(e.ctx); err != nil || n == 0 {
		t.Fatalf("Sweep at retention = %d, %v", n, err)
	}
	check("tombstone", 39)
	e.clock.Advance(e.opts.TombstoneRetention)
	if _, n, err := e.s.Sweep(e.ctx); err != nil || n == 0 {
		t.Fatalf("Sweep at tombstone retention = %d deleted, %v", n, err)
	}
	if _, err := e.s.Get(e.ctx, "t1", c.Key); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("Get after deletion: %v, want ErrNotFound", err)
	}
	check("deleted", 40)
}
