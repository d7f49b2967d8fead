package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"idemgate/ledger/postgres"
)

// migrateCmd applies the PostgreSQL ledger's schema migrations (serve
// applies them too, at start; this runs them on their own, before a
// rolling upgrade, say).
func migrateCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := fs.String("db", env("IDEMGATE_DB", ""), "PostgreSQL ledger URL, postgres://… (env IDEMGATE_DB)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("migrate takes no arguments, got %q; usage: idemgate migrate --db postgres://…", fs.Args())}
	}
	if !postgres.IsURL(*db) {
		return usageError{errors.New("migrate works on a PostgreSQL ledger: pass --db postgres://… (a ledger file needs no migration; it is upgraded when opened)")}
	}
	return migrateDB(*db, stdout)
}

// migrateDB migrates the PostgreSQL ledger at url and says what it did.
func migrateDB(url string, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	from, to, err := postgres.Migrate(ctx, url)
	if err != nil {
		return err
	}
	if from == to {
		fmt.Fprintf(stdout, "PostgreSQL ledger schema: version %d, up to date\n", to)
	} else {
		fmt.Fprintf(stdout, "PostgreSQL ledger schema: migrated from version %d to %d\n", from, to)
	}
	return nil
}
