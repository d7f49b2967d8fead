package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"idemgate/ledger"
	"idemgate/ledger/postgres/pgtest"
)

// atVersion returns a new database whose schema is at version v (0: none).
func atVersion(t *testing.T, v int) string {
	t.Helper()
	url := pgtest.NewDatabase(t)
	if v == 0 {
		return url
	}
	ctx := context.Background()
	pool, err := newPool(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if from, to, err := migrateTo(ctx, pool, v); err != nil || from != 0 || to != v {
		t.Fatalf("migrating a new database to version %d: %d, %d, %v", v, from, to, err)
	}
	return url
}

// schemaOf describes the idemgate tables of the database at url — their
// columns, indexes and constraints, and the recorded versions — for
// comparing two databases.
func schemaOf(t *testing.T, url string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var b strings.Builder
	for _, q := range []string{
		`SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, ''), coalesce(collation_name, '')
		   FROM information_schema.columns WHERE table_schema = 'public' AND table_name LIKE 'idemgate%' ORDER BY 1, 2`,
		`SELECT tablename, indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename LIKE 'idemgate%' ORDER BY 1, 2`,
		`SELECT conrelid::regclass::text, pg_get_constraintdef(oid) FROM pg_constraint
		   WHERE conrelid::regclass::text LIKE 'idemgate%' ORDER BY 1, 2`,
		`SELECT version::text, name FROM idemgate_schema_version ORDER BY version`,
	} {
		rows, err := conn.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintln(&b, vals...)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return b.String()
}

// TestMigrateFromEveryOlderVersion: a database at each older schema
// version is migrated to this build's, in order, and ends with the same
// schema as a new database migrated at once.
func TestMigrateFromEveryOlderVersion(t *testing.T) {
	want := schemaOf(t, atVersion(t, SchemaVersion()))
	if !strings.Contains(want, "idemgate_commits") || !strings.Contains(want, "idemgate_kv") {
		t.Fatalf("the current schema lacks its tables:\n%s", want)
	}
	for v := 1; v < SchemaVersion(); v++ {
		t.Run(fmt.Sprintf("from version %d", v), func(t *testing.T) {
			url := atVersion(t, v)
			if got := schemaOf(t, url); got == want {
				t.Fatalf("a database at version %d already has the current schema: the test proves nothing", v)
			}
			from, to, err := Migrate(context.Background(), url)
			if err != nil || from != v || to != SchemaVersion() {
				t.Fatalf("Migrate from version %d = %d, %d, %v; want %d, %d, nil", v, from, to, err, v, SchemaVersion())
			}
			if got := schemaOf(t, url); got != want {
				t.Errorf("the schema migrated from version %d differs from a new one's:\n got:\n%s\nwant:\n%s", v, got, want)
			}
		})
	}
}

// TestUpgradeVersion1LedgerKeepsItsData: a ledger written at schema
// version 1 (before idemgate_commits) — made here by writing a ledger and
// taking versions 2 and 3 off it, which is all they added — is refused
// by a read-only open with the command to run, brought to this build's
// version by `idemgate migrate` (Migrate), and then reads what it held
// (the record, its saved result, the audit chain) and takes new claims,
// whose commit markers the upgrade's table now records.
func TestUpgradeVersion1LedgerKeepsItsData(t *testing.T) {
	if SchemaVersion() != 3 {
		t.Fatalf("this test makes a version-1 ledger by undoing migrations 2 and 3; the schema is at version %d: extend it", SchemaVersion())
	}
	url := pgtest.NewDatabase(t)
	ctx := context.Background()
	actor := ledger.Actor{Tenant: "acme", Principal: "alice", Role: "agent"}
	claim := func(key string) ledger.Claim {
		return ledger.Claim{Actor: actor, Key: key, Tool: "create_order", Fingerprint: "fp-" + key, OnLeaseExpiry: ledger.StateRetryable}
	}
	apply := func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		if err := tx.Put("effects", rec.Key, []byte("x")); err != nil {
			return ledger.Outcome{}, err
		}
		return ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{"order":"` + rec.Key + `"}`), Summary: "effect"}, nil
	}
	d, err := Open(url, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Execute(ctx, claim("old"), apply); err != nil {
		t.Fatal(err)
	}
	d.Close()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP TABLE idemgate_commits; DROP SEQUENCE idemgate_journal_order; DELETE FROM idemgate_schema_version WHERE version IN (2, 3)"); err != nil {
		t.Fatal(err)
	}

	if _, err := OpenReadOnly(url, ledger.Options{}); !errors.Is(err, ledger.ErrSchemaVersion) || !strings.Contains(err.Error(), "idemgate migrate") {
		t.Errorf("read-only open of a version-1 ledger: %v, want ErrSchemaVersion naming idemgate migrate", err)
	}
	from, to, err := Migrate(ctx, url)
	if err != nil || from != 1 || to != 3 {
		t.Fatalf("Migrate of a version-1 ledger = %d, %d, %v; want 1, 3, nil", from, to, err)
	}
	d, err = Open(url, ledger.Options{})
	if err != nil {
		t.Fatalf("Open after the upgrade: %v", err)
	}
	defer d.Close()
	rec, err := d.Get(ctx, "acme", "old")
	if err != nil || rec.State != ledger.StateSucceeded || string(rec.Result) != `{"order":"old"}` {
		t.Fatalf("the version-1 ledger's record after the upgrade: %+v, %v", rec, err)
	}
	if dd, err := d.Execute(ctx, claim("old"), apply); err != nil || dd.Kind != ledger.DecisionReplay {
		t.Errorf("the old key after the upgrade: %s, %v, want a replay", dd.Kind, err)
	}
	if dd, err := d.Execute(ctx, claim("new"), apply); err != nil || dd.Kind != ledger.DecisionExecuted {
		t.Fatalf("a new claim after the upgrade: %s, %v", dd.Kind, err)
	}
	var markers int
	if err := conn.QueryRow(ctx, "SELECT count(*) FROM idemgate_commits").Scan(&markers); err != nil || markers == 0 {
		t.Errorf("commit markers after the upgrade: %d, %v; want the new writes' markers", markers, err)
	}
	if _, err := d.VerifyAudit(ctx); err != nil {
		t.Errorf("the audit chain across the upgrade: %v", err)
	}
}

// TestConcurrentMigrations: several Migrate calls on one database at
// once — replicas starting together, an operator's `idemgate migrate`
// beside them — from no schema and from an older one: every call
// succeeds, exactly one applies the migrations (the others, having
// waited for the advisory lock, find the schema current), each version is
// recorded once, and the schema is a new database's.
func TestConcurrentMigrations(t *testing.T) {
	want := schemaOf(t, atVersion(t, SchemaVersion()))
	for _, start := range []int{0, 1} {
		t.Run(fmt.Sprintf("from version %d", start), func(t *testing.T) {
			url := atVersion(t, start)
			const n = 4
			type result struct {
				from, to int
				err      error
			}
			results := make([]result, n)
			var ready, wg sync.WaitGroup
			ready.Add(n)
			gate := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					ready.Done()
					<-gate
					var r result
					r.from, r.to, r.err = Migrate(context.Background(), url)
					results[i] = r
				})
			}
			ready.Wait()
			close(gate)
			wg.Wait()
			var froms []int
			for i, r := range results {
				if r.err != nil || r.to != SchemaVersion() {
					t.Errorf("Migrate %d: %d, %d, %v; want to %d, nil", i, r.from, r.to, r.err, SchemaVersion())
				}
				froms = append(froms, r.from)
			}
			slices.Sort(froms)
			wantFroms := []int{start}
			for range n - 1 {
				wantFroms = append(wantFroms, SchemaVersion())
			}
			if !slices.Equal(froms, wantFroms) {
				t.Errorf("the calls found versions %v, want %v: exactly one migrates", froms, wantFroms)
			}
			if got := schemaOf(t, url); got != want {
				t.Errorf("the schema after concurrent migrations differs from a new one's:\n got:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}
