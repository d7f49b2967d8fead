package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The benchmarks measure whole tool calls through the real binary over
// stdio with the mcp-go client (protocol 2026-07-28, its default), each on
// a fresh ledger, and report the median latency of one call as p50-µs
// (and p99-µs). Run them with
//
//	go test -run '^$' -bench . ./e2e/
//
// or IDEMGATE_BENCH=1 go test -count=1 -run TestBenchmarkRatios -v ./e2e/
// for the table of ratios to floors measured in the same run.

var benchFlavor = mcpGoModern

// latencies runs op b.N times in a row and reports the percentiles.
func latencies(b *testing.B, op func(ctx context.Context, i int) error) {
	ctx := context.Background()
	durs := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		t0 := time.Now()
		if err := op(ctx, i); err != nil {
			b.Fatalf("op %d: %v", i, err)
		}
		durs = append(durs, time.Since(t0))
	}
	b.StopTimer()
	reportPercentiles(b, durs)
}

func reportPercentiles(b *testing.B, durs []time.Duration) {
	if len(durs) == 0 {
		return
	}
	slices.Sort(durs)
	pct := func(p float64) float64 {
		return float64(durs[int(p*float64(len(durs)-1))].Nanoseconds()) / 1e3
	}
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
}

// succeed turns a tool result into an error unless it succeeded.
func succeed(r *rawResult, err error) error {
	if err != nil {
		return err
	}
	if r.IsError || len(r.Texts) != 1 {
		return fmt.Errorf("call failed: %v", r.Texts)
	}
	return nil
}

// benchNoopServer: the baseline — a one-tool mcp-go stdio server that
// returns a constant. What MCP over stdio costs before idemgate does
// anything.
func benchNoopServer(b *testing.B) {
	if noopBin == "" {
		b.Skip("the no-op server is built only when benchmarks run (-bench or IDEMGATE_BENCH=1)")
	}
	s, err := connect(b, benchFlavor, noopBin, nil)
	if err != nil {
		b.Fatal(err)
	}
	latencies(b, func(ctx context.Context, _ int) error {
		return succeed(s.callRaw(ctx, "noop", map[string]any{}, nil))
	})
}

// benchListOrdersEmpty: idemgate's cheapest tool call that touches the
// ledger: list_orders of a customer without orders (one read transaction,
// schema validation, fingerprinting nothing).
func benchListOrdersEmpty(b *testing.B) {
	s := startServer(b, benchFlavor, serverConfig{})
	args := map[string]any{"customer_id": "nobody"}
	latencies(b, func(ctx context.Context, _ int) error {
		return succeed(s.callRaw(ctx, "list_orders", args, nil))
	})
}

// benchGetOrder: a read whose answer carries an order, like a replay's:
// the same MCP payload cost without the ledger's claim logic. The fair
// baseline for a replay.
func benchGetOrder(b *testing.B) {
	s := startServer(b, benchFlavor, serverConfig{})
	r, err := s.callRaw(context.Background(), "create_order", orderArgs(newKey(), "cust-bench-get", coffee, nil), nil)
	if err := succeed(r, err); err != nil {
		b.Fatal(err)
	}
	e, err := decodeEnvelope("create_order", r)
	if err != nil {
		b.Fatal(err)
	}
	args := map[string]any{"order_id": e.orderID()}
	latencies(b, func(ctx context.Context, _ int) error {
		return succeed(s.callRaw(ctx, "get_order", args, nil))
	})
}

// benchReplay: create_order once, then the same key and arguments each op
// (answered from the saved result with a read transaction).
func benchReplay(b *testing.B) {
	s := startServer(b, benchFlavor, serverConfig{})
	args := orderArgs(newKey(), "cust-bench-replay", coffee, nil)
	if err := succeed(s.callRaw(context.Background(), "create_order", args, nil)); err != nil {
		b.Fatal(err)
	}
	latencies(b, func(ctx context.Context, _ int) error {
		return succeed(s.callRaw(ctx, "create_order", args, nil))
	})
}

// benchCreateOrder: a new intent each op, one at a time: claim, order,
// outbox entry and outcome in one committed (fsynced) transaction.
func benchCreateOrder(b *testing.B) {
	s := startServer(b, benchFlavor, serverConfig{})
	run := newKey()[:8]
	latencies(b, func(ctx context.Context, i int) error {
		return succeed(s.callRaw(ctx, "create_order", orderArgs(newKey(), fmt.Sprintf("c-%s-%d", run, i), coffee, nil), nil))
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "creates/s")
}

// benchCreateOrderParallel: new intents from 64 concurrent callers on one
// client and one server process (--workers 64): group commit at work.
func benchCreateOrderParallel(b *testing.B) {
	const callers = 64
	s := startServer(b, benchFlavor, serverConfig{Args: []string{"--workers", "64"}})
	run := newKey()[:8]
	ctx := context.Background()
	var next atomic.Int64
	var mu sync.Mutex
	var firstErr error
	durs := make([]time.Duration, 0, b.N)
	var wg sync.WaitGroup
	b.ResetTimer()
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]time.Duration, 0, b.N/callers+1)
			for {
				i := next.Add(1) - 1
				if i >= int64(b.N) {
					break
				}
				t0 := time.Now()
				err := succeed(s.callRaw(ctx, "create_order", orderArgs(newKey(), fmt.Sprintf("p-%s-%d", run, i), coffee, nil), nil))
				local = append(local, time.Since(t0))
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					break
				}
			}
			mu.Lock()
			durs = append(durs, local...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	b.StopTimer()
	if firstErr != nil {
		b.Fatal(firstErr)
	}
	reportPercentiles(b, durs)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "creates/s")
}

func BenchmarkNoopCall(b *testing.B) {
	b.Run("noop-server", benchNoopServer)
	b.Run("list_orders-empty", benchListOrdersEmpty)
}

func BenchmarkGetOrder(b *testing.B)            { benchGetOrder(b) }
func BenchmarkReplay(b *testing.B)              { benchReplay(b) }
func BenchmarkCreateOrder(b *testing.B)         { benchCreateOrder(b) }
func BenchmarkCreateOrderParallel(b *testing.B) { benchCreateOrderParallel(b) }

// benchBoltCommit: the durability floor — a raw bbolt Update that puts
// one key, with bbolt's default fsync on commit, in a file in the same
// temporary directory (the same filesystem) as the servers' ledgers. No
// idemgate code runs.
func benchBoltCommit(b *testing.B) {
	db, err := bolt.Open(filepath.Join(b.TempDir(), "floor.db"), 0o600, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	latencies(b, func(_ context.Context, i int) error {
		return db.Update(func(tx *bolt.Tx) error {
			bk, err := tx.CreateBucketIfNotExists([]byte("floor"))
			if err != nil {
				return err
			}
			return bk.Put([]byte(fmt.Sprintf("k%09d", i)), []byte("a value of a few dozen bytes, like a small record"))
		})
	})
}

func BenchmarkBoltCommit(b *testing.B) { benchBoltCommit(b) }

// TestBenchmarkRatios runs every benchmark once in this process and states
// each figure as a ratio to floors measured in the same run, so the
// ratios, not the absolute numbers, are what compares across machines:
//
//   - the no-op floor: a call of a one-tool mcp-go stdio server that
//     returns a constant (what MCP over stdio costs before idemgate does
//     anything);
//   - the commit floor: a raw bbolt Update with fsync on the same
//     filesystem (what one durable write costs before idemgate does
//     anything).
//
// Both floors are measured at the start and again at the end of the run;
// their mean is the floor, and the drift between the two says how far the
// machine's speed moved during the run. Reads are compared with the no-op
// floor; writes with the no-op floor plus one commit, the least a durable
// answer over stdio can cost. Set IDEMGATE_BENCH=1.
func TestBenchmarkRatios(t *testing.T) {
	if os.Getenv("IDEMGATE_BENCH") != "1" {
		t.Skip("set IDEMGATE_BENCH=1 to run the benchmarks and print the ratio table")
	}
	type row struct {
		name  string
		fn    func(*testing.B)
		write bool
		res   testing.BenchmarkResult
	}
	noopStart := &row{name: "floor: no-op MCP call (start)", fn: benchNoopServer}
	commitStart := &row{name: "floor: bbolt commit (start)", fn: benchBoltCommit}
	calls := []*row{
		{name: "list_orders (empty)", fn: benchListOrdersEmpty},
		{name: "get_order (an order back)", fn: benchGetOrder},
		{name: "replay", fn: benchReplay},
		{name: "create_order (sequential)", fn: benchCreateOrder, write: true},
		{name: "create_order (64 concurrent)", fn: benchCreateOrderParallel, write: true},
	}
	noopEnd := &row{name: "floor: no-op MCP call (end)", fn: benchNoopServer}
	commitEnd := &row{name: "floor: bbolt commit (end)", fn: benchBoltCommit}
	all := append(append([]*row{noopStart, commitStart}, calls...), noopEnd, commitEnd)
	for _, r := range all {
		r.res = testing.Benchmark(r.fn)
		if r.res.N == 0 {
			t.Fatalf("benchmark %q did not run (failed or skipped)", r.name)
		}
		t.Logf("%-30s %s", r.name, r.res.String())
	}
	p50 := func(r *row) float64 { return r.res.Extra["p50-µs"] }
	noop := (p50(noopStart) + p50(noopEnd)) / 2
	commit := (p50(commitStart) + p50(commitEnd)) / 2
	drift := func(a, b float64) float64 { return 100 * (b - a) / a }
	var sb strings.Builder
	fmt.Fprintf(&sb, "\nfloors (p50, mean of start and end; drift end vs start):\n")
	fmt.Fprintf(&sb, "  no-op MCP call     %8.0fµs  (%.0f → %.0f µs, %+.0f%%)\n", noop, p50(noopStart), p50(noopEnd), drift(p50(noopStart), p50(noopEnd)))
	fmt.Fprintf(&sb, "  bbolt commit       %8.0fµs  (%.0f → %.0f µs, %+.0f%%)\n", commit, p50(commitStart), p50(commitEnd), drift(p50(commitStart), p50(commitEnd)))
	fmt.Fprintf(&sb, "\n%-30s %10s %9s %22s\n", "call", "p50", "× no-op", "× (no-op + commit)")
	for _, r := range calls[:4] {
		floor := "—"
		if r.write {
			floor = fmt.Sprintf("%.2f×", p50(r)/(noop+commit))
		}
		fmt.Fprintf(&sb, "%-30s %8.0fµs %8.2f× %22s\n", r.name, p50(r), p50(r)/noop, floor)
	}
	// Under 64 concurrent callers a call's latency includes its wait in
	// the queue; only the throughput compares.
	par := calls[4]
	fmt.Fprintf(&sb, "%-30s %8.0fµs %9s %22s\n", par.name, p50(par), "(queued)", "")
	fmt.Fprintf(&sb, "\nreplay / get_order p50: %.2f× (same answer size; the cost of the ledger's check)\n", p50(calls[2])/p50(calls[1]))
	seq, conc := calls[3].res.Extra["creates/s"], par.res.Extra["creates/s"]
	fmt.Fprintf(&sb, "creates/s sequential %.0f, 64 concurrent %.0f: %.2f× (group commit); commit floor alone: %.0f commits/s\n", seq, conc, conc/seq, 1e6/commit)
	t.Log(sb.String())
}
