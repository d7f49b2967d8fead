package ledger

import (
	"context"
	"reflect"
	"testing"
	"time"
)

// auditOnly is a Store whose audit log is entries; it answers nothing
// else.
type auditOnly struct {
	Store
	entries []AuditEntry
}

func (a *auditOnly) AuditLog(_ context.Context, after uint64, limit int) ([]AuditEntry, error) {
	var out []AuditEntry
	for _, e := range a.entries {
		if e.Seq > after && (limit <= 0 || len(out) < limit) {
			out = append(out, e)
		}
	}
	return out, nil
}

// statsLog is a tenant's history over three hours (and another tenant's
// entry that must not count).
func statsLog(h0 time.Time) []AuditEntry {
	h := func(n int, m int) time.Time { return h0.Add(time.Duration(n)*time.Hour + time.Duration(m)*time.Minute) }
	a := Actor{Tenant: "t1", Principal: "agent"}
	tr := func(at time.Time, key string, before, after State, decision AuditDecision) AuditEntry {
		return AuditEntry{At: at, Event: "transition", Actor: a, Key: key, StateBefore: before, StateAfter: after, Decision: decision}
	}
	call := func(at time.Time, key string, d DecisionKind) AuditEntry {
		return AuditEntry{At: at, Event: "call", Actor: a, Key: key, Decision: AuditDecision(d)}
	}
	log := []AuditEntry{
		tr(h(0, 1), "a", "", StateInProgress, "claimed"),
		tr(h(0, 2), "a", StateInProgress, StateSucceeded, "completed"),
		tr(h(0, 3), "b", "", StateInProgress, "claimed"),
		tr(h(0, 4), "b", StateInProgress, StateUnknown, "completed"),
		call(h(1, 0), "a", DecisionReplay),
		call(h(1, 1), "a", DecisionMismatch),
		tr(h(1, 2), "d", "", StateAwaitingApproval, "suspected_duplicate of a"),
		tr(h(1, 3), "d", StateAwaitingApproval, StateInProgress, "approved by boss"),
		tr(h(1, 4), "d", StateInProgress, StateSucceeded, "executed after approval"),
		{At: h(1, 5), Event: "answer", Actor: a, Key: "a"}, // counts nothing
		{At: h(2, 0), Event: "transition", Actor: a, Key: "b", StateBefore: StateUnknown, StateAfter: StateSucceeded, Decision: "resolved", Settled: SettledResolvedByHand},
		tr(h(2, 1), "c", "", StateInProgress, "claimed"),
		tr(h(2, 2), "c", StateInProgress, StateSucceeded, "completed"),
		tr(h(2, 3), "c", StateSucceeded, StateInProgress, "bug"),
		tr(h(2, 4), "c", StateInProgress, StateSucceeded, "completed"), // a second execution: a duplicate side effect
		call(h(2, 5), "e", DecisionExpired),
		{At: h(2, 6), Event: "call", Actor: Actor{Tenant: "t2"}, Key: "x", Decision: AuditDecision(DecisionReplay)},
	}
	for i := range log {
		log[i].Seq = uint64(i + 1)
	}
	return log
}

// TestStatsCounterIncremental: a counter updated as the log grows reaches
// the numbers ComputeStats computes from the whole log at once, and each
// hour's bucket counts what happened in that hour.
func TestStatsCounterIncremental(t *testing.T) {
	ctx := context.Background()
	h0 := time.Date(2026, 3, 4, 10, 0, 0, 0, time.UTC)
	log := statsLog(h0)
	whole, err := ComputeStats(ctx, &auditOnly{entries: log}, "t1")
	if err != nil {
		t.Fatal(err)
	}
	want := Stats{Operations: 4, Calls: 7, Executions: 4, DuplicateSideEffects: 1, ReplaysServed: 1, MismatchesRefused: 1,
		SuspectedDuplicates: 1, FalseDedupes: 1, Unknown: 1, Settled: map[string]int{"resolved_by_hand": 1}, LateReplays: 1, RetryAmplification: 1.75}
	if !reflect.DeepEqual(whole, want) {
		t.Errorf("ComputeStats =\n%+v, want\n%+v", whole, want)
	}

	c := NewStatsCounter("t1")
	store := &auditOnly{}
	for i := range log { // one entry appended at a time
		store.entries = log[:i+1]
		if err := c.Update(ctx, store); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.Stats(); !reflect.DeepEqual(got, whole) {
		t.Errorf("incremental = %+v, want %+v", got, whole)
	}
	if c.Read() != uint64(len(log)) {
		t.Errorf("Read = %d, want %d", c.Read(), len(log))
	}

	hours := c.Series(h0.Add(2*time.Hour+30*time.Minute), time.Hour, 4)
	type row struct {
		start                                          time.Time
		ops, calls, dups, replays, mismatches, unknown int
		settled, suspects, falseDedupes, late          int
	}
	var got []row
	for _, b := range hours {
		got = append(got, row{b.Start, b.Operations, b.Calls, b.DuplicateSideEffects, b.ReplaysServed, b.MismatchesRefused, b.Unknown,
			b.Settled["resolved_by_hand"], b.SuspectedDuplicates, b.FalseDedupes, b.LateReplays})
	}
	wantRows := []row{
		{start: h0.Add(-time.Hour)},
		{start: h0, ops: 2, calls: 2, unknown: 1},
		{start: h0.Add(time.Hour), ops: 1, calls: 3, replays: 1, mismatches: 1, suspects: 1, falseDedupes: 1},
		{start: h0.Add(2 * time.Hour), ops: 1, calls: 2, dups: 1, settled: 1, late: 1},
	}
	if !reflect.DeepEqual(got, wantRows) {
		t.Errorf("hourly series =\n%+v, want\n%+v", got, wantRows)
	}
	if r := hours[2].RetryAmplification; r != 3 {
		t.Errorf("hour 2 retry amplification = %v, want 3 (3 calls, 1 operation)", r)
	}
	days := c.Series(h0, 24*time.Hour, 2)
	if days[1].Start != h0.Truncate(24*time.Hour) || days[1].Operations != 4 || days[1].Calls != 7 || days[0].Operations != 0 {
		t.Errorf("daily series = %+v, want today with every operation", days)
	}
}

// TestStatsCounterKeepsBoundedBuckets: however long the log, the counter
// keeps at most StatsKeepBuckets hourly buckets; the totals count all.
func TestStatsCounterKeepsBoundedBuckets(t *testing.T) {
	h0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var log []AuditEntry
	for i := range 2000 {
		log = append(log, AuditEntry{Seq: uint64(i + 1), At: h0.Add(time.Duration(i) * time.Hour), Event: "call", Actor: Actor{Tenant: "t1"}, Key: "k", Decision: AuditDecision(DecisionReplay)})
	}
	c := NewStatsCounter("")
	if err := c.Update(context.Background(), &auditOnly{entries: log}); err != nil {
		t.Fatal(err)
	}
	if len(c.buckets) > StatsKeepBuckets {
		t.Errorf("%d buckets kept, want at most %d", len(c.buckets), StatsKeepBuckets)
	}
	if got := c.Stats().ReplaysServed; got != 2000 {
		t.Errorf("replays = %d, want 2000", got)
	}
}
