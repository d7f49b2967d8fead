package bolt

import (
	"context"
	"fmt"
	"idemgate/ledger"
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

// countingBackend counts the Update transactions a ledger runs and the
// records each one writes.
type countingBackend struct {
	ledger.Backend
	mu         sync.Mutex
	updates    int             // updates that wrote at least one record
	maxRecords int             // the most records one update wrote
	durations  []time.Duration // of the updates that wrote records
}

func (c *countingBackend) Update(ctx context.Context, fn func(ledger.BTx) error) error {
	var puts int
	start := time.Now()
	err := c.Backend.Update(ctx, func(tx ledger.BTx) error {
		puts = 0 // fn may run twice (group commit)
		return fn(countingTx{BTx: tx, puts: &puts})
	})
	if err == nil && puts > 0 {
		c.mu.Lock()
		c.updates++
		c.maxRecords = max(c.maxRecords, puts)
		c.durations = append(c.durations, time.Since(start))
		c.mu.Unlock()
	}
	return err
}

type countingTx struct {
	ledger.BTx
	puts *int
}

func (t countingTx) Bucket(name []byte) ledger.Bucket {
	b := t.BTx.Bucket(name)
	if string(name) != ledger.RecordsCollection || b == nil {
		return b
	}
	return countingBucket{Bucket: b, puts: t.puts}
}

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
// tombstone) due an hour ago, as the ledger writes them: raw bbolt, in
// big transactions, so a large file is quick to make.
func writeDueRecords(t testing.TB, path string, n int) {
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
				at := base.Add(time.Duration(i) * time.Millisecond)
				rec := succeededRecord(sweepTenant, key, at)
				if err := putRecord(tx, rec); err != nil {
					return err
				}
				if err := times.Put(timeKey(at, sweepTenant, key), nil); err != nil {
					return err
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
// many transactions of at most 50 records each, never one big one, and
// compacts every record.
func TestSweepSmallTransactions(t *testing.T) {
	const n = 5000
	path := filepath.Join(t.TempDir(), "ledger.db")
	writeDueRecords(t, path, n)
	l, cb := openCounting(t, path, ledger.Options{Retention: time.Hour})
	compacted, deleted, err := l.Sweep(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if compacted != n || deleted != 0 {
		t.Fatalf("Sweep = %d compacted, %d deleted; want %d, 0", compacted, deleted, n)
	}
	const maxPerTx = 50
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
// latency with no sweep (the floor, measured in the same run). Run with
// -benchtime=1x: one sweep.
func BenchmarkSweepClaimWait(b *testing.B) {
	n := 100_000
	if os.Getenv("IDEMGATE_BENCH_LARGE") == "1" {
		n = 1_000_000
	}
	if v, err := strconv.Atoi(os.Getenv("IDEMGATE_SWEEP_RECORDS")); err == nil && v > 0 {
		n = v
	}
	for range b.N {
		b.StopTimer()
		path := filepath.Join(b.TempDir(), "ledger.db")
		writeDueRecords(b, path, n)
		l, cb := openCounting(b, path, ledger.Options{Retention: time.Hour})
		floor := claimsAlone(b, l, 2, 2*time.Second)
		b.StartTimer()
		res := sweepWithClaims(b, l, 2)
		b.StopTimer()
		if res.compacted != n {
			b.Fatalf("Sweep compacted %d; want %d", res.compacted, n)
		}
		b.ReportMetric(res.sweep.Seconds(), "sweep-s")
		b.ReportMetric(float64(len(res.waits)), "claims-during-sweep")
		b.ReportMetric(float64(res.p(0.5).Microseconds())/1000, "claim-p50-ms")
		b.ReportMetric(float64(res.p(1).Microseconds())/1000, "claim-max-ms")
		b.ReportMetric(float64(floor.p(0.5).Microseconds())/1000, "floor-p50-ms")
		b.ReportMetric(float64(floor.p(1).Microseconds())/1000, "floor-max-ms")
		b.ReportMetric(float64(cb.maxRecords), "max-records-per-tx")
		slices.Sort(cb.durations)
		b.Logf("%d write transactions: p50 %v, p99 %v, max %v", len(cb.durations), cb.durations[len(cb.durations)/2], cb.durations[len(cb.durations)*99/100], cb.durations[len(cb.durations)-1])
		b.Logf("%d due records: sweep %v; %d claims during it, p50 %v p99 %v max %v; without a sweep p50 %v p99 %v max %v (%d claims)",
			n, res.sweep.Round(time.Millisecond), len(res.waits), res.p(0.5), res.p(0.99), res.p(1), floor.p(0.5), floor.p(0.99), floor.p(1), len(floor.waits))
	}
}

// claimsAlone runs callers goroutines claiming new keys for d, with no
// sweep, and returns their latencies: the floor to compare with.
func claimsAlone(t testing.TB, l *ledger.Ledger, callers int, d time.Duration) sweepRun {
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
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(waits)
	return sweepRun{waits: waits}
}
