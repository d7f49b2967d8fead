package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
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
	stopOwnerAtEnd(t, srv.Args[1:])
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

// TestSegmentOutboxDamage: 50 confirmations delivered to the segments
// outbox, then, with the server stopped, the newest segment damaged as a
// disk or a hand can damage it. A damaged whole line in the middle (a
// byte changed at the start of line 11, or an empty line inserted after
// line 10) is not a torn tail: the server refuses to start, naming the
// segment and the line, and changes nothing — the 40 delivered lines
// after it stay; `idemgate check` lists it. The last line cut in half is
// a torn tail: the server cuts it off, but keeps it aside, logs the
// message it names, and counts it at /metrics; `idemgate check` lists the
// kept tail, whose message the ledger records as delivered and which is
// not written again.
func TestSegmentOutboxDamage(t *testing.T) {
	dir := t.TempDir()
	config := filepath.Join(dir, "idemgate.toml")
	if err := os.WriteFile(config, []byte("[notifications]\noutbox_format = \"segments\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	db := filepath.Join(dir, "ledger.db")
	rep := runBench(t, "--db", db, "--config", config, "--calls", "50", "--duration", "0", "--clients", "1",
		"--dup-ratio", "0", "--mix", "create_order=1", "--drain-timeout", "30s")
	if d := rep.Delivery; d == nil || !d.Drained {
		t.Fatalf("delivery %+v, want every confirmation delivered", d)
	}
	stopOwner(t, db) // the server stopped: its owner too
	seg := filepath.Join(dir, "outbox", "segments", "000000000001.jsonl")
	whole, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(whole, []byte("\n"))
	lines = lines[:len(lines)-1] // after the last "\n": nothing
	if len(lines) != 50 {
		t.Fatalf("the segment holds %d lines, want 50", len(lines))
	}
	line11 := len(bytes.Join(lines[:10], nil)) // where line 11 starts

	for _, tc := range []struct {
		name   string
		damage func() []byte
		after  int // the whole lines after the damaged one
	}{
		{"a byte changed at the start of line 11", func() []byte {
			b := bytes.Clone(whole)
			b[line11] = 'X'
			return b
		}, 39},
		{"an empty line after line 10", func() []byte {
			return append(append(bytes.Clone(whole[:line11]), '\n'), whole[line11:]...)
		}, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			damaged := tc.damage()
			if err := os.WriteFile(seg, damaged, 0o600); err != nil {
				t.Fatal(err)
			}
			defer os.WriteFile(seg, whole, 0o600)
			r := runCLI(t, 30*time.Second, "serve", "--db", db, "--config", config)
			if r.Code == 0 || !strings.Contains(r.Stderr, "000000000001.jsonl is damaged at line 11 ") || !strings.Contains(r.Stderr, fmt.Sprintf(" %d whole line(s) after it are kept", tc.after)) {
				t.Errorf("serve over the damaged segment: exit %d, stderr:\n%s\nwant a refusal naming the segment, line 11 and the %d lines after it", r.Code, r.Stderr, tc.after)
			}
			if got, _ := os.ReadFile(seg); !bytes.Equal(got, damaged) {
				t.Errorf("the segment holds %d bytes (%d lines) after the server ran, want the %d bytes it had: nothing cut",
					len(got), bytes.Count(got, []byte("\n")), len(damaged))
			}
			c := runCLI(t, 30*time.Second, "check", "--db", db)
			if c.Code != 1 || !strings.Contains(c.Stdout, "000000000001.jsonl: line 11 (byte ") {
				t.Errorf("idemgate check: exit %d, stdout:\n%s\nstderr: %s\nwant line 11 listed, exit 1", c.Code, c.Stdout, c.Stderr)
			}
		})
	}

	t.Run("the last line cut in half", func(t *testing.T) {
		last := lines[49]
		var m deliveredMessage
		if err := json.Unmarshal(last, &m); err != nil {
			t.Fatal(err)
		}
		cut := len(whole) - len(last)/2
		if err := os.Truncate(seg, int64(cut)); err != nil {
			t.Fatal(err)
		}
		c := runCLI(t, 30*time.Second, "check", "--db", db)
		if c.Code != 1 || !strings.Contains(c.Stdout, "is a torn tail") || !strings.Contains(c.Stdout, m.MessageID) {
			t.Errorf("idemgate check before a start: exit %d, stdout:\n%s\nwant the torn tail of %s listed, exit 1", c.Code, c.Stdout, m.MessageID)
		}

		tokens := filepath.Join(dir, "tokens.json")
		addToken(t, tokens, "alice", "acme", "agent")
		srv := startHTTP(t, db, tokens, 0, "--config", config)
		kept, _ := filepath.Glob(seg + ".torn-*")
		if len(kept) != 1 {
			t.Errorf("kept aside: %v, want one file", kept)
			kept = []string{seg + ".torn-?"}
		}
		if b, _ := os.ReadFile(kept[0]); !bytes.Equal(b, whole[len(whole)-len(last):cut]) {
			t.Errorf("the kept file holds %q, want the half line %q", b, whole[len(whole)-len(last):cut])
		}
		if got, _ := os.ReadFile(seg); !bytes.Equal(got, whole[:len(whole)-len(last)]) {
			t.Errorf("the segment holds %d bytes, want the 49 whole lines (%d bytes)", len(got), len(whole)-len(last))
		}
		// The outbox is the owner's, which logs to its own log.
		if log := srv.stderr.String() + ownerLog(db); !strings.Contains(log, "cut off an unterminated last line") || !strings.Contains(log, m.MessageID) || !strings.Contains(log, kept[0]) {
			t.Errorf("the server's log does not name the cut message %s and the kept file:\n%s", m.MessageID, log)
		}
		if got := scrape(t, srv.base, "idemgate_outbox_segment_torn_tails_total"); got != 1 {
			t.Errorf("/metrics idemgate_outbox_segment_torn_tails_total = %v, want 1", got)
		}
		c = runCLI(t, 30*time.Second, "check", "--db", db)
		if c.Code != 1 || !strings.Contains(c.Stdout, kept[0]) || !strings.Contains(c.Stdout, m.MessageID) {
			t.Errorf("idemgate check after the cut: exit %d, stdout:\n%s\nwant the kept tail of %s listed, exit 1", c.Code, c.Stdout, m.MessageID)
		}
	})

	// Damage another process appends while this one serves: calls are
	// served, the confirmation waits queued (the gauge says why) and is
	// delivered once the line is removed; nothing is cut meanwhile.
	t.Run("a damaged line appended while serving", func(t *testing.T) {
		tokens := filepath.Join(dir, "tokens.json")
		token := addToken(t, tokens, "bob", "acme", "agent")
		srv := startHTTP(t, db, tokens, 0, "--config", config)
		before, err := os.ReadFile(seg)
		if err != nil {
			t.Fatal(err)
		}
		damaged := append(bytes.Clone(before), "not a message\n"...)
		report := fmt.Sprintf("is damaged at line %d ", bytes.Count(damaged, []byte("\n")))
		if err := os.WriteFile(seg, damaged, 0o600); err != nil {
			t.Fatal(err)
		}
		order := httpSession(t, srv.base, token).mustSucceed(t, "create_order", orderArgs(newKey(), "cust-damage", coffee, nil)).orderID()
		eventually(10*time.Second, func() bool {
			got, _ := os.ReadFile(seg)
			return strings.Contains(ownerLog(db), report) || !bytes.Equal(got, damaged)
		})
		if got, _ := os.ReadFile(seg); !bytes.Equal(got, damaged) {
			t.Fatalf("the segment was changed while damaged: it ends in %q", got[max(0, len(got)-200):])
		}
		if log := srv.stderr.String() + ownerLog(db); !strings.Contains(log, report) {
			t.Errorf("the server's log does not say %q:\n%s", report, log)
		}
		if got := scrape(t, srv.base, "idemgate_outbox_segment_damaged"); got != 1 {
			t.Errorf("idemgate_outbox_segment_damaged = %v, want 1", got)
		}
		if err := os.WriteFile(seg, before, 0o600); err != nil { // the operator removes the line
			t.Fatal(err)
		}
		delivered := func() bool {
			b, _ := os.ReadFile(seg)
			return bytes.Contains(b, []byte(`"order_id":"`+order+`"`))
		}
		if !eventually(10*time.Second, delivered) || scrape(t, srv.base, "idemgate_outbox_segment_damaged") != 0 {
			t.Fatalf("the confirmation of %s was not delivered once the line was removed (or the gauge stayed 1); server log:\n%s", order, srv.stderr.String())
		}
	})
}
