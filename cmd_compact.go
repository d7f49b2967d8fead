package main

import (
	"errors"
	"flag"
	"fmt"
	"io"

	"idemgate/ledger/bolt"
	"idemgate/ledger/postgres"
	"idemgate/owner"
)

// compactCmd reclaims the free space of a ledger file: bbolt compaction
// into a new file, checked and swapped in while no other process has the
// ledger open (or, with --out, written beside it as a copy).
func compactCmd(args []string, stdout, stderr io.Writer) error {
	const use = "usage: idemgate compact [--db PATH] [--out FILE] [--no-backup]"
	fs := flag.NewFlagSet("compact", flag.ContinueOnError)
	fs.SetOutput(stderr)
	db := dbFlag(fs)
	out := fs.String("out", "", "write the compacted ledger to this new file and leave the ledger as it is (it reads the file, so not while the ledger's owner serves it: then idemgate backup COPY and compact --db COPY instead)")
	noBackup := fs.Bool("no-backup", false, "after compacting in place, delete the old file instead of keeping it beside the ledger as FILE.pre-compact-TIME")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q; %s", fs.Args(), use)}
	}
	if *db == "" {
		return usageError{errors.New("--db is empty and no data directory could be found; pass --db PATH")}
	}
	if *out != "" && *noBackup {
		return usageError{errors.New("--no-backup is for compacting in place; --out never changes the ledger")}
	}
	if postgres.IsURL(*db) {
		return errors.New("compact rewrites a ledger file; PostgreSQL reclaims a database's space itself: autovacuum makes deleted rows' space reusable, and VACUUM FULL idemgate_kv (which locks the table while it runs) returns it to the system")
	}
	// Compact reads the file (and in place replaces it): the owner that
	// holds it for the ledger's clients must go first.
	if place, err := owner.PlaceOf(*db); err == nil {
		if pid, ok := owner.PID(place); ok {
			return fmt.Errorf("ledger %s: its owner, process %d, holds it for its clients, and compact needs the file: stop the owner (kill %d; it also exits a minute after its last client leaves) and compact again, or, for a compacted copy while it serves, run idemgate backup COPY and then idemgate compact --db COPY", *db, pid, pid)
		}
	}
	res, err := bolt.Compact(*db, bolt.CompactOptions{Out: *out, NoBackup: *noBackup})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "compacted %s: %s → %s (%d keys copied and checked)\n", res.Path, mib(res.Before), mib(res.After), res.Keys)
	if res.Backup != "" {
		fmt.Fprintf(stdout, "the old file is kept as %s: delete it once the compacted ledger has served\n", res.Backup)
	}
	return nil
}

// mib is a file size for people.
func mib(n int64) string {
	if n < 1<<20 {
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
