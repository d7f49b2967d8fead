package main

import (
	"context"
	"log/slog"
	"time"

	"idemgate/ledger"
)

// sharedTask is a background loop's claim on its work across the
// processes sharing the ledger (see ledger.TakeTask): a pass runs only in
// the process holding the task; the others skip it.
type sharedTask struct {
	store  ledger.Store
	name   string
	holder string        // this process
	hold   time.Duration // how long a pass's hold lasts (longer than the loop's period)
	log    *slog.Logger
	held   bool // the last take succeeded (to log changes only)
}

// take reports whether this process holds the task for the coming pass,
// taking or extending it. A ledger error skips the pass (it would fail
// too).
func (t *sharedTask) take(ctx context.Context) bool {
	ok, err := ledger.TakeTask(ctx, t.store, t.name, t.holder, t.hold)
	if err != nil {
		if ctx.Err() == nil {
			t.log.Warn("background task", "task", t.name, "err", err)
		}
		return false
	}
	if ok != t.held {
		t.log.Debug("background task", "task", t.name, "held", ok)
		t.held = ok
	}
	return ok
}

// end gives the task up, if held, so another process takes it at its
// next pass rather than after the hold expires.
func (t *sharedTask) end() {
	if !t.held {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ledger.EndTask(ctx, t.store, t.name, t.holder); err != nil {
		t.log.Warn("background task", "task", t.name, "err", err)
	}
}
