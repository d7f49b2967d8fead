package main

// idemgate audit prune and audit verify: audit retention from the command
// line. The rules (anchor, prune record, batches) are in package ledger
// (prune.go); this file parses, writes the archive file and prints.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"idemgate/ledger"
	"idemgate/server"
)

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(v string) error {
	if v == "" {
		return errors.New("empty")
	}
	*l = append(*l, v)
	return nil
}

// Bounds of --audit-retention: less than an hour is a mistake (the entries
// of calls still running), more than a century is "never".
const (
	minAuditRetention = time.Hour
	maxAuditRetention = 100 * 365 * 24 * time.Hour
)

// auditVerify checks the archives (in order) and then the ledger's kept
// log, then that the chain holds what the checkpoints in the files
// checkpointFiles cover (signed by key), and says what was proven from
// where.
func auditVerify(ctx context.Context, store ledger.Store, archives, checkpointFiles []string, key *checkpointKey, stdout io.Writer) error {
	var cps checkpointCheck
	for _, name := range checkpointFiles {
		if err := cps.read(name, key); err != nil {
			return fmt.Errorf("checkpoint file %s: %w", name, err)
		}
	}
	var chain *ledger.AuditChain
	if len(archives) > 0 {
		chain = &ledger.AuditChain{}
		for _, name := range archives {
			first := chain.Last + 1
			n, err := readArchive(name, chain, cps.see)
			if err != nil {
				return fmt.Errorf("archive %s: %w", name, err)
			}
			if n == 0 {
				return fmt.Errorf("archive %s: no entries", name)
			}
			if chain.N == n {
				first = chain.First
			}
			fmt.Fprintf(stdout, "archive %s: entries %d-%d chain intact\n", name, first, chain.Last)
		}
		if chain.First != 1 {
			fmt.Fprintf(stdout, "note: the archives start at entry %d; entries before it are taken as given (pass their archives first to check them)\n", chain.First)
		}
	}
	res, err := store.VerifyAuditChain(ctx, chain)
	if err != nil {
		return fmt.Errorf("audit chain broken after %d good entries: %w", res.Entries, err)
	}
	if err := cps.check(ctx, store); err != nil {
		return fmt.Errorf("audit chain does not hold what a checkpoint covers: %w", err)
	}
	defer cps.report(stdout)
	switch {
	case res.Anchor == nil && chain != nil:
		fmt.Fprintf(stdout, "audit chain intact: %d entries; the archives are copies of entries %d-%d\n", res.Entries, chain.First, chain.Last)
	case res.Anchor == nil:
		fmt.Fprintf(stdout, "audit chain intact: %d entries\n", res.Entries)
	case chain != nil:
		fmt.Fprintf(stdout, "audit chain intact: entries %d-%d from the archives, %d-%d in the ledger (%d entries)\n", chain.First, chain.Last, res.First, res.Last, res.Entries)
	default:
		a := res.Anchor
		fmt.Fprintf(stdout, "audit chain intact: %d entries (%d-%d), from the anchor: entries 1-%d were pruned on %s (the last one's hash %s); check their archive with --archive FILE\n",
			res.Entries, res.First, res.Last, a.Seq, a.PrunedAt.UTC().Format(time.RFC3339), a.Hash)
	}
	return nil
}

// readArchive adds the entries of an archive file (JSON lines, the format
// of audit export) to chain, each also to see, and returns how many it
// read. The checkpoint line of an export is skipped (pass the file to
// --checkpoint to check it).
func readArchive(name string, chain *ledger.AuditChain, see func(ledger.AuditEntry) error) (int, error) {
	f, err := os.Open(name)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	dec := json.NewDecoder(bufio.NewReaderSize(f, 1<<20))
	n := 0
	for line := 1; ; line++ {
		var raw json.RawMessage
		err := dec.Decode(&raw)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		var e ledger.AuditEntry
		if err == nil {
			if bytes.HasPrefix(raw, []byte(`{"audit_checkpoint":`)) {
				continue
			}
			err = json.Unmarshal(raw, &e)
		}
		if err != nil {
			return n, fmt.Errorf("line %d: not an audit entry: %w", line, err)
		}
		if err := chain.Add(e); err != nil {
			return n, err
		}
		if err := see(e); err != nil {
			return n, err
		}
		n++
	}
}

func auditPrune(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("audit prune", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	before := fs.String("before", "", "prune the entries written before this time (RFC 3339, e.g. 2026-01-01T00:00:00Z)")
	age := fs.Duration("audit-retention", 0, "prune the entries older than this (e.g. 2160h); default: [audit] retention in the config file")
	export := fs.String("export", "", "write the pruned entries to this new file first (JSON lines, the format of audit export); it must not exist")
	discard := fs.Bool("discard", false, "prune without writing the entries anywhere (they are gone for good)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q", fs.Arg(0))}
	}
	if err := lf.inOwner(fs, stdout, stderr, []string{"audit", "prune"}); err != nil {
		return err
	}
	if err := lf.load(); err != nil {
		return err
	}
	if (*export == "") == !*discard {
		return usageError{errors.New("audit prune removes entries for good: say --export FILE to write them to an archive first, or --discard to drop them without one")}
	}
	var cutoff time.Time
	switch {
	case *before != "" && *age != 0:
		return usageError{errors.New("--before and --audit-retention both say which entries to prune: give one")}
	case *before != "":
		t, err := time.Parse(time.RFC3339, *before)
		if err != nil {
			return usageError{fmt.Errorf("--before: %w", err)}
		}
		if t.After(time.Now()) {
			return usageError{fmt.Errorf("--before %s is in the future", *before)}
		}
		cutoff = t
	default:
		d := *age
		if d == 0 {
			d = lf.file.Audit.Retention.Duration
		}
		if d == 0 {
			return usageError{errors.New("say which entries to prune: --before TIME, --audit-retention AGE, or [audit] retention in the config file")}
		}
		if d < minAuditRetention || d > maxAuditRetention {
			return usageError{fmt.Errorf("audit retention must be between %s and %s, got %s", minAuditRetention, maxAuditRetention, d)}
		}
		cutoff = time.Now().Add(-d)
	}
	var archive *archiveFile
	if *export != "" {
		a, err := createArchive(*export)
		if err != nil {
			return err
		}
		archive = a
		defer archive.f.Close()
	}
	store, err := lf.open()
	if err != nil {
		if archive != nil {
			archive.remove()
		}
		return err
	}
	defer store.Close()
	var la ledger.AuditArchive
	if archive != nil {
		la = archive
	}
	actor := ledger.Actor{Principal: "audit-prune", ClientName: "idemgate", ClientVersion: server.Version}
	res, err := store.PruneAudit(context.Background(), cutoff, actor, la)
	if archive != nil && res.Entries == 0 {
		archive.remove() // nothing went into it
	}
	if res.Entries > 0 {
		where := "discarded"
		if archive != nil {
			where = "exported to " + archive.name
		}
		fmt.Fprintf(stdout, "pruned audit entries 1-%d (%d this run, written before %s), %s; the log now starts at entry %d, anchored at entry %d (hash %s)\n",
			res.Anchor.Seq, res.Entries, cutoff.UTC().Format(time.RFC3339), where, res.Anchor.Seq+1, res.Anchor.Seq, res.Anchor.Hash)
	}
	if err != nil {
		return fmt.Errorf("audit prune stopped: %w", err)
	}
	if res.Entries == 0 {
		fmt.Fprintf(stdout, "nothing to prune: no audit entry was written before %s\n", cutoff.UTC().Format(time.RFC3339))
	}
	return nil
}

// archiveFile is an archive a prune writes: a new file of JSON lines, each
// batch synced before the ledger removes it.
type archiveFile struct {
	name string
	f    *os.File
	size int64 // bytes written and synced so far
	prev int64 // size before the last Write (for Undo)
}

// createArchive creates name, refusing to overwrite a file, and makes its
// name durable.
func createArchive(name string) (*archiveFile, error) {
	f, err := os.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, os.ErrExist) {
		return nil, usageError{fmt.Errorf("--export %s: the file exists; audit prune never overwrites an archive, choose a new name", name)}
	}
	if err != nil {
		return nil, fmt.Errorf("--export: %w", err)
	}
	if d, err := os.Open(filepath.Dir(name)); err == nil {
		d.Sync()
		d.Close()
	}
	return &archiveFile{name: name, f: f}, nil
}

// Write implements ledger.AuditArchive: the entries are appended and
// synced; the note names the file and the SHA-256 of these lines.
func (a *archiveFile) Write(entries []ledger.AuditEntry) (string, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, e := range entries {
		if err := enc.Encode(e); err != nil {
			return "", err
		}
	}
	if _, err := a.f.Write(buf.Bytes()); err != nil {
		return "", err
	}
	if err := a.f.Sync(); err != nil {
		return "", err
	}
	a.prev, a.size = a.size, a.size+int64(buf.Len())
	sum := sha256.Sum256(buf.Bytes())
	return fmt.Sprintf("exported to %s, these lines' sha256 %s", filepath.Base(a.name), hex.EncodeToString(sum[:])), nil
}

// Undo implements ledger.AuditArchive: the last batch, not pruned after
// all, is cut off again, so the archive holds exactly what was pruned.
func (a *archiveFile) Undo() error {
	if err := a.f.Truncate(a.prev); err != nil {
		return err
	}
	if _, err := a.f.Seek(a.prev, io.SeekStart); err != nil {
		return err
	}
	a.size = a.prev
	return a.f.Sync()
}

// remove deletes an archive nothing was pruned into.
func (a *archiveFile) remove() {
	a.f.Close()
	os.Remove(a.name)
}
