package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/ledger/postgres"
)

// backupCmd writes a consistent copy of a live ledger to FILE, holding the
// ledger only as a reader does, then checks the copy.
func backupCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("backup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, "backup FILE [--db PATH]", "Writes a consistent copy of the ledger file to FILE (a new file) while servers run, and checks the copy.")
	db := dbFlag(fs)
	pos, err := parseCommand(fs, args, "FILE")
	if err != nil {
		return err
	}
	dst, err := filepath.Abs(pos[0])
	if err != nil {
		return err
	}
	if *db == "" {
		return usageError{errors.New("--db is empty and no data directory could be found; pass --db PATH")}
	}
	if postgres.IsURL(*db) {
		return usageError{errors.New("backup copies a ledger file; back a PostgreSQL ledger up with PostgreSQL's own tools (pg_dump, or continuous archiving)")}
	}
	t := throughOwner{words: []string{"backup"}, fs: fs, args: []string{dst}, db: *db}
	if err := t.run(context.Background(), stdout, stderr); err != nil {
		return err
	}
	var n int64
	if owned != nil {
		n, err = owned.store.(*bolt.File).Backup(dst)
	} else {
		store, oerr := bolt.OpenReadOnly(*db, ledger.Options{})
		if oerr != nil {
			return oerr
		}
		n, err = store.Backup(dst)
		if cerr := store.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return err
	}
	rep, err := bolt.Check(dst)
	if err != nil {
		return fmt.Errorf("backup %s was written but does not open: %w", dst, err)
	}
	if len(rep.Problems) > 0 {
		return fmt.Errorf("backup %s was written but does not check: %v", dst, rep.Problems[0])
	}
	fmt.Fprintf(stdout, "wrote %s: %d bytes, %d records, %d audit entries (checked)\n", dst, n, rep.Records, rep.Audit)
	return nil
}
