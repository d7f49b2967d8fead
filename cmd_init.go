package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"idemgate/ledger/bolt"
	"idemgate/ledger/postgres"
)

// dbFlag registers --db alone, for the commands that work on the file
// itself (init, check, backup).
func dbFlag(fs *flag.FlagSet) *string {
	return fs.String("db", env("IDEMGATE_DB", defaultDB()), "ledger file, or postgres:// URL (env IDEMGATE_DB)")
}

// initCmd creates a new, empty ledger. It never overwrites a file: an
// existing one, even empty, is refused.
func initCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := dbFlag(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("init takes no arguments, got %q; usage: idemgate init [--db PATH]", fs.Args())}
	}
	if *db == "" {
		return usageError{errors.New("--db is empty and no data directory could be found; pass --db PATH")}
	}
	if postgres.IsURL(*db) { // the PostgreSQL equivalent: create the schema
		return migrateDB(*db, stdout)
	}
	if err := os.MkdirAll(filepath.Dir(*db), 0o700); err != nil {
		return fmt.Errorf("ledger directory: %w", err)
	}
	if err := bolt.Init(*db); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "created an empty ledger at %s\n", *db)
	return nil
}
