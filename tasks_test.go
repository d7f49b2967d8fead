package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
)

// TestSharedTaskOneHolder: two processes' loops on one ledger file (two
// holders of one task): one runs its passes, the other skips them, until
// the first gives the task up at shutdown; then the other takes it.
func TestSharedTaskOneHolder(t *testing.T) {
	store, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	a := &sharedTask{store: store, name: "reconcile", holder: "A", hold: time.Minute, log: log}
	b := &sharedTask{store: store, name: "reconcile", holder: "B", hold: time.Minute, log: log}
	for pass := range 3 {
		if !a.take(ctx) {
			t.Fatalf("pass %d: A does not hold the task it took", pass)
		}
		if b.take(ctx) {
			t.Fatalf("pass %d: B took the task A holds", pass)
		}
	}
	a.end()
	if !b.take(ctx) {
		t.Fatal("B did not take the task A gave up")
	}
	if a.take(ctx) {
		t.Fatal("A took the task back while B holds it")
	}
}
