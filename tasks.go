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
	held   bool      // the last take succeeded
	until  time.Time // when the hold ends at the earliest, by this process's clock
}

// take reports whether this process holds the task for the coming pass,
// taking or extending it. A ledger error skips the pass (it would fail
// too).
func (t *sharedTask) take(ctx context.Context) bool {
	if t.held && time.Until(t.until) > t.hold/2 {
		return true // more than half the hold left: no need to write yet
	}
	start := time.Now() // the ledger's clock reads later: the hold lasts at least until start+hold
	ok, err := ledger.TakeTask(ctx, t.store, t.name, t.holder, t.hold)
	if err != nil {
		if ctx.Err() == nil {
			t.log.Warn("background task", "task", t.name, "err", err)
		}
		return false // t.held stays: end still gives it up
	}
	if ok != t.held {
		t.log.Debug("background task", "task", t.name, "held", ok)
		t.held = ok
	}
	if ok {
		t.until = start.Add(t.hold)
	}
	return ok
}

// end gives the task up, if held, so another process takes it at its
// next pass rather than after the hold expires.
func (t *sharedTask) end() {
	if !t.held {
		return
	}
	t.held = false
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := ledger.EndTask(ctx, t.store, t.name, t.holder); err != nil {
		t.log.Warn("background task", "task", t.name, "err", err)
	}
}
