package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/server"
	"idemgate/tools"
	"io"
)

// settleCmd runs reconcile_operation or resolve_operation from a
// terminal, through the same code as the tools.
func settleCmd(sub string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	if sub == "resolve" {
		setUsage(fs, "resolve KEY --outcome succeeded|not_executed --evidence TEXT [--downstream-ref R] --principal P [--token TOKEN] [flags]",
			"Settles an unknown operation by hand, as an approver, with the evidence recorded in the audit log.")
	} else {
		setUsage(fs, "reconcile KEY [flags]",
			"Asks the order API (--orders-api, or [orders_api] in --config) what became of an unknown operation, and settles it when the answer decides.")
	}
	var lf settings
	lf.register(fs)
	principal := fs.String("principal", env("IDEMGATE_PRINCIPAL", "operator"), "who acts (env IDEMGATE_PRINCIPAL); resolve needs an approver's name")
	tenant := fs.String("tenant", env("IDEMGATE_TENANT", "default"), "tenant (env IDEMGATE_TENANT)")
	outcome := fs.String("outcome", "", "resolve: succeeded or not_executed")
	evidence := fs.String("evidence", "", "resolve: what you checked and what it showed (10-2000 characters)")
	ref := fs.String("downstream-ref", "", "resolve: the order system's id for what was done")
	var tf tokenFlags
	tf.register(fs)
	pos, err := parseCommand(fs, args, "KEY")
	if err != nil {
		return err
	}
	key := pos[0]
	if err := lf.inOwner(fs, stdout, stderr, []string{sub}, pos...); err != nil {
		return err
	}
	if err := lf.load(); err != nil {
		return err
	}
	who, err := tf.identity(&lf, fs, server.Identity{Principal: *principal, Tenant: *tenant, Role: approvals.RoleApprover}, sub == "resolve")
	if err != nil {
		return err
	}
	if err := who.Validate(); err != nil {
		return usageError{err}
	}
	store, svc, err := lf.openService("", 0, quietLogger(stderr))
	if err != nil {
		return err
	}
	defer store.Close()
	actor := ledger.Actor{Tenant: who.Tenant, Principal: who.Principal, Role: who.Role, ClientName: "idemgate-cli"}
	ctx := context.Background()
	var resp *tools.Response
	if sub == "resolve" {
		resp = svc.Resolve(ctx, actor, tools.ResolveRequest{OperationKey: key, Outcome: *outcome, Evidence: *evidence, DownstreamRef: *ref})
	} else {
		resp = svc.Reconcile(ctx, actor, tools.ReconcileRequest{OperationKey: key})
	}
	svc.Deliverer().DeliverPending(ctx) // a settled order's confirmation goes out now
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(resp); err != nil {
		return err
	}
	if resp.IsError && resp.Error != nil {
		return fmt.Errorf("%s: %s", resp.Error.Code, resp.Error.Message)
	}
	return nil
}
