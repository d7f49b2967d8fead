package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"idemgate/ledger/bolt"
	"idemgate/ledger/postgres"
	"idemgate/outbox"
)

// checkCmd checks the whole ledger file read-only: bbolt's page check and
// every record and audit entry; then, read-only too, the outbox segments
// beside it (--outbox-dir) when there are any (outbox.CheckSegments).
// Problems go to stdout, one a line; the exit status is 1 when there is
// any.
func checkCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := dbFlag(fs)
	outboxDir := fs.String("outbox-dir", env("IDEMGATE_OUTBOX_DIR", ""), "the notification outbox directory whose segments to check, if any (default: 'outbox' beside --db)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("check takes no arguments, got %q; usage: idemgate check [--db PATH] [--outbox-dir DIR]", fs.Args())}
	}
	if *db == "" {
		return usageError{errors.New("--db is empty and no data directory could be found; pass --db PATH")}
	}
	if postgres.IsURL(*db) {
		return usageError{errors.New("check inspects a ledger file's pages; a PostgreSQL ledger is checked by PostgreSQL itself (pg_amcheck), and its audit chain by: idemgate audit verify --db URL")}
	}
	t := throughOwner{words: []string{"check"}, fs: fs, db: *db}
	if err := t.run(context.Background(), stdout, stderr); err != nil {
		return err
	}
	var (
		rep bolt.CheckReport
		err error
	)
	if owned != nil {
		rep, err = owned.store.(*bolt.File).Check()
	} else {
		rep, err = bolt.Check(*db)
	}
	if err != nil {
		return err
	}
	for _, p := range rep.Problems {
		fmt.Fprintln(stdout, p)
	}
	if *outboxDir == "" {
		*outboxDir = filepath.Join(dataDirOf(*db), "outbox")
	}
	segProblems, err := outbox.CheckSegments(*outboxDir)
	if err != nil {
		return err
	}
	for _, p := range segProblems {
		fmt.Fprintln(stdout, p)
	}
	if n := len(rep.Problems); n > 0 {
		return fmt.Errorf("ledger %s: the ledger file is damaged: %d problem(s) found (listed on stdout): stop every process using it and restore it from a backup (see idemgate backup)", *db, n)
	}
	fmt.Fprintf(stdout, "ledger %s: ok (%d records, %d audit entries; every page checked)\n", *db, rep.Records, rep.Audit)
	if n := len(segProblems); n > 0 {
		return fmt.Errorf("outbox segments in %s: %d problem(s) found (listed on stdout): each line says what to do", *outboxDir, n)
	}
	return nil
}
