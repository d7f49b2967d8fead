package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"idemgate/ledger"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	bbolt "go.etcd.io/bbolt"
)

// The retention sweep works in small transactions that yield to claims.
// These tests count the transactions (a count, not a time: the machine
// may be loaded); BenchmarkSweepClaimWait measures how long claims wait
// while a sweep runs.

// countingBackend counts the Update transactions a ledger runs, the
// records each one writes, and the audit entries they step through.
type countingBackend struct {
	ledger.Backend
	mu         sync.Mutex
	updates    int             // updates that wrote at least one record
	maxRecords int             // the most records one update wrote
	durations  []time.Duration // of the updates that wrote records
	auditSteps int             // audit cursor moves (Seek, Next, Prev) in updates
}

func (c *countingBackend) Update(ctx context.Context, fn func(ledger.BTx) error) error {
	var puts, steps int
	start := time.Now()
	err := c.Backend.Update(ctx, func(tx ledger.BTx) error {
		puts, steps = 0, 0 // fn may run twice (group commit)
		return fn(countingTx{BTx: tx, puts: &puts, steps: &steps})
	})
	if err == nil {
		c.mu.Lock()
		c.auditSteps += steps
		if puts > 0 {
			c.updates++
			c.maxRecords = max(c.maxRecords, puts)
			c.durations = append(c.durations, time.Since(start))
		}
		c.mu.Unlock()
	}
	return err
}

type countingTx struct {
	ledger.BTx
	puts, steps *int
}

func (t countingTx) Bucket(name []byte) ledger.Bucket {
	b := t.BTx.Bucket(name)
	switch {
	case b == nil:
		return b
	case string(name) == ledger.RecordsCollection:
		return countingBucket{Bucket: b, puts: t.puts}
	case string(name) == ledger.AuditCollection:
		return auditCountingBucket{Bucket: b, steps: t.steps}
	}
	return b
}

// auditCountingBucket counts the moves of its cursors that read past the
// log's ends (First and Last are how a transaction finds them).
type auditCountingBucket struct {
	ledger.Bucket
	steps *int
}

func (b auditCountingBucket) Cursor() ledger.Cursor {
	return auditCountingCursor{Cursor: b.Bucket.Cursor(), steps: b.steps}
}

type auditCountingCursor struct {
	ledger.Cursor
	steps *int
}

func (c auditCountingCursor) Seek(k []byte) ([]byte, []byte) { *c.steps++; return c.Cursor.Seek(k) }
func (c auditCountingCursor) Next() ([]byte, []byte)         { *c.steps++; return c.Cursor.Next() }
func (c auditCountingCursor) Prev() ([]byte, []byte)         { *c.steps++; return c.Cursor.Prev() }

type countingBucket struct {
	ledger.Bucket
	puts *int
}

func (b countingBucket) Put(k, v []byte) error {
	*b.puts++
	return b.Bucket.Put(k, v)
}

// sweepTenant is the tenant of the generated due records.
const sweepTenant = "sweep"

// writeDueRecords writes n finished records to the ledger file at path,
// each completed two hours ago with its retention entry (compaction to a
// tombstone) due an hour ago, as earlier builds wrote them: raw bbolt, in
// big transactions, so a large file is quick to make.
func writeDueRecords(t testing.TB, path string, n int) {
	t.Helper()
	writeRecordsAgo(t, path, n, true)
}

// writeRecordsAgo is writeDueRecords, with the retention entries (as
// earlier builds wrote them) or without (as this one does: the sweep
// finds the records by their first-seen time).
func writeRecordsAgo(t testing.TB, path string, n int, entries bool) {
	t.Helper()
	writeSweepRecords(t, path, n, entries, false)
}

// writeSweepRecords is writeRecordsAgo, with keys in the order of their
// first-seen time (random false), or in an order unrelated to it (random
// true: an agent's keys, which the records collection stores far from
// each other).
func writeSweepRecords(t testing.TB, path string, n int, entries, random bool) {
	t.Helper()
	s, err := Open(path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{NoSync: true, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	base := time.Now().Add(-2*time.Hour - time.Duration(n)*time.Millisecond).UTC()
	const chunk = 50_000
	for lo := 0; lo < n; lo += chunk {
		err := db.Update(func(tx *bbolt.Tx) error {
			times, exp := tx.Bucket(bucketByTime), tx.Bucket([]byte("expiry"))
			for i := lo; i < min(lo+chunk, n); i++ {
				key := fmt.Sprintf("00000000-0000-4000-9000-%012d", i)
				if random {
					key = uuid.NewSHA1(uuid.Nil, []byte(key)).String()
				}
				at := base.Add(time.Duration(i) * time.Millisecond)
				rec := succeededRecord(sweepTenant, key, at)
				if err := putRecord(tx, rec); err != nil {
					return err
				}
				if err := times.Put(timeKey(at, sweepTenant, key), nil); err != nil {
					return err
				}
				if !entries {
					continue
				}
				// expiry: due (8 bytes BE ns) action tenant \x00 key → action
				due := append(append(be64(uint64(at.Add(time.Hour).UnixNano())), 'r'), recordKey(sweepTenant, key)...)
				if err := exp.Put(due, []byte{'r'}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Sync(); err != nil {
		t.Fatal(err)
	}
}

// openCounting opens the ledger at path over a countingBackend.
func openCounting(t testing.TB, path string, opts ledger.Options) (*ledger.Ledger, *countingBackend) {
	t.Helper()
	be, err := openBackend(path, openReadWrite, false, 0)
	if err != nil {
		t.Fatal(err)
	}
	cb := &countingBackend{Backend: be}
	l := ledger.New(cb, opts)
	t.Cleanup(func() { l.Close() })
	return l, cb
}

// TestSweepSmallTransactions: a sweep of many due records commits them in
// many transactions of at most 20 records each (the ledger's sweepChunk),
// never one big one, and compacts every record.
func TestSweepSmallTransactions(t *testing.T) {
	t.Run("entries", func(t *testing.T) { testSweepSmallTransactions(t, true) })
	t.Run("walk", func(t *testing.T) { testSweepSmallTransactions(t, false) })
}

// testSweepSmallTransactions is TestSweepSmallTransactions over records
// with their retention entries (earlier builds) or without (this one).
func testSweepSmallTransactions(t *testing.T, entries bool) {
	const n = 5000
	path := filepath.Join(t.TempDir(), "ledger.db")
	writeRecordsAgo(t, path, n, entries)
	l, cb := openCounting(t, path, ledger.Options{Retention: time.Hour})
	compacted, deleted, err := l.Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if compacted != n || deleted != 0 {
		t.Fatalf("Sweep = %d compacted, %d deleted; want %d, 0", compacted, deleted, n)
	}
	const maxPerTx = 20
	if cb.maxRecords > maxPerTx {
		t.Errorf("one sweep transaction wrote %d records; want at most %d", cb.maxRecords, maxPerTx)
	}
	if cb.updates < n/maxPerTx {
		t.Errorf("the sweep used %d transactions; want at least %d", cb.updates, n/maxPerTx)
	}
	rec, err := l.Get(context.Background(), sweepTenant, "00000000-0000-4000-9000-000000000007")
	if err != nil {
		t.Fatal(err)
	}
	if !rec.Tombstone || rec.Result != nil {
		t.Errorf("record after the sweep: tombstone %v, result %s; want a tombstone without its result", rec.Tombstone, rec.Result)
	}
}

// TestSweepYieldsToClaims runs claims while a sweep works through many due
// records: every claim is served during the sweep (none waits for its
// end), and the sweep still compacts every record. The claims' waits are
// logged, not asserted (the machine's load decides them).
func TestSweepYieldsToClaims(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 20k records")
	}
	const n = 20_000
	path := filepath.Join(t.TempDir(), "ledger.db")
	writeDueRecords(t, path, n)
	l, _ := openCounting(t, path, ledger.Options{Retention: time.Hour})
	res := sweepWithClaims(t, l, 2)
	if res.compacted != n {
		t.Fatalf("Sweep compacted %d; want %d", res.compacted, n)
	}
	if len(res.waits) == 0 {
		t.Fatalf("no claim finished while the sweep ran (%v): claims waited for the whole sweep", res.sweep)
	}
	t.Logf("sweep of %d due records: %v; %d claims during it, wait p50 %v, max %v", n, res.sweep, len(res.waits), res.p(0.5), res.p(1))
}

type sweepRun struct {
	compacted int
	sweep     time.Duration
	waits     []time.Duration // claims that started and ended during the sweep, sorted
}

func (r sweepRun) p(q float64) time.Duration {
	if len(r.waits) == 0 {
		return 0
	}
	return r.waits[min(len(r.waits)-1, int(q*float64(len(r.waits))))]
}

// sweepWithClaims sweeps l while callers goroutines claim and execute new
// keys back to back, and returns the latencies of the claims made during
// the sweep.
func sweepWithClaims(t testing.TB, l *ledger.Ledger, callers int) sweepRun {
	t.Helper()
	ctx := context.Background()
	var (
		done  atomic.Bool
		mu    sync.Mutex
		waits []time.Duration
		wg    sync.WaitGroup
		a     applier
	)
	for range callers {
		wg.Go(func() {
			for !done.Load() {
				start := time.Now()
				d, err := l.Execute(ctx, newClaim("claims", "create_order", "fp-"+uuid.NewString()), a.succeed(`{"ok":true}`))
				took := time.Since(start)
				if err != nil || d.Kind != ledger.DecisionExecuted {
					t.Errorf("Execute during the sweep = %v, %v", d.Kind, err)
					return
				}
				if !done.Load() {
					mu.Lock()
					waits = append(waits, took)
					mu.Unlock()
				}
			}
		})
	}
	time.Sleep(20 * time.Millisecond) // the callers are running
	start := time.Now()
	c, _, err := l.Sweep(ctx)
	took := time.Since(start)
	done.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(waits)
	return sweepRun{compacted: c, sweep: took, waits: waits}
}

// BenchmarkSweepClaimWait measures the retention sweep of many due records
// (IDEMGATE_SWEEP_RECORDS, default 100000; 1000000 with
// IDEMGATE_BENCH_LARGE=1) while 2 callers claim new keys, and reports the
// claims' p50 and max latency during the sweep beside the same callers'
// latency with no sweep (the floor, measured in the same run, after the
// sweep, over as many claims as were made during it: the worst of fewer
// claims would be a lower bar). The records are as this build writes
// them (no retention entry; the sweep walks their first-seen times) under
// random keys (as agents choose them, so that a sweep transaction's
// records lie on pages far apart); IDEMGATE_SWEEP_LAYOUT=sequential
// writes them as the benchmark did up to commit 39354c9 instead: keys in
// first-seen order, each with its retention entry as earlier builds wrote
// it. Run with -benchtime=1x: one sweep.
func BenchmarkSweepClaimWait(b *testing.B) {
	n := 100_000
	if os.Getenv("IDEMGATE_BENCH_LARGE") == "1" {
		n = 1_000_000
	}
	if v, err := strconv.Atoi(os.Getenv("IDEMGATE_SWEEP_RECORDS")); err == nil && v > 0 {
		n = v
	}
	sequential := os.Getenv("IDEMGATE_SWEEP_LAYOUT") == "sequential"
	for range b.N {
		b.StopTimer()
		path := filepath.Join(b.TempDir(), "ledger.db")
		writeSweepRecords(b, path, n, sequential, !sequential)
		l, cb := openCounting(b, path, ledger.Options{Retention: time.Hour})
		b.StartTimer()
		res := sweepWithClaims(b, l, 2)
		b.StopTimer()
		if res.compacted != n {
			b.Fatalf("Sweep compacted %d; want %d", res.compacted, n)
		}
		behind := cb.Backend.(*backend).commitStats()
		floor := claimsAlone(b, l, 2, len(res.waits), 2*time.Minute)
		b.ReportMetric(res.sweep.Seconds(), "sweep-s")
		b.ReportMetric(float64(len(res.waits)), "claims-during-sweep")
		b.ReportMetric(float64(res.p(0.5).Microseconds())/1000, "claim-p50-ms")
		b.ReportMetric(float64(res.p(0.99).Microseconds())/1000, "claim-p99-ms")
		b.ReportMetric(float64(res.p(1).Microseconds())/1000, "claim-max-ms")
		b.ReportMetric(float64(floor.p(0.5).Microseconds())/1000, "floor-p50-ms")
		b.ReportMetric(float64(floor.p(0.99).Microseconds())/1000, "floor-p99-ms")
		b.ReportMetric(float64(floor.p(1).Microseconds())/1000, "floor-max-ms")
		b.ReportMetric(float64(cb.maxRecords), "max-records-per-tx")
		b.ReportMetric(float64(behind.BehindBackgroundMax.Microseconds())/1000, "behind-sweep-max-ms")
		b.ReportMetric(float64(behind.BehindBackground), "behind-sweep-txs")
		slices.Sort(cb.durations)
		b.Logf("%d write transactions: p50 %v, p99 %v, max %v", len(cb.durations), cb.durations[len(cb.durations)/2], cb.durations[len(cb.durations)*99/100], cb.durations[len(cb.durations)-1])
		b.Logf("%d transactions waited for a sweep transaction, the longest %v", behind.BehindBackground, behind.BehindBackgroundMax)
		b.Logf("%d due records: sweep %v; %d claims during it, p50 %v p99 %v max %v; without a sweep p50 %v p99 %v max %v (%d claims)",
			n, res.sweep.Round(time.Millisecond), len(res.waits), res.p(0.5), res.p(0.99), res.p(1), floor.p(0.5), floor.p(0.99), floor.p(1), len(floor.waits))
	}
}

// claimsAlone runs callers goroutines claiming new keys, with no sweep,
// until they have made n claims or d has passed, and returns their
// latencies: the floor to compare with.
func claimsAlone(t testing.TB, l *ledger.Ledger, callers, n int, d time.Duration) sweepRun {
	t.Helper()
	ctx := context.Background()
	var (
		mu    sync.Mutex
		waits []time.Duration
		wg    sync.WaitGroup
		a     applier
	)
	end := time.Now().Add(d)
	for range callers {
		wg.Go(func() {
			for time.Now().Before(end) {
				start := time.Now()
				if _, err := l.Execute(ctx, newClaim("claims", "create_order", "fp-"+uuid.NewString()), a.succeed(`{"ok":true}`)); err != nil {
					t.Error(err)
					return
				}
				took := time.Since(start)
				mu.Lock()
				waits = append(waits, took)
				enough := len(waits) >= n
				mu.Unlock()
				if enough {
					return
				}
			}
		})
	}
	wg.Wait()
	slices.Sort(waits)
	return sweepRun{waits: waits}
}

// keyIndex returns the per-key audit index entries of (tenant, key) in the
// file at path: the sequence number in each key, and its value.
func keyIndex(t *testing.T, path, tenant, key string) (seqs []uint64, values [][]byte) {
	t.Helper()
	rawUpdate(t, path, func(tx *bbolt.Tx) error {
		p := []byte(tenant + "\x00" + key + "\x00")
		c := tx.Bucket(bucketAuditByKey).Cursor()
		for k, v := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, v = c.Next() {
			seqs = append(seqs, binary.BigEndian.Uint64(k[len(p):]))
			values = append(values, bytes.Clone(v))
		}
		return nil
	})
	return seqs, values
}

func auditSeqsOf(entries []ledger.AuditEntry) []uint64 {
	var out []uint64
	for _, e := range entries {
		out = append(out, e.Seq)
	}
	return out
}

// TestSweepDeletionKeepsHistory: deleting a tombstone keeps its key's
// history whole — AuditForKey returns the same entries in the same order,
// and the deletion's own entry after them, including the entries found
// only by the scan near the record's transitions (the answer and the
// replay right after the execution) — while the sweep reads no audit entry
// for it and leaves one index entry for the record's transitions. An index
// as the build before left it (an entry per audit entry) reads the same.
// PruneAudit cut right after the transitions keeps the entries near them,
// and a prune of everything leaves none of the key's index entries.
func TestSweepDeletionKeepsHistory(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	opts := ledger.Options{Now: clock.Now, Elapsed: clock.Elapsed, Retention: time.Hour, TombstoneRetention: time.Hour}
	path := filepath.Join(t.TempDir(), "ledger.db")
	if err := mustOpenPath(t, path, opts).Close(); err != nil { // creates the file
		t.Fatal(err)
	}
	l, cb := openCounting(t, path, opts)
	ap := &applier{}
	a := newClaim("t1", "create_order", "fp-a")
	if d, err := l.Execute(ctx, a, ap.succeed(`{"ok":true}`)); err != nil || d.Kind != ledger.DecisionExecuted {
		t.Fatalf("Execute = %v, %v", d.Kind, err)
	}
	clock.Advance(time.Second)
	cut := clock.Now() // a prune before it removes only the execution
	l.Audit(ledger.AuditEntry{Event: ledger.EventAnswer, Actor: a.Actor, Tool: a.Tool, Key: a.Key, StateAfter: ledger.StateSucceeded})
	if d, err := l.Execute(ctx, a, ap.succeed(`{"ok":true}`)); err != nil || d.Kind != ledger.DecisionReplay {
		t.Fatalf("replay = %v, %v", d.Kind, err)
	}
	for i := range 300 { // entries of other keys: what follows is not near
		l.Audit(ledger.AuditEntry{Event: ledger.EventCall, Actor: testActor("t1"), Tool: "get_order", Key: fmt.Sprint("other-", i), Decision: "read"})
	}
	if _, err := l.Execute(ctx, a, ap.succeed(`{"ok":true}`)); err != nil { // a late replay, indexed
		t.Fatal(err)
	}
	before, total, err := l.AuditForKey(ctx, "t1", a.Key, 0)
	if err != nil || total != len(before) || len(before) < 4 {
		t.Fatalf("AuditForKey before = %v (total %d), %v; want the execution, the answer and two replays", summary(before), total, err)
	}

	clock.Advance(opts.Retention)
	if c, _, err := l.Sweep(ctx); err != nil || c != 1 {
		t.Fatalf("Sweep at retention = %d compacted, %v", c, err)
	}
	clock.Advance(opts.TombstoneRetention)
	cb.mu.Lock()
	cb.auditSteps = 0
	cb.mu.Unlock()
	if _, d, err := l.Sweep(ctx); err != nil || d != 1 {
		t.Fatalf("Sweep at tombstone retention = %d deleted, %v", d, err)
	}
	if cb.auditSteps != 0 {
		t.Errorf("the deletion stepped through %d audit entries; want none", cb.auditSteps)
	}
	after, total, err := l.AuditForKey(ctx, "t1", a.Key, 0)
	if err != nil || total != len(after) {
		t.Fatalf("AuditForKey after = %v (total %d), %v", summary(after), total, err)
	}
	if len(after) != len(before)+1 || !slices.Equal(auditSeqsOf(after[:len(before)]), auditSeqsOf(before)) || after[len(before)].Event != ledger.EventDeleted {
		t.Fatalf("history after the deletion = %v %v; want %v %v and the deletion", auditSeqsOf(after), summary(after), auditSeqsOf(before), summary(before))
	}
	for i, e := range before {
		if after[i].Hash != e.Hash {
			t.Errorf("entry %d after the deletion is not the one before", e.Seq)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	seqs, values := keyIndex(t, path, "t1", a.Key)
	sets := 0
	for _, v := range values {
		if len(v) > 0 {
			sets++
		}
	}
	// The late replay, the deletion, and the record's transitions.
	if len(seqs) != 3 || sets != 1 {
		t.Errorf("the key's index entries: %v (%d with numbers); want the late replay, the deletion and one for the record's transitions", seqs, sets)
	}

	t.Run("index of the build before", func(t *testing.T) {
		old := filepath.Join(t.TempDir(), "old.db")
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(old, b, 0o600); err != nil {
			t.Fatal(err)
		}
		// As the build before deleted it: an entry per audit entry.
		rawUpdate(t, old, func(tx *bbolt.Tx) error {
			idx := tx.Bucket(bucketAuditByKey)
			for _, seq := range seqs {
				if err := idx.Delete(append([]byte("t1\x00"+a.Key+"\x00"), be64(seq)...)); err != nil {
					return err
				}
			}
			for _, e := range after {
				if err := idx.Put(append([]byte("t1\x00"+a.Key+"\x00"), be64(e.Seq)...), nil); err != nil {
					return err
				}
			}
			return nil
		})
		s := mustOpenPath(t, old, opts)
		got, _, err := s.AuditForKey(ctx, "t1", a.Key, 0)
		if err != nil || !slices.Equal(auditSeqsOf(got), auditSeqsOf(after)) {
			t.Errorf("old index: AuditForKey = %v, %v; want %v", auditSeqsOf(got), err, auditSeqsOf(after))
		}
	})

	s := mustOpenPath(t, path, opts)
	pruned, err := s.PruneAudit(ctx, cut, testActor("ops"), nil)
	if err != nil || pruned.Entries == 0 || pruned.Anchor.Seq >= before[1].Seq {
		t.Fatalf("PruneAudit before the answer = %+v, %v; want the execution's entries pruned, not the answer (%d)", pruned, err, before[1].Seq)
	}
	var kept []uint64
	for _, e := range after {
		if e.Seq > pruned.Anchor.Seq {
			kept = append(kept, e.Seq)
		}
	}
	got, total, err := s.AuditForKey(ctx, "t1", a.Key, 0)
	if err != nil || total != len(kept) || !slices.Equal(auditSeqsOf(got), kept) {
		t.Errorf("after a prune through %d: AuditForKey = %v (total %d), %v; want %v", pruned.Anchor.Seq, auditSeqsOf(got), total, err, kept)
	}
	clock.Advance(time.Second)
	if _, err := s.PruneAudit(ctx, clock.Now(), testActor("ops"), nil); err != nil {
		t.Fatal(err)
	}
	if got, total, err := s.AuditForKey(ctx, "t1", a.Key, 0); err != nil || total != 0 || len(got) != 0 {
		t.Errorf("after a prune of everything: AuditForKey = %v (total %d), %v; want nothing", summary(got), total, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if seqs, _ := keyIndex(t, path, "t1", a.Key); len(seqs) != 0 {
		t.Errorf("after a prune of everything the key's index holds %v; want nothing", seqs)
	}
}

// TestSweepDeletionAfterPrune: a record deleted after the audit entries
// it numbers were pruned keeps the kept entries near them in its key's
// history, and a later prune of everything leaves none of the key's index
// entries behind.
func TestSweepDeletionAfterPrune(t *testing.T) {
	ctx := context.Background()
	clock := newFakeClock()
	opts := ledger.Options{Now: clock.Now, Elapsed: clock.Elapsed, Retention: time.Hour, TombstoneRetention: time.Hour}
	path := filepath.Join(t.TempDir(), "ledger.db")
	s := mustOpenPath(t, path, opts)
	ap := &applier{}
	a := newClaim("t1", "create_order", "fp-a")
	if _, err := s.Execute(ctx, a, ap.succeed(`{"ok":true}`)); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Second)
	cut := clock.Now()
	s.Audit(ledger.AuditEntry{Event: ledger.EventAnswer, Actor: a.Actor, Tool: a.Tool, Key: a.Key, StateAfter: ledger.StateSucceeded})
	if _, _, err := s.AuditForKey(ctx, "t1", a.Key, 0); err != nil { // written
		t.Fatal(err)
	}
	if p, err := s.PruneAudit(ctx, cut, testActor("ops"), nil); err != nil || p.Entries == 0 {
		t.Fatalf("PruneAudit = %+v, %v", p, err)
	}
	before, _, err := s.AuditForKey(ctx, "t1", a.Key, 0)
	if err != nil || len(before) != 1 || before[0].Event != ledger.EventAnswer {
		t.Fatalf("AuditForKey after the prune = %v, %v; want the answer", summary(before), err)
	}
	clock.Advance(opts.Retention + opts.TombstoneRetention)
	for range 2 { // compacts, then deletes
		if _, _, err := s.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	after, _, err := s.AuditForKey(ctx, "t1", a.Key, 0)
	if err != nil || len(after) != 2 || after[0].Seq != before[0].Seq || after[1].Event != ledger.EventDeleted {
		t.Fatalf("AuditForKey after the deletion = %v, %v; want the answer and the deletion", summary(after), err)
	}
	clock.Advance(time.Second)
	if _, err := s.PruneAudit(ctx, clock.Now(), testActor("ops"), nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if seqs, _ := keyIndex(t, path, "t1", a.Key); len(seqs) != 0 {
		t.Errorf("after a prune of everything the key's index holds %v; want nothing", seqs)
	}
}

// BenchmarkSweepDelete measures a sweep that deletes many tombstones
// (IDEMGATE_SWEEP_RECORDS, default 50000), each numbering two audit
// entries with a third of its key (an answer) right after them, and
// reports the sweep's time and its transactions' (no claims run beside
// it). The audit log is written raw, its hashes placeholders: the sweep
// does not verify the chain. Run with -benchtime=1x.
func BenchmarkSweepDelete(b *testing.B) {
	n := 50_000
	if v, err := strconv.Atoi(os.Getenv("IDEMGATE_SWEEP_RECORDS")); err == nil && v > 0 {
		n = v
	}
	for range b.N {
		b.StopTimer()
		path := filepath.Join(b.TempDir(), "ledger.db")
		s, err := Open(path, ledger.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		db, err := bbolt.Open(path, 0o600, &bbolt.Options{NoSync: true})
		if err != nil {
			b.Fatal(err)
		}
		base := time.Now().Add(-3*time.Hour - time.Duration(n)*time.Millisecond).UTC()
		const chunk = 20_000
		for lo := 0; lo < n; lo += chunk {
			err := db.Update(func(tx *bbolt.Tx) error {
				times, exp, audit, meta := tx.Bucket(bucketByTime), tx.Bucket([]byte("expiry")), tx.Bucket([]byte("audit")), tx.Bucket([]byte("meta"))
				for i := lo; i < min(lo+chunk, n); i++ {
					key := fmt.Sprintf("00000000-0000-4000-9000-%012d", i)
					at := base.Add(time.Duration(i) * time.Millisecond)
					rec := succeededRecord(sweepTenant, key, at)
					rec.Tombstone, rec.Result = true, nil
					rec.AuditSeqs = []uint64{uint64(3*i + 1), uint64(3*i + 2)}
					if err := putRecord(tx, rec); err != nil {
						return err
					}
					if err := times.Put(timeKey(at, sweepTenant, key), nil); err != nil {
						return err
					}
					due := append(append(be64(uint64(at.Add(2*time.Hour).UnixNano())), 't'), recordKey(sweepTenant, key)...)
					if err := exp.Put(due, []byte{'t'}); err != nil {
						return err
					}
					for j := 1; j <= 3; j++ {
						seq := uint64(3*i + j)
						e := fmt.Sprintf(`{"seq":%d,"at":%q,"event":"executed","actor":{"tenant":"sweep","principal":"agent-sweep","role":"agent","client_name":"bench"},"tool":"create_order","key":%q,"fingerprint":"fp-%s","state_after":"succeeded","hash":"%064d","prev_hash":"%064d"}`, seq, at.Format(time.RFC3339Nano), key, key, seq, seq-1)
						if err := audit.Put(be64(seq), []byte(e)); err != nil {
							return err
						}
					}
				}
				return meta.Put([]byte("audit_indexed"), be64(uint64(3*min(lo+chunk, n))))
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		if err := db.Sync(); err != nil {
			b.Fatal(err)
		}
		if err := db.Close(); err != nil {
			b.Fatal(err)
		}
		be, err := openBackend(path, openReadWrite, false, 0)
		if err != nil {
			b.Fatal(err)
		}
		cb := &timingBackend{Backend: be}
		l := ledger.New(cb, ledger.Options{Retention: time.Hour, TombstoneRetention: time.Hour})
		b.Cleanup(func() { l.Close() })
		b.StartTimer()
		start := time.Now()
		_, d, err := l.Sweep(context.Background())
		took := time.Since(start)
		b.StopTimer()
		if err != nil || d != n {
			b.Fatalf("Sweep deleted %d, %v; want %d", d, err, n)
		}
		slices.Sort(cb.durations)
		b.ReportMetric(took.Seconds(), "sweep-s")
		b.ReportMetric(float64(cb.durations[len(cb.durations)/2].Microseconds())/1000, "tx-p50-ms")
		b.ReportMetric(float64(cb.durations[len(cb.durations)*99/100].Microseconds())/1000, "tx-p99-ms")
		b.ReportMetric(float64(cb.durations[len(cb.durations)-1].Microseconds())/1000, "tx-max-ms")
		b.ReportMetric(float64(len(cb.durations)), "write-txs")
	}
}

// timingBackend keeps the duration of every Update a ledger runs.
type timingBackend struct {
	ledger.Backend
	durations []time.Duration
}

func (c *timingBackend) Update(ctx context.Context, fn func(ledger.BTx) error) error {
	start := time.Now()
	err := c.Backend.Update(ctx, fn)
	c.durations = append(c.durations, time.Since(start))
	return err
}

// expiryActions counts the entries of the expiry index by action.
func expiryActions(t testing.TB, f *File) map[byte]int {
	t.Helper()
	got := map[byte]int{}
	err := f.view(func(tx *bbolt.Tx) error {
		return tx.Bucket([]byte("expiry")).ForEach(func(k, v []byte) error {
			got[k[8]]++
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestCreateWritesNoExpiryEntry: an operation that completes — executed at
// once, or claimed and then completed — writes nothing to the expiry
// index (the sweep finds it by its first-seen time); a held one writes
// only its approval's expiry.
func TestCreateWritesNoExpiryEntry(t *testing.T) {
	ctx := context.Background()
	f := mustOpen(t, ledger.Options{})
	ap := &applier{}
	if _, err := f.Execute(ctx, newClaim("t1", "create_order", "fp-1"), ap.succeed(`{}`)); err != nil {
		t.Fatal(err)
	}
	c := newClaim("t1", "create_order", "fp-2")
	d, err := f.Claim(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Complete(ctx, c.Actor, c.Key, d.Record.Generation, ledger.Outcome{State: ledger.StateFailed}); err != nil {
		t.Fatal(err)
	}
	held := newClaim("t1", "create_order", "fp-3")
	held.RequireApproval = true
	if _, err := f.Execute(ctx, held, ap.succeed(`{}`)); err != nil {
		t.Fatal(err)
	}
	if got, want := expiryActions(t, f), map[byte]int{'a': 1}; !maps.Equal(got, want) {
		t.Errorf("expiry entries by action = %v; want %v (one approval's expiry, no compaction)", got, want)
	}
}

// TestSweepHonoursEarlierEntries: a file of an earlier build holds a
// compaction entry per completed record. An entry due before the sweep's
// walk by first-seen time reaches its record (a record that completed
// before it was first seen, a clock set back) compacts it when due, as
// before; afterwards only the tombstones' deletion entries are left.
func TestSweepHonoursEarlierEntries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	writeRecordsAgo(t, path, 100, true) // first seen and completed 2h ago, entries due 1h ago
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	early := succeededRecord(sweepTenant, "completed-before-first-seen", now.Add(-30*time.Minute))
	early.CompletedAt = now.Add(-2 * time.Hour)
	err = db.Update(func(tx *bbolt.Tx) error {
		if err := putRecord(tx, early); err != nil {
			return err
		}
		if err := tx.Bucket(bucketByTime).Put(timeKey(early.FirstSeenAt, early.Tenant, early.Key), nil); err != nil {
			return err
		}
		due := append(append(be64(uint64(early.CompletedAt.Add(time.Hour).UnixNano())), 'r'), recordKey(early.Tenant, early.Key)...)
		return tx.Bucket([]byte("expiry")).Put(due, []byte{'r'})
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
	f := mustOpenPath(t, path, ledger.Options{Retention: time.Hour})
	compacted, deleted, err := f.Sweep(context.Background())
	if err != nil || compacted != 101 || deleted != 0 {
		t.Fatalf("Sweep = %d compacted, %d deleted, %v; want 101, 0, nil", compacted, deleted, err)
	}
	if rec := mustGet(t, f, early.Tenant, early.Key); !rec.Tombstone {
		t.Errorf("the record due by its entry only is not a tombstone: %s", recordJSON(t, rec))
	}
	if got, want := expiryActions(t, f), map[byte]int{'t': 101}; !maps.Equal(got, want) {
		t.Errorf("expiry entries by action after the sweep = %v; want %v", got, want)
	}
	if n, d, err := f.Sweep(context.Background()); err != nil || n != 0 || d != 0 {
		t.Errorf("second Sweep = %d, %d, %v; want 0, 0, nil", n, d, err)
	}
}
