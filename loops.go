package main

import (
	"context"
	"fmt"
	"io"
	"sync"
)

// loops owns a server's background goroutines (the outbox deliverer, the
// retention sweep, the reconciler, the session sweep). Each runs with a
// context that Stop cancels, and Stop returns only once every one has
// returned; a loop must return promptly when its context is done. Safe
// for concurrent use.
type loops struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newLoops() *loops {
	ctx, cancel := context.WithCancel(context.Background())
	return &loops{ctx: ctx, cancel: cancel}
}

// Go runs loop in a goroutine of its own until Stop.
func (l *loops) Go(loop func(ctx context.Context)) {
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		loop(l.ctx)
	}()
}

// Stop cancels every loop and waits for all of them to return.
func (l *loops) Stop() {
	l.cancel()
	l.wg.Wait()
}

// closeAfter stops and joins the loops, then waits for the work svc runs
// detached from its callers (svc may be nil), and only then closes store,
// which they all use: nothing ever runs against a closed store.
func closeAfter(l *loops, svc interface{ Close() }, store io.Closer) error {
	l.Stop()
	if h, ok := store.(hostedStore); ok {
		return h.Close() // the owner's: it closes them itself
	}
	if svc != nil {
		svc.Close()
	}
	if err := store.Close(); err != nil {
		return fmt.Errorf("closing the ledger: %w", err)
	}
	return nil
}
