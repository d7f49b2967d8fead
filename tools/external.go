package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/orders"
)

// runner performs one operation against an external downstream, with no
// transaction open. Its outcome may be unknown.
type runner func(ctx context.Context, rec *ledger.Record) ledger.Outcome

// external returns the runner of tool when its downstream is remote (the
// HTTP order API, or a declared tool's API), or false when the tool runs in the ledger's transaction.
func (s *Service) external(tool string, tenant string, args json.RawMessage) (runner, bool, error) {
	if op := s.remoteOpOf(tool); op != nil {
		return func(ctx context.Context, rec *ledger.Record) ledger.Outcome {
			r, err := op.Send(ctx, tenant, opRef(rec), args, approvedVersion(rec))
			return declaredOutcome(op, r, err)
		}, true, nil
	}
	e := s.effectOf(tool)
	if s.remote == nil || e == nil || !e.onOrders() {
		return nil, false, nil
	}
	write, summary, err := e.remoteWrite(s.remote, tenant, args)
	if err != nil {
		return nil, true, err
	}
	return func(ctx context.Context, rec *ledger.Record) ledger.Outcome {
		o, err := write(ctx, opRef(rec))
		return s.withFollowUps(outcomeOf(o, err, summary), tenant, rec, args, o, map[string]any{"order": o})
	}, true, nil
}

// executeExternal is execute for an external downstream: claim with a
// lease, call out with no transaction open, complete fenced by the claim's
// generation. A record left unknown is reconciled before anything is sent
// again.
//
// A duplicate never answers a record in flight without waiting for it:
// whenever the record is in_progress — the first attempt, or a re-run that
// another duplicate claimed after reconciliation proved the first attempt
// absent — the call waits for it (bounded by WaitInProgress, with
// progress) and answers its outcome, like any duplicate of a running
// operation. A call runs the operation at most once itself.
func (s *Service) executeExternal(ctx context.Context, c *call, claim ledger.Claim, run runner) *Response {
	claim.OnLeaseExpiry = ledger.StateUnknown // it may have been sent
	// One call may wait more than once: its progress keeps increasing.
	waiting := *c
	waiting.progress = increasing(c.progress)
	c = &waiting
	// Rounds: wait for the first attempt, reconcile it, wait for (or run)
	// the re-run, and once more should that re-run itself end unknown or
	// retryable and be re-run by another duplicate.
	const rounds = 4
	for range rounds {
		lctx, span := s.startSpan(ctx, "ledger claim")
		d, err := s.ledger.Claim(lctx, claim)
		endLedgerSpan(span, d, err)
		if err != nil {
			return s.ledgerError(c, err)
		}
		c.noteBefore(d)
		if d.Kind == ledger.DecisionApprovalRequested || d.Kind == ledger.DecisionSuspectedDuplicate {
			s.outbox.Kick() // the approvers' notice is queued
		}
		if r := c.answered(d); r != nil {
			return r // answered as it is (externalFinal), by its audit entry too
		}
		if d.Kind == ledger.DecisionHeld && d.Record.State == ledger.StateUnknown {
			if d, err = s.reconcile(ctx, c.actor, d.Record); err != nil {
				return s.ledgerError(c, err)
			}
		}
		switch {
		case d.Kind == ledger.DecisionClaimed:
			done := s.runClaimed(ctx, c.actor, d.Record, run, claim.Answer)
			if r := c.answered(done); r != nil {
				return r // the completion's entry carries it
			}
			return s.respond(done)
		case d.Kind == ledger.DecisionBusy || (d.Kind == ledger.DecisionHeld && d.Record.State == ledger.StateInProgress):
			// Busy, or reconciled while another duplicate re-claimed it.
			// (Only a duplicate waits: a mismatch answers at once.)
			rec, err := s.waitForOutcome(ctx, c, d.Record)
			if err != nil {
				return s.ledgerError(c, err)
			}
			if rec.State == ledger.StateUnknown || rec.State == ledger.StateRetryable {
				continue // the owner left it unknown or retryable: reconcile or run it
			}
			return s.respond(decisionFor(rec))
		case d.Kind == ledger.DecisionHeld && d.Record.State == ledger.StateRetryable:
			continue // proven absent and safe to resend: claim it again
		default:
			return s.respond(d)
		}
	}
	rec, err := s.ledger.Get(ctx, c.actor.Tenant, claim.Key)
	if err != nil {
		return s.ledgerError(c, err)
	}
	if rec.State == ledger.StateInProgress {
		if rec, err = s.waitForOutcome(ctx, c, rec); err != nil {
			return s.ledgerError(c, err)
		}
	}
	return s.respond(decisionFor(rec))
}

// externalFinal reports whether executeExternal answers d as it is
// (respond), without running, waiting for or reconciling the operation.
func externalFinal(d ledger.Decision) bool {
	switch d.Kind {
	case ledger.DecisionClaimed, ledger.DecisionBusy:
		return false
	case ledger.DecisionHeld:
		st := d.Record.State
		return st != ledger.StateUnknown && st != ledger.StateInProgress && st != ledger.StateRetryable
	}
	return true
}

// increasing wraps the progress reporter of one call that may wait
// several times (for the first attempt, then for a re-run), each wait
// counting from zero, so that the values it sends keep increasing as MCP
// requires: a later wait continues from where the earlier one stopped, and
// a value that would not increase is not sent. Not safe for concurrent
// use (one call's goroutine reports).
func increasing(p Progress) Progress {
	var base, prevRaw, last float64
	sent := false
	return func(progress, total float64, msg string) {
		if sent && progress < prevRaw { // a new wait started from zero
			base = last
		}
		prevRaw = progress
		v := base + progress
		if sent && v <= last {
			return
		}
		sent, last = true, v
		p(v, base+total, msg)
	}
}

// runClaimed runs a claimed operation to its outcome, under the trace of
// ctx. The downstream call is detached from the caller's cancellation (a client that gives up does
// not leave the call half-recorded) but bounded by the API timeout; the
// lease is renewed while it runs. If the lease was lost meanwhile, the
// completion is refused by the ledger (fencing) and the record as it now
// stands is the answer.
//
// answer, when not nil, is the call's Claim.Answer: the entry that
// records the outcome is asked to carry the answer to it, and the
// decision returned says whether it did (Decision.Answered).
func (s *Service) runClaimed(caller context.Context, actor ledger.Actor, rec *ledger.Record, run runner, answer ledger.AnswerFunc) ledger.Decision {
	detached := context.WithoutCancel(caller)
	timeout := s.opts.CallTimeout
	if op, ok := s.remoteOpOf(rec.Tool).(interface{ Timeout() time.Duration }); ok {
		timeout = max(timeout, op.Timeout())
	}
	ctx, cancel := context.WithTimeout(detached, timeout)
	defer cancel()
	renewed := make(chan struct{})
	go func() { // exits when the call returns or the lease is lost
		defer close(renewed)
		t := time.NewTicker(s.opts.Lease / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := s.ledger.RenewLease(ctx, rec.Tenant, rec.Key, rec.Generation); err != nil {
					s.renewalFailed(ctx, rec, err)
					return
				}
			}
		}
	}()
	started := time.Now()
	trace := &httpTrace{}
	out := run(withHTTPTrace(ctx, trace), rec)
	cancel()
	<-renewed
	s.log.Debug("downstream call", "tool", rec.Tool, "key", rec.Key, "state", out.State, "duration", time.Since(started))
	if out.Call == nil {
		out.Call = trace.downstreamCall(s.systemOf(rec.Tool), rec.Attempts)
		noteOrder(out.Call, out.Result)
		auditedAlso(&out)
	}
	if out.State == ledger.StateSucceeded {
		s.outbox.Kick()
	}
	if answer != nil {
		out.Answer = &ledger.OutcomeAnswer{For: answer}
	}
	taken := func() bool { return out.Answer != nil && out.Answer.Taken }
	lctx, span := s.startSpan(detached, "ledger complete")
	done, err := s.ledger.Complete(lctx, actor, rec.Key, rec.Generation, out)
	endRecordSpan(span, done, err)
	if err == nil {
		return ledger.Decision{Kind: ledger.DecisionExecuted, Record: done, Answered: taken()}
	}
	if errors.Is(err, ledger.ErrStaleGeneration) && (out.State == ledger.StateSucceeded || out.State == ledger.StateFailed) {
		// The lease ran out while the call was in flight, and the record
		// went unknown (or on to a re-run approval, or retryable). The
		// answer that came back is what happened: settle the record with it
		// rather than let a re-run send the request a second time.
		lctx, span := s.startSpan(detached, "ledger settle")
		settled, serr := s.ledger.Settle(lctx, ledger.SettleRequest{
			Actor: actor, Key: rec.Key, Outcome: out,
			From: []ledger.State{ledger.StateUnknown, ledger.StateAwaitingApproval, ledger.StateRetryable},
			Why:  fmt.Sprintf("late answer of attempt %d, after its lease had passed: %s", rec.Attempts, out.State),
		})
		endRecordSpan(span, settled, serr)
		if serr == nil {
			return ledger.Decision{Kind: ledger.DecisionExecuted, Record: settled, Answered: taken()}
		}
		s.log.Warn("late answer not recorded", "key", rec.Key, "err", serr)
	}
	cur, gerr := s.ledger.Get(context.Background(), rec.Tenant, rec.Key)
	if gerr != nil {
		s.log.Error("completion refused and record unreadable", "key", rec.Key, "err", err, "get", gerr)
		return ledger.Decision{Kind: ledger.DecisionHeld, Record: &ledger.Record{Key: rec.Key, Tool: rec.Tool, State: ledger.StateUnknown}}
	}
	s.log.Warn("completion refused", "key", rec.Key, "err", err, "state now", cur.State)
	if cur.State.Final() {
		return ledger.Decision{Kind: ledger.DecisionReplay, Record: cur}
	}
	return ledger.Decision{Kind: ledger.DecisionHeld, Record: cur}
}

// renewalFailed logs a failed lease renewal of rec's call, whose context
// is ctx. A renewal that failed because the call just ended or timed out
// (ctx is done) lost nothing and is not logged; a lease really lost while
// the call runs is a warning, as is a ledger failure.
func (s *Service) renewalFailed(ctx context.Context, rec *ledger.Record, err error) {
	switch {
	case ctx.Err() != nil:
		s.log.Debug("lease renewal skipped: the call has ended", "key", rec.Key)
	case errors.Is(err, ledger.ErrStaleGeneration):
		s.log.Warn("lease lost while the downstream call runs; its completion will be refused", "key", rec.Key, "generation", rec.Generation)
	default:
		s.log.Warn("lease renewal", "key", rec.Key, "err", err)
	}
}

// reconcile asks the order API what became of an unknown operation and
// settles it: the API's order makes it succeeded; proven absent makes it
// retryable when the API guarantees safe same-key retries, and otherwise
// holds it for an approver to allow a re-run. When the API cannot tell, it
// stays unknown.
//
// Reconciliations of one (tenant, key) are coalesced within the process:
// one is in flight — a single lookup at the API and its settlement — and
// every other caller waits for its answer (or for its own ctx). The flight
// reads the record first, so a caller that saw unknown just before another
// settled it gets the settled record without a second lookup. The flight
// runs detached from the caller that started it: that caller giving up
// does not fail the others. Its settlement is attributed to that caller.
func (s *Service) reconcile(ctx context.Context, actor ledger.Actor, rec *ledger.Record) (ledger.Decision, error) {
	if !s.reconcilable(rec.Tool) {
		return ledger.Decision{Kind: ledger.DecisionHeld, Record: rec}, nil
	}
	detached := context.WithoutCancel(ctx)
	ch := s.reconciling.DoChan(rec.Tenant+"\x00"+rec.Key, func() (v any, err error) {
		if !s.startFlight() {
			return nil, errServiceClosed
		}
		defer s.flights.Done()
		defer recoverFlight(&err)
		return s.reconcileOnce(detached, actor, rec.Tenant, rec.Key)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return ledger.Decision{}, r.Err
		}
		return r.Val.(ledger.Decision), nil
	case <-ctx.Done():
		return ledger.Decision{}, ctx.Err()
	}
}

// errServiceClosed is a reconciliation asked for after Close.
var errServiceClosed = errors.New("tools: the service is shutting down")

// recoverFlight turns a panic in a coalesced flight into its error:
// singleflight would re-raise it on a goroutine of its own, out of reach
// of Call's recovery, and end the process.
func recoverFlight(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("panic in a coalesced call: %v", r)
	}
}

// reconcileOnce is one reconciliation of (tenant, key); see reconcile.
func (s *Service) reconcileOnce(ctx context.Context, actor ledger.Actor, tenant, key string) (ledger.Decision, error) {
	rec, err := s.ledger.Get(ctx, tenant, key)
	if err != nil {
		return ledger.Decision{}, err
	}
	if rec.State != ledger.StateUnknown {
		return settledDecision(rec), nil // settled meanwhile: nothing to ask
	}
	trace := &httpTrace{}
	found, what, err := s.lookupOutcome(withHTTPTrace(ctx, trace), rec)
	s.lookups.observe(s.log, rec.Key, err)
	system := "the order system"
	if s.remoteOpOf(rec.Tool) != nil {
		system = "the API of " + rec.Tool
	}
	req := ledger.SettleRequest{Actor: actor, Key: rec.Key, From: []ledger.State{ledger.StateUnknown}}
	switch {
	case err == nil:
		req.Outcome = found
		req.How, req.Why = ledger.SettledReconciledFound, "reconciled: "+system+" has "+what+" for this key"
	case errors.Is(err, orders.ErrAbsent) && s.safeRetry(rec.Tool):
		req.Outcome = ledger.Outcome{State: ledger.StateRetryable}
		req.How, req.Why = ledger.SettledReconciledAbsentRetry, "reconciled: "+system+" has nothing for this key, and same-key retries are safe"
	case errors.Is(err, orders.ErrAbsent):
		req.Outcome = ledger.Outcome{State: ledger.StateAwaitingApproval}
		req.Proposal = &ledger.Approval{Rule: "rerun_after_unknown",
			Reason:   "the first attempt's outcome was unknown and " + system + " has nothing for this key; re-sending needs a human because the API does not guarantee safe same-key retries",
			DiffText: "re-send " + rec.Tool + " for operation " + rec.Key + " (first attempt lost; " + system + " shows no trace of it)"}
		req.How, req.Why = ledger.SettledReconciledAbsentNeedsApproval, "reconciled: absent at "+system+"; re-run needs approval"
		req.OnHeld = s.heldNotice(func() *approvals.Total { return s.totalOf(rec) })
	default:
		return ledger.Decision{Kind: ledger.DecisionHeld, Record: rec}, nil
	}
	req.Outcome.Call = trace.downstreamCall(s.systemOf(rec.Tool), rec.Attempts)
	noteOrder(req.Outcome.Call, req.Outcome.Result)
	auditedAlso(&req.Outcome)
	lctx, span := s.startSpan(ctx, "ledger settle")
	settled, err := s.ledger.Settle(lctx, req)
	endRecordSpan(span, settled, err)
	if err == nil && req.OnHeld != nil {
		s.outbox.Kick() // the approvers' notice is queued
	}
	if errors.Is(err, ledger.ErrWrongState) {
		cur, gerr := s.ledger.Get(ctx, rec.Tenant, rec.Key)
		if gerr != nil {
			return ledger.Decision{}, gerr
		}
		settled = cur
	} else if err != nil {
		return ledger.Decision{}, err
	}
	return settledDecision(settled), nil
}

// settledDecision is how reconcile reports a record: a final one is a
// replay, any other (unknown, retryable, in_progress, awaiting_approval)
// is held, for the caller to wait on, run or answer.
func settledDecision(rec *ledger.Record) ledger.Decision {
	if rec.State.Final() {
		return ledger.Decision{Kind: ledger.DecisionReplay, Record: rec}
	}
	return ledger.Decision{Kind: ledger.DecisionHeld, Record: rec}
}

// lookupHealth turns the results of reconciliation lookups into a log an
// operator can read during an outage of the order API: one warning when
// lookups start failing, nothing per failed lookup after it, and one line
// with the count when a lookup gets an answer again. Safe for concurrent
// use; the zero value is ready.
type lookupHealth struct {
	mu     sync.Mutex
	down   bool
	since  time.Time
	failed int
	keys   map[string]struct{} // distinct keys left unknown, up to maxOutageKeys
}

const maxOutageKeys = 10000

// observe records the result of one lookup for key.
func (h *lookupHealth) observe(log *slog.Logger, key string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err != nil && !errors.Is(err, orders.ErrAbsent) {
		h.failed++
		if h.keys == nil {
			h.keys = map[string]struct{}{}
		}
		if len(h.keys) < maxOutageKeys {
			h.keys[key] = struct{}{}
		}
		if !h.down {
			h.down, h.since = true, time.Now()
			log.Warn("reconciliation lookups are failing: unknown operations stay unknown until the order API answers again; logged once for this outage",
				"err", err, "first_key", key)
		} else {
			log.Debug("reconciliation lookup failed", "key", key, "err", err, "failed_so_far", h.failed)
		}
		return
	}
	if h.down {
		log.Info("reconciliation lookups recovered", "failed_lookups", h.failed, "operations_affected", len(h.keys),
			"outage", time.Since(h.since).Round(time.Millisecond))
		h.down, h.failed = false, 0
		clear(h.keys)
	}
}

// Sweep is the background work of a server (one goroutine calls it): expired leases become unknown
// or retryable, and unknown operations are reconciled with the order API.
// It returns how many of each it handled.
func (s *Service) Sweep(ctx context.Context) (expired, reconciled int, err error) {
	expired, err = s.ledger.ExpireLeases(ctx)
	if err != nil || (s.remote == nil && !s.hasDeclared) {
		return expired, 0, err
	}
	// Page through the unknown records, a hundred per pass, wrapping
	// around, so records whose lookups keep failing cannot starve the rest.
	recs, err := s.ledger.OpenRecords(ctx, ledger.StateUnknown, s.sweepAfter, 100)
	if err != nil {
		return expired, 0, err
	}
	if len(recs) < 100 {
		s.sweepAfter = ""
	} else {
		last := recs[len(recs)-1]
		s.sweepAfter = ledger.OpenPosition(last)
	}
	sweeper := ledger.Actor{Principal: "idemgate-reconciler", Role: "system"}
	for _, rec := range recs {
		sweeper.Tenant = rec.Tenant
		d, err := s.reconcile(ctx, sweeper, rec)
		if err != nil {
			return expired, reconciled, err
		}
		if d.Record.State != ledger.StateUnknown {
			reconciled++
		}
	}
	return expired, reconciled, nil
}
