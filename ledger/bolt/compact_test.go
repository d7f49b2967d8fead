package bolt

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"idemgate/ledger"
)

// fillAndEmpty writes n operations with big results to the ledger at path
// and then lets retention delete them (and prunes their audit entries), so
// the file is big and mostly free pages. It returns the keys of two
// operations made afterwards, which must survive compaction.
func fillAndEmpty(t *testing.T, path string, n int) (keep []string) {
	t.Helper()
	clock := newFakeClock()
	o := ledger.Options{Retention: time.Hour, TombstoneRetention: time.Hour, Now: clock.Now, Elapsed: clock.Elapsed}
	s, err := Open(path, o)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	big := `{"order":{"order_id":"o","note":"` + strings.Repeat("x", 2000) + `"}}`
	var a applier
	for range n {
		if _, err := s.Execute(ctx, newClaim("t1", "create_order", "fp"), a.succeed(big)); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(3 * time.Hour)
	if _, d, err := s.Sweep(ctx); err != nil || d != n {
		t.Fatalf("Sweep deleted %d, %v; want %d", d, err, n)
	}
	if _, err := s.PruneAudit(ctx, clock.Now().Add(-time.Minute), ledger.Actor{Principal: "test"}, nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		c := newClaim("t1", "create_order", "fp-kept")
		c.Fingerprint += c.Key
		if _, err := s.Execute(ctx, c, a.succeed(`{"order":{"order_id":"kept"}}`)); err != nil {
			t.Fatal(err)
		}
		keep = append(keep, c.Key)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return keep
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// TestCompactInPlace: after most of the ledger was deleted, compaction
// shrinks the file; the compacted ledger opens, its audit chain verifies,
// its operations replay and new ones run; the old file is kept whole as
// the backup.
func TestCompactInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	keep := fillAndEmpty(t, path, 600)
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Compact(path, CompactOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Before != int64(len(old)) || res.After != fileSize(t, path) || res.After*3 > res.Before {
		t.Errorf("Compact = %d → %d bytes (file now %d); want at least 3 × smaller", res.Before, res.After, fileSize(t, path))
	}
	t.Logf("compacted %d → %d bytes, %d keys", res.Before, res.After, res.Keys)
	if backup, err := os.ReadFile(res.Backup); err != nil || !bytes.Equal(backup, old) {
		t.Errorf("backup %s: %v; want the old file, byte for byte", res.Backup, err)
	}

	// The fake clock of fillAndEmpty is in 2025: a long retention keeps
	// its records replayable by today's clock.
	s := mustOpenPath(t, path, ledger.Options{Retention: 100 * 365 * 24 * time.Hour})
	ctx := context.Background()
	if n, err := s.VerifyAudit(ctx); err != nil || n == 0 {
		t.Errorf("VerifyAudit of the compacted ledger = %d, %v", n, err)
	}
	var a applier
	for _, key := range keep {
		c := newClaim("t1", "create_order", "fp-kept"+key)
		c.Key = key
		d, err := s.Execute(ctx, c, a.succeed(`{"order":{"order_id":"second"}}`))
		if err != nil || d.Kind != ledger.DecisionReplay || string(d.Record.Result) != `{"order":{"order_id":"kept"}}` {
			t.Errorf("replay of %s after compaction = %v %s, %v", key, d.Kind, d.Record.Result, err)
		}
	}
	if d, err := s.Execute(ctx, newClaim("t1", "create_order", "fp-new"), a.succeed(`{}`)); err != nil || d.Kind != ledger.DecisionExecuted {
		t.Errorf("new operation after compaction = %v, %v", d.Kind, err)
	}
	if a.n() != 1 {
		t.Errorf("apply ran %d times; want 1 (the new operation only)", a.n())
	}
}

// TestCompactNoBackup: with NoBackup the old file is gone after the swap.
func TestCompactNoBackup(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ledger.db")
	fillAndEmpty(t, path, 10)
	res, err := Compact(path, CompactOptions{NoBackup: true})
	if err != nil || res.Backup != "" {
		t.Fatalf("Compact = %+v, %v", res, err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), "compact") {
			t.Errorf("left behind: %s", e.Name())
		}
	}
}

// TestCompactRefusedWhileOpen: while another ledger handle (here, in the
// same process; another process holds the same flock) has the file open,
// even read-only, compaction is refused with ErrLocked saying what to do,
// and the file is not touched; once it is closed, compaction runs.
func TestCompactRefusedWhileOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	fillAndEmpty(t, path, 10)
	before, _ := os.ReadFile(path)
	s, err := OpenReadOnly(path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = Compact(path, CompactOptions{Wait: 50 * time.Millisecond})
	if !errors.Is(err, ErrLocked) || !strings.Contains(err.Error(), "stop the servers") {
		t.Errorf("Compact while open = %v; want ErrLocked saying what to do", err)
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(before, after) {
		t.Error("a refused compaction changed the file")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Compact(path, CompactOptions{}); err != nil {
		t.Errorf("Compact after Close: %v", err)
	}
}

// TestCompactOut: --out writes a compacted copy, reading the ledger as a
// read-only open does: beside another reader, never while a process has
// it open for writing (ErrLocked); the ledger is unchanged, and an
// existing destination is refused.
func TestCompactOut(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "ledger.db")
	keep := fillAndEmpty(t, path, 300)
	out := filepath.Join(dir, "copy.db")
	w := mustOpenPath(t, path, ledger.Options{})
	if _, err := Compact(path, CompactOptions{Out: out, Wait: 50 * time.Millisecond}); !errors.Is(err, ErrLocked) {
		t.Errorf("Compact --out of a ledger open for writing = %v; want ErrLocked", err)
	}
	w.Close()
	s := mustOpenPathReadOnly(t, path)
	res, err := Compact(path, CompactOptions{Out: out})
	if err != nil {
		t.Fatal(err)
	}
	if res.After >= res.Before || res.Path != out || fileSize(t, path) != res.Before {
		t.Errorf("Compact --out = %+v; want a smaller copy, the ledger unchanged", res)
	}
	if _, err := Compact(path, CompactOptions{Out: out}); !errors.Is(err, ErrExists) {
		t.Errorf("Compact to an existing file = %v; want ErrExists", err)
	}
	c := mustOpenPath(t, out, ledger.Options{})
	if _, err := c.VerifyAudit(context.Background()); err != nil {
		t.Errorf("VerifyAudit of the copy: %v", err)
	}
	if rec := mustGet(t, c, "t1", keep[0]); rec.State != ledger.StateSucceeded {
		t.Errorf("record in the copy = %s", rec.State)
	}
	_ = s
}

// TestCompactRefusesForeignFile: a bbolt file that is not a ledger is not
// rewritten.
func TestCompactRefusesForeignFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "other.db")
	if err := os.WriteFile(path, []byte("not a database"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Compact(path, CompactOptions{}); err == nil {
		t.Error("Compact of a file that is not a ledger succeeded")
	}
	if b, _ := os.ReadFile(path); string(b) != "not a database" {
		t.Error("the file was changed")
	}
	if _, err := Compact(filepath.Join(t.TempDir(), "missing.db"), CompactOptions{}); !errors.Is(err, ErrNoLedger) {
		t.Errorf("Compact of a missing file = %v; want ErrNoLedger", err)
	}
}
