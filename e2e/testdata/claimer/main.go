// Command claimer is a second executor on an idemgate ledger file, used by
// the end-to-end suite to hold an operation in_progress while a real
// `idemgate serve` process answers a duplicate call. The embedded order
// store claims and executes in one transaction, so the binary alone never
// leaves an in_progress record behind; a downstream that runs outside the
// transaction (the HTTP order API of DESIGN §6) does, and this program
// plays that executor through the ledger's public Claim/Complete API.
//
// Usage: claimer -db FILE -tenant T -tool NAME -args JSON
//
// It claims the operation named by the arguments' operation_key, prints one
// JSON line {"key","generation","state"} on stdout, then reads commands
// from stdin: "complete RESULT_JSON" completes the operation as succeeded
// with that result and prints {"state":"succeeded"} (or {"error":…} when
// the ledger refuses the completion); end of input exits
// without completing (the record stays in_progress until its lease ends).
//
// One process at a time opens a ledger file: the claimer closes it once it
// has claimed, so a server can open it, and opens it again to complete
// (waiting up to 5 s for it).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/schemas"
)

func main() {
	db := flag.String("db", "", "ledger file")
	tenant := flag.String("tenant", "default", "tenant")
	tool := flag.String("tool", "create_order", "tool")
	args := flag.String("args", "{}", "tool arguments (JSON)")
	lease := flag.Duration("lease", 30*time.Second, "lease of the claim")
	flag.Parse()
	if err := run(*db, *tenant, *tool, *args, *lease); err != nil {
		fmt.Fprintln(os.Stderr, "claimer:", err)
		os.Exit(1)
	}
}

func run(db, tenant, tool, args string, lease time.Duration) error {
	ctx := context.Background()
	v, err := schemas.New()
	if err != nil {
		return err
	}
	req, err := v.Prepare(tool, json.RawMessage(args))
	if err != nil {
		return err
	}
	store, err := bolt.Open(db, ledger.Options{Lease: lease})
	if err != nil {
		return err
	}
	actor := ledger.Actor{Tenant: tenant, Principal: "claimer", Role: "agent"}
	d, err := store.Claim(ctx, ledger.Claim{
		Actor: actor, Key: req.OperationKey, Tool: req.Tool, Fingerprint: req.Fingerprint,
		OnLeaseExpiry: ledger.StateRetryable,
	})
	if cerr := store.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if d.Kind != ledger.DecisionClaimed {
		return fmt.Errorf("claim: decision %q, state %q", d.Kind, d.Record.State)
	}
	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(map[string]any{"key": d.Record.Key, "generation": d.Record.Generation, "state": d.Record.State}); err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	for in.Scan() {
		cmd, rest, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "complete":
			rec, err := complete(ctx, db, lease, actor, d.Record, json.RawMessage(rest))
			if err != nil { // e.g. a stale generation after the lease ran out
				if err := out.Encode(map[string]any{"error": err.Error()}); err != nil {
					return err
				}
				continue
			}
			if err := out.Encode(map[string]any{"state": rec.State}); err != nil {
				return err
			}
		default:
			return fmt.Errorf("unknown command %q", cmd)
		}
	}
	return in.Err()
}

// complete opens the ledger again and completes rec as succeeded with
// result.
func complete(ctx context.Context, db string, lease time.Duration, actor ledger.Actor, rec *ledger.Record, result json.RawMessage) (*ledger.Record, error) {
	store, err := bolt.Open(db, ledger.Options{Lease: lease}, bolt.Wait(5*time.Second))
	if err != nil {
		return nil, err
	}
	defer store.Close()
	return store.Complete(ctx, actor, rec.Key, rec.Generation, ledger.Outcome{
		State: ledger.StateSucceeded, Result: result, Summary: "completed by claimer", DownstreamRef: "claimer",
	})
}
