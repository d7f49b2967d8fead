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
// rings, not because the holder polls: with every poll and the idle close
// an hour away, the reader still gets the file.
//
// Only the ring can wake the holder here: the reader opened its lock
// files (an open the watch would hear as well) while the writer's file
// was closed and watched by no one, and the reader starts waiting only
// after the holder's watch has made its first probe (h.wakes counts the
// watch's passes), which found no one waiting. Without the ring the
// reader would wait for the hour.
func TestDoorbellHandsOverWithoutPolling(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the doorbell is inotify's; elsewhere the holder polls")
	}
	path := filepath.Join(t.TempDir(), "ledger.db")
	w := mustOpenPath(t, path, ledger.Options{})
	h := w.be.h
	waitFor(t, "the writer's idle file to close (its watch ends)", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.db == nil
	})
	h.mu.Lock()
	h.poll, h.bellPoll, h.idleClose = time.Hour, time.Hour, time.Hour
	wakes := h.wakes // the ended watch's passes
	h.mu.Unlock()
	// The reader's lock files open now, with no watch to hear them; the
	// reader's file then closes when idle (or when the writer rings).
	r, err := OpenReadOnly(path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	if _, err := w.Claim(ctx, newClaim("t1", "create_order", "fp")); err != nil { // opens the writer's file again
		t.Fatal(err)
	}
	waitFor(t, "the writer's new watch to make its first probe", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.db != nil && h.wakes > wakes
	})
	h.mu.Lock()
	belled := h.belled
	h.mu.Unlock()
	if !belled {
		t.Fatal("the writer's watch has no doorbell")
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.Get(ctx, "t1", "no such key")
		if errors.Is(err, ledger.ErrNotFound) {
			err = nil
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		w.Close() // hands the file over, so the reader can end
		<-done
		t.Fatal("the reader still waited for the file after 10 s: the holder did not hear the doorbell")
	}
}

// waitFor waits until cond holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10 s for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
