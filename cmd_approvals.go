package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/server"
	"idemgate/tools"
	"io"
	"strings"
	"time"
)

// approvalsCmd lets an approver list and decide approvals from a terminal,
// on the same ledger the agents' servers use, through the same code as the
// decide_approval tool.
func approvalsCmd(args []string, stdout, stderr io.Writer) error {
	const use = "usage: idemgate approvals list | show ID | approve ID [--comment C] | reject ID [--comment C] | require-token on|off  (with --principal P --tenant T, or --token)"
	if err := groupHelp("approvals", use, args, stderr); err != nil {
		return err
	}
	if len(args) == 0 {
		return usageError{errors.New(use)}
	}
	sub := args[0]
	var want []string
	fs := flag.NewFlagSet("approvals "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	switch sub {
	case "list":
		setUsage(fs, "approvals list [flags]", "Lists the pending approvals of the approver's tenant, each with its diff.")
	case "show":
		want = []string{"ID"}
		setUsage(fs, "approvals show ID [flags]", "Shows one approval of the tenant, with its diff.")
	case "approve", "reject":
		want = []string{"ID"}
		setUsage(fs, "approvals "+sub+" ID [--comment C] [flags]", "Decides an approval as an approver (not the requester), through the same code as the decide_approval tool; approve runs the operation.")
	case "require-token":
		want = []string{"on|off"}
		setUsage(fs, "approvals require-token on|off --token TOKEN [flags]", "Makes every process on the ledger ask approvers for a token (on), or stops asking (off).")
	default:
		return usageError{errors.New(use)}
	}
	var lf settings
	lf.register(fs)
	principal := fs.String("principal", env("IDEMGATE_PRINCIPAL", ""), "the approver deciding (env IDEMGATE_PRINCIPAL)")
	tenant := fs.String("tenant", env("IDEMGATE_TENANT", "default"), "tenant (env IDEMGATE_TENANT)")
	comment := fs.String("comment", "", "why; recorded in the audit log (approve, reject)")
	outbox := fs.String("outbox-dir", env("IDEMGATE_OUTBOX_DIR", ""), "notification sink directory (default: 'outbox' beside --db)")
	var tf tokenFlags
	tf.register(fs)
	pos, err := parseCommand(fs, args[1:], want...)
	if err != nil {
		return err
	}
	var id string
	if len(pos) > 0 {
		id = pos[0]
	}
	if sub == "require-token" && id != "on" && id != "off" {
		return usageError{fmt.Errorf("require-token %q: say on or off", id)}
	}
	if err := lf.inOwner(fs, stdout, stderr, []string{"approvals", sub}, pos...); err != nil {
		return err
	}
	if err := lf.load(); err != nil {
		return err
	}
	who, err := tf.identity(&lf, fs, server.Identity{Principal: *principal, Tenant: *tenant, Role: approvals.RoleApprover}, sub == "approve" || sub == "reject" || sub == "require-token")
	if err != nil {
		return err
	}
	if sub == "require-token" && tf.token == "" {
		return errors.New("forbidden: changing require_approver_token needs an approver's token (IDEMGATE_TOKEN or --token), whatever the rule is now")
	}
	if err := who.Validate(); err != nil {
		return usageError{err}
	}
	if len(*comment) > 1000 {
		return usageError{fmt.Errorf("--comment is %d characters; at most 1000", len(*comment))}
	}
	store, svc, err := lf.openServiceMode(sub == "list" || sub == "show", *outbox, 0, quietLogger(stderr))
	if err != nil {
		return err
	}
	defer store.Close()
	ctx := context.Background()
	actor := ledger.Actor{Tenant: who.Tenant, Principal: who.Principal, Role: who.Role, ClientName: "idemgate-cli"}
	switch sub {
	case "list":
		list, err := listAllPending(ctx, svc, actor)
		if err != nil {
			return err
		}
		printApprovals(stdout, list)
		return nil
	case "require-token":
		if err := setApproverTokenRule(ctx, store, id == "on"); err != nil {
			return err
		}
		store.Audit(ledger.AuditEntry{Event: ledger.EventCall, Actor: actor, Decision: ledger.AuditDecision("require_approver_token " + id)})
		fmt.Fprintf(stdout, "require_approver_token: %s (recorded in the ledger; every process on it enforces it)\n", id)
		return nil
	case "show":
		a, err := svc.ShowApproval(ctx, actor, id)
		if err != nil {
			return err
		}
		printApprovals(stdout, []tools.ApprovalView{*a})
		return nil
	}
	resp := svc.Decide(ctx, actor, tools.DecideRequest{ApprovalID: id, Decision: tools.Decision(sub), Comment: *comment})
	// Deliver what the approved operation queued, so a confirmation is
	// not left waiting for the next server to start.
	svc.Deliverer().DeliverPending(ctx)
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(resp); err != nil {
		return err
	}
	rejectedAsAsked := sub == "reject" && resp.Status == ledger.StateRejected && resp.Approval != nil && ledger.SamePrincipal(resp.Approval.DecidedBy, who.Principal)
	if resp.IsError && resp.Error != nil && !rejectedAsAsked {
		return fmt.Errorf("%s: %s", resp.Error.Code, resp.Error.Message)
	}
	return nil
}

// printApprovals prints approvals for a person: each with its diff text.
func printApprovals(w io.Writer, list []tools.ApprovalView) {
	if len(list) == 0 {
		fmt.Fprintln(w, "no pending approvals")
	}
	for _, a := range list {
		fmt.Fprintf(w, "%s  %s  %s  requested by %s  expires %s\n  why: %s\n", a.ApprovalID, a.Status, a.Tool, a.RequestedBy, a.ExpiresAt.Format(time.RFC3339Nano), a.Reason)
		fmt.Fprintf(w, "  operation_key: %s\n", a.OperationKey)
		for _, line := range strings.Split(strings.TrimRight(a.DiffText, "\n"), "\n") {
			fmt.Fprintf(w, "  | %s\n", line)
		}
		fmt.Fprintln(w)
	}
}

// listAllPending pages through every pending approval, oldest first (a
// person at a terminal wants them all).
func listAllPending(ctx context.Context, svc *tools.Service, actor ledger.Actor) ([]tools.ApprovalView, error) {
	var all []tools.ApprovalView
	req := tools.ListApprovalsRequest{Limit: 100}
	for {
		page, err := svc.ListApprovals(ctx, actor, req)
		if err != nil {
			return nil, err
		}
		all = append(all, page.Approvals...)
		if page.NextCursor == "" {
			return all, nil
		}
		req.Cursor = page.NextCursor
	}
}
