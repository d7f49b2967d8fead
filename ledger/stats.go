package ledger

import (
	"context"
	"maps"
	"time"
)

// Stats are the reliability numbers the project keeps apart (DESIGN §7),
// computed from the audit log.
type Stats struct {
	// Operations counts distinct operations seen in transitions: a (tenant,
	// key), or more than one when the key was used again after the sweep
	// deleted its tombstone (an "deleted" audit entry) — a new operation.
	Operations int `json:"operations"`
	Calls      int `json:"calls"` // tool calls answered by the ledger (refusals before it excluded)
	// RetryAmplification is calls per operation: how often the same intent
	// was sent. 1.0 means nobody retried.
	RetryAmplification float64 `json:"retry_amplification"`
	Executions         int     `json:"executions"` // operations that reached succeeded
	// DuplicateSideEffects counts operations that reached succeeded more
	// than once (extra executions). Must be 0. An operation under a key
	// freed by the deletion of its tombstone is a new operation, not a
	// duplicate; one created under a key whose earlier operation was never
	// deleted is counted with it.
	DuplicateSideEffects int `json:"duplicate_side_effects"`
	ReplaysServed        int `json:"replays_served"`
	MismatchesRefused    int `json:"fingerprint_mismatches_refused"`
	InvalidRefused       int `json:"invalid_arguments_refused"`
	SuspectedDuplicates  int `json:"suspected_duplicates_held"`
	// FalseDedupes counts suspected duplicates an approver then approved:
	// requests the duplicate rule held that were meant as new intents.
	FalseDedupes int `json:"false_dedupes"`
	// Unknown counts operations whose outcome became unknown, and Settled
	// how each was settled, by how (reconciled_found, reconciled_absent_retry,
	// reconciled_absent_needs_approval, resolved_by_hand, other).
	Unknown     int            `json:"unknown_outcomes"`
	Settled     map[string]int `json:"unknown_settled"`
	StillUnsure int            `json:"unknown_unsettled"`
	// LateReplays counts calls that arrived after retention and got
	// key_expired instead of a re-execution.
	LateReplays int `json:"late_replays_after_retention"`
}

// ComputeStats reads the whole audit log (for tenant, or every tenant when
// tenant is "") and returns the numbers.
func ComputeStats(ctx context.Context, s Store, tenant string) (Stats, error) {
	c := NewStatsCounter(tenant)
	if err := c.Update(ctx, s); err != nil {
		return c.Stats(), err
	}
	return c.Stats(), nil
}

// StatsBucketWidth is the width of StatsCounter's time buckets.
const StatsBucketWidth = time.Hour

// StatsKeepBuckets is how many hourly buckets a StatsCounter keeps: 31
// days. Older ones are dropped; the totals keep counting them.
const StatsKeepBuckets = 31 * 24

// StatsBucket is what happened in one span of time: each number of Stats
// counted by the time of the audit entry that made it (an operation by its
// first transition, a duplicate side effect by its extra execution, a
// settlement by the transition that settled). StillUnsure is not kept per
// bucket; RetryAmplification is the bucket's calls over its operations.
type StatsBucket struct {
	Start time.Time `json:"start"`
	Stats
}

// StatsCounter computes Stats from the audit log incrementally: Update
// reads only the entries appended since the previous Update, so a caller
// that keeps one (the console) pays for the whole log once and then for
// what is new. Its memory grows with the tenant's operations (as
// ComputeStats's does) plus at most StatsKeepBuckets buckets. ComputeStats
// is one Update of a new counter: the numbers are the same computation.
// Not safe for concurrent use; the caller serialises.
type StatsCounter struct {
	tenant string
	after  uint64 // the last audit entry read

	incarnation map[statsKey]int  // the key's current operation
	freed       map[statsKey]bool // its tombstone was deleted: the next record is a new operation
	ops         map[statsOp]bool
	succeeded   map[statsOp]int
	unknownNow  map[statsOp]bool
	suspect     map[statsOp]bool

	total   Stats
	buckets map[int64]*Stats // by the bucket's start, Unix seconds
}

type statsKey struct{ tenant, key string }

type statsOp struct {
	statsKey
	incarnation int // operations under the key so far, less one
}

// NewStatsCounter returns a counter of tenant's numbers (every tenant's
// when tenant is "") that has read nothing yet.
func NewStatsCounter(tenant string) *StatsCounter {
	return &StatsCounter{
		tenant: tenant, incarnation: map[statsKey]int{}, freed: map[statsKey]bool{},
		ops: map[statsOp]bool{}, succeeded: map[statsOp]int{}, unknownNow: map[statsOp]bool{}, suspect: map[statsOp]bool{},
		total: Stats{Settled: map[string]int{}}, buckets: map[int64]*Stats{},
	}
}

// Read is the sequence number of the last audit entry the counter has
// read (0: none).
func (c *StatsCounter) Read() uint64 { return c.after }

// Update reads the audit entries appended since the last Update, 10000
// at a time, and counts them. On an error the entries read before it stay
// counted and the next Update goes on from there.
func (c *StatsCounter) Update(ctx context.Context, s Store) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		entries, err := s.AuditLog(ctx, c.after, 10000)
		if err != nil {
			return err
		}
		for _, e := range entries {
			c.after = e.Seq
			c.add(e)
		}
		if len(entries) < 10000 {
			c.prune()
			return nil
		}
	}
}

// add counts e into the totals and into e's time bucket.
func (c *StatsCounter) add(e AuditEntry) {
	if c.tenant != "" && e.Actor.Tenant != c.tenant {
		return
	}
	var d Stats // what e adds
	kk := statsKey{e.Actor.Tenant, e.Key}
	if e.Event == EventTransition && e.StateBefore == "" && c.freed[kk] {
		c.incarnation[kk]++
		delete(c.freed, kk)
	}
	k := statsOp{kk, c.incarnation[kk]}
	settled := ""
	switch e.Event {
	case EventDeleted:
		c.freed[kk] = true
	case EventCall:
		if e.Is(AuditRefused) {
			if e.ErrorCode == string(CodeInvalidArguments) {
				d.InvalidRefused++
			}
			break // refused before the ledger: no operation to count it against
		}
		if e.Key == "" {
			break
		}
		d.Calls++
		switch DecisionKind(e.Decision) {
		case DecisionReplay:
			d.ReplaysServed++
		case DecisionMismatch:
			d.MismatchesRefused++
		case DecisionExpired:
			d.LateReplays++
		}
	case EventTransition:
		if !c.ops[k] {
			c.ops[k] = true
			d.Operations++
		}
		if e.StateBefore == "" || e.StateBefore == StateRetryable {
			d.Calls++ // the call that claimed it
		}
		if e.Is(AuditSuspectedDuplicate) {
			d.SuspectedDuplicates++
			c.suspect[k] = true
		}
		if c.suspect[k] && e.Is(AuditApprovedBy) {
			d.FalseDedupes++
		}
		if e.StateAfter == StateSucceeded && e.StateBefore != StateSucceeded {
			c.succeeded[k]++
			if c.succeeded[k] == 1 {
				d.Executions++
			} else {
				d.DuplicateSideEffects++
			}
		}
		if e.StateAfter == StateUnknown && e.StateBefore != StateUnknown {
			d.Unknown++
			c.unknownNow[k] = true
		}
		if e.StateBefore == StateUnknown && e.StateAfter != StateUnknown {
			delete(c.unknownNow, k)
			settled = string(e.SettledHow())
		}
	}
	if settled == "" && d.Operations+d.Calls+d.Executions+d.DuplicateSideEffects+d.ReplaysServed+d.MismatchesRefused+
		d.InvalidRefused+d.SuspectedDuplicates+d.FalseDedupes+d.Unknown+d.LateReplays == 0 {
		return // counts nothing (an answer, say): no bucket for it
	}
	c.total.addCounts(d, settled)
	start := e.At.UTC().Truncate(StatsBucketWidth).Unix()
	b := c.buckets[start]
	if b == nil {
		b = &Stats{}
		c.buckets[start] = b
	}
	b.addCounts(d, settled)
}

// addCounts adds d's counters, and a settlement when settled is not "".
func (st *Stats) addCounts(d Stats, settled string) {
	st.Operations += d.Operations
	st.Calls += d.Calls
	st.Executions += d.Executions
	st.DuplicateSideEffects += d.DuplicateSideEffects
	st.ReplaysServed += d.ReplaysServed
	st.MismatchesRefused += d.MismatchesRefused
	st.InvalidRefused += d.InvalidRefused
	st.SuspectedDuplicates += d.SuspectedDuplicates
	st.FalseDedupes += d.FalseDedupes
	st.Unknown += d.Unknown
	st.LateReplays += d.LateReplays
	if settled != "" {
		if st.Settled == nil {
			st.Settled = map[string]int{}
		}
		st.Settled[settled]++
	}
}

// prune drops the buckets before the newest StatsKeepBuckets hours.
func (c *StatsCounter) prune() {
	if len(c.buckets) <= StatsKeepBuckets {
		return
	}
	var newest int64
	for start := range c.buckets {
		newest = max(newest, start)
	}
	cut := newest - int64(StatsKeepBuckets*StatsBucketWidth/time.Second)
	for start := range c.buckets {
		if start <= cut {
			delete(c.buckets, start)
		}
	}
}

// Stats returns the numbers so far.
func (c *StatsCounter) Stats() Stats {
	st := c.total
	st.Settled = maps.Clone(c.total.Settled)
	st.StillUnsure = len(c.unknownNow)
	if st.Operations > 0 {
		st.RetryAmplification = float64(st.Calls) / float64(st.Operations)
	}
	return st
}

// Series returns n buckets of width each (a multiple of StatsBucketWidth),
// oldest first, the last one holding until: each sums the hourly buckets
// it covers. A span older than the kept buckets reads as zero.
func (c *StatsCounter) Series(until time.Time, width time.Duration, n int) []StatsBucket {
	if width < StatsBucketWidth {
		width = StatsBucketWidth
	}
	width = width.Truncate(StatsBucketWidth)
	end := until.UTC().Truncate(width).Add(width) // the end of the bucket holding until
	out := make([]StatsBucket, n)
	for i := range out {
		out[i].Start = end.Add(-time.Duration(n-i) * width)
	}
	for start, b := range c.buckets {
		t := time.Unix(start, 0).UTC()
		if t.Before(out[0].Start) || !t.Before(end) {
			continue
		}
		i := int(t.Sub(out[0].Start) / width)
		out[i].addCounts(*b, "")
		for how, v := range b.Settled {
			if out[i].Settled == nil {
				out[i].Settled = map[string]int{}
			}
			out[i].Settled[how] += v
		}
	}
	for i := range out {
		if out[i].Operations > 0 {
			out[i].RetryAmplification = float64(out[i].Calls) / float64(out[i].Operations)
		}
	}
	return out
}
