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

func ops(args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || (args[0] != "list" && args[0] != "show") {
		return usageError{errors.New("usage: idemgate ops list [--tenant T] [--state S] [--limit N] | idemgate ops show KEY [--tenant T]")}
	}
	sub := args[0]
	fs := flag.NewFlagSet("ops "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	tenant := fs.String("tenant", env("IDEMGATE_TENANT", "default"), "tenant (\"\" with list: every tenant)")
	state := fs.String("state", "", "list only this state")
	limit := fs.Int("limit", 50, "list at most this many (1-10000)")
	asJSON := fs.Bool("json", false, "print JSON")
	rest := args[1:]
	var key string
	if sub == "show" {
		if len(rest) == 0 || len(rest[0]) == 0 || rest[0][0] == '-' {
			return usageError{errors.New("usage: idemgate ops show KEY [--tenant T]")}
		}
		key, rest = rest[0], rest[1:]
	}
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if *limit < 1 || *limit > 10000 {
		return usageError{fmt.Errorf("--limit must be 1-10000, got %d", *limit)}
	}
	store, err := lf.openReadOnly()
	if err != nil {
		return err
	}
	defer store.Close()
	ctx := context.Background()
	if sub == "show" {
		rec, err := store.Get(ctx, *tenant, key)
		if errors.Is(err, ledger.ErrNotFound) {
			return fmt.Errorf("no operation %q in tenant %q", key, *tenant)
		}
		if err != nil {
			return err
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rec)
	}
	recs, err := store.List(ctx, ledger.Filter{Tenant: *tenant, State: ledger.State(*state), Limit: *limit})
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(recs)
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "FIRST SEEN\tTENANT\tKEY\tTOOL\tSTATE\tATTEMPTS\tSUMMARY")
	for _, r := range recs {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", r.FirstSeenAt.UTC().Format(time.RFC3339), r.Tenant, r.Key, r.Tool, r.State, r.Attempts, r.Summary)
	}
	return w.Flush()
}
