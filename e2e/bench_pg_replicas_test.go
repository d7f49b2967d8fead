package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"idemgate/ledger/postgres/pgtest"
	"idemgate/loadgen"
)

// TestBenchmarkPostgresReplicas measures the rows of issue 20: creates/s of
// 1, 2 and 4 `serve --http` replicas on one PostgreSQL database, 64 HTTP
// clients in all (one `idemgate bench` process, its clients spread over
// the replicas, new keys only), with no added delay and with a proxy that
// delays each direction between the replicas and PostgreSQL by
// IDEMGATE_BENCH_PG_DELAY (default 0.5ms; the proxy's measured mean is
// printed: Go's timers wake about a millisecond late at the least on some
// machines). Each configuration runs on a new database. Run it with
// IDEMGATE_BENCH_PG=1 (see BENCHMARKS.md); IDEMGATE_BENCH_PG_REPLICAS
// (say "1") measures only those replica counts, IDEMGATE_BENCH_PG_PROFILES
// (a directory) has each replica write a CPU profile there, and
// IDEMGATE_BENCH_PG_DURABLE=1 runs them on a cluster of its own with
// PostgreSQL's default durability (the shared one has fsync off). Each
// configuration also logs its round trips, refused transactions and CPU
// per create: the replicas', PostgreSQL's and the whole machine's.
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
// way, and one bench process whose 64 clients are spread over them, new
// keys only; it returns the creates/s and the proxy's mean delay.
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
	// One load generator for every configuration, its 64 clients spread
	// over the replicas: the same clients in each, so that only the
	// servers change.
	args := []string{"--token", tok, "--clients", "64", "--dup-ratio", "0", "--mix", "create_order=1", "--duration", b.dur, "--drain-timeout", "0"}
	for _, s := range servers {
		args = append(args, "--url", s.base+"/mcp", "--server-pid", strconv.Itoa(s.cmd.Process.Pid))
	}
	busy0, pg0 := loadgen.MachineBusy(), loadgen.CommandCPU("postgres")
	rep, err := b.bench(fmt.Sprintf("pg-%d-%s", n, d), args...)
	if err != nil {
		return 0, 0, err
	}
	busy, pg := loadgen.MachineBusy()-busy0, loadgen.CommandCPU("postgres")-pg0
	var trips, conflicts float64
	for _, s := range servers {
		trips += scrape(t, s.base, "idemgate_postgres_round_trips_total")
		conflicts += scrape(t, s.base, "idemgate_postgres_conflicts_total")
	}
	calls := rep.Calls
	var cpu time.Duration
	if rep.ServerCPU != nil {
		cpu = time.Duration(rep.ServerCPU.Total * float64(time.Millisecond))
	}
	if calls > 0 {
		// Round trips include the replicas' background work (opening,
		// the audit sealer, clock samples): an upper bound per create.
		// PostgreSQL's and the machine's CPU are read around the whole
		// bench command (its start and end included): the machine's is
		// every process's, the harness's and the load generator's too.
		per := func(d time.Duration) time.Duration { return (d / time.Duration(calls)).Round(time.Microsecond) }
		t.Logf("%d replica(s), %s each way: %d creates, %.1f round trips and %.2f conflicts per create; CPU per create: %s servers, %s PostgreSQL, %s the whole machine",
			n, d, calls, trips/float64(calls), conflicts/float64(calls), per(cpu), per(pg), per(busy))
	}
	for _, s := range servers {
		s.cmd.Process.Signal(os.Interrupt)
		<-s.exited
	}
	return rep.Throughput, proxy.MeanDelay(), nil
}
