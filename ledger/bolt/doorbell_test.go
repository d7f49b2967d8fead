package bolt

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"idemgate/ledger"
)

// TestDoorbellHandsOverWithoutPolling: the holder of the file yields to a
// process that starts waiting (here a read-only open) because the waiter
// rings, not because the holder polls: with every poll an hour apart and
// the idle close an hour away, the reader still gets the file at once.
func TestDoorbellHandsOverWithoutPolling(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the doorbell is inotify's; elsewhere the holder polls")
	}
	path := filepath.Join(t.TempDir(), "ledger.db")
	w := mustOpenPath(t, path, ledger.Options{})
	h := w.be.h
	time.Sleep(4 * h.idleClose) // the handle closes the idle file; its watch ends
	h.mu.Lock()
	if h.db != nil {
		h.mu.Unlock()
		t.Fatal("the idle file is still open")
	}
	h.poll, h.bellPoll, h.idleClose = time.Hour, time.Hour, time.Hour
	h.mu.Unlock()
	ctx := context.Background()
	if _, err := w.Claim(ctx, newClaim("t1", "create_order", "fp")); err != nil { // opens the file again
		t.Fatal(err)
	}
	// Let the watch make its first probe (which finds no one waiting), so
	// only the doorbell can tell it of the reader.
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		r, err := OpenReadOnly(path, ledger.Options{})
		if err == nil {
			if _, err = r.Get(ctx, "t1", "no such key"); errors.Is(err, ledger.ErrNotFound) {
				err = nil
			}
			err = errors.Join(err, r.Close())
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("the reader got the file after %v", time.Since(start))
	case <-time.After(10 * time.Second):
		t.Fatal("the reader still waits for the file after 10 s: the holder did not hear the doorbell")
	}
}
