package postgres

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"idemgate/ledger"
)

// The schema's migrations, one file per version: NNNN_name.sql, applied in
// order, each in its own transaction with the row that records it in
// idemgate_schema_version. One that changes rows of idemgate_kv must
// first take the advisory locks of the keys it changes, as every writer
// of that table does (see "Locks" in postgres.go): running replicas'
// claims rely on them.
//
//go:embed migrations/*.sql
var migrationFS embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil || v <= 0 {
			return nil, fmt.Errorf("postgres: migration file %q is not named NNNN_name.sql", e.Name())
		}
		b, err := migrationFS.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, err
		}
		out = append(out, migration{version: v, name: e.Name(), sql: string(b)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].version < out[j].version })
	for i, m := range out {
		if m.version != i+1 {
			return nil, fmt.Errorf("postgres: migrations are not numbered 1, 2, 3…: %s", m.name)
		}
	}
	return out, nil
}

// SchemaVersion is the schema version this build writes and reads.
func SchemaVersion() int {
	ms, err := migrations()
	if err != nil {
		panic(err) // the embedded files are part of the build: a test catches this
	}
	return len(ms)
}

// migrateLockKey is the advisory lock (pg_advisory_lock) that serialises
// migrations between processes opening the same database at once.
const migrateLockKey int64 = 0x6964656d67617465 // "idemgate"

// ErrNotMigrated is returned by OpenExisting and OpenReadOnly for a
// database that holds no idemgate schema yet.
var ErrNotMigrated = errors.New("postgres: the database holds no idemgate ledger")

// Migrate applies the migrations this build knows and the database lacks,
// under an advisory lock, and returns the schema version before and after.
// A database whose schema is newer than this build is refused with
// ledger.ErrSchemaVersion (an older binary never writes a newer schema).
func Migrate(ctx context.Context, url string) (from, to int, err error) {
	pool, err := newPool(ctx, url)
	if err != nil {
		return 0, 0, err
	}
	defer pool.Close()
	return migrate(ctx, pool)
}

func migrate(ctx context.Context, pool *pgxpool.Pool) (from, to int, err error) {
	return migrateTo(ctx, pool, 0)
}

// migrateTo is migrate stopping at version upTo (0: the newest); tests
// make older schemas with it.
func migrateTo(ctx context.Context, pool *pgxpool.Pool, upTo int) (from, to int, err error) {
	ms, err := migrations()
	if err != nil {
		return 0, 0, err
	}
	if upTo > 0 && upTo < len(ms) {
		ms = ms[:upTo]
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return 0, 0, connError(err)
	}
	defer conn.Release()
	// A migration may take long, and so may waiting for another process's
	// (the lock below): the session bounds (sessionBounds) are lifted on
	// this connection while it migrates.
	if _, err := conn.Exec(ctx, "SET statement_timeout = 0; SET lock_timeout = 0"); err != nil {
		return 0, 0, connError(err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "RESET statement_timeout; RESET lock_timeout")
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrateLockKey); err != nil {
		return 0, 0, connError(err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrateLockKey)
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS idemgate_schema_version (
		version    integer PRIMARY KEY,
		name       text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return 0, 0, fmt.Errorf("postgres: creating idemgate_schema_version: %w", err)
	}
	from, err = currentVersion(ctx, conn.Conn())
	if err != nil {
		return 0, 0, err
	}
	if from > len(ms) {
		if upTo > 0 {
			return from, from, nil
		}
		return from, from, newerSchema(from)
	}
	for _, m := range ms[from:] {
		err := pgx.BeginFunc(ctx, conn.Conn(), func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.sql); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "INSERT INTO idemgate_schema_version (version, name) VALUES ($1, $2)", m.version, m.name)
			return err
		})
		if err != nil {
			return from, m.version - 1, fmt.Errorf("postgres: migration %s: %w", m.name, err)
		}
	}
	return from, len(ms), nil
}

type querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// currentVersion reads the schema version: 0 when the table is missing
// or empty.
func currentVersion(ctx context.Context, q querier) (int, error) {
	var exists bool
	if err := q.QueryRow(ctx, "SELECT to_regclass('idemgate_schema_version') IS NOT NULL").Scan(&exists); err != nil {
		return 0, connError(err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := q.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM idemgate_schema_version").Scan(&v); err != nil {
		return 0, connError(err)
	}
	return v, nil
}

func newerSchema(v int) error {
	return fmt.Errorf("%w: the database's idemgate schema is version %d, this build knows versions up to %d; run a newer idemgate (an older binary never writes a newer schema)", ledger.ErrSchemaVersion, v, SchemaVersion())
}
