package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"idemgate/ledger"
	"idemgate/outbox"
	"io"
	"os/user"
	"strings"
	"unicode/utf8"
)

// outboxCmd lets an operator put a dead-lettered message back in the queue
// once the gateway is fixed; a running server delivers it.
func outboxCmd(args []string, stdout, stderr io.Writer) error {
	const use = "usage: idemgate outbox requeue MESSAGE_ID [--principal P] [--db PATH]"
	if err := groupHelp("outbox", use, args, stderr); err != nil {
		return err
	}
	if len(args) == 0 || args[0] != "requeue" {
		return usageError{errors.New(use)}
	}
	fs := flag.NewFlagSet("outbox requeue", flag.ContinueOnError)
	fs.SetOutput(stderr)
	setUsage(fs, "outbox requeue MESSAGE_ID [flags]", "Puts a dead-lettered notification back in the queue; a running server delivers it.")
	var lf settings
	lf.register(fs)
	principal := fs.String("principal", env("IDEMGATE_PRINCIPAL", osUser()), "who requeues, for the audit log (env IDEMGATE_PRINCIPAL; default: the operating system's user name)")
	pos, err := parseCommand(fs, args[1:], "MESSAGE_ID")
	if err != nil {
		return err
	}
	id := pos[0]
	if p := strings.TrimSpace(*principal); p == "" || len(p) > 200 || !utf8.ValidString(p) {
		return usageError{fmt.Errorf("--principal must be 1-200 bytes of text, got %q", clipArg(*principal))}
	}
	if err := lf.inOwner(fs, stdout, stderr, []string{"outbox", "requeue"}, pos...); err != nil {
		return err
	}
	store, svc, err := lf.openService("", 0, quietLogger(stderr))
	if err != nil {
		return err
	}
	defer store.Close()
	if err := svc.Deliverer().Requeue(context.Background(), id, ledger.Actor{Principal: strings.TrimSpace(*principal), Role: "operator", ClientName: "idemgate-cli"}); err != nil {
		if errors.Is(err, outbox.ErrMessageNotFound) || errors.Is(err, outbox.ErrMessageNotDead) {
			return usageError{err}
		}
		return err
	}
	fmt.Fprintf(stdout, "requeued %s (written to the audit log); a running server delivers it within a second\n", id)
	return nil
}

// osUser is the operating system's user name, "operator" when unknown.
func osUser() string {
	if u, err := user.Current(); err == nil && u.Username != "" {
		return u.Username
	}
	return "operator"
}

// clipArg shortens an argument for an error message.
func clipArg(s string) string {
	if len(s) > 60 {
		return strings.ToValidUTF8(s[:60], "") + "…"
	}
	return s
}
