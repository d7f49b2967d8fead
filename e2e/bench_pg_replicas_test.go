package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"idemgate/ledger/postgres/pgtest"
	"idemgate/loadgen"
)

// TestBenchmarkPostgresReplicas measures the rows of issue 20: creates/s of
// 1, 2 and 4 `serve --http` replicas on one PostgreSQL database, 64 HTTP
// clients in all (each replica its share, one `idemgate bench` process per
// replica, new keys only), with no added delay and with a proxy that
// delays each direction between the replicas and PostgreSQL by
// IDEMGATE_BENCH_PG_DELAY (default 0.5ms; the proxy's measured mean is
// printed: Go's timers wake about a millisecond late at the least on some
// machines). Each configuration runs on a new database. Run it with
// IDEMGATE_BENCH_PG=1 (see BENCHMARKS.md); IDEMGATE_BENCH_PG_REPLICAS
// (say "1") measures only those replica counts, IDEMGATE_BENCH_PG_PROFILES
// (a directory) has each replica write a CPU profile there, and
// IDEMGATE_BENCH_PG_DURABLE=1 runs them on a cluster of its own with
// PostgreSQL's default durability (the shared one has fsync off). Each
// configuration also logs its round trips, refused transactions and
// server CPU per create.
func TestBenchmarkPostgresReplicas(t *testing.T) {
	if os.Getenv("IDEMGATE_BENCH_PG") != "1" {
		t.Skip("set IDEMGATE_BENCH_PG=1 to measure PostgreSQL replicas (see BENCHMARKS.md)")
	}
	delay := 500 * time.Microsecond
	if v := os.Getenv("IDEMGATE_BENCH_PG_DELAY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > time.Second {
			t.Fatalf("IDEMGATE_BENCH_PG_DELAY %q: want a duration of 0-1s", v)
		}
		delay = d
	}
	counts := []int{1, 2, 4}
	if v := os.Getenv("IDEMGATE_BENCH_PG_REPLICAS"); v != "" { // e.g. "1" to compare builds
		counts = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > 64 || 64%n != 0 {
				t.Fatalf("IDEMGATE_BENCH_PG_REPLICAS %q: want replica counts that divide 64, comma-separated", v)
			}
			counts = append(counts, n)
		}
	}
	newDB := pgtest.NewDatabase
	if os.Getenv("IDEMGATE_BENCH_PG_DURABLE") == "1" { // every COMMIT flushes its WAL, as in production
		c, err := pgtest.StartDurable()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Stop() })
		newDB = func(t testing.TB) string {
			url, err := c.CreateDatabase(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			return url
		}
	}
	b := newAllBench(t, envInt(t, "IDEMGATE_BENCH_SECONDS", 10))
	var base float64 // one replica, no delay
	for _, d := range []time.Duration{0, delay} {
		var one float64
		for _, n := range counts {
			name := fmt.Sprintf("%d replica(s), %s added each way", n, d)
			total, mean, err := b.replicas(newDB, n, d)
			if err != nil {
				b.failed(name, "—", err)
				continue
			}
			if d > 0 {
				name += fmt.Sprintf(" (measured %s)", mean.Round(10*time.Microsecond))
			}
			switch {
			case n == 1 && d == 0:
				base, one = total, total
				b.add(allRow{name + ": creates/s", rate(total), "—", "—", "—", "—"})
			case n == 1:
				one = total
				b.add(allRow{name + ": creates/s", rate(total), rate(base) + " with no delay", times(total / base), "≥ 0.7 × with no delay", atLeast(total/base, 0.7)})
			default:
				b.add(allRow{name + ": creates/s", rate(total), rate(one) + " for one replica", times(total / one), "≥ 0.9 × one replica", atLeast(total/one, 0.9)})
			}
		}
	}
	fmt.Println(b.markdown(0))
}

// replicas runs n replicas on a new database (newDB) behind a proxy adding d each
// way, and one bench process per replica, 64/n clients each, new keys
// only; it returns the creates/s summed and the proxy's mean delay.
func (b *allBench) replicas(newDB func(testing.TB) string, n int, d time.Duration) (float64, time.Duration, error) {
	t := b.t
	db := newDB(t)
	proxy := pgtest.NewDelayProxy(t, db, d)
	dir := filepath.Join(b.dir, fmt.Sprintf("pg-%d-%s", n, d))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, 0, err
	}
	tokens := filepath.Join(dir, "tokens.json")
	tok := addToken(t, tokens, "bench-agent", "acme", "agent")
	var servers []*httpProc
	for i := range n {
		var env []string
		if p := os.Getenv("IDEMGATE_BENCH_PG_PROFILES"); p != "" { // a directory: each replica's CPU profile
			env = []string{fmt.Sprintf("IDEMGATE_CPUPROFILE=%s/cpu-%d-%s-%d.pprof", p, n, d, i)}
		}
		servers = append(servers, startHTTPEnv(t, env, proxy.URL(), tokens, 0, "--workers", "64", "--outbox-dir", filepath.Join(dir, "outbox")))
	}
	reps := make([]*loadgen.Report, n)
	errs := make([]error, n)
	cpu0 := make([]time.Duration, n)
	for i, s := range servers {
		cpu0[i], _ = loadgen.ProcessCPU(s.cmd.Process.Pid)
	}
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Go(func() {
			reps[i], errs[i] = b.bench(fmt.Sprintf("pg-%d-%s-%d", n, d, i), "--url", s.base+"/mcp", "--token", tok,
				"--clients", strconv.Itoa(64/n), "--dup-ratio", "0", "--mix", "create_order=1", "--duration", b.dur, "--drain-timeout", "0")
		})
	}
	wg.Wait()
	total := 0.0
	var calls int64
	var cpu time.Duration
	var trips, conflicts float64
	for i, s := range servers {
		if errs[i] != nil {
			return 0, 0, errs[i]
		}
		total += reps[i].Throughput
		calls += reps[i].Calls
		used, _ := loadgen.ProcessCPU(s.cmd.Process.Pid)
		cpu += used - cpu0[i]
		trips += scrape(t, s.base, "idemgate_postgres_round_trips_total")
		conflicts += scrape(t, s.base, "idemgate_postgres_conflicts_total")
	}
	if calls > 0 {
		// Round trips include the replicas' background work (opening,
		// the audit sealer, clock samples): an upper bound per create.
		t.Logf("%d replica(s), %s each way: %d creates, %.1f round trips and %.2f conflicts per create, %s of server CPU per create",
			n, d, calls, trips/float64(calls), conflicts/float64(calls), (cpu / time.Duration(calls)).Round(time.Microsecond))
	}
	for _, s := range servers {
		s.cmd.Process.Signal(os.Interrupt)
		<-s.exited
	}
	return total, proxy.MeanDelay(), nil
}
