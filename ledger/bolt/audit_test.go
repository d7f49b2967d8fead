package bolt

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	bbolt "go.etcd.io/bbolt"
)

// summary names each entry by tenant/key:event:decision, for messages.
func summary(entries []ledger.AuditEntry) []string {
	var out []string
	for _, e := range entries {
		out = append(out, e.Actor.Tenant+"/"+e.Key+":"+string(e.Event)+":"+string(e.Decision))
	}
	return out
}

// TestAuditForKey: the per-key read returns exactly the key's entries of
// its tenant — transitions, replays and mismatches, including buffered
// ones not yet flushed — oldest first, and limit keeps the newest.
func TestAuditForKey(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, ledger.Options{})
	ap := &applier{}
	a := newClaim("t1", "create_order", "fp-a")
	b := newClaim("t1", "create_order", "fp-b")
	other := a
	other.Actor = testActor("t2") // the same key in another tenant
	prefix := a
	prefix.Key = a.Key[:8] // a key that is a prefix of a's
	for _, c := range []ledger.Claim{a, b, other, prefix, a, b} {
		if _, err := s.Execute(ctx, c, ap.succeed(ledgertest.ResultOrder)); err != nil {
			t.Fatal(err)
		}
	}
	mism := a
	mism.Fingerprint = "fp-changed"
	if _, err := s.Execute(ctx, mism, ap.succeed(ledgertest.ResultOrder)); err != nil {
		t.Fatal(err)
	}
	// The replay and the mismatch are still buffered: AuditForKey must see them.
	got, total, err := s.AuditForKey(ctx, "t1", a.Key, 0)
	if err != nil {
		t.Fatal(err)
	}
	want := []ledger.AuditDecision{"executed", "replay", "mismatch"}
	if total != len(want) || len(got) != len(want) {
		t.Fatalf("AuditForKey(t1, a) = %d of %d: %v, want %v", len(got), total, summary(got), want)
	}
	for i, e := range got {
		if e.Key != a.Key || e.Actor.Tenant != "t1" || e.Decision != want[i] || (i > 0 && e.Seq <= got[i-1].Seq) {
			t.Errorf("entry %d = %v, want %s of t1/%s in order", i, summary(got[i:i+1]), want[i], a.Key)
		}
	}
	newest, total, err := s.AuditForKey(ctx, "t1", a.Key, 2)
	if err != nil || total != 3 || len(newest) != 2 || newest[0].Decision != "replay" || newest[1].Decision != "mismatch" {
		t.Errorf("AuditForKey limit 2 = %v (total %d, %v), want the replay and the mismatch of 3", summary(newest), total, err)
	}
	if got, _, _ := s.AuditForKey(ctx, "t2", a.Key, 0); len(got) != 1 {
		t.Errorf("AuditForKey(t2, a) = %v, want the other tenant's entry", summary(got))
	}
	if got, total, err := s.AuditForKey(ctx, "t1", "no-such-key", 0); err != nil || total != 0 || len(got) != 0 {
		t.Errorf("AuditForKey(unknown) = %v, %d, %v; want nothing", summary(got), total, err)
	}
}

// TestAuditIndexBackfilled: a file written before the per-key index (no
// index bucket, no watermark) is indexed when it is opened; entries an
// older build appends after the watermark are indexed at the next open,
// found meanwhile by a scan past the watermark, and indexed by the next
// write.
func TestAuditIndexBackfilled(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	s := mustOpenPath(t, path, ledger.Options{})
	ap := &applier{}
	a := newClaim("t1", "create_order", "fp-a")
	for range 2 {
		if _, err := s.Execute(ctx, a, ap.succeed(ledgertest.ResultOrder)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// As an older build left the file: no index, no watermark.
	rawUpdate(t, path, func(tx *bbolt.Tx) error {
		if err := tx.DeleteBucket(bucketAuditByKey); err != nil {
			return err
		}
		return tx.Bucket(bucketMeta).Delete(keyAuditIndexed)
	})
	s = mustOpenPath(t, path, ledger.Options{})
	if got, total, err := s.AuditForKey(ctx, "t1", a.Key, 0); err != nil || total != 2 {
		t.Fatalf("after backfill: %v, %d, %v; want executed, replay", summary(got), total, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// An older build appends an entry and does not index it.
	rawUpdate(t, path, func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketAudit)
		_, v := b.Cursor().Last()
		var last ledger.AuditEntry
		if err := json.Unmarshal(v, &last); err != nil {
			return err
		}
		e := ledger.AuditEntry{Seq: last.Seq + 1, At: last.At, Event: "call", Actor: testActor("t1"), Tool: "create_order", Key: a.Key, Decision: "replay"}
		if err := chain(&e, last.Hash); err != nil {
			return err
		}
		nv, _ := json.Marshal(e)
		return b.Put(be64(e.Seq), nv)
	})
	s2, err := Open(path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got, total, err := s2.AuditForKey(ctx, "t1", a.Key, 0); err != nil || total != 3 {
		t.Fatalf("with an unindexed tail: %v, %d, %v; want 3 entries", summary(got), total, err)
	}
	var indexed uint64
	s2.view(func(tx *bbolt.Tx) error { indexed = auditIndexed(tx); return nil })
	if indexed != 3 {
		t.Errorf("watermark after open = %d, want 3 (the open indexes what an older build appended)", indexed)
	}
	// While the store is open, another build appends without indexing:
	// the read still finds the entry (it scans past the watermark), and
	// the next write indexes it.
	if err := s2.update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketAudit)
		_, v := b.Cursor().Last()
		var last ledger.AuditEntry
		if err := json.Unmarshal(v, &last); err != nil {
			return err
		}
		e := ledger.AuditEntry{Seq: last.Seq + 1, At: last.At, Event: "call", Actor: testActor("t1"), Tool: "create_order", Key: a.Key, Decision: "replay"}
		if err := chain(&e, last.Hash); err != nil {
			return err
		}
		nv, _ := json.Marshal(e)
		return b.Put(be64(e.Seq), nv)
	}); err != nil {
		t.Fatal(err)
	}
	if got, total, err := s2.AuditForKey(ctx, "t1", a.Key, 0); err != nil || total != 4 || got[3].Seq != 4 {
		t.Fatalf("with an entry past the watermark: %v, %d, %v; want 4 entries", summary(got), total, err)
	}
	if _, err := s2.Execute(ctx, newClaim("t1", "create_order", "fp-z"), ap.succeed(ledgertest.ResultOrder)); err != nil {
		t.Fatal(err)
	}
	s2.view(func(tx *bbolt.Tx) error { indexed = auditIndexed(tx); return nil })
	if indexed != 5 {
		t.Errorf("watermark after a write = %d, want 5 (the appended entry and the write's one)", indexed)
	}
	if got, total, err := s2.AuditForKey(ctx, "t1", a.Key, 0); err != nil || total != 4 {
		t.Errorf("after the catch-up: %v, %d, %v; want 4 entries", summary(got), total, err)
	}
	if n, err := s2.VerifyAudit(ctx); err != nil || n != 5 {
		t.Errorf("VerifyAudit = %d, %v; want 5 intact", n, err)
	}
}

// TestAuditOldEntryStillVerifies: an entry written by the first release
// (none of the fields added since) verifies, and reads back with the same
// hash: the new fields are omitted when empty.
func TestAuditOldEntryStillVerifies(t *testing.T) {
	// Exactly what the first release marshalled, hash empty.
	old := `{"seq":1,"at":"2025-03-04T05:06:07Z","event":"transition","actor":{"tenant":"t1","principal":"agent-t1","role":"agent","client_name":"c","client_version":"1","request_id":"7","trace":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},"tool":"create_order","key":"k1","fingerprint":"fp","decision":"executed","state_before":"in_progress","state_after":"succeeded","attempt":1,"error_code":"x","prev_hash":"","hash":""}`
	sum := sha256.Sum256([]byte(old))
	stored := strings.Replace(old, `"hash":""`, `"hash":"`+hex.EncodeToString(sum[:])+`"`, 1)
	var e ledger.AuditEntry
	if err := json.Unmarshal([]byte(stored), &e); err != nil {
		t.Fatal(err)
	}
	if err := verifyChain(e, ""); err != nil {
		t.Fatalf("an entry of the first release no longer verifies: %v", err)
	}
	b, _ := json.Marshal(e)
	if string(b) != stored {
		t.Errorf("re-encoded entry differs:\n got %s\nwant %s", b, stored)
	}
}

// TestAuditInvalidUTF8StillVerifies: an entry holding text that is not
// valid UTF-8 (a client name cut at 64 bytes inside a character) is
// stored as a reader will read it, so the chain verifies rather than
// reporting the entry as edited.
func TestAuditInvalidUTF8StillVerifies(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, ledger.Options{})
	a := testActor("t1")
	a.ClientName = strings.Repeat("a", 63) + "\xc3" // "é" cut in half
	s.Audit(ledger.AuditEntry{Event: "call", Actor: a, Key: "k1", Decision: "resolved by boss: evidence: \xff\xfe"})
	s.Audit(ledger.AuditEntry{Event: "call", Actor: testActor("t1"), Key: "k1", Decision: "replay"})
	if _, err := s.AuditLog(ctx, 0, 0); err != nil { // writes the buffered entries
		t.Fatal(err)
	}
	n, err := s.VerifyAudit(ctx)
	if err != nil || n != 2 {
		t.Fatalf("VerifyAudit = %d, %v; want 2 intact entries", n, err)
	}
	got, _, err := s.AuditForKey(ctx, "t1", "k1", 0)
	if err != nil || len(got) != 2 || got[0].Actor.ClientName != strings.Repeat("a", 63)+"\uFFFD" {
		t.Fatalf("AuditForKey = %+v, %v; want the client name with U+FFFD for the broken byte", got, err)
	}
}

// TestAuditLogAfterLast: export --after the largest sequence number
// exports nothing (after+1 used to wrap to 0: the whole log).
func TestAuditLogAfterLast(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, ledger.Options{})
	s.Audit(ledger.AuditEntry{Event: "call", Actor: testActor("t1"), Key: "k1", Decision: "replay"})
	if got, err := s.AuditLog(ctx, 1, 0); err != nil || len(got) != 0 {
		t.Fatalf("AuditLog(after 1) = %d entries, %v; want none", len(got), err)
	}
	if got, err := s.AuditLog(ctx, math.MaxUint64, 0); err != nil || len(got) != 0 {
		t.Fatalf("AuditLog(after MaxUint64) = %d entries, %v; want none", len(got), err)
	}
}

// TestAuditTransitionsNotIndexed: an executed create writes no per-key
// audit index entry (its record numbers its transition, Record.AuditSeqs),
// nor does a replay soon after it (found by a scan near the transition);
// a replay far after it is indexed.
func TestAuditTransitionsNotIndexed(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	s := mustOpenPath(t, path, ledger.Options{})
	ap := &applier{}
	a := newClaim("t1", "create_order", "fp-a")
	if _, err := s.Execute(ctx, a, ap.succeed(ledgertest.ResultOrder)); err != nil {
		t.Fatal(err)
	}
	if rec := mustGet(t, s, "t1", a.Key); len(rec.AuditSeqs) != 1 {
		t.Fatalf("record audit_seqs = %v, want its executed entry", rec.AuditSeqs)
	}
	if _, err := s.Execute(ctx, a, ap.succeed(ledgertest.ResultOrder)); err != nil { // a replay
		t.Fatal(err)
	}
	for i := range 300 { // entries of other keys
		s.Audit(ledger.AuditEntry{Event: ledger.EventCall, Actor: testActor("t1"), Tool: "get_order", Key: fmt.Sprint("other-", i), Decision: "read"})
	}
	if _, err := s.Execute(ctx, a, ap.succeed(ledgertest.ResultOrder)); err != nil { // a late replay
		t.Fatal(err)
	}
	want, total, err := s.AuditForKey(ctx, "t1", a.Key, 0)
	if err != nil || total != 3 {
		t.Fatalf("AuditForKey = %v, %d, %v; want executed, replay, replay", summary(want), total, err)
	}
	if err := s.view(func(tx *bbolt.Tx) error {
		var seqs []uint64
		p := []byte("t1\x00" + a.Key + "\x00")
		c := tx.Bucket(bucketAuditByKey).Cursor()
		for k, _ := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = c.Next() {
			seqs = append(seqs, binary.BigEndian.Uint64(k[len(p):]))
		}
		if !slices.Equal(seqs, []uint64{want[2].Seq}) {
			t.Errorf("per-key index holds %v, want only the late replay %d", seqs, want[2].Seq)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
