package loadgen

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"idemgate/outbox"
)

func writeMessages(t *testing.T, dir string, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("msg_%04d.json", i)), []byte("{}\n"), 0o600); err != nil {
			t.Error(err)
			return
		}
	}
}

// TestCountMessages: only message files count — not a sink's hidden
// temporary files, nor other names; a missing directory holds none.
func TestCountMessages(t *testing.T) {
	dir := t.TempDir()
	if n, err := CountMessages(filepath.Join(dir, "missing")); n != 0 || err != nil {
		t.Fatalf("missing directory: %d, %v", n, err)
	}
	writeMessages(t, dir, 0, 3)
	for _, name := range []string{".tmp-msg_9.json-123", ".msg_8.json", "notes.txt"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := CountMessages(dir); n != 3 || err != nil {
		t.Fatalf("CountMessages = %d, %v; want the 3 message files", n, err)
	}
	// The segment sink's lines count too, whole lines only (not a torn
	// tail, nor its lock file).
	sink, err := outbox.NewSegmentSink(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		m := &outbox.Message{MessageID: fmt.Sprintf("msg_%d", i), Channel: "email", To: []string{"a@example.com"}, Body: "hi"}
		if err := sink.Deliver(context.Background(), m); err != nil {
			t.Fatal(err)
		}
	}
	if err := sink.Flush(); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(filepath.Join(dir, "segments", "000000000001.jsonl"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(`{"message_id":"msg_torn`)
	f.Close()
	if n, err := CountMessages(dir); n != 7 || err != nil {
		t.Fatalf("CountMessages = %d, %v; want 3 files and 4 lines", n, err)
	}
}

// TestDeliveryWatch: a run that queued 10 messages, 2 of which were
// delivered before it ended (beside 5 of an earlier run), has a backlog
// of 8 at its end; it is drained when the files appear, and a backlog
// that never comes is reported as left once the timeout runs out.
func TestDeliveryWatch(t *testing.T) {
	dir := t.TempDir()
	writeMessages(t, dir, 0, 5) // an earlier run's
	w, err := WatchDelivery(dir)
	if err != nil {
		t.Fatal(err)
	}
	writeMessages(t, dir, 5, 7)
	rep := &Report{Elapsed: 2, Correctness: Correctness{Keys: map[string]int{"create_order": 6, "send_notification": 4, "get_order": 99}}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(50 * time.Millisecond)
		writeMessages(t, dir, 7, 15)
	}()
	if err := w.Finish(context.Background(), rep, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	<-done
	d := rep.Delivery
	if d.Queued != 10 || d.DeliveredDuringRun != 2 || d.QueuedPerS != 5 || d.DeliveredPerS != 1 || d.KeepUp != 0.2 || d.BacklogAtEnd != 8 {
		t.Fatalf("delivery %+v: want 10 queued (5/s), 2 delivered (1/s, 0.2×), a backlog of 8", d)
	}
	if !d.Drained || d.Left != 0 || d.DrainSeconds <= 0 || d.DrainPerS <= 0 {
		t.Fatalf("delivery %+v: want drained, with its time", d)
	}

	w, err = WatchDelivery(dir)
	if err != nil {
		t.Fatal(err)
	}
	rep = &Report{Elapsed: 1, Correctness: Correctness{Keys: map[string]int{"create_order": 3}}}
	writeMessages(t, dir, 15, 16)
	if err := w.Finish(context.Background(), rep, 100*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if d := rep.Delivery; d.Drained || d.Left != 2 || d.BacklogAtEnd != 2 || d.DrainSeconds != 0 {
		t.Fatalf("delivery %+v: want 2 left undrained after the timeout", d)
	}

	// No timeout: the figures at the run's end, without waiting.
	w, _ = WatchDelivery(dir)
	rep = &Report{Elapsed: 1, Correctness: Correctness{Keys: map[string]int{"create_order": 1}}}
	if err := w.Finish(context.Background(), rep, 0); err != nil {
		t.Fatal(err)
	}
	if d := rep.Delivery; d.Drained || d.BacklogAtEnd != 1 || d.Left != 1 {
		t.Fatalf("delivery %+v with no drain timeout", d)
	}
}
