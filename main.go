// Command idemgate is an MCP server whose side-effecting tools are safe to
// call twice. See README.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"idemgate/server"
)

const usage = `idemgate — an MCP server whose side-effecting tools are safe to call twice

Usage:
  idemgate serve [flags]          serve MCP over stdio (embedded ledger), or --http ADDR
  idemgate console [--listen 127.0.0.1:8081] [--principal P --tenant T] [--db PATH]
                                  serve the web console alone and print a one-time login link
  idemgate tokens add --principal P --tenant T --role agent|approver
                                  create a bearer token for --http (shown once; stored hashed)
  idemgate ops list [flags]       list recent operations, newest first (--limit N, --cursor C for the next page)
  idemgate ops show KEY [flags]   show one operation's record and its whole audit history
  idemgate approvals list|show ID|approve ID|reject ID [--comment C] --principal P [--token TOKEN]
                                  decide approvals as an approver, on the same ledger
  idemgate approvals require-token on|off --token TOKEN
                                  make every process on the ledger ask approvers for a token (or stop)
  idemgate reconcile KEY [--db PATH] [--orders-api URL] [--tenant T]
                                  ask the order API what became of an unknown operation
  idemgate resolve KEY --outcome succeeded|not_executed --evidence TEXT [--downstream-ref R]
                   --principal P [--token TOKEN] [--db PATH] [--orders-api URL]
                                  settle an unknown operation by hand, as an approver
  idemgate outbox requeue MESSAGE_ID   retry a dead-lettered notification
  idemgate stats [--tenant T] [--json]
                                  reliability numbers: duplicates, replays, unknown outcomes, retries
  idemgate audit verify|tail|export
                                  check the audit hash chain, print recent entries, or export it as JSON lines
  idemgate audit prune --before TIME|--audit-retention AGE --export FILE|--discard
                                  archive the old audit entries and remove them (verify --archive FILE checks both)
  idemgate init [--db PATH]       create a new, empty ledger file (never overwrites one)
  idemgate migrate --db URL       create or upgrade a PostgreSQL ledger's schema (serve does it at start)
  idemgate check [--db PATH] [--outbox-dir DIR]
                                  check the whole ledger file (pages, records, audit entries) and the outbox
                                  segments beside it (damaged lines, torn tails); exit 1 on a problem
  idemgate backup FILE [--db PATH]
                                  write a consistent copy of the ledger, while servers run
  idemgate compact [--db PATH] [--out FILE] [--no-backup]
                                  shrink the ledger file to its live data (no other process may have it open)
  idemgate bench [--clients N] [--dup-ratio R] [--mix TOOL=W,…] [--duration D] [--json] [--floors]
                 [--url URL --token T]
                                  load-test a spawned server (stdio) or a running one (HTTP) to size a deployment
  idemgate tools check [--config FILE]
                                  check the declared tools ([[tools]], tools_dir) and print them as tools/list will
  idemgate tools import OPENAPI_FILE --operation ID --base-url URL
                                  write declarations of an OpenAPI document's operations, for a person to review
  idemgate demo                   walk through the guarantees with a real server
  idemgate version

Every command that opens the ledger takes --db PATH, or a postgres:// URL
(env IDEMGATE_DB), and --config FILE. Run "idemgate COMMAND --help" (or
"idemgate help COMMAND") for a command's flags.
`

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run runs the command args; ctx ends a long-running one (serve, console)
// as SIGTERM does: in the owner of a ledger file, when the client that
// sent the command leaves.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	var err error
	switch args[0] {
	case "serve":
		err = serve(ctx, args[1:], stdin, stdout, stderr)
	case ownerArg:
		err = ownerCmd(args[1:], stderr)
	case "console":
		err = consoleCmd(ctx, args[1:], stderr)
	case "ops":
		err = ops(args[1:], stdout, stderr)
	case "approvals":
		err = approvalsCmd(args[1:], stdout, stderr)
	case "audit":
		err = audit(args[1:], stdout, stderr)
	case "stats":
		err = stats(args[1:], stdout, stderr)
	case "outbox":
		err = outboxCmd(args[1:], stdout, stderr)
	case "reconcile", "resolve":
		err = settleCmd(args[0], args[1:], stdout, stderr)
	case "tokens":
		err = tokensCmd(args[1:], stdout, stderr)
	case "init":
		err = initCmd(args[1:], stdout, stderr)
	case "migrate":
		err = migrateCmd(args[1:], stdout, stderr)
	case "check":
		err = checkCmd(args[1:], stdout, stderr)
	case "backup":
		err = backupCmd(args[1:], stdout, stderr)
	case "compact":
		err = compactCmd(args[1:], stdout, stderr)
	case "bench":
		err = benchCmd(args[1:], stdout, stderr)
	case "tools":
		err = toolsCmd(args[1:], stdout, stderr)
	case "demo":
		err = runDemo(args[1:], stdout, stderr)
	case "version", "--version":
		if len(args) > 1 && isHelpArg(args[1]) {
			fmt.Fprint(stderr, "usage: idemgate version\n\nPrints idemgate's version.\n")
			return 0
		}
		fmt.Fprintln(stdout, "idemgate", server.Version)
	case "help", "-h", "--help", "-help":
		if len(args) > 1 && args[0] == "help" && !isHelpArg(args[1]) {
			// idemgate help CMD [SUB] is idemgate CMD [SUB] --help.
			return run(ctx, append(args[1:len(args):len(args)], "--help"), stdin, stdout, stderr)
		}
		fmt.Fprint(stdout, usage)
	default:
		fmt.Fprintf(stderr, "idemgate: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	var status exitStatus
	if errors.As(err, &status) {
		return int(status) // the command ran in the ledger's owner, which wrote why
	}
	if err != nil {
		fmt.Fprintln(stderr, "idemgate:", err)
		if errors.As(err, new(usageError)) {
			return 2
		}
		return 1
	}
	return 0
}
