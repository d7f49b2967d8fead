package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"idemgate/outbox"
	"io"
	"strings"
)

// outboxCmd lets an operator put a dead-lettered message back in the queue
// once the gateway is fixed; a running server delivers it.
func outboxCmd(args []string, stdout, stderr io.Writer) error {
	const use = "usage: idemgate outbox requeue MESSAGE_ID [--db PATH]"
	if len(args) < 2 || args[0] != "requeue" || strings.HasPrefix(args[1], "-") {
		return usageError{errors.New(use)}
	}
	id := args[1]
	fs := flag.NewFlagSet("outbox requeue", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var lf settings
	lf.register(fs)
	if err := fs.Parse(args[2:]); err != nil {
		return err
	}
	store, svc, err := lf.openService("", 0, quietLogger(stderr))
	if err != nil {
		return err
	}
	defer store.Close()
	if err := svc.Deliverer().Requeue(context.Background(), id); err != nil {
		if errors.Is(err, outbox.ErrMessageNotFound) || errors.Is(err, outbox.ErrMessageNotDead) {
			return usageError{err}
		}
		return err
	}
	fmt.Fprintf(stdout, "requeued %s; a running server delivers it within a second\n", id)
	return nil
}
