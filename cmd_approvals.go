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
)

// approvalsCmd lets an approver list and decide approvals from a terminal,
// on the same ledger the agents' servers use, through the same code as the
// decide_approval tool.
func approvalsCmd(args []string, stdout, stderr io.Writer) error {
	const use = "usage: idemgate approvals list | show ID | approve ID [--comment C] | reject ID [--comment C]  (with --principal P --tenant T, or --token)"
	if len(args) == 0 {
		return usageError{errors.New(use)}
	}
	sub, rest := args[0], args[1:]
	var id string
	switch sub {
	case "list":
	case "show", "approve", "reject":
		if len(rest) == 0 || strings.HasPrefix(rest[0], "-") {
			return usageError{errors.New(use)}
		}
		id, rest = rest[0], rest[1:]
	default:
		return usageError{errors.New(use)}
	}
	fs := flag.NewFlagSet("approvals "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	principal := fs.String("principal", env("IDEMGATE_PRINCIPAL", ""), "the approver deciding (env IDEMGATE_PRINCIPAL)")
	tenant := fs.String("tenant", env("IDEMGATE_TENANT", "default"), "tenant (env IDEMGATE_TENANT)")
	comment := fs.String("comment", "", "why; recorded in the audit log (approve, reject)")
	outbox := fs.String("outbox-dir", env("IDEMGATE_OUTBOX_DIR", ""), "notification sink directory (default: 'outbox' beside --db)")
	var tf tokenFlags
	tf.register(fs)
	if err := fs.Parse(rest); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %q; %s", fs.Args(), use)}
	}
	if err := lf.load(); err != nil {
		return err
	}
	who, err := tf.identity(&lf, fs, server.Identity{Principal: *principal, Tenant: *tenant, Role: approvals.RoleApprover}, sub == "approve" || sub == "reject")
	if err != nil {
		return err
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
	var resp *tools.Response
	switch sub {
	case "list":
		resp = listAllPending(ctx, svc, actor)
	case "show":
		resp = svc.ShowApproval(ctx, actor, id)
	default:
		args := map[string]any{"approval_id": id, "decision": sub}
		if *comment != "" {
			args["comment"] = *comment
		}
		resp = svc.Call(ctx, actor, "decide_approval", args, nil)
		// Deliver what the approved operation queued, so a confirmation is
		// not left waiting for the next server to start.
		svc.Deliverer().DeliverPending(ctx)
	}
	if sub == "list" || sub == "show" {
		if err := printApprovals(stdout, resp); err != nil {
			return err
		}
	} else {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(resp); err != nil {
			return err
		}
	}
	rejectedAsAsked := sub == "reject" && resp.Status == ledger.StateRejected && resp.Approval != nil && ledger.SamePrincipal(resp.Approval.DecidedBy, who.Principal)
	if resp.IsError && resp.Error != nil && !rejectedAsAsked {
		return fmt.Errorf("%s: %s", resp.Error.Code, resp.Error.Message)
	}
	return nil
}

// printApprovals prints approvals for a person: each with its diff text.
func printApprovals(w io.Writer, resp *tools.Response) error {
	if resp.IsError {
		return nil
	}
	var r struct {
		Approvals []map[string]any `json:"approvals"`
		Approval  map[string]any   `json:"approval"`
	}
	if err := json.Unmarshal(resp.Result, &r); err != nil {
		return err
	}
	if r.Approval != nil {
		r.Approvals = append(r.Approvals, r.Approval)
	}
	if len(r.Approvals) == 0 {
		fmt.Fprintln(w, "no pending approvals")
	}
	for _, a := range r.Approvals {
		fmt.Fprintf(w, "%v  %v  %v  requested by %v  expires %v\n  why: %v\n", a["approval_id"], a["status"], a["tool"], a["requested_by"], a["expires_at"], a["reason"])
		fmt.Fprintf(w, "  operation_key: %v\n", a["operation_key"])
		for _, line := range strings.Split(strings.TrimRight(fmt.Sprint(a["diff_text"]), "\n"), "\n") {
			fmt.Fprintf(w, "  | %s\n", line)
		}
		fmt.Fprintln(w)
	}
	return nil
}

// listAllPending pages through every pending approval, oldest first, and
// answers as one page (a person at a terminal wants them all).
func listAllPending(ctx context.Context, svc *tools.Service, actor ledger.Actor) *tools.Response {
	var all []json.RawMessage
	args := map[string]any{"limit": 100}
	for {
		resp := svc.Call(ctx, actor, "list_pending_approvals", args, nil)
		if resp.IsError {
			return resp
		}
		var page struct {
			Approvals  []json.RawMessage `json:"approvals"`
			NextCursor string            `json:"next_cursor"`
		}
		if err := json.Unmarshal(resp.Result, &page); err != nil {
			return resp
		}
		all = append(all, page.Approvals...)
		if page.NextCursor == "" {
			resp.Result, _ = json.Marshal(map[string]any{"approvals": all, "count": len(all)})
			return resp
		}
		args["cursor"] = page.NextCursor
	}
}
