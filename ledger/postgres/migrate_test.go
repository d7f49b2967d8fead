package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"idemgate/ledger"
	"idemgate/ledger/postgres"
	"idemgate/ledger/postgres/pgtest"
)

// TestMigrateIsVersionedAndIdempotent: a new database is migrated to this
// build's version once; migrating again changes nothing.
func TestMigrateIsVersionedAndIdempotent(t *testing.T) {
	url := pgtest.NewDatabase(t)
	ctx := context.Background()
	from, to, err := postgres.Migrate(ctx, url)
	if err != nil || from != 0 || to != postgres.SchemaVersion() {
		t.Fatalf("first Migrate = %d, %d, %v; want 0, %d, nil", from, to, err, postgres.SchemaVersion())
	}
	from, to, err = postgres.Migrate(ctx, url)
	if err != nil || from != to || to != postgres.SchemaVersion() {
		t.Fatalf("second Migrate = %d, %d, %v; want no change", from, to, err)
	}
}

// TestNewerSchemaIsRefused: a database migrated by a newer build is
// refused by Open, OpenExisting, OpenReadOnly and Migrate, with a message
// that says what to do, and nothing is written.
func TestNewerSchemaIsRefused(t *testing.T) {
	url := pgtest.NewDatabase(t)
	ctx := context.Background()
	if _, _, err := postgres.Migrate(ctx, url); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "INSERT INTO idemgate_schema_version (version, name) VALUES (99, 'from_the_future.sql')"); err != nil {
		t.Fatal(err)
	}
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ledger.ErrSchemaVersion) || !strings.Contains(err.Error(), "version 99") || !strings.Contains(err.Error(), "newer idemgate") {
			t.Errorf("%s of a newer schema: %v; want ErrSchemaVersion naming version 99 and a newer idemgate", what, err)
		}
	}
	_, err = postgres.Open(url, ledger.Options{})
	check("Open", err)
	_, err = postgres.OpenExisting(url, ledger.Options{})
	check("OpenExisting", err)
	_, err = postgres.OpenReadOnly(url, ledger.Options{})
	check("OpenReadOnly", err)
	_, _, err = postgres.Migrate(ctx, url)
	check("Migrate", err)
}

// TestOpenExistingRefusesAnEmptyDatabase: the commands that must not start
// a ledger refuse a database without one, and create nothing.
func TestOpenExistingRefusesAnEmptyDatabase(t *testing.T) {
	url := pgtest.NewDatabase(t)
	for name, open := range map[string]func(string, ledger.Options) (*postgres.DB, error){"OpenExisting": postgres.OpenExisting, "OpenReadOnly": postgres.OpenReadOnly} {
		if _, err := open(url, ledger.Options{}); !errors.Is(err, postgres.ErrNotMigrated) || !strings.Contains(err.Error(), "idemgate migrate") {
			t.Errorf("%s of an empty database: %v; want ErrNotMigrated with the migrate hint", name, err)
		}
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var exists bool
	conn.QueryRow(ctx, "SELECT to_regclass('idemgate_kv') IS NOT NULL").Scan(&exists)
	if exists {
		t.Error("opening an empty database for reading created the schema")
	}
}

// TestReadOnlyRefusesWrites: a read-only ledger reads what a writer wrote
// and refuses to write.
func TestReadOnlyRefusesWrites(t *testing.T) {
	url := pgtest.NewDatabase(t)
	w, err := postgres.Open(url, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	r, err := postgres.OpenReadOnly(url, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	err = r.IssueKey(context.Background(), "tenant", "k")
	if !errors.Is(err, postgres.ErrReadOnly) {
		t.Errorf("IssueKey on a read-only ledger: %v, want ErrReadOnly", err)
	}
}

// TestBadURLNamesTheProblemNotThePassword: a URL pgx cannot parse is
// refused with the reason, and the password is never echoed.
func TestBadURLNamesTheProblemNotThePassword(t *testing.T) {
	for url, reason := range map[string]string{
		"postgres://u:s3cret@127.0.0.1:badport/x":               "invalid port",
		"postgres://u:s3cret@127.0.0.1:5432/x?sslmode=whatever": "sslmode is invalid",
	} {
		_, err := postgres.Open(url, ledger.Options{})
		if err == nil || strings.Contains(err.Error(), "s3cret") || !strings.Contains(err.Error(), reason) {
			t.Errorf("Open(%s): %v; want the reason %q without the password", url, err, reason)
		}
	}
}

// TestRedactedHidesThePassword: what the server logs of --db.
func TestRedactedHidesThePassword(t *testing.T) {
	if got := postgres.Redacted("postgres://u:s3cret@db:5432/x?sslmode=disable"); strings.Contains(got, "s3cret") || !strings.Contains(got, "db:5432/x") {
		t.Errorf("Redacted = %q", got)
	}
	if got := postgres.Redacted("/var/lib/idemgate/ledger.db"); got != "/var/lib/idemgate/ledger.db" {
		t.Errorf("Redacted of a path = %q", got)
	}
}
