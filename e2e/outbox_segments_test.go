package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"idemgate/loadgen"
)

// TestSegmentOutboxTwoProcesses: two servers (each spawned by a bench
// run) on one ledger file and one outbox directory, writing their
// notifications as segments ([notifications] outbox_format = "segments"),
// deliver each other's confirmations too (and a third server what they
// left queued); the segments then hold exactly one whole line per
// confirmation queued, every message id once, each naming an order the
// runs created.
func TestSegmentOutboxTwoProcesses(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "idemgate.toml")
	if err := os.WriteFile(config, []byte("[notifications]\noutbox_format = \"segments\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "ledger.db")
	reps := make([]*loadgen.Report, 2)
	var wg sync.WaitGroup
	for i := range reps {
		wg.Go(func() {
			reps[i] = runBench(t, "--db", db, "--config", config, "--calls", "120", "--duration", "0", "--clients", "4",
				"--dup-ratio", "0.25", "--mix", "create_order=1", "--drain-timeout", "30s")
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	queued := 0
	for i, rep := range reps {
		checkReport(t, rep, 4)
		if d := rep.Delivery; d == nil || !d.Drained {
			t.Fatalf("run %d: delivery %+v, want every confirmation delivered", i, d)
		}
		queued += rep.Correctness.Keys["create_order"]
	}
	// A run's drain counts the other run's lines too, so it may end with
	// its own confirmations still queued: a third server, started on the
	// ledger once both have stopped, delivers what is left.
	srv := exec.Command(idemgate, "serve", "--db", db, "--config", config)
	stdin, err := srv.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	lines := func() int {
		n, err := loadgen.CountMessages(filepath.Join(dir, "outbox"))
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for deadline := time.Now().Add(20 * time.Second); lines() < queued && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	stdin.Close() // the end of its input stops a stdio server
	if err := srv.Wait(); err != nil {
		t.Fatalf("the third server: %v", err)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "outbox", "*.json")); len(files) != 0 {
		t.Fatalf("message files %v beside the segments", files)
	}
	names, err := filepath.Glob(filepath.Join(dir, "outbox", "segments", "*.jsonl"))
	if err != nil || len(names) == 0 {
		t.Fatalf("segments %v, %v", names, err)
	}
	sort.Strings(names)
	seen := map[string]bool{}
	orders := map[string]bool{}
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if len(b) > 0 && b[len(b)-1] != '\n' {
			t.Fatalf("%s ends in a line without its newline", name)
		}
		for line := range bytes.Lines(b) {
			var m deliveredMessage
			if err := json.Unmarshal(line, &m); err != nil || m.MessageID == "" || m.Step != "confirmation" || m.OrderID == "" {
				t.Fatalf("%s: line %q (%v): want a confirmation", name, line, err)
			}
			if seen[m.MessageID] {
				t.Fatalf("message %s appended twice", m.MessageID)
			}
			seen[m.MessageID] = true
			orders[m.OrderID] = true
		}
	}
	if len(seen) != queued || len(orders) != queued {
		t.Fatalf("%d messages for %d orders in the segments; the runs queued %d confirmations", len(seen), len(orders), queued)
	}
}
