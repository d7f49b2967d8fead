package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
)

// writeAuditHistory writes operations to a new ledger file at path: three
// in January 2026 and two in March 2026 (by the ledger's clock), each with
// its audit entries.
func writeAuditHistory(t *testing.T, path string) {
	t.Helper()
	for _, at := range []time.Time{
		time.Date(2026, 1, 10, 0, 0, 0, 0, time.UTC),
		time.Date(2026, 3, 10, 0, 0, 0, 0, time.UTC),
	} {
		now := at
		s, err := bolt.Open(path, ledger.Options{Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		n := 3
		if at.Month() == time.March {
			n = 2
		}
		for range n {
			c := ledger.Claim{Actor: ledger.Actor{Tenant: "t1", Principal: "agent"}, Key: uuid.NewString(), Tool: "create_order", Fingerprint: "fp-" + uuid.NewString(), OnLeaseExpiry: ledger.StateRetryable}
			_, err := s.Execute(context.Background(), c, func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
				return ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{"order":{"order_id":"o"}}`), Summary: "order o"}, nil
			})
			if err != nil {
				t.Fatal(err)
			}
			now = now.Add(time.Hour)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// runCmd runs the command line in-process and returns its exit code and
// output.
func runCmd(args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(""), &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestAuditPruneCommand: audit prune exports the old entries to a new file
// and removes them; audit verify proves the kept part from the anchor, and
// with the archive the whole chain; a refusal changes nothing.
func TestAuditPruneCommand(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "ledger.db")
	writeAuditHistory(t, db)
	_, whole, _ := runCmd("audit", "export", "--db", db)
	total := strings.Count(whole, "\n")

	// Refusals: no archive decision; no cutoff; a cutoff in the future; an
	// archive file that exists. Nothing is pruned by any of them.
	existing := filepath.Join(dir, "exists.jsonl")
	if err := os.WriteFile(existing, []byte("keep me\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--before", "2026-02-01T00:00:00Z"},
		{"--export", filepath.Join(dir, "a.jsonl")},
		{"--before", "2999-01-01T00:00:00Z", "--discard"},
		{"--before", "2026-02-01T00:00:00Z", "--export", existing},
		{"--audit-retention", "1m", "--discard"},
		{"--before", "yesterday", "--discard"},
	} {
		code, _, stderr := runCmd(append([]string{"audit", "prune", "--db", db}, args...)...)
		if code != 2 || stderr == "" {
			t.Errorf("audit prune %v = exit %d, %q; want a usage error", args, code, stderr)
		}
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep me\n" {
		t.Errorf("an existing archive file was changed: %q", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "a.jsonl")); err == nil {
		t.Error("a refused prune left an archive file")
	}
	if _, out, _ := runCmd("audit", "export", "--db", db); out != whole {
		t.Fatal("a refused prune changed the log")
	}

	archive := filepath.Join(dir, "audit-2026-01.jsonl")
	code, out, stderr := runCmd("audit", "prune", "--db", db, "--before", "2026-02-01T00:00:00Z", "--export", archive)
	if code != 0 || !strings.Contains(out, "pruned audit entries 1-") {
		t.Fatalf("audit prune = exit %d, %q, %q", code, out, stderr)
	}
	arch, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	// The archive is, byte for byte, the start of the export before.
	if !strings.HasPrefix(whole, string(arch)) || len(arch) == 0 {
		t.Fatalf("the archive is not the first lines of audit export:\n%s", arch)
	}
	pruned := strings.Count(string(arch), "\n")
	if pruned == 0 || pruned >= total {
		t.Fatalf("pruned %d of %d entries", pruned, total)
	}
	_, kept, _ := runCmd("audit", "export", "--db", db)
	if got := strings.Count(kept, "\n"); got != total-pruned+1 {
		t.Errorf("%d entries kept; want %d (and the prune record)", got, total-pruned+1)
	}

	code, out, stderr = runCmd("audit", "verify", "--db", db)
	if code != 0 || !strings.Contains(out, "audit chain intact") || !strings.Contains(out, "were pruned") {
		t.Errorf("audit verify = exit %d, %q, %q", code, out, stderr)
	}
	code, out, stderr = runCmd("audit", "verify", "--db", db, "--archive", archive)
	if code != 0 || !strings.Contains(out, "from the archives") {
		t.Errorf("audit verify --archive = exit %d, %q, %q", code, out, stderr)
	}

	// An archive with an edited line fails; so does one cut short.
	edited := filepath.Join(dir, "edited.jsonl")
	if err := os.WriteFile(edited, bytes.Replace(arch, []byte(`"tenant":"t1"`), []byte(`"tenant":"t2"`), 1), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runCmd("audit", "verify", "--db", db, "--archive", edited); code != 1 || !strings.Contains(stderr, "edited after it was written") {
		t.Errorf("verify with an edited archive = exit %d, %q", code, stderr)
	}
	lines := strings.SplitAfter(string(arch), "\n")
	short := filepath.Join(dir, "short.jsonl")
	if err := os.WriteFile(short, []byte(strings.Join(lines[:len(lines)-2], "")), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, stderr := runCmd("audit", "verify", "--db", db, "--archive", short); code != 1 || !strings.Contains(stderr, "missing") {
		t.Errorf("verify with a short archive = exit %d, %q", code, stderr)
	}

	// Nothing older is left: a second prune says so and leaves no file.
	again := filepath.Join(dir, "again.jsonl")
	if code, out, _ := runCmd("audit", "prune", "--db", db, "--before", "2026-02-01T00:00:00Z", "--export", again); code != 0 || !strings.Contains(out, "nothing to prune") {
		t.Errorf("second prune = exit %d, %q", code, out)
	}
	if _, err := os.Stat(again); err == nil {
		t.Error("a prune that removed nothing left an archive file")
	}

	// The retention from the config file prunes the rest (all written
	// long before now), discarding them on the operator's word.
	conf := filepath.Join(dir, "idemgate.toml")
	if err := os.WriteFile(conf, []byte("[audit]\nretention = \"2160h\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, out, stderr := runCmd("audit", "prune", "--db", db, "--config", conf, "--discard"); code != 0 || !strings.Contains(out, "discarded") {
		t.Errorf("prune by [audit] retention = exit %d, %q, %q", code, out, stderr)
	}
	// Left: the two prune records, written now.
	if code, out, stderr := runCmd("audit", "verify", "--db", db); code != 0 || !strings.Contains(out, "audit chain intact: 2 entries") {
		t.Errorf("verify after pruning all = exit %d, %q, %q", code, out, stderr)
	}
}
