package e2e

import (
	"context"
	"math"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"idemgate/ledger/postgres/pgtest"
)

// TestBenchCLIPostgresFloor: `idemgate bench --url … --floor-db URL`
// against an HTTP server whose ledger is in PostgreSQL measures the bare
// INSERT … ON CONFLICT claim on that database before and after the run,
// from as many connections as clients, states new creates/s as a share of
// it and replay p50 as a multiple of get_order's, and leaves no table of
// its own behind.
func TestBenchCLIPostgresFloor(t *testing.T) {
	db := pgtest.NewDatabase(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	tok := addToken(t, tokens, "bench-agent", "acme", "agent")
	base := httpServer(t, db, tokens, "--outbox-dir", filepath.Join(dir, "outbox"))
	rep := runBench(t, "--url", base+"/mcp", "--token", tok, "--floor-db", db, "--calls", "150", "--duration", "0",
		"--clients", "3", "--dup-ratio", "0.4", "--mix", "create_order=2,get_order=1")
	checkReport(t, rep, 3)
	f := rep.ClaimFloor
	if f == nil {
		t.Fatal("no pg_claim_floor in the report")
	}
	if f.Connections != 3 || f.RateStart <= 0 || f.RateEnd <= 0 || math.Abs(f.Rate-(f.RateStart+f.RateEnd)/2) > 1e-6 {
		t.Fatalf("claim floor %+v: want 3 connections, both measurements, their mean", f)
	}
	if want := rep.Kinds["create_order/new"].Throughput / f.Rate; math.Abs(f.NewCreates-want) > 1e-9 || f.NewCreates <= 0 {
		t.Fatalf("new creates share %v, want %v", f.NewCreates, want)
	}
	rp, g := rep.Kinds["create_order/replay"], rep.Kinds["get_order"]
	if rp == nil || g == nil {
		t.Fatalf("the run has no replay or no get_order: %v", rep.Kinds)
	}
	if want := rp.Latency.P50 / g.Latency.P50; math.Abs(rep.ReplayVsGet-want) > 1e-9 {
		t.Fatalf("replay/get_order %v, want %v", rep.ReplayVsGet, want)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var left int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'idemgate_bench_floor_%'").Scan(&left); err != nil || left != 0 {
		t.Fatalf("floor tables left behind: %d (%v)", left, err)
	}

	// Not a PostgreSQL URL: refused before anything runs.
	r := runCLI(t, 30*time.Second, "bench", "--url", base+"/mcp", "--token", tok, "--floor-db", filepath.Join(dir, "ledger.db"), "--duration", "1s")
	if r.Code != 2 || !strings.Contains(r.Stderr, "--floor-db must be a postgres://") || r.Stdout != "" {
		t.Fatalf("--floor-db with a file: exit %d\nstdout: %s\nstderr: %s", r.Code, r.Stdout, r.Stderr)
	}
}

// TestBenchCLIFloorsOnPostgres: --floors with a spawned server on a
// postgres:// --db measures the claim floor on that database instead of a
// bbolt commit beside a file.
func TestBenchCLIFloorsOnPostgres(t *testing.T) {
	db := pgtest.NewDatabase(t)
	rep := runBench(t, "--floors", "--db", db, "--calls", "40", "--duration", "0", "--clients", "2", "--mix", "create_order=1")
	checkReport(t, rep, 2)
	if rep.Floors == nil || rep.Floors.NoopP50 <= 0 || rep.Floors.CommitP50 != 0 {
		t.Fatalf("floors %+v: want the no-op floor and no bbolt commit floor", rep.Floors)
	}
	if f := rep.ClaimFloor; f == nil || f.Connections != 2 || f.Rate <= 0 || f.NewCreates <= 0 {
		t.Fatalf("claim floor %+v: want one measured on --db with 2 connections", rep.ClaimFloor)
	}
}
