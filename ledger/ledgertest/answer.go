package ledgertest

import (
	"encoding/json"
	"errors"
	"testing"

	"idemgate/ledger"
)

// contractAnswerInEntry: with Claim.Answer, a call leaves one audit entry
// — a create its executed (or held) transition, a replay its call entry,
// each carrying the answer — and Decision.Answered says so; an answer
// that contradicts the entry (a mismatch answered "rejected") or is not
// known yet (nil) is not taken, and the caller's answer entry follows as
// before. A log in the earlier form (a call and an answer entry) keeps
// verifying, and reads the same in AuditForKey and the stats.
func contractAnswerInEntry(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	asked := 0
	answer := func(d ledger.Decision) *ledger.Answer {
		asked++
		if d.Kind == ledger.DecisionBusy {
			return nil
		}
		a := &ledger.Answer{State: d.Record.State, Attempt: d.Record.Attempts, Replayed: d.Kind == ledger.DecisionReplay,
			ResponseSHA256: "sha-" + string(d.Kind), DurationMS: 1.5, PolicyRule: "default_allow", PolicyAction: "allow"}
		if d.Kind == ledger.DecisionMismatch {
			a.State, a.Attempt, a.ErrorCode = ledger.StateRejected, 0, string(ledger.CodeKeyReused)
		}
		return a
	}
	entriesSince := func(after uint64) []ledger.AuditEntry {
		t.Helper()
		log, err := e.s.AuditLog(e.ctx, after, 0)
		if err != nil {
			t.Fatalf("AuditLog: %v", err)
		}
		return log
	}
	last := func() uint64 {
		t.Helper()
		tail, err := e.s.AuditTail(e.ctx, 1)
		if err != nil {
			t.Fatalf("AuditTail: %v", err)
		}
		if len(tail) == 0 {
			return 0
		}
		return tail[0].Seq
	}

	c := newClaim("t1", "create_order", "fp-answer")
	c.PolicyRule, c.PolicyAction = "default_allow", "allow"
	c.Answer = answer
	d := e.exec(c, e.ap.succeed(ResultOrder))
	wantKind(t, d, ledger.DecisionExecuted)
	log := entriesSince(0)
	if !d.Answered || len(log) != 1 || log[0].Event != ledger.EventTransition || log[0].ResponseSHA256 != "sha-executed" ||
		log[0].StateAfter != ledger.StateSucceeded || log[0].DurationMS != 1.5 || log[0].Replayed {
		t.Fatalf("a create wrote %+v (answered %v), want one executed transition carrying its answer", log, d.Answered)
	}

	for range 3 {
		at := last()
		d = e.exec(c, e.ap.succeed(ResultOrder))
		wantKind(t, d, ledger.DecisionReplay)
		log = entriesSince(at)
		if !d.Answered || len(log) != 1 || log[0].Event != ledger.EventCall || log[0].Decision != ledger.AuditDecision(ledger.DecisionReplay) ||
			log[0].ResponseSHA256 != "sha-replay" || !log[0].Replayed || log[0].StateAfter != ledger.StateSucceeded || log[0].DurationMS != 1.5 {
			t.Fatalf("a replay wrote %+v (answered %v), want one call entry carrying its answer", log, d.Answered)
		}
	}
	e.wantCalls(1)

	// A mismatch's answer (rejected) contradicts its entry (the
	// operation's state): the entry stays as it was, and is not answered.
	at := last()
	other := c
	other.Fingerprint = "fp-other"
	d = e.exec(other, e.ap.succeed(ResultOrder))
	wantKind(t, d, ledger.DecisionMismatch)
	if d.Answered {
		t.Errorf("a mismatch was answered by its entry")
	}
	e.s.Audit(ledger.AnswerEntry(c.Actor, c.Tool, c.Key, *answer(d)))
	log = entriesSince(at)
	if len(log) != 2 || log[0].ResponseSHA256 != "" || log[0].StateAfter != ledger.StateSucceeded ||
		log[1].Event != ledger.EventAnswer || log[1].StateAfter != ledger.StateRejected || log[1].ResponseSHA256 != "sha-mismatch" {
		t.Errorf("a mismatch wrote %+v, want its call entry and its answer entry", log)
	}

	// An answer not known yet (nil) is not taken.
	busy := newClaim("t1", "create_order", "fp-busy")
	busy.Answer = answer
	wantKind(t, e.claim(busy), ledger.DecisionClaimed)
	n := asked
	d = e.claim(busy)
	wantKind(t, d, ledger.DecisionBusy)
	if d.Answered || asked != n+1 {
		t.Errorf("busy: answered %v, asked %d times, want asked once and not answered", d.Answered, asked-n)
	}

	// The earlier form: a replay as a call entry and an answer entry.
	old := newClaim("t1", "create_order", "fp-old")
	wantKind(t, e.exec(old, e.ap.succeed(ResultOrder)), ledger.DecisionExecuted)
	e.s.Audit(ledger.AnswerEntry(old.Actor, old.Tool, old.Key, ledger.Answer{State: ledger.StateSucceeded, Attempt: 1, ResponseSHA256: "sha-old-create"}))
	wantKind(t, e.exec(old, e.ap.succeed(ResultOrder)), ledger.DecisionReplay)
	e.s.Audit(ledger.AnswerEntry(old.Actor, old.Tool, old.Key, ledger.Answer{State: ledger.StateSucceeded, Attempt: 1, Replayed: true, ResponseSHA256: "sha-old-replay"}))
	all := len(entriesSince(0)) // written first: VerifyAudit reads what is written
	if n, err := e.s.VerifyAudit(e.ctx); err != nil || n != all {
		t.Errorf("VerifyAudit = %d, %v; want every entry verified", n, err)
	}
	for _, k := range []ledger.Claim{c, old} {
		h, total, err := e.s.AuditForKey(e.ctx, "t1", k.Key, 0)
		if err != nil || total != len(h) {
			t.Fatalf("AuditForKey(%s) = %d of %d, %v", k.Key, len(h), total, err)
		}
		var digests []string
		for _, en := range h {
			if en.ResponseSHA256 != "" {
				digests = append(digests, en.ResponseSHA256)
			}
		}
		want := map[string]int{c.Key: 5, old.Key: 2}[k.Key] // create, 3 replays, the mismatch's answer; create, replay
		if len(digests) != want {
			t.Errorf("history of %s has %d answers %v, want %d", k.Key, len(digests), digests, want)
		}
	}
	st, err := ledger.ComputeStats(e.ctx, e.s, "t1")
	if err != nil {
		t.Fatal(err)
	}
	// Operations: c, busy, old. Calls: c's create, 3 replays and the
	// mismatch; busy's claim and its busy call; old's create and replay
	// (the answer entries of the earlier form count nothing).
	if st.Operations != 3 || st.Calls != 9 || st.ReplaysServed != 4 || st.MismatchesRefused != 1 || st.Executions != 2 {
		t.Errorf("stats = %+v, want 3 operations, 9 calls, 4 replays, 1 mismatch, 2 executions", st)
	}
}

// contractAnswerInCompletion: an outcome recorded by Complete or Settle
// with Outcome.Answer set — a claim that called out with no transaction
// open — has its transition entry carry the answer For gives for the
// record as committed (DecisionExecuted), and Taken says so; an answer
// that contradicts the entry is not taken (the caller writes its answer
// entry), and a completion refused (a stale generation) takes nothing.
func contractAnswerInCompletion(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	var asked []ledger.Decision
	answer := func(state ledger.State, sha string) *ledger.OutcomeAnswer {
		return &ledger.OutcomeAnswer{For: func(d ledger.Decision) *ledger.Answer {
			asked = append(asked, d)
			return &ledger.Answer{State: state, Attempt: d.Record.Attempts, ResponseSHA256: sha, DurationMS: 2.5}
		}}
	}
	lastEntry := func() ledger.AuditEntry {
		t.Helper()
		tail, err := e.s.AuditTail(e.ctx, 1)
		if err != nil || len(tail) != 1 {
			t.Fatalf("AuditTail = %v, %v", tail, err)
		}
		return tail[0]
	}

	c := newClaim("t1", "create_order", "fp-complete-answer")
	d := e.claim(c)
	wantKind(t, d, ledger.DecisionClaimed)
	gen := d.Record.Generation
	a := answer(ledger.StateSucceeded, "sha-completed")
	rec, err := e.s.Complete(e.ctx, c.Actor, c.Key, gen, ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(ResultOrder), Answer: a})
	if err != nil {
		t.Fatal(err)
	}
	if !a.Taken || len(asked) == 0 {
		t.Fatalf("Complete: taken %v, asked %d times; want the answer taken", a.Taken, len(asked))
	}
	if got := asked[len(asked)-1]; got.Kind != ledger.DecisionExecuted || got.Record != rec || got.Record.State != ledger.StateSucceeded {
		t.Errorf("asked for %s of %p (%s), want executed of the record returned %p", got.Kind, got.Record, got.Record.State, rec)
	}
	if en := lastEntry(); en.Event != ledger.EventTransition || en.Decision != ledger.AuditCompleted || en.ResponseSHA256 != "sha-completed" ||
		en.DurationMS != 2.5 || en.StateAfter != ledger.StateSucceeded || en.Attempt != 1 {
		t.Errorf("completion's entry = %+v, want the completed transition carrying its answer", en)
	}

	// Stale: refused, nothing taken (Taken is cleared).
	a = answer(ledger.StateSucceeded, "sha-stale")
	a.Taken = true
	if _, err := e.s.Complete(e.ctx, c.Actor, c.Key, gen, ledger.Outcome{State: ledger.StateFailed, Answer: a}); !errors.Is(err, ledger.ErrStaleGeneration) {
		t.Fatalf("second Complete: %v, want ErrStaleGeneration", err)
	}
	if a.Taken {
		t.Errorf("a refused completion says its answer was taken")
	}

	// An answer that contradicts the entry (another state) is not taken.
	other := newClaim("t1", "create_order", "fp-complete-contradicts")
	d = e.claim(other)
	wantKind(t, d, ledger.DecisionClaimed)
	a = answer(ledger.StateRejected, "sha-contradicts")
	if _, err := e.s.Complete(e.ctx, other.Actor, other.Key, d.Record.Generation, ledger.Outcome{State: ledger.StateFailed, Answer: a}); err != nil {
		t.Fatal(err)
	}
	if en := lastEntry(); a.Taken || en.ResponseSHA256 != "" || en.StateAfter != ledger.StateFailed {
		t.Errorf("a contradicting answer: taken %v, entry %+v; want not taken, the entry as it was", a.Taken, en)
	}

	// Settle takes it the same way.
	late := newClaim("t1", "create_order", "fp-settle-answer")
	wantKind(t, e.claim(late), ledger.DecisionClaimed)
	a = answer(ledger.StateSucceeded, "sha-settled")
	rec, err = e.s.Settle(e.ctx, ledger.SettleRequest{Actor: late.Actor, Key: late.Key, From: []ledger.State{ledger.StateInProgress},
		Outcome: ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(ResultOrder), Answer: a}, Why: "late answer"})
	if err != nil {
		t.Fatal(err)
	}
	if en := lastEntry(); !a.Taken || en.ResponseSHA256 != "sha-settled" || en.StateAfter != ledger.StateSucceeded || asked[len(asked)-1].Record != rec {
		t.Errorf("Settle: taken %v, entry %+v; want the settled transition carrying its answer", a.Taken, en)
	}

	log, err := e.s.AuditLog(e.ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := e.s.VerifyAudit(e.ctx); err != nil || n != len(log) {
		t.Errorf("VerifyAudit = %d, %v; want %d entries verified", n, err, len(log))
	}
}

// contractReplayIsItsOwn: the record a replay answers with is the
// caller's own — changing it changes neither the stored record nor what
// the next replay reads — and a replay reads the record as it is stored
// now, after a write outside the claim (the record's compaction).
func contractReplayIsItsOwn(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c := newClaim("t1", "create_order", "fp-replay-own")
	out := ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(ResultOrder), Error: nil, Summary: "order ord_1"}
	wantKind(t, e.exec(c, e.ap.outcome(out)), ledger.DecisionExecuted)
	var want string
	for i := range 3 {
		d := e.exec(c, e.ap.succeed(ResultOrder))
		wantKind(t, d, ledger.DecisionReplay)
		got := recordJSON(t, d.Record)
		if i == 0 {
			want = got
		} else if got != want {
			t.Fatalf("replay %d read %s, want %s", i, got, want)
		}
		// Scribble on everything the record holds.
		d.Record.State, d.Record.Summary, d.Record.Attempts = ledger.StateFailed, "changed", 9
		for j := range d.Record.Result {
			d.Record.Result[j] = ' '
		}
		for j := range d.Record.AuditSeqs {
			d.Record.AuditSeqs[j] = 0
		}
		d.Record.Error = &ledger.OpError{Code: "changed"}
	}
	if got := recordJSON(t, mustGet(t, e.s, "t1", c.Key)); got != want {
		t.Errorf("stored record %s, want %s", got, want)
	}
	e.clock.Advance(e.opts.Retention)
	if n, _, err := e.s.Sweep(e.ctx); err != nil || n != 1 {
		t.Fatalf("Sweep at retention = %d compacted, %v; want 1", n, err)
	}
	d := e.exec(c, e.ap.succeed(ResultOrder))
	wantKind(t, d, ledger.DecisionExpired)
	if !d.Record.Tombstone || d.Record.Result != nil {
		t.Errorf("after compaction a replay read %s, want the tombstone", recordJSON(t, d.Record))
	}
	// The key freed and used again: a replay answers the new operation.
	e.clock.Advance(e.opts.TombstoneRetention)
	if _, n, err := e.s.Sweep(e.ctx); err != nil || n != 1 {
		t.Fatalf("Sweep at tombstone retention = %d deleted, %v; want 1", n, err)
	}
	again := e.exec(c, e.ap.outcome(ledger.Outcome{State: ledger.StateFailed, Error: &ledger.OpError{Code: "downstream_error", Message: "second"}}))
	wantKind(t, again, ledger.DecisionExecuted)
	d = e.exec(c, e.ap.succeed(ResultOrder))
	wantKind(t, d, ledger.DecisionReplay)
	if d.Record.State != ledger.StateFailed || d.Record.Incarnation != again.Record.Incarnation || d.Record.Result != nil {
		t.Errorf("a replay of the key used again read %s, want the new operation's record", recordJSON(t, d.Record))
	}
	e.wantCalls(2)
}
