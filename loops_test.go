package main

import (
	"context"
	"sync"
	"testing"
	"time"
)

// eventLog records what happened, in order.
type eventLog struct {
	mu     sync.Mutex
	events []string
}

func (l *eventLog) add(e string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, e)
}

func (l *eventLog) list() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

// closeRecorder is a store that notes when it is closed.
type closeRecorder struct{ log *eventLog }

func (c closeRecorder) Close() error { c.log.add("store closed"); return nil }

// TestCloseAfterJoinsLoops: serve's shutdown (closeAfter) closes the
// store only after every background loop has returned, even loops that
// take a while to finish the pass they are in when cancelled.
func TestCloseAfterJoinsLoops(t *testing.T) {
	log := &eventLog{}
	bg := newLoops()
	started := make(chan struct{}, 3)
	for i, finish := range []time.Duration{0, 30 * time.Millisecond, 80 * time.Millisecond} {
		bg.Go(func(ctx context.Context) {
			started <- struct{}{}
			<-ctx.Done()
			time.Sleep(finish) // the pass in progress when the server stops
			log.add("loop " + string(rune('0'+i)) + " returned")
		})
	}
	for range 3 {
		<-started
	}
	if err := closeAfter(bg, nil, closeRecorder{log}); err != nil {
		t.Fatal(err)
	}
	got := log.list()
	if len(got) != 4 || got[3] != "store closed" {
		t.Fatalf("events %q: want the three loops to return, then the store to close", got)
	}
}

// TestLoopsStopTwice: Stop may be called again (serve stops the loops
// before returning its answer, and the deferred close stops them again).
func TestLoopsStopTwice(t *testing.T) {
	bg := newLoops()
	bg.Go(func(ctx context.Context) { <-ctx.Done() })
	bg.Stop()
	done := make(chan struct{})
	go func() { bg.Stop(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("a second Stop did not return")
	}
}
