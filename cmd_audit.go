package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"idemgate/ledger"
	"io"
	"text/tabwriter"
	"time"
)

func audit(args []string, stdout, stderr io.Writer) error {
	const use = "usage: idemgate audit verify [--archive FILE]... [--checkpoint FILE]... | tail [-n N] | export [--after SEQ] | prune (--before TIME | --audit-retention AGE) (--export FILE | --discard)"
	if err := groupHelp("audit", use, args, stderr); err != nil {
		return err
	}
	if len(args) == 0 || (args[0] != "verify" && args[0] != "tail" && args[0] != "export" && args[0] != "prune") {
		return usageError{errors.New(use)}
	}
	if args[0] == "prune" {
		return auditPrune(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("audit "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	n := fs.Int("n", 20, "tail: how many of the newest entries (1-10000)")
	after := fs.Uint64("after", 0, "export: only entries with a sequence number above this (resume an earlier export)")
	var archives stringList
	fs.Var(&archives, "archive", "verify: an archive written by audit prune --export (or audit export), checked first and required to continue into the ledger; repeat, oldest first")
	var checkpoints stringList
	fs.Var(&checkpoints, "checkpoint", "verify: a file holding signed checkpoints of the chain (the server's log, or an audit export made with --audit-checkpoint-key): the chain must still hold every entry they cover, unchanged; repeat for several files")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q; %s", fs.Arg(0), use)}
	}
	if *n < 1 || *n > 10000 {
		return usageError{fmt.Errorf("-n must be 1-10000, got %d", *n)}
	}
	if (len(archives) > 0 || len(checkpoints) > 0) && args[0] != "verify" {
		return usageError{errors.New("--archive and --checkpoint are flags of audit verify")}
	}
	if err := lf.inOwner(fs, stdout, stderr, []string{"audit", args[0]}); err != nil {
		return err
	}
	store, err := lf.openReadOnly()
	if err != nil {
		return err
	}
	defer store.Close()
	var key *checkpointKey
	if name := lf.file.Audit.CheckpointKey; name != "" && (args[0] == "export" || len(checkpoints) > 0) {
		if key, err = loadCheckpointKey(name); err != nil {
			return usageError{err}
		}
	}
	ctx := context.Background()
	if args[0] == "verify" {
		if len(checkpoints) > 0 && key == nil {
			return usageError{errors.New("--checkpoint needs the key that signed the checkpoints: --audit-checkpoint-key FILE (its public key is enough)")}
		}
		return auditVerify(ctx, store, archives, checkpoints, key, stdout)
	}
	enc := json.NewEncoder(stdout)
	if args[0] == "export" {
		// The whole log (or what follows --after) as JSON lines, oldest
		// first, paged so that a long log is never held in memory; each
		// line keeps its hash chain fields for an external verifier.
		var last *ledger.AuditEntry
		for seq := *after; ; {
			page, err := store.AuditLog(ctx, seq, 10000)
			if err != nil {
				return err
			}
			for i, e := range page {
				if err := enc.Encode(e); err != nil {
					return err
				}
				seq, last = e.Seq, &page[i]
			}
			if len(page) < 10000 {
				break
			}
		}
		// With a signing key, a last line is the signed checkpoint of the
		// last entry exported: kept with the export, it proves later that
		// the ledger still holds every entry up to there.
		switch {
		case key == nil || last == nil:
		case key.priv == nil:
			fmt.Fprintf(stderr, "note: no checkpoint written: %s is a public key, which cannot sign\n", key.file)
		default:
			cp := ledger.SignAuditCheckpoint(key.priv, "", last.Seq, last.Hash, time.Now())
			return enc.Encode(exportCheckpoint{&cp})
		}
		return nil
	}
	entries, err := store.AuditTail(ctx, *n)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := enc.Encode(e); err != nil {
			return err
		}
	}
	return nil
}

func stats(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	tenant := fs.String("tenant", "", "only this tenant (default: every tenant)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("stats takes no arguments, got %q", fs.Args())}
	}
	if err := lf.inOwner(fs, stdout, stderr, []string{"stats"}); err != nil {
		return err
	}
	store, err := lf.openReadOnly()
	if err != nil {
		return err
	}
	defer store.Close()
	st, err := ledger.ComputeStats(context.Background(), store, *tenant)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	for _, row := range []struct {
		name string
		v    any
	}{
		{"operations", st.Operations},
		{"tool calls with a key", st.Calls},
		{"retry amplification (calls per operation)", fmt.Sprintf("%.2f", st.RetryAmplification)},
		{"duplicate side effects (must be 0)", st.DuplicateSideEffects},
		{"replays served", st.ReplaysServed},
		{"fingerprint mismatches refused", st.MismatchesRefused},
		{"invalid arguments refused", st.InvalidRefused},
		{"suspected duplicates held (new key, same request)", st.SuspectedDuplicates},
		{"false dedupes (held duplicates approved as new intents)", st.FalseDedupes},
		{"unknown outcomes", st.Unknown},
		{"  settled", st.Settled},
		{"  still unknown", st.StillUnsure},
		{"late replays after retention (key_expired)", st.LateReplays},
	} {
		fmt.Fprintf(w, "%s\t%v\n", row.name, row.v)
	}
	return w.Flush()
}
