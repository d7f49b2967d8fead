package ledgertest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"idemgate/ledger"
	"slices"
	"strings"
	"testing"
	"time"
)

// Package ledgertest is the contract every ledger backend must pass: what
// the ledger promises (claim races, fencing, leases and their expiry,
// Decide, Settle, approvals, paging, retention, tombstones, the audit
// chain, an injectable clock), written against the ledger.Store interface
// only. A backend's test calls Run with a function that opens a fresh,
// empty store for one subtest (and closes it in t.Cleanup):
//
//	func TestContract(t *testing.T) {
//		ledgertest.Run(t, func(t *testing.T, o ledger.Options) ledger.Store {
//			s := ledger.New(newMyBackend(t), o)
//			t.Cleanup(func() { s.Close() })
//			return s
//		})
//	}
//
// The options passed to open carry the test's fake clock in Options.Now
// and Options.Elapsed; open must pass them through unchanged.
//
// RunBackend checks the backend itself, below the ledger (atomicity,
// ordering, isolation, Close), so that a failure of Run can be traced to
// the guarantee the backend misses.

// Opts are the windows every contract case runs with: short enough
// to read, distinct enough that a mix-up between them shows.
func Opts() ledger.Options {
	return ledger.Options{
		Retention:          1 * time.Hour,
		TombstoneRetention: 24 * time.Hour,
		Lease:              30 * time.Second,
		SuspectWindow:      10 * time.Minute,
		ApprovalTTL:        2 * time.Hour,
	}
}

// env is one contract case's store, clock and counting applier.
type env struct {
	t     *testing.T
	ctx   context.Context
	clock *fakeClock
	opts  ledger.Options
	s     ledger.Store
	ap    *applier
}

func newEnv(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store, mod func(*ledger.Options)) *env {
	t.Helper()
	clock := newFakeClock()
	o := Opts()
	if mod != nil {
		mod(&o)
	}
	o.Now, o.Elapsed = clock.Now, clock.Elapsed
	return &env{t: t, ctx: context.Background(), clock: clock, opts: o, s: open(t, o), ap: &applier{}}
}

// exec runs Execute and fails the test on an error.
func (e *env) exec(c ledger.Claim, apply ledger.ApplyFunc) ledger.Decision {
	e.t.Helper()
	d, err := e.s.Execute(e.ctx, c, apply)
	if err != nil {
		e.t.Fatalf("Execute(%s): %v", c.Key, err)
	}
	return d
}

// claim runs Claim and fails the test on an error.
func (e *env) claim(c ledger.Claim) ledger.Decision {
	e.t.Helper()
	d, err := e.s.Claim(e.ctx, c)
	if err != nil {
		e.t.Fatalf("Claim(%s): %v", c.Key, err)
	}
	return d
}

// wantKind fails the test unless d is of kind want.
func wantKind(t *testing.T, d ledger.Decision, want ledger.DecisionKind) {
	t.Helper()
	if d.Kind != want {
		state := ledger.State("<no record>")
		if d.Record != nil {
			state = d.Record.State
		}
		t.Fatalf("decision = %q (record state %s), want %q", d.Kind, state, want)
	}
}

// wantState fails the test unless rec is in state want.
func wantState(t *testing.T, rec *ledger.Record, want ledger.State) {
	t.Helper()
	if rec == nil {
		t.Fatalf("record = nil, want state %s", want)
	}
	if rec.State != want {
		t.Fatalf("record state = %s, want %s", rec.State, want)
	}
}

// wantCalls fails the test unless the applier ran want times.
func (e *env) wantCalls(want int64) {
	e.t.Helper()
	if got := e.ap.n(); got != want {
		e.t.Fatalf("apply ran %d times, want %d", got, want)
	}
}

// ResultOrder is the result the contract's applies save.
const ResultOrder = `{"order":{"order_id":"ord_1","version":1}}`

// Run runs the Store contract against the stores open makes.
func Run(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	cases := []struct {
		name string
		run  func(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store)
	}{
		{"ExecuteNewRunsApplyOnce", contractExecuteNew},
		{"FreshOnlyInTheCreatingApply", contractFresh},
		{"ReplayReturnsSavedResult", contractReplay},
		{"ReplayIsByteIdentical", contractReplayByteIdentical},
		{"MismatchInEveryState", contractMismatchEveryState},
		{"ApplyErrorLeavesNoRecord", contractApplyError},
		{"InvalidResultLeavesNoRecord", contractInvalidResult},
		{"FailedOutcomeIsSavedAndReplayed", contractFailedOutcome},
		{"ClaimBusyComplete", contractClaimBusyComplete},
		{"CompleteStaleGeneration", contractCompleteStale},
		{"CompleteUnfinishedOutcomes", contractCompleteUnfinished},
		{"LeaseExpiryRetryable", contractLeaseExpiryRetryable},
		{"LeaseExpiryUnknown", contractLeaseExpiryUnknown},
		{"RenewLease", contractRenewLease},
		{"RetentionTombstoneSweep", contractRetention},
		{"RetentionMoment", contractRetentionMoment},
		{"Tenants", contractTenants},
		{"SuspectedDuplicate", contractSuspectedDuplicate},
		{"ApprovalExpiry", contractApprovalExpiry},
		{"ExpiredApprovalFollowsRetention", contractExpiredApprovalRetention},
		{"RequireIssuedKeys", contractRequireIssuedKeys},
		{"List", contractList},
		{"Collections", contractCollections},
		{"ReverseScanKeysWithFFBytes", contractReverseScanFF},
		{"Audit", contractAudit},
		{"ContextCancelled", contractContextCancelled},
		{"Closed", contractClosed},
		{"ConcurrentSameClaim", contractConcurrentSameClaim},
		{"ConcurrentDistinctKeys", contractConcurrentDistinctKeys},
		{"ConcurrentBatchMemberFails", contractConcurrentBatchMemberFails},
		{"DecideApprove", contractDecideApprove},
		{"DecideReject", contractDecideReject},
		{"DecideExpired", contractDecideExpired},
		{"DecideClaimAndDownstream", contractDecideClaimAndDownstream},
		{"PendingApprovals", contractPendingApprovals},
		{"Settle", contractSettle},
		{"OutcomeAlso", contractOutcomeAlso},
		{"OpenRecordsPaging", contractOpenRecordsPaging},
		{"ExpireLeases", contractExpireLeases},
		{"InjectedClock", contractInjectedClock},
		{"SettleHowAudited", contractSettleHowAudited},
		{"AuditBufferSurvivesPanic", contractAuditBufferSurvivesPanic},
		{"OnHeld", contractOnHeld},
		{"AuditHistoryOfKey", contractAuditHistoryOfKey},
		{"AnswerInEntry", contractAnswerInEntry},
		{"AnswerInCompletion", contractAnswerInCompletion},
		{"ReplayIsItsOwn", contractReplayIsItsOwn},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, open) })
	}
}

// contractFresh: an apply sees Record.Fresh only in the transaction that
// creates the record (so that a create may skip reading whether ids
// derived from its incarnation are free); a rolled-back creation leaves
// nothing, so the next claim creates afresh; a re-run of the same
// incarnation is not fresh, and no decision carries the flag out.
func contractFresh(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	var seen []bool
	apply := func(fail bool) ledger.ApplyFunc {
		return func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
			seen = append(seen, rec.Fresh)
			if fail {
				return ledger.Outcome{}, errBoom
			}
			return ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(ResultOrder), Summary: "fresh"}, nil
		}
	}
	c := newClaim("t1", "create_order", "fp-1")
	if _, err := e.s.Execute(e.ctx, c, apply(true)); !errors.Is(err, errBoom) {
		t.Fatalf("a failing apply: err = %v, want errBoom", err)
	}
	d := e.exec(c, apply(false))
	wantKind(t, d, ledger.DecisionExecuted)
	if d.Record.Fresh {
		t.Error("the executed decision's record is still Fresh")
	}

	rerun := newClaim("t1", "create_order", "fp-2")
	first := e.claim(rerun)
	if first.Record.Fresh {
		t.Error("the claimed decision's record is still Fresh")
	}
	if _, err := e.s.Complete(e.ctx, rerun.Actor, rerun.Key, first.Record.Generation, ledger.Outcome{State: ledger.StateRetryable, Error: &ledger.OpError{Code: "downstream_error", Message: "connection refused"}}); err != nil {
		t.Fatal(err)
	}
	d = e.exec(rerun, apply(false))
	wantKind(t, d, ledger.DecisionExecuted)
	if d.Record.Incarnation != first.Record.Incarnation {
		t.Fatalf("the re-run has incarnation %s, want %s", d.Record.Incarnation, first.Record.Incarnation)
	}
	if want := []bool{true, true, false}; !slices.Equal(seen, want) {
		t.Errorf("Fresh as the applies saw it: %v, want %v (creation rolled back, creation, re-run)", seen, want)
	}
}

func contractExecuteNew(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c := newClaim("t1", "create_order", "fp-1")
	d := e.exec(c, e.ap.succeed(ResultOrder))
	wantKind(t, d, ledger.DecisionExecuted)
	e.wantCalls(1)
	rec := d.Record
	wantState(t, rec, ledger.StateSucceeded)
	if string(rec.Result) != ResultOrder {
		t.Errorf("Result = %s, want %s", rec.Result, ResultOrder)
	}
	if rec.Tenant != "t1" || rec.Key != c.Key || rec.Tool != c.Tool || rec.Fingerprint != c.Fingerprint || rec.Principal != c.Actor.Principal {
		t.Errorf("record identity = %s/%s %s %s %s, want t1/%s %s %s %s", rec.Tenant, rec.Key, rec.Tool, rec.Fingerprint, rec.Principal, c.Key, c.Tool, c.Fingerprint, c.Actor.Principal)
	}
	if rec.Attempts != 1 || rec.Generation != 1 {
		t.Errorf("Attempts, Generation = %d, %d; want 1, 1", rec.Attempts, rec.Generation)
	}
	if rec.ResultFormat != ledger.ResultFormat {
		t.Errorf("ResultFormat = %d, want %d", rec.ResultFormat, ledger.ResultFormat)
	}
	if rec.LeaseOwner != "" || !rec.LeaseExpires.IsZero() {
		t.Errorf("finished record still has a lease: owner %q until %v", rec.LeaseOwner, rec.LeaseExpires)
	}
	if !rec.FirstSeenAt.Equal(epoch) || !rec.CompletedAt.Equal(epoch) || !rec.UpdatedAt.Equal(epoch) {
		t.Errorf("timestamps first/updated/completed = %v/%v/%v, want all %v", rec.FirstSeenAt, rec.UpdatedAt, rec.CompletedAt, epoch)
	}
	if rec.Summary != "effect "+c.Key {
		t.Errorf("Summary = %q, want %q", rec.Summary, "effect "+c.Key)
	}
	if got := effects(t, e.s); len(got) != 1 {
		t.Errorf("effects = %v, want exactly one", got)
	}

	got := mustGet(t, e.s, "t1", c.Key)
	wantState(t, got, ledger.StateSucceeded)
	if !bytes.Equal(got.Result, rec.Result) || got.Attempts != 1 || got.Generation != 1 || got.Tombstone {
		t.Errorf("Get = %s, want the executed record %s", recordJSON(t, got), recordJSON(t, rec))
	}
}

func contractReplay(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c := newClaim("t1", "create_order", "fp-1")
	first := e.exec(c, e.ap.succeed(ResultOrder))
	wantKind(t, first, ledger.DecisionExecuted)

	for i, advance := range []time.Duration{0, time.Second, e.opts.Retention - time.Nanosecond - time.Second} {
		e.clock.Advance(advance)
		t.Run(fmt.Sprintf("replay%d", i+1), func(t *testing.T) {
			d := e.exec(c, e.ap.succeed(`{"order":{"order_id":"ord_SECOND"}}`))
			wantKind(t, d, ledger.DecisionReplay)
			e.wantCalls(1)
			wantState(t, d.Record, ledger.StateSucceeded)
			if !bytes.Equal(d.Record.Result, first.Record.Result) {
				t.Errorf("replayed Result = %s, want %s", d.Record.Result, first.Record.Result)
			}
			if d.Record.Attempts != 1 || d.Record.Tombstone {
				t.Errorf("replayed record Attempts=%d Tombstone=%v, want 1, false", d.Record.Attempts, d.Record.Tombstone)
			}
			// Claim replays too, and never starts anything.
			d = e.claim(c)
			wantKind(t, d, ledger.DecisionReplay)
		})
	}
	if got := effects(t, e.s); len(got) != 1 {
		t.Errorf("effects = %v, want exactly one", got)
	}
}

// contractReplayByteIdentical checks that what a replay returns is the very
// bytes the execution returned, whatever valid JSON the downstream produced.
func contractReplayByteIdentical(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	results := []struct{ name, json string }{
		{"compact", `{"a":1,"b":[true,null,"x"]}`},
		{"number_forms", `{"n":1.0,"m":1e3,"z":-0}`},
		{"unicode", `{"name":"Zoë Ünïcödé ☃","esc":"a\nb"}`},
		{"whitespace", "{\n  \"order\": {\"order_id\": \"ord_1\"}\n}"},
		{"html_characters", `{"note":"1 < 2 && 3 > 2"}`},
	}
	for _, r := range results {
		t.Run(r.name, func(t *testing.T) {
			e := newEnv(t, open, nil)
			c := newClaim("t1", "create_order", "fp-"+r.name)
			first := e.exec(c, e.ap.succeed(r.json))
			wantKind(t, first, ledger.DecisionExecuted)
			d := e.exec(c, e.ap.succeed(`{}`))
			wantKind(t, d, ledger.DecisionReplay)
			if !bytes.Equal(d.Record.Result, first.Record.Result) {
				t.Errorf("replayed Result is not byte-identical:\n executed %q\n replayed %q", first.Record.Result, d.Record.Result)
			}
			if got := mustGet(t, e.s, "t1", c.Key); !bytes.Equal(got.Result, first.Record.Result) {
				t.Errorf("Get Result is not byte-identical:\n executed %q\n got      %q", first.Record.Result, got.Result)
			}
		})
	}
}

// stateSetup brings a fresh key into one state and returns its claim.
type stateSetup struct {
	name  string
	state ledger.State // what Get shows afterwards
	tomb  bool
	setup func(e *env) ledger.Claim
}

func stateSetups() []stateSetup {
	return []stateSetup{
		{"succeeded", ledger.StateSucceeded, false, func(e *env) ledger.Claim {
			c := newClaim("t1", "create_order", "fp-1")
			wantKind(e.t, e.exec(c, e.ap.succeed(ResultOrder)), ledger.DecisionExecuted)
			return c
		}},
		{"failed", ledger.StateFailed, false, func(e *env) ledger.Claim {
			c := newClaim("t1", "create_order", "fp-1")
			wantKind(e.t, e.exec(c, e.ap.outcome(ledger.Outcome{State: ledger.StateFailed, Error: &ledger.OpError{Code: "downstream_error", Message: "no"}})), ledger.DecisionExecuted)
			return c
		}},
		{"in_progress", ledger.StateInProgress, false, func(e *env) ledger.Claim {
			c := newClaim("t1", "create_order", "fp-1")
			wantKind(e.t, e.claim(c), ledger.DecisionClaimed)
			return c
		}},
		{"retryable_lease_expired", ledger.StateRetryable, false, func(e *env) ledger.Claim {
			c := newClaim("t1", "create_order", "fp-1")
			wantKind(e.t, e.claim(c), ledger.DecisionClaimed)
			e.clock.Advance(e.opts.Lease)
			return c
		}},
		{"unknown", ledger.StateUnknown, false, func(e *env) ledger.Claim {
			c := newClaim("t1", "create_order", "fp-1")
			c.OnLeaseExpiry = ledger.StateUnknown
			wantKind(e.t, e.claim(c), ledger.DecisionClaimed)
			e.clock.Advance(e.opts.Lease + time.Second)
			wantKind(e.t, e.exec(c, e.ap.succeed(ResultOrder)), ledger.DecisionHeld) // records the transition
			return c
		}},
		{"awaiting_approval", ledger.StateAwaitingApproval, false, func(e *env) ledger.Claim {
			first := newClaim("t1", "create_order", "fp-1")
			wantKind(e.t, e.exec(first, e.ap.succeed(ResultOrder)), ledger.DecisionExecuted)
			e.ap.calls.Store(0)
			c := newClaim("t1", "create_order", "fp-1")
			c.SuspectDuplicates = true
			wantKind(e.t, e.exec(c, e.ap.succeed(ResultOrder)), ledger.DecisionSuspectedDuplicate)
			return c
		}},
		{"rejected", ledger.StateRejected, false, func(e *env) ledger.Claim {
			first := newClaim("t1", "create_order", "fp-1")
			wantKind(e.t, e.exec(first, e.ap.succeed(ResultOrder)), ledger.DecisionExecuted)
			e.ap.calls.Store(0)
			c := newClaim("t1", "create_order", "fp-1")
			c.SuspectDuplicates = true
			wantKind(e.t, e.exec(c, e.ap.succeed(ResultOrder)), ledger.DecisionSuspectedDuplicate)
			e.clock.Advance(e.opts.ApprovalTTL)
			wantKind(e.t, e.exec(c, e.ap.succeed(ResultOrder)), ledger.DecisionReplay) // records the rejection
			return c
		}},
		{"tombstone", ledger.StateSucceeded, true, func(e *env) ledger.Claim {
			c := newClaim("t1", "create_order", "fp-1")
			wantKind(e.t, e.exec(c, e.ap.succeed(ResultOrder)), ledger.DecisionExecuted)
			e.clock.Advance(e.opts.Retention)
			return c
		}},
		{"tombstone_swept", ledger.StateSucceeded, true, func(e *env) ledger.Claim {
			c := newClaim("t1", "create_order", "fp-1")
			wantKind(e.t, e.exec(c, e.ap.succeed(ResultOrder)), ledger.DecisionExecuted)
			e.clock.Advance(e.opts.Retention)
			if n, _, err := e.s.Sweep(e.ctx); err != nil || n != 1 {
				e.t.Fatalf("Sweep = %d compacted, %v; want 1, nil", n, err)
			}
			return c
		}},
	}
}

func contractMismatchEveryState(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	for _, st := range stateSetups() {
		t.Run(st.name, func(t *testing.T) {
			variants := []struct {
				name   string
				change func(c *ledger.Claim)
			}{
				{"other_fingerprint", func(c *ledger.Claim) { c.Fingerprint += "-changed" }},
				{"other_tool_same_fingerprint", func(c *ledger.Claim) { c.Tool = "cancel_order" }},
			}
			for _, v := range variants {
				t.Run(v.name, func(t *testing.T) {
					e := newEnv(t, open, nil)
					c := st.setup(e)
					before := mustGet(t, e.s, "t1", c.Key)
					wantState(t, before, st.state)
					if before.Tombstone != st.tomb {
						t.Fatalf("setup: Tombstone = %v, want %v", before.Tombstone, st.tomb)
					}
					calls := e.ap.n()

					other := c
					v.change(&other)
					d := e.exec(other, e.ap.succeed(`{"other":true}`))
					wantKind(t, d, ledger.DecisionMismatch)
					if d.Record == nil || d.Record.Fingerprint != c.Fingerprint || d.Record.Tool != c.Tool {
						t.Errorf("mismatch decision should carry the existing record (tool %s, fingerprint %s), got %+v", c.Tool, c.Fingerprint, d.Record)
					}
					wantKind(t, e.claim(other), ledger.DecisionMismatch)
					e.wantCalls(calls)

					after := mustGet(t, e.s, "t1", c.Key)
					if a, b := recordJSON(t, after), recordJSON(t, before); a != b {
						t.Errorf("a mismatch changed the record:\n before %s\n after  %s", b, a)
					}
				})
			}
		})
	}
}

func contractApplyError(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c := newClaim("t1", "create_order", "fp-1")
	d, err := e.s.Execute(e.ctx, c, e.ap.fail(errBoom))
	if !errors.Is(err, errBoom) {
		t.Fatalf("Execute with a failing apply: err = %v, want %v", err, errBoom)
	}
	if d.Kind != "" {
		t.Errorf("decision of a failed apply = %q, want none", d.Kind)
	}
	if _, err := e.s.Get(e.ctx, "t1", c.Key); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("Get after a failed apply: err = %v, want ErrNotFound", err)
	}
	if got := effects(t, e.s); len(got) != 0 {
		t.Fatalf("the failed apply's Put survived: %v", got)
	}
	if recs, err := e.s.List(e.ctx, ledger.Filter{Tenant: "t1"}); err != nil || len(recs) != 0 {
		t.Fatalf("List after a failed apply = %d records, %v; want none", len(recs), err)
	}

	// The caller fixes the arguments and reuses the key; even another
	// fingerprint is fine, since nothing was recorded.
	c.Fingerprint = "fp-fixed"
	d = e.exec(c, e.ap.succeed(ResultOrder))
	wantKind(t, d, ledger.DecisionExecuted)
	if d.Record.Attempts != 1 || d.Record.Generation != 1 {
		t.Errorf("re-used key: Attempts, Generation = %d, %d; want 1, 1", d.Record.Attempts, d.Record.Generation)
	}
	if got := effects(t, e.s); len(got) != 1 {
		t.Errorf("effects = %v, want exactly one", got)
	}
}

// contractInvalidResult: a result that is not JSON cannot be saved; the
// claim fails as a whole, like an apply error, and nothing is recorded.
func contractInvalidResult(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	for _, bad := range []string{"{not json", "[1,2", `{"a":}`} {
		t.Run(fmt.Sprintf("%q", bad), func(t *testing.T) {
			e := newEnv(t, open, nil)
			c := newClaim("t1", "create_order", "fp-1")
			_, err := e.s.Execute(e.ctx, c, e.ap.outcome(ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(bad)}))
			if err == nil {
				t.Fatalf("Execute with result %q succeeded", bad)
			}
			if _, err := e.s.Get(e.ctx, "t1", c.Key); !errors.Is(err, ledger.ErrNotFound) {
				t.Errorf("Get: err = %v, want ErrNotFound", err)
			}
			if got := effects(t, e.s); len(got) != 0 {
				t.Errorf("effects = %v, want none", got)
			}
		})
	}
}

func contractFailedOutcome(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c := newClaim("t1", "create_order", "fp-1")
	out := ledger.Outcome{State: ledger.StateFailed, Error: &ledger.OpError{Code: "downstream_error", Message: "card declined", Details: json.RawMessage(`{"reason":"declined"}`)}, Summary: "declined"}
	d := e.exec(c, e.ap.outcome(out))
	wantKind(t, d, ledger.DecisionExecuted)
	wantState(t, d.Record, ledger.StateFailed)
	if d.Record.CompletedAt.IsZero() {
		t.Error("a failed record has no CompletedAt")
	}

	for _, name := range []string{"Execute", "Claim"} {
		t.Run(name, func(t *testing.T) {
			var got ledger.Decision
			if name == "Execute" {
				got = e.exec(c, e.ap.succeed(ResultOrder))
			} else {
				got = e.claim(c)
			}
			wantKind(t, got, ledger.DecisionReplay)
			wantState(t, got.Record, ledger.StateFailed)
			if got.Record.Error == nil || got.Record.Error.Code != "downstream_error" || got.Record.Error.Message != "card declined" || string(got.Record.Error.Details) != `{"reason":"declined"}` {
				t.Errorf("replayed Error = %+v, want the saved one", got.Record.Error)
			}
			if got.Record.Summary != "declined" {
				t.Errorf("Summary = %q, want declined", got.Record.Summary)
			}
			e.wantCalls(1)
		})
	}
}

func contractClaimBusyComplete(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c := newClaim("t1", "send_notification", "fp-1")
	d := e.claim(c)
	wantKind(t, d, ledger.DecisionClaimed)
	wantState(t, d.Record, ledger.StateInProgress)
	gen := d.Record.Generation
	if gen != 1 || d.Record.Attempts != 1 {
		t.Fatalf("claim: Generation, Attempts = %d, %d; want 1, 1", gen, d.Record.Attempts)
	}
	if want := epoch.Add(e.opts.Lease); !d.Record.LeaseExpires.Equal(want) {
		t.Errorf("LeaseExpires = %v, want %v", d.Record.LeaseExpires, want)
	}

	e.clock.Advance(e.opts.Lease - time.Nanosecond)
	for _, name := range []string{"Claim", "Execute"} {
		t.Run("duplicate_"+name, func(t *testing.T) {
			var dup ledger.Decision
			if name == "Claim" {
				dup = e.claim(c)
			} else {
				dup = e.exec(c, e.ap.succeed(ResultOrder))
			}
			wantKind(t, dup, ledger.DecisionBusy)
			wantState(t, dup.Record, ledger.StateInProgress)
			e.wantCalls(0)
		})
	}

	rec, err := e.s.Complete(e.ctx, c.Actor, c.Key, gen, ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{"message_id":"m1"}`), DownstreamRef: "m1", Summary: "message m1"})
	if err != nil {
		t.Fatalf("Complete: %v", err)
	}
	wantState(t, rec, ledger.StateSucceeded)
	if rec.DownstreamRef != "m1" || string(rec.Result) != `{"message_id":"m1"}` || rec.CompletedAt.IsZero() || rec.LeaseOwner != "" {
		t.Errorf("completed record = %s", recordJSON(t, rec))
	}

	d = e.exec(c, e.ap.succeed(ResultOrder))
	wantKind(t, d, ledger.DecisionReplay)
	if string(d.Record.Result) != `{"message_id":"m1"}` {
		t.Errorf("replay after Complete: Result = %s", d.Record.Result)
	}
	e.wantCalls(0)

	// Completing twice is refused: the record is no longer in progress.
	if _, err := e.s.Complete(e.ctx, c.Actor, c.Key, gen, ledger.Outcome{State: ledger.StateFailed}); !errors.Is(err, ledger.ErrStaleGeneration) {
		t.Errorf("second Complete: err = %v, want ErrStaleGeneration", err)
	}
	wantState(t, mustGet(t, e.s, "t1", c.Key), ledger.StateSucceeded)

	if _, err := e.s.Complete(e.ctx, c.Actor, "no-such-key", 1, ledger.Outcome{State: ledger.StateSucceeded}); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("Complete of an unknown key: err = %v, want ErrNotFound", err)
	}
}

func contractCompleteStale(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c := newClaim("t1", "send_notification", "fp-1")
	d := e.claim(c)
	wantKind(t, d, ledger.DecisionClaimed)
	before := recordJSON(t, mustGet(t, e.s, "t1", c.Key))

	for _, gen := range []uint64{0, d.Record.Generation + 1, d.Record.Generation + 100} {
		t.Run(fmt.Sprintf("gen%d", gen), func(t *testing.T) {
			rec, err := e.s.Complete(e.ctx, c.Actor, c.Key, gen, ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{"x":1}`)})
			if !errors.Is(err, ledger.ErrStaleGeneration) {
				t.Fatalf("Complete(gen %d): err = %v, want ErrStaleGeneration", gen, err)
			}
			if rec != nil {
				t.Errorf("Complete(gen %d) returned a record with its error", gen)
			}
			if after := recordJSON(t, mustGet(t, e.s, "t1", c.Key)); after != before {
				t.Errorf("a refused Complete changed the record:\n before %s\n after  %s", before, after)
			}
		})
	}
}

func contractCompleteUnfinished(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	t.Run("retryable_runs_again", func(t *testing.T) {
		e := newEnv(t, open, nil)
		c := newClaim("t1", "create_order", "fp-1")
		d := e.claim(c)
		if _, err := e.s.Complete(e.ctx, c.Actor, c.Key, d.Record.Generation, ledger.Outcome{State: ledger.StateRetryable, Error: &ledger.OpError{Code: "downstream_error", Message: "connection refused"}}); err != nil {
			t.Fatalf("Complete(retryable): %v", err)
		}
		wantState(t, mustGet(t, e.s, "t1", c.Key), ledger.StateRetryable)
		d = e.exec(c, e.ap.succeed(ResultOrder))
		wantKind(t, d, ledger.DecisionExecuted)
		if d.Record.Attempts != 2 || d.Record.Generation != 2 {
			t.Errorf("re-run: Attempts, Generation = %d, %d; want 2, 2", d.Record.Attempts, d.Record.Generation)
		}
		if d.Record.Error != nil {
			t.Errorf("re-run kept the old error %+v", d.Record.Error)
		}
		e.wantCalls(1)
	})
	t.Run("unknown_is_held", func(t *testing.T) {
		e := newEnv(t, open, nil)
		c := newClaim("t1", "create_order", "fp-1")
		d := e.claim(c)
		if _, err := e.s.Complete(e.ctx, c.Actor, c.Key, d.Record.Generation, ledger.Outcome{State: ledger.StateUnknown, Error: &ledger.OpError{Code: "outcome_unknown"}}); err != nil {
			t.Fatalf("Complete(unknown): %v", err)
		}
		d = e.exec(c, e.ap.succeed(ResultOrder))
		wantKind(t, d, ledger.DecisionHeld)
		wantState(t, d.Record, ledger.StateUnknown)
		e.wantCalls(0)
	})
}

func contractLeaseExpiryRetryable(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	rerun := []struct {
		name string
		run  func(e *env, c ledger.Claim) ledger.Decision
		want ledger.DecisionKind
	}{
		{"Execute", func(e *env, c ledger.Claim) ledger.Decision { return e.exec(c, e.ap.succeed(ResultOrder)) }, ledger.DecisionExecuted},
		{"Claim", func(e *env, c ledger.Claim) ledger.Decision { return e.claim(c) }, ledger.DecisionClaimed},
	}
	for _, r := range rerun {
		t.Run(r.name, func(t *testing.T) {
			e := newEnv(t, open, nil)
			c := newClaim("t1", "create_order", "fp-1")
			c.OnLeaseExpiry = ledger.StateRetryable
			old := e.claim(c)
			wantKind(t, old, ledger.DecisionClaimed)

			e.clock.Advance(e.opts.Lease)
			got := mustGet(t, e.s, "t1", c.Key)
			wantState(t, got, ledger.StateRetryable) // shown as it will be recorded

			d := r.run(e, c)
			wantKind(t, d, r.want)
			if d.Record.Attempts != 2 || d.Record.Generation != 2 {
				t.Fatalf("re-run: Attempts, Generation = %d, %d; want 2, 2", d.Record.Attempts, d.Record.Generation)
			}
			if r.want == ledger.DecisionExecuted {
				e.wantCalls(1)
			}

			// Fencing: the old owner comes back and is refused.
			before := recordJSON(t, mustGet(t, e.s, "t1", c.Key))
			if _, err := e.s.Complete(e.ctx, c.Actor, c.Key, old.Record.Generation, ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{"stale":true}`)}); !errors.Is(err, ledger.ErrStaleGeneration) {
				t.Fatalf("old owner's Complete: err = %v, want ErrStaleGeneration", err)
			}
			if err := e.s.RenewLease(e.ctx, "t1", c.Key, old.Record.Generation); !errors.Is(err, ledger.ErrStaleGeneration) {
				t.Errorf("old owner's RenewLease: err = %v, want ErrStaleGeneration", err)
			}
			if after := recordJSON(t, mustGet(t, e.s, "t1", c.Key)); after != before {
				t.Errorf("stale Complete changed the record:\n before %s\n after  %s", before, after)
			}
			if r.want == ledger.DecisionClaimed {
				rec, err := e.s.Complete(e.ctx, c.Actor, c.Key, d.Record.Generation, ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{"new":true}`)})
				if err != nil {
					t.Fatalf("new owner's Complete: %v", err)
				}
				wantState(t, rec, ledger.StateSucceeded)
			}
		})
	}

	t.Run("failed_rerun_rolls_back", func(t *testing.T) {
		e := newEnv(t, open, nil)
		c := newClaim("t1", "create_order", "fp-1")
		old := e.claim(c)
		e.clock.Advance(e.opts.Lease)
		if _, err := e.s.Execute(e.ctx, c, e.ap.fail(errBoom)); !errors.Is(err, errBoom) {
			t.Fatalf("re-run with a failing apply: err = %v, want errBoom", err)
		}
		got := mustGet(t, e.s, "t1", c.Key)
		wantState(t, got, ledger.StateRetryable)
		if got.Attempts != 1 || got.Generation != old.Record.Generation {
			t.Errorf("after a rolled-back re-run: Attempts, Generation = %d, %d; want 1, %d", got.Attempts, got.Generation, old.Record.Generation)
		}
		d := e.exec(c, e.ap.succeed(ResultOrder))
		wantKind(t, d, ledger.DecisionExecuted)
		if d.Record.Attempts != 2 {
			t.Errorf("Attempts = %d, want 2", d.Record.Attempts)
		}
		if got := effects(t, e.s); len(got) != 1 {
			t.Errorf("effects = %v, want exactly one", got)
		}
	})
}

func contractLeaseExpiryUnknown(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	for _, onExpiry := range []ledger.State{ledger.StateUnknown, ""} {
		name := string(onExpiry)
		if name == "" {
			name = "unset_defaults_to_unknown"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, open, nil)
			c := newClaim("t1", "create_order", "fp-1")
			c.OnLeaseExpiry = onExpiry
			old := e.claim(c)
			e.clock.Advance(e.opts.Lease + time.Minute)
			wantState(t, mustGet(t, e.s, "t1", c.Key), ledger.StateUnknown)

			for i := range 2 {
				d := e.exec(c, e.ap.succeed(ResultOrder))
				wantKind(t, d, ledger.DecisionHeld)
				wantState(t, d.Record, ledger.StateUnknown)
				if d.Record.Attempts != 1 || d.Record.Generation != old.Record.Generation {
					t.Errorf("call %d: Attempts, Generation = %d, %d; want 1, %d", i, d.Record.Attempts, d.Record.Generation, old.Record.Generation)
				}
				wantKind(t, e.claim(c), ledger.DecisionHeld)
			}
			e.wantCalls(0)
			if got := effects(t, e.s); len(got) != 0 {
				t.Errorf("effects = %v, want none", got)
			}
			got := mustGet(t, e.s, "t1", c.Key)
			wantState(t, got, ledger.StateUnknown)
			if got.LeaseOwner != "" {
				t.Errorf("unknown record keeps lease owner %q", got.LeaseOwner)
			}
		})
	}
}

func contractRenewLease(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c := newClaim("t1", "send_notification", "fp-1")
	d := e.claim(c)
	gen := d.Record.Generation

	e.clock.Advance(e.opts.Lease - time.Second)
	if err := e.s.RenewLease(e.ctx, "t1", c.Key, gen); err != nil {
		t.Fatalf("RenewLease: %v", err)
	}
	if got, want := mustGet(t, e.s, "t1", c.Key).LeaseExpires, e.clock.Now().Add(e.opts.Lease); !got.Equal(want) {
		t.Errorf("LeaseExpires after renewal = %v, want %v", got, want)
	}
	e.clock.Advance(2 * time.Second) // past the first lease, inside the renewed one
	wantKind(t, e.claim(c), ledger.DecisionBusy)
	wantState(t, mustGet(t, e.s, "t1", c.Key), ledger.StateInProgress)

	errCases := []struct {
		name   string
		tenant string
		key    string
		gen    uint64
		want   error
	}{
		{"wrong_generation", "t1", c.Key, gen + 1, ledger.ErrStaleGeneration},
		{"unknown_key", "t1", "no-such-key", gen, ledger.ErrNotFound},
		{"other_tenant", "t2", c.Key, gen, ledger.ErrNotFound},
	}
	for _, tc := range errCases {
		t.Run(tc.name, func(t *testing.T) {
			if err := e.s.RenewLease(e.ctx, tc.tenant, tc.key, tc.gen); !errors.Is(err, tc.want) {
				t.Errorf("RenewLease: err = %v, want %v", err, tc.want)
			}
		})
	}

	t.Run("after_expiry", func(t *testing.T) {
		e := newEnv(t, open, nil)
		c := newClaim("t1", "send_notification", "fp-1")
		d := e.claim(c)
		e.clock.Advance(e.opts.Lease)
		if err := e.s.RenewLease(e.ctx, "t1", c.Key, d.Record.Generation); !errors.Is(err, ledger.ErrStaleGeneration) {
			t.Errorf("RenewLease of an expired lease: err = %v, want ErrStaleGeneration", err)
		}
	})
	t.Run("after_complete", func(t *testing.T) {
		e := newEnv(t, open, nil)
		c := newClaim("t1", "send_notification", "fp-1")
		d := e.claim(c)
		if _, err := e.s.Complete(e.ctx, c.Actor, c.Key, d.Record.Generation, ledger.Outcome{State: ledger.StateSucceeded}); err != nil {
			t.Fatal(err)
		}
		if err := e.s.RenewLease(e.ctx, "t1", c.Key, d.Record.Generation); !errors.Is(err, ledger.ErrStaleGeneration) {
			t.Errorf("RenewLease of a completed record: err = %v, want ErrStaleGeneration", err)
		}
	})
}

func contractRetention(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c := newClaim("t1", "create_order", "fp-1")
	first := e.exec(c, e.ap.outcome(ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(ResultOrder), Summary: "order ord_1", DownstreamRef: "ord_1"}))
	wantKind(t, first, ledger.DecisionExecuted)

	e.clock.Advance(e.opts.Retention - time.Nanosecond)
	wantKind(t, e.exec(c, e.ap.succeed(ResultOrder)), ledger.DecisionReplay)
	if n, d, err := e.s.Sweep(e.ctx); err != nil || n != 0 || d != 0 {
		t.Fatalf("Sweep before retention = %d, %d, %v; want 0, 0, nil", n, d, err)
	}

	e.clock.Advance(time.Nanosecond)
	checkTomb := func(t *testing.T, rec *ledger.Record) {
		t.Helper()
		if !rec.Tombstone {
			t.Fatalf("record is not a tombstone: %s", recordJSON(t, rec))
		}
		if rec.Result != nil {
			t.Errorf("tombstone keeps the result %s", rec.Result)
		}
		if rec.Fingerprint != c.Fingerprint || rec.Tool != c.Tool || rec.Key != c.Key || rec.State != ledger.StateSucceeded {
			t.Errorf("tombstone lost its identity: %s", recordJSON(t, rec))
		}
		if rec.Summary != "order ord_1" {
			t.Errorf("tombstone Summary = %q, want %q", rec.Summary, "order ord_1")
		}
	}
	d := e.exec(c, e.ap.succeed(ResultOrder))
	wantKind(t, d, ledger.DecisionExpired)
	checkTomb(t, d.Record)
	checkTomb(t, mustGet(t, e.s, "t1", c.Key))
	wantKind(t, e.claim(c), ledger.DecisionExpired)
	e.wantCalls(1)

	compacted, deleted, err := e.s.Sweep(e.ctx)
	if err != nil || compacted != 1 || deleted != 0 {
		t.Fatalf("Sweep at retention = %d compacted, %d deleted, %v; want 1, 0, nil", compacted, deleted, err)
	}
	checkTomb(t, mustGet(t, e.s, "t1", c.Key))
	wantKind(t, e.exec(c, e.ap.succeed(ResultOrder)), ledger.DecisionExpired)
	if n, d, err := e.s.Sweep(e.ctx); err != nil || n != 0 || d != 0 {
		t.Fatalf("second Sweep = %d, %d, %v; want 0, 0, nil", n, d, err)
	}

	e.clock.Advance(e.opts.TombstoneRetention - time.Nanosecond)
	if n, d, err := e.s.Sweep(e.ctx); err != nil || n != 0 || d != 0 {
		t.Fatalf("Sweep just before tombstone retention = %d, %d, %v; want 0, 0, nil", n, d, err)
	}
	e.clock.Advance(time.Nanosecond)
	compacted, deleted, err = e.s.Sweep(e.ctx)
	if err != nil || compacted != 0 || deleted != 1 {
		t.Fatalf("Sweep at tombstone retention = %d compacted, %d deleted, %v; want 0, 1, nil", compacted, deleted, err)
	}
	if _, err := e.s.Get(e.ctx, "t1", c.Key); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("Get after the tombstone is gone: err = %v, want ErrNotFound", err)
	}
	if recs, err := e.s.List(e.ctx, ledger.Filter{}); err != nil || len(recs) != 0 {
		t.Errorf("List after deletion = %d records, %v; want none", len(recs), err)
	}
	// The key is free again (idempotency is bounded by the two windows).
	d = e.exec(c, e.ap.succeed(ResultOrder))
	wantKind(t, d, ledger.DecisionExecuted)
	if d.Record.Attempts != 1 {
		t.Errorf("fresh run after deletion: Attempts = %d, want 1", d.Record.Attempts)
	}

	t.Run("failed_keeps_error_code", func(t *testing.T) {
		e := newEnv(t, open, nil)
		c := newClaim("t1", "create_order", "fp-1")
		e.exec(c, e.ap.outcome(ledger.Outcome{State: ledger.StateFailed, Error: &ledger.OpError{Code: "downstream_error", Message: "long message"}}))
		e.clock.Advance(e.opts.Retention)
		d := e.exec(c, e.ap.succeed(ResultOrder))
		wantKind(t, d, ledger.DecisionExpired)
		wantState(t, d.Record, ledger.StateFailed)
		if d.Record.Error == nil || d.Record.Error.Code != "downstream_error" || d.Record.Error.Message != "" {
			t.Errorf("tombstone Error = %+v, want only the code", d.Record.Error)
		}
	})

	t.Run("one_late_sweep_does_both", func(t *testing.T) {
		e := newEnv(t, open, nil)
		c := newClaim("t1", "create_order", "fp-1")
		e.exec(c, e.ap.succeed(ResultOrder))
		e.clock.Advance(e.opts.Retention + e.opts.TombstoneRetention)
		compacted, deleted, err := e.s.Sweep(e.ctx)
		if err != nil || compacted != 1 || deleted != 1 {
			t.Fatalf("late Sweep = %d, %d, %v; want 1, 1, nil", compacted, deleted, err)
		}
		if _, err := e.s.Get(e.ctx, "t1", c.Key); !errors.Is(err, ledger.ErrNotFound) {
			t.Fatalf("Get: err = %v, want ErrNotFound", err)
		}
	})

	t.Run("unfinished_records_are_kept", func(t *testing.T) {
		e := newEnv(t, open, nil)
		c := newClaim("t1", "create_order", "fp-1")
		c.OnLeaseExpiry = ledger.StateUnknown
		e.claim(c)
		e.clock.Advance(e.opts.Retention + e.opts.TombstoneRetention)
		if n, d, err := e.s.Sweep(e.ctx); err != nil || n != 0 || d != 0 {
			t.Fatalf("Sweep = %d, %d, %v; want 0, 0, nil", n, d, err)
		}
		wantState(t, mustGet(t, e.s, "t1", c.Key), ledger.StateUnknown)
	})
}

func contractTenants(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	a := newClaim("tenant-a", "create_order", "fp-a")
	b := a
	b.Actor = testActor("tenant-b")
	b.Fingerprint = "fp-b" // same key, another request: not a mismatch across tenants

	da := e.exec(a, e.ap.succeed(`{"tenant":"a"}`))
	db := e.exec(b, e.ap.succeed(`{"tenant":"b"}`))
	wantKind(t, da, ledger.DecisionExecuted)
	wantKind(t, db, ledger.DecisionExecuted)
	e.wantCalls(2)
	if got := effects(t, e.s); len(got) != 2 {
		t.Errorf("effects = %v, want two", got)
	}

	for _, tc := range []struct{ tenant, result, principal string }{
		{"tenant-a", `{"tenant":"a"}`, a.Actor.Principal},
		{"tenant-b", `{"tenant":"b"}`, b.Actor.Principal},
	} {
		t.Run(tc.tenant, func(t *testing.T) {
			rec := mustGet(t, e.s, tc.tenant, a.Key)
			if string(rec.Result) != tc.result || rec.Tenant != tc.tenant || rec.Principal != tc.principal {
				t.Errorf("Get(%s) = %s", tc.tenant, recordJSON(t, rec))
			}
			recs, err := e.s.List(e.ctx, ledger.Filter{Tenant: tc.tenant})
			if err != nil || len(recs) != 1 || recs[0].Tenant != tc.tenant {
				t.Errorf("List(%s) = %d records, %v; want its own one", tc.tenant, len(recs), err)
			}
		})
	}
	if _, err := e.s.Get(e.ctx, "tenant-c", a.Key); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("Get from a third tenant: err = %v, want ErrNotFound", err)
	}

	// Operations in one tenant cannot be completed or renewed from another.
	cl := newClaim("tenant-a", "send_notification", "fp-n")
	d := e.claim(cl)
	other := testActor("tenant-b")
	if _, err := e.s.Complete(e.ctx, other, cl.Key, d.Record.Generation, ledger.Outcome{State: ledger.StateSucceeded}); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("Complete from another tenant: err = %v, want ErrNotFound", err)
	}
	if err := e.s.RenewLease(e.ctx, "tenant-b", cl.Key, d.Record.Generation); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("RenewLease from another tenant: err = %v, want ErrNotFound", err)
	}
	wantState(t, mustGet(t, e.s, "tenant-a", cl.Key), ledger.StateInProgress)

	// A replay in one tenant stays in that tenant.
	wantKind(t, e.exec(a, e.ap.succeed(`{}`)), ledger.DecisionReplay)
	wantKind(t, e.exec(b, e.ap.succeed(`{}`)), ledger.DecisionReplay)
	e.wantCalls(2)
}

func contractSuspectedDuplicate(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	setup := func(t *testing.T) (*env, ledger.Claim) {
		e := newEnv(t, open, nil)
		first := newClaim("t1", "create_order", "fp-same")
		first.SuspectDuplicates = true
		wantKind(t, e.exec(first, e.ap.succeed(ResultOrder)), ledger.DecisionExecuted)
		return e, first
	}

	t.Run("held_within_window", func(t *testing.T) {
		e, first := setup(t)
		e.clock.Advance(e.opts.SuspectWindow - time.Second)
		second := newClaim("t1", "create_order", "fp-same")
		second.SuspectDuplicates = true
		d := e.exec(second, e.ap.succeed(`{"order":{"order_id":"ord_2"}}`))
		wantKind(t, d, ledger.DecisionSuspectedDuplicate)
		e.wantCalls(1)
		wantState(t, d.Record, ledger.StateAwaitingApproval)
		if d.Earlier == nil || d.Earlier.Key != first.Key {
			t.Fatalf("Earlier = %+v, want the record of %s", d.Earlier, first.Key)
		}
		if string(d.Earlier.Result) != ResultOrder || d.Earlier.State != ledger.StateSucceeded {
			t.Errorf("Earlier should carry the earlier result: %s", recordJSON(t, d.Earlier))
		}
		ap := d.Record.Approval
		if ap == nil || ap.ID == "" || ap.Status != "pending" || ap.EarlierKey != first.Key || ap.Reason != "suspected_duplicate" {
			t.Fatalf("Approval = %+v", ap)
		}
		if want := e.clock.Now().Add(e.opts.ApprovalTTL); !ap.ExpiresAt.Equal(want) {
			t.Errorf("Approval.ExpiresAt = %v, want %v", ap.ExpiresAt, want)
		}
		if got := effects(t, e.s); len(got) != 1 {
			t.Errorf("effects = %v, want only the first", got)
		}

		// A third key, still inside the window, names the first one (the
		// operation that ran), not the held second one.
		third := newClaim("t1", "create_order", "fp-same")
		third.SuspectDuplicates = true
		d3 := e.exec(third, e.ap.succeed(`{}`))
		wantKind(t, d3, ledger.DecisionSuspectedDuplicate)
		if d3.Earlier == nil || d3.Earlier.Key != first.Key {
			t.Errorf("third key: Earlier = %+v, want %s", d3.Earlier, first.Key)
		}
		if d3.Record.Approval.ID == ap.ID {
			t.Error("two held keys share one approval id")
		}

		e.clock.Advance(time.Minute)
		for _, name := range []string{"Execute", "Claim"} {
			t.Run("retry_same_key_"+name, func(t *testing.T) {
				var r ledger.Decision
				if name == "Execute" {
					r = e.exec(second, e.ap.succeed(`{}`))
				} else {
					r = e.claim(second)
				}
				wantKind(t, r, ledger.DecisionHeld)
				wantState(t, r.Record, ledger.StateAwaitingApproval)
				if r.Record.Approval == nil || r.Record.Approval.ID != ap.ID {
					t.Errorf("retry got approval %+v, want ID %s", r.Record.Approval, ap.ID)
				}
				e.wantCalls(1)
			})
		}
		got := mustGet(t, e.s, "t1", second.Key)
		wantState(t, got, ledger.StateAwaitingApproval)
		if got.Approval == nil || got.Approval.ID != ap.ID {
			t.Errorf("Get approval = %+v, want ID %s", got.Approval, ap.ID)
		}

	})

	cases := []struct {
		name  string
		after time.Duration
		claim func(c *ledger.Claim)
	}{
		{"outside_window", 10 * time.Minute, func(c *ledger.Claim) {}},
		{"well_outside_window", 3 * time.Hour, func(c *ledger.Claim) {}},
		{"not_asked_to_suspect", time.Second, func(c *ledger.Claim) { c.SuspectDuplicates = false }},
		{"other_tenant", time.Second, func(c *ledger.Claim) { c.Actor = testActor("t2") }},
		{"other_fingerprint", time.Second, func(c *ledger.Claim) { c.Fingerprint = "fp-other" }},
	}
	for _, tc := range cases {
		t.Run("executes_"+tc.name, func(t *testing.T) {
			e, _ := setup(t)
			e.clock.Advance(tc.after)
			c := newClaim("t1", "create_order", "fp-same")
			c.SuspectDuplicates = true
			tc.claim(&c)
			d := e.exec(c, e.ap.succeed(`{"order":{"order_id":"ord_2"}}`))
			wantKind(t, d, ledger.DecisionExecuted)
			e.wantCalls(2)
		})
	}

	t.Run("first_key_retry_is_a_replay", func(t *testing.T) {
		e, first := setup(t)
		e.clock.Advance(time.Second)
		wantKind(t, e.exec(first, e.ap.succeed(`{}`)), ledger.DecisionReplay)
	})
}

func contractApprovalExpiry(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	first := newClaim("t1", "create_order", "fp-same")
	e.exec(first, e.ap.succeed(ResultOrder))
	second := newClaim("t1", "create_order", "fp-same")
	second.SuspectDuplicates = true
	held := e.exec(second, e.ap.succeed(`{}`))
	wantKind(t, held, ledger.DecisionSuspectedDuplicate)

	e.clock.Advance(e.opts.ApprovalTTL - time.Nanosecond)
	wantState(t, mustGet(t, e.s, "t1", second.Key), ledger.StateAwaitingApproval)
	wantKind(t, e.exec(second, e.ap.succeed(`{}`)), ledger.DecisionHeld)

	e.clock.Advance(time.Nanosecond)
	got := mustGet(t, e.s, "t1", second.Key)
	wantState(t, got, ledger.StateRejected)
	if got.Approval == nil || got.Approval.Status != "expired" || got.Approval.ID != held.Record.Approval.ID {
		t.Errorf("Approval after expiry = %+v, want status expired, id %s", got.Approval, held.Record.Approval.ID)
	}
	if got.Error == nil || !strings.Contains(got.Error.Message+got.Summary, "approval_expired") {
		t.Errorf("rejected record does not say approval_expired: error %+v summary %q", got.Error, got.Summary)
	}
	recs, err := e.s.List(e.ctx, ledger.Filter{Tenant: "t1", State: ledger.StateRejected})
	if err != nil || len(recs) != 1 || recs[0].Key != second.Key {
		t.Errorf("List(rejected) = %d records, %v; want %s", len(recs), err, second.Key)
	}

	d := e.exec(second, e.ap.succeed(`{}`))
	wantKind(t, d, ledger.DecisionReplay)
	wantState(t, d.Record, ledger.StateRejected)
	e.wantCalls(1)
	wantKind(t, e.exec(second, e.ap.succeed(`{}`)), ledger.DecisionReplay)
	e.wantCalls(1)
}

// contractExpiredApprovalRetention: a pending approval nobody decided
// becomes "rejected" at its expiry, and from then on it is a final record
// like any other, bounded by Retention and TombstoneRetention — also when
// nobody calls with its key again.
func contractExpiredApprovalRetention(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	first := newClaim("t1", "create_order", "fp-same")
	e.exec(first, e.ap.succeed(ResultOrder))
	second := newClaim("t1", "create_order", "fp-same")
	second.SuspectDuplicates = true
	wantKind(t, e.exec(second, e.ap.succeed(`{}`)), ledger.DecisionSuspectedDuplicate)
	expires := e.clock.Now().Add(e.opts.ApprovalTTL)

	e.clock.Advance(e.opts.ApprovalTTL + time.Minute)
	got := mustGet(t, e.s, "t1", second.Key)
	wantState(t, got, ledger.StateRejected)
	if !got.CompletedAt.Equal(expires) {
		t.Errorf("rejected at %v, want the approval's expiry %v (it must not move with the clock)", got.CompletedAt, expires)
	}

	e.clock.Advance(e.opts.Retention)
	if got := mustGet(t, e.s, "t1", second.Key); !got.Tombstone {
		t.Errorf("an approval that expired more than Retention ago is still shown in full: %s", recordJSON(t, got))
	}

	e.clock.Advance(e.opts.TombstoneRetention)
	if _, _, err := e.s.Sweep(e.ctx); err != nil {
		t.Fatal(err)
	}
	if rec, err := e.s.Get(e.ctx, "t1", second.Key); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("Sweep never removed the expired approval's record (unbounded retention): Get = %v, %v; want ErrNotFound", rec != nil, err)
	}
}

func contractRequireIssuedKeys(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, func(o *ledger.Options) { o.RequireIssuedKeys = true })
	unissued := newClaim("t1", "create_order", "fp-1")

	t.Run("unissued", func(t *testing.T) {
		if _, err := e.s.Execute(e.ctx, unissued, e.ap.succeed(ResultOrder)); !errors.Is(err, ledger.ErrKeyNotIssued) {
			t.Errorf("Execute: err = %v, want ErrKeyNotIssued", err)
		}
		if _, err := e.s.Claim(e.ctx, unissued); !errors.Is(err, ledger.ErrKeyNotIssued) {
			t.Errorf("Claim: err = %v, want ErrKeyNotIssued", err)
		}
		e.wantCalls(0)
		if _, err := e.s.Get(e.ctx, "t1", unissued.Key); !errors.Is(err, ledger.ErrNotFound) {
			t.Errorf("Get: err = %v, want ErrNotFound", err)
		}
	})

	issued := newClaim("t1", "create_order", "fp-2")
	if err := e.s.IssueKey(e.ctx, "t1", issued.Key); err != nil {
		t.Fatalf("IssueKey: %v", err)
	}
	t.Run("issued_in_other_tenant", func(t *testing.T) {
		c := issued
		c.Actor = testActor("t2")
		if _, err := e.s.Execute(e.ctx, c, e.ap.succeed(ResultOrder)); !errors.Is(err, ledger.ErrKeyNotIssued) {
			t.Errorf("Execute: err = %v, want ErrKeyNotIssued", err)
		}
	})
	t.Run("issued", func(t *testing.T) {
		wantKind(t, e.exec(issued, e.ap.succeed(ResultOrder)), ledger.DecisionExecuted)
		wantKind(t, e.exec(issued, e.ap.succeed(ResultOrder)), ledger.DecisionReplay)
		e.wantCalls(1)
	})
	t.Run("issued_key_expires_unused", func(t *testing.T) {
		e := newEnv(t, open, func(o *ledger.Options) { o.RequireIssuedKeys = true })
		c := newClaim("t1", "create_order", "fp-3")
		if err := e.s.IssueKey(e.ctx, "t1", c.Key); err != nil {
			t.Fatal(err)
		}
		e.clock.Advance(e.opts.Retention)
		if _, _, err := e.s.Sweep(e.ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := e.s.Execute(e.ctx, c, e.ap.succeed(ResultOrder)); !errors.Is(err, ledger.ErrKeyNotIssued) {
			t.Errorf("Execute of a key issued more than Retention ago: err = %v, want ErrKeyNotIssued", err)
		}
	})
}

func contractList(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	keys := map[string]string{} // name → key
	add := func(name, tenant string, run func(c ledger.Claim)) {
		c := newClaim(tenant, "create_order", "fp-"+name)
		keys[name] = c.Key
		run(c)
		e.clock.Advance(time.Second)
	}
	succeed := func(c ledger.Claim) { wantKind(t, e.exec(c, e.ap.succeed(ResultOrder)), ledger.DecisionExecuted) }
	add("a1", "a", succeed)
	add("b1", "b", succeed)
	add("a2", "a", func(c ledger.Claim) {
		e.exec(c, e.ap.outcome(ledger.Outcome{State: ledger.StateFailed, Error: &ledger.OpError{Code: "downstream_error"}}))
	})
	add("a3", "a", func(c ledger.Claim) { e.claim(c) })
	add("a4", "a", succeed)
	add("b2", "b", succeed)

	cases := []struct {
		name string
		f    ledger.Filter
		want []string
	}{
		{"all", ledger.Filter{}, []string{"b2", "a4", "a3", "a2", "b1", "a1"}},
		{"tenant", ledger.Filter{Tenant: "a"}, []string{"a4", "a3", "a2", "a1"}},
		{"tenant_other", ledger.Filter{Tenant: "b"}, []string{"b2", "b1"}},
		{"tenant_none", ledger.Filter{Tenant: "zz"}, nil},
		{"state", ledger.Filter{State: ledger.StateSucceeded}, []string{"b2", "a4", "b1", "a1"}},
		{"tenant_state", ledger.Filter{Tenant: "a", State: ledger.StateFailed}, []string{"a2"}},
		{"in_progress", ledger.Filter{Tenant: "a", State: ledger.StateInProgress}, []string{"a3"}},
		{"limit", ledger.Filter{Limit: 2}, []string{"b2", "a4"}},
		{"tenant_limit", ledger.Filter{Tenant: "a", Limit: 3}, []string{"a4", "a3", "a2"}},
		{"state_limit", ledger.Filter{State: ledger.StateSucceeded, Limit: 3}, []string{"b2", "a4", "b1"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			recs, err := e.s.List(e.ctx, tc.f)
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			var got []string
			for _, r := range recs {
				name := ""
				for n, k := range keys {
					if k == r.Key {
						name = n
					}
				}
				got = append(got, name)
				if tc.f.Tenant != "" && r.Tenant != tc.f.Tenant {
					t.Errorf("record of tenant %s in List(%s)", r.Tenant, tc.f.Tenant)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("List(%+v) = %v, want %v", tc.f, got, tc.want)
			}
		})
	}

	t.Run("default_limit_100", func(t *testing.T) {
		e := newEnv(t, open, nil)
		for range 105 {
			e.exec(newClaim("t1", "create_order", "fp"), e.ap.succeed(`{}`))
			e.clock.Advance(time.Millisecond)
		}
		recs, err := e.s.List(e.ctx, ledger.Filter{Tenant: "t1"})
		if err != nil || len(recs) != 100 {
			t.Errorf("List without a limit = %d records, %v; want 100", len(recs), err)
		}
		for i := 1; i < len(recs); i++ {
			if recs[i].FirstSeenAt.After(recs[i-1].FirstSeenAt) {
				t.Fatalf("List is not newest first at %d: %v after %v", i, recs[i].FirstSeenAt, recs[i-1].FirstSeenAt)
			}
		}
	})
}

func contractCollections(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	ctx := e.ctx
	err := e.s.Update(ctx, func(tx ledger.Tx) error {
		if !tx.Now().Equal(epoch) {
			t.Errorf("Tx.Now = %v, want the store clock %v", tx.Now(), epoch)
		}
		for _, k := range []string{"order/2", "order/1", "order/3", "orders/9", "other/1", "ord"} {
			if err := tx.Put("orders", k, []byte("v-"+k)); err != nil {
				return err
			}
		}
		return tx.Put("customers", "c1", []byte("alice"))
	})
	if err != nil {
		t.Fatalf("Update: %v", err)
	}

	scan := func(t *testing.T, collection, prefix string, reverse bool, stopAfter int) []string {
		t.Helper()
		var got []string
		err := e.s.View(ctx, func(tx ledger.Tx) error {
			return tx.Scan(collection, prefix, reverse, func(k string, v []byte) (bool, error) {
				if string(v) != "v-"+k {
					t.Errorf("Scan value of %s = %q", k, v)
				}
				got = append(got, k)
				return stopAfter <= 0 || len(got) < stopAfter, nil
			})
		})
		if err != nil {
			t.Fatalf("View/Scan: %v", err)
		}
		return got
	}
	scans := []struct {
		name       string
		collection string
		prefix     string
		reverse    bool
		stopAfter  int
		want       []string
	}{
		{"forward_prefix", "orders", "order/", false, 0, []string{"order/1", "order/2", "order/3"}},
		{"reverse_prefix", "orders", "order/", true, 0, []string{"order/3", "order/2", "order/1"}},
		{"forward_short_prefix", "orders", "ord", false, 0, []string{"ord", "order/1", "order/2", "order/3", "orders/9"}},
		{"reverse_short_prefix", "orders", "ord", true, 0, []string{"orders/9", "order/3", "order/2", "order/1", "ord"}},
		{"reverse_prefix_at_end", "orders", "other/", true, 0, []string{"other/1"}},
		{"forward_all", "orders", "", false, 0, []string{"ord", "order/1", "order/2", "order/3", "orders/9", "other/1"}},
		{"reverse_all", "orders", "", true, 0, []string{"other/1", "orders/9", "order/3", "order/2", "order/1", "ord"}},
		{"forward_stop", "orders", "order/", false, 2, []string{"order/1", "order/2"}},
		{"reverse_stop", "orders", "order/", true, 1, []string{"order/3"}},
		{"no_match", "orders", "zzz", false, 0, nil},
		{"no_match_reverse", "orders", "zzz", true, 0, nil},
		{"no_match_reverse_before_all", "orders", "a", true, 0, nil},
		{"missing_collection", "nope", "", false, 0, nil},
		{"missing_collection_reverse", "nope", "", true, 0, nil},
	}
	for _, tc := range scans {
		t.Run("scan_"+tc.name, func(t *testing.T) {
			if got := scan(t, tc.collection, tc.prefix, tc.reverse, tc.stopAfter); !slices.Equal(got, tc.want) {
				t.Errorf("Scan(%s, %q, reverse=%v) = %v, want %v", tc.collection, tc.prefix, tc.reverse, got, tc.want)
			}
		})
	}

	t.Run("scan_error_stops", func(t *testing.T) {
		n := 0
		err := e.s.View(ctx, func(tx ledger.Tx) error {
			return tx.Scan("orders", "", false, func(string, []byte) (bool, error) {
				n++
				return true, errBoom
			})
		})
		if !errors.Is(err, errBoom) || n != 1 {
			t.Errorf("Scan with a failing fn: err = %v after %d calls, want errBoom after 1", err, n)
		}
	})

	t.Run("get_delete", func(t *testing.T) {
		err := e.s.View(ctx, func(tx ledger.Tx) error {
			for _, tc := range []struct{ coll, key, want string }{
				{"customers", "c1", "alice"},
				{"customers", "c2", ""},
				{"nope", "c1", ""},
			} {
				v, err := tx.Get(tc.coll, tc.key)
				if err != nil {
					return err
				}
				if string(v) != tc.want {
					t.Errorf("Get(%s, %s) = %q, want %q", tc.coll, tc.key, v, tc.want)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := e.s.Update(ctx, func(tx ledger.Tx) error {
			if err := tx.Delete("nope", "x"); err != nil { // deleting from a missing collection is a no-op
				return err
			}
			return tx.Delete("customers", "c1")
		}); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		_ = e.s.View(ctx, func(tx ledger.Tx) error {
			if v, _ := tx.Get("customers", "c1"); v != nil {
				t.Errorf("deleted value still there: %q", v)
			}
			return nil
		})
	})

	t.Run("update_error_rolls_back", func(t *testing.T) {
		err := e.s.Update(ctx, func(tx ledger.Tx) error {
			if err := tx.Put("orders", "order/4", []byte("v-order/4")); err != nil {
				return err
			}
			if err := tx.Put("fresh_collection", "k", []byte("v")); err != nil {
				return err
			}
			return errBoom
		})
		if !errors.Is(err, errBoom) {
			t.Fatalf("Update: err = %v, want errBoom", err)
		}
		if got := scan(t, "orders", "order/", false, 0); !slices.Equal(got, []string{"order/1", "order/2", "order/3"}) {
			t.Errorf("a failed Update's Put survived: %v", got)
		}
		_ = e.s.View(ctx, func(tx ledger.Tx) error {
			if v, _ := tx.Get("fresh_collection", "k"); v != nil {
				t.Errorf("a failed Update's new collection survived: %q", v)
			}
			return nil
		})
	})

	t.Run("apply_sees_and_writes_collections", func(t *testing.T) {
		c := newClaim("t1", "create_order", "fp-1")
		d, err := e.s.Execute(ctx, c, func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
			v, err := tx.Get("orders", "order/1")
			if err != nil || string(v) != "v-order/1" {
				t.Errorf("apply's Get = %q, %v", v, err)
			}
			if rec.State != ledger.StateInProgress || rec.Key != c.Key {
				t.Errorf("apply sees record %s", recordJSON(t, rec))
			}
			if !tx.Now().Equal(e.clock.Now()) {
				t.Errorf("apply's Tx.Now = %v, want %v", tx.Now(), e.clock.Now())
			}
			return ledger.Outcome{State: ledger.StateSucceeded}, tx.Put("orders", "order/5", []byte("v-order/5"))
		})
		if err != nil || d.Kind != ledger.DecisionExecuted {
			t.Fatalf("Execute = %q, %v", d.Kind, err)
		}
		if got := scan(t, "orders", "order/5", false, 0); !slices.Equal(got, []string{"order/5"}) {
			t.Errorf("apply's Put is missing: %v", got)
		}

		c2 := newClaim("t1", "create_order", "fp-2")
		_, err = e.s.Execute(ctx, c2, func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
			if err := tx.Put("orders", "order/6", []byte("v-order/6")); err != nil {
				return ledger.Outcome{}, err
			}
			return ledger.Outcome{}, errBoom
		})
		if !errors.Is(err, errBoom) {
			t.Fatalf("Execute with a failing apply: err = %v", err)
		}
		if got := scan(t, "orders", "order/6", false, 0); len(got) != 0 {
			t.Errorf("a failed apply's Put survived: %v", got)
		}
	})
}

// contractReverseScanFF: keys are opaque strings, so a reverse scan must
// find every key with the prefix, also those whose next bytes are 0xff.
func contractReverseScanFF(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	keys := []string{"p\x01", "p\xfe", "p\xff", "p\xff\xff\xff\xff", "p\xff\xff\xff\xff\x01", "q"}
	if err := e.s.Update(e.ctx, func(tx ledger.Tx) error {
		for _, k := range keys {
			if err := tx.Put("bin", k, []byte("x")); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		prefix string
		want   []string
	}{
		{"prefix_p", "p", []string{"p\xff\xff\xff\xff\x01", "p\xff\xff\xff\xff", "p\xff", "p\xfe", "p\x01"}},
		{"prefix_p_ff", "p\xff", []string{"p\xff\xff\xff\xff\x01", "p\xff\xff\xff\xff", "p\xff"}},
		{"empty_prefix", "", []string{"q", "p\xff\xff\xff\xff\x01", "p\xff\xff\xff\xff", "p\xff", "p\xfe", "p\x01"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			if err := e.s.View(e.ctx, func(tx ledger.Tx) error {
				return tx.Scan("bin", tc.prefix, true, func(k string, _ []byte) (bool, error) {
					got = append(got, k)
					return true, nil
				})
			}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("reverse Scan(%q) = %q, want %q", tc.prefix, got, tc.want)
			}
		})
	}
}

func contractAudit(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	al := e.s
	actor := ledger.Actor{Tenant: "t1", Principal: "alice", Role: "agent", ClientName: "claude", ClientVersion: "9", RequestID: "req-1", Trace: "00-abc-01"}
	mk := func(fp string) ledger.Claim {
		c := newClaim("t1", "create_order", fp)
		c.Actor = actor
		return c
	}
	k1 := mk("fp-1")
	e.exec(k1, e.ap.succeed(ResultOrder))                              // "" → in_progress → succeeded
	wantKind(t, e.exec(k1, e.ap.succeed(`{}`)), ledger.DecisionReplay) // call: replay
	bad := k1
	bad.Fingerprint = "fp-other"
	wantKind(t, e.exec(bad, e.ap.succeed(`{}`)), ledger.DecisionMismatch) // call: mismatch

	k2 := mk("fp-2")
	d2 := e.claim(k2) // "" → in_progress
	if _, err := e.s.Complete(e.ctx, actor, k2.Key, d2.Record.Generation, ledger.Outcome{State: ledger.StateFailed, Error: &ledger.OpError{Code: "downstream_error"}}); err != nil {
		t.Fatal(err) // in_progress → failed
	}

	k3 := mk("fp-3")
	e.claim(k3) // "" → in_progress
	e.clock.Advance(e.opts.Lease)
	wantKind(t, e.exec(k3, e.ap.succeed(ResultOrder)), ledger.DecisionExecuted) // → retryable → in_progress → succeeded

	k4 := mk("fp-1")
	k4.SuspectDuplicates = true
	wantKind(t, e.exec(k4, e.ap.succeed(`{}`)), ledger.DecisionSuspectedDuplicate) // "" → awaiting_approval
	e.clock.Advance(e.opts.ApprovalTTL)
	wantKind(t, e.exec(k4, e.ap.succeed(`{}`)), ledger.DecisionReplay) // awaiting_approval → rejected

	entries, err := al.AuditLog(e.ctx, 0, 0)
	if err != nil {
		t.Fatalf("AuditLog: %v", err)
	}

	type tr struct {
		key           string
		before, after ledger.State
	}
	var transitions []tr
	calls := map[ledger.AuditDecision][]string{} // decision → keys
	prev := ""
	for i, en := range entries {
		if en.Seq != uint64(i+1) {
			t.Errorf("entry %d has Seq %d", i, en.Seq)
		}
		if en.PrevHash != prev || en.Hash == "" {
			t.Errorf("entry %d does not chain: prev_hash %q, previous hash %q", en.Seq, en.PrevHash, prev)
		}
		prev = en.Hash
		if en.Actor.Tenant != "t1" || en.Actor.Principal != "alice" || en.Actor.ClientName != "claude" || en.Actor.RequestID != "req-1" || en.Actor.Trace != "00-abc-01" {
			t.Errorf("entry %d lost the actor: %+v", en.Seq, en.Actor)
		}
		if en.At.IsZero() || en.Tool != "create_order" {
			t.Errorf("entry %d: At %v, Tool %q", en.Seq, en.At, en.Tool)
		}
		switch en.Event {
		case ledger.EventTransition:
			transitions = append(transitions, tr{en.Key, en.StateBefore, en.StateAfter})
		case ledger.EventCall:
			calls[en.Decision] = append(calls[en.Decision], en.Key)
			if en.Decision == ledger.AuditDecision(ledger.DecisionMismatch) && (en.ErrorCode != "key_reused_with_different_request" || en.Fingerprint != "fp-other") {
				t.Errorf("mismatch entry: error code %q, fingerprint %q", en.ErrorCode, en.Fingerprint)
			}
		default:
			t.Errorf("entry %d: unknown event %q", en.Seq, en.Event)
		}
	}

	wantTransitions := map[string][]tr{
		// An Execute that runs its side effect in the claim's transaction
		// is one transition, from the state before the claim to the outcome.
		k1.Key: {{k1.Key, "", ledger.StateSucceeded}},
		k2.Key: {{k2.Key, "", ledger.StateInProgress}, {k2.Key, ledger.StateInProgress, ledger.StateFailed}},
		k3.Key: {{k3.Key, "", ledger.StateInProgress}, {k3.Key, ledger.StateInProgress, ledger.StateRetryable}, {k3.Key, ledger.StateRetryable, ledger.StateSucceeded}},
		k4.Key: {{k4.Key, "", ledger.StateAwaitingApproval}, {k4.Key, ledger.StateAwaitingApproval, ledger.StateRejected}},
	}
	for key, want := range wantTransitions {
		var got []tr
		for _, x := range transitions {
			if x.key == key {
				got = append(got, x)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("transitions of %s = %v, want %v", key, got, want)
		}
	}
	if got := calls[ledger.AuditDecision(ledger.DecisionReplay)]; !slices.Contains(got, k1.Key) {
		t.Errorf("no replay call entry for %s (replay entries: %v)", k1.Key, got)
	}
	if got := calls[ledger.AuditDecision(ledger.DecisionMismatch)]; !slices.Equal(got, []string{k1.Key}) {
		t.Errorf("mismatch call entries = %v, want [%s]", got, k1.Key)
	}

	n, err := al.VerifyAudit(e.ctx)
	if err != nil || n != len(entries) {
		t.Errorf("VerifyAudit = %d, %v; want %d, nil", n, err, len(entries))
	}

	t.Run("paging", func(t *testing.T) {
		page, err := al.AuditLog(e.ctx, 3, 2)
		if err != nil || len(page) != 2 || page[0].Seq != 4 || page[1].Seq != 5 {
			t.Errorf("AuditLog(after 3, limit 2) = %d entries, %v", len(page), err)
		}
		rest, err := al.AuditLog(e.ctx, uint64(len(entries)), 0)
		if err != nil || len(rest) != 0 {
			t.Errorf("AuditLog(after last) = %d entries, %v; want none", len(rest), err)
		}
	})
}

func contractContextCancelled(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c := newClaim("t1", "create_order", "fp-1")
	if _, err := e.s.Execute(ctx, c, e.ap.succeed(ResultOrder)); !errors.Is(err, context.Canceled) {
		t.Errorf("Execute with a cancelled context: err = %v, want context.Canceled", err)
	}
	if _, err := e.s.Claim(ctx, c); !errors.Is(err, context.Canceled) {
		t.Errorf("Claim with a cancelled context: err = %v, want context.Canceled", err)
	}
	e.wantCalls(0)
	if _, err := e.s.Get(e.ctx, "t1", c.Key); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("Get: err = %v, want ErrNotFound", err)
	}
}

func contractClosed(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c := newClaim("t1", "create_order", "fp-1")
	e.exec(c, e.ap.succeed(ResultOrder))
	if err := e.s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := e.s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	ctx := e.ctx
	calls := []struct {
		name string
		call func() error
	}{
		{"Execute_new", func() error {
			_, err := e.s.Execute(ctx, newClaim("t1", "create_order", "fp-2"), e.ap.succeed(`{}`))
			return err
		}},
		{"Execute_replay", func() error { _, err := e.s.Execute(ctx, c, e.ap.succeed(`{}`)); return err }},
		{"Claim", func() error { _, err := e.s.Claim(ctx, newClaim("t1", "create_order", "fp-3")); return err }},
		{"Complete", func() error {
			_, err := e.s.Complete(ctx, c.Actor, c.Key, 1, ledger.Outcome{State: ledger.StateSucceeded})
			return err
		}},
		{"RenewLease", func() error { return e.s.RenewLease(ctx, "t1", c.Key, 1) }},
		{"Get", func() error { _, err := e.s.Get(ctx, "t1", c.Key); return err }},
		{"List", func() error { _, err := e.s.List(ctx, ledger.Filter{}); return err }},
		{"IssueKey", func() error { return e.s.IssueKey(ctx, "t1", "k") }},
		{"View", func() error { return e.s.View(ctx, func(ledger.Tx) error { return nil }) }},
		{"Update", func() error { return e.s.Update(ctx, func(ledger.Tx) error { return nil }) }},
		{"Sweep", func() error { _, _, err := e.s.Sweep(ctx); return err }},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, ledger.ErrClosed) {
				t.Errorf("%s after Close: err = %v, want ErrClosed", tc.name, err)
			}
		})
	}
	e.wantCalls(1)
}
