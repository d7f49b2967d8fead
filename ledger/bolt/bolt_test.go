package bolt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"
)

func TestBoltContract(t *testing.T) {
	ledgertest.Run(t, func(t *testing.T, o ledger.Options) ledger.Store { return mustOpen(t, o) })
}

// TestBoltBackend runs the backend-level checks on a bbolt file.
func TestBoltBackend(t *testing.T) {
	ledgertest.RunBackend(t, func(t *testing.T) ledger.Backend {
		be, err := openBackend(filepath.Join(t.TempDir(), "ledger.db"), openReadWrite, true, deepCheckLimit)
		if err != nil {
			t.Fatal(err)
		}
		return be
	})
}

// rawUpdate runs fn on the closed ledger file with bbolt directly, as an
// attacker or an old tool would.
func rawUpdate(t *testing.T, path string, fn func(tx *bbolt.Tx) error) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("raw bbolt.Open: %v", err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		t.Fatalf("raw Update: %v", err)
	}
}

// TestBoltDurableAcrossReopen: everything a store wrote is there after
// Close and Open, and behaves the same.
func TestBoltDurableAcrossReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	clock := newFakeClock()
	o := ledgertest.Opts()
	o.Now, o.Elapsed = clock.Now, clock.Elapsed
	ctx := context.Background()
	ap := &applier{}

	s := mustOpenPath(t, path, o)
	done := newClaim("t1", "create_order", "fp-1")
	claimed := newClaim("t1", "send_notification", "fp-2")
	held := newClaim("t1", "create_order", "fp-1")
	held.SuspectDuplicates = true
	issued := newClaim("t1", "create_order", "fp-3")

	if d, err := s.Execute(ctx, done, ap.succeed(ledgertest.ResultOrder)); err != nil || d.Kind != ledger.DecisionExecuted {
		t.Fatalf("Execute = %q, %v", d.Kind, err)
	}
	cd, err := s.Claim(ctx, claimed)
	if err != nil || cd.Kind != ledger.DecisionClaimed {
		t.Fatalf("Claim = %q, %v", cd.Kind, err)
	}
	hd, err := s.Execute(ctx, held, ap.succeed(`{}`))
	if err != nil || hd.Kind != ledger.DecisionSuspectedDuplicate {
		t.Fatalf("suspect = %q, %v", hd.Kind, err)
	}
	if err := s.IssueKey(ctx, "t1", issued.Key); err != nil {
		t.Fatal(err)
	}
	if err := s.Update(ctx, func(tx ledger.Tx) error { return tx.Put("orders", "ord_1", []byte(`{"v":1}`)) }); err != nil {
		t.Fatal(err)
	}
	before := map[string]string{}
	for _, k := range []string{done.Key, claimed.Key, held.Key} {
		before[k] = recordJSON(t, mustGet(t, s, "t1", k))
	}
	nAudit, err := s.VerifyAudit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	o.RequireIssuedKeys = true
	s = mustOpenPath(t, path, o)
	for k, want := range before {
		if got := recordJSON(t, mustGet(t, s, "t1", k)); got != want {
			t.Errorf("record %s changed across reopen:\n before %s\n after  %s", k, want, got)
		}
	}
	cases := []struct {
		name string
		c    ledger.Claim
		want ledger.DecisionKind
	}{
		{"finished_replays", done, ledger.DecisionReplay},
		{"claimed_is_busy", claimed, ledger.DecisionBusy},
		{"held_stays_held", held, ledger.DecisionHeld},
		{"issued_key_usable", issued, ledger.DecisionExecuted},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := s.Execute(ctx, tc.c, ap.succeed(`{"after":"reopen"}`))
			if err != nil || d.Kind != tc.want {
				t.Fatalf("Execute = %q, %v; want %q", d.Kind, err, tc.want)
			}
			if tc.want == ledger.DecisionReplay && string(d.Record.Result) != ledgertest.ResultOrder {
				t.Errorf("Result after reopen = %s", d.Record.Result)
			}
			if tc.want == ledger.DecisionHeld && d.Record.Approval.ID != hd.Record.Approval.ID {
				t.Errorf("approval id changed across reopen")
			}
		})
	}
	if _, err := s.Complete(ctx, claimed.Actor, claimed.Key, cd.Record.Generation, ledger.Outcome{State: ledger.StateSucceeded}); err != nil {
		t.Errorf("Complete by the pre-reopen owner's generation: %v", err)
	}
	if err := s.View(ctx, func(tx ledger.Tx) error {
		v, err := tx.Get("orders", "ord_1")
		if err == nil && string(v) != `{"v":1}` {
			err = fmt.Errorf("collection value after reopen = %q", v)
		}
		return err
	}); err != nil {
		t.Error(err)
	}
	if n, err := s.VerifyAudit(ctx); err != nil || n <= nAudit {
		t.Errorf("VerifyAudit after reopen = %d, %v; want more than %d, nil", n, err, nAudit)
	}
	if got := len(effects(t, s)); got != 2 {
		t.Errorf("effects = %d, want 2 (one before, one after reopen)", got)
	}
}

// TestBoltReplayAuditedAcrossClose: replay entries are buffered; Close must
// write them, so they are in the log when the file is opened again.
func TestBoltReplayAuditedAcrossClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	ctx := context.Background()
	s := mustOpenPath(t, path, ledger.Options{})
	c := newClaim("t1", "create_order", "fp-1")
	ap := &applier{}
	if _, err := s.Execute(ctx, c, ap.succeed(ledgertest.ResultOrder)); err != nil {
		t.Fatal(err)
	}
	bad := c
	bad.Fingerprint = "fp-other"
	for _, cl := range []ledger.Claim{c, c, bad} {
		if _, err := s.Execute(ctx, cl, ap.succeed(ledgertest.ResultOrder)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil { // at once: well inside the flush interval
		t.Fatal(err)
	}

	s = mustOpenPath(t, path, ledger.Options{})
	entries, err := s.AuditLog(ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	count := map[ledger.AuditDecision]int{}
	for _, e := range entries {
		if e.Event == "call" && e.Key == c.Key {
			count[e.Decision]++
		}
	}
	if count["replay"] != 2 || count["mismatch"] != 1 {
		t.Errorf("call entries after reopen = %v, want 2 replay and 1 mismatch", count)
	}
	if _, err := s.VerifyAudit(ctx); err != nil {
		t.Errorf("VerifyAudit: %v", err)
	}
}

// TestBoltReplayAuditFlushedByTimer: without any further write, a buffered
// replay entry reaches the file within the flush interval.
func TestBoltReplayAuditFlushedByTimer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	ctx := context.Background()
	s := mustOpenPath(t, path, ledger.Options{})
	c := newClaim("t1", "create_order", "fp-1")
	ap := &applier{}
	for range 2 {
		if _, err := s.Execute(ctx, c, ap.succeed(ledgertest.ResultOrder)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		n := 0
		if err := s.view(func(tx *bbolt.Tx) error {
			return tx.Bucket(bucketAudit).ForEach(func(_, v []byte) error {
				var e ledger.AuditEntry
				if err := json.Unmarshal(v, &e); err != nil {
					return err
				}
				if e.Event == "call" && e.Decision == "replay" {
					n++
				}
				return nil
			})
		}); err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("replay entry not written %v after the replay (flush interval %v)", 3*time.Second, auditFlushInterval)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBoltAuditTamper edits the closed file with bbolt directly; VerifyAudit
// must name the first entry that no longer verifies, and count the good
// entries before it; a tail cut is found by the numbers the records and
// the index's watermark hold.
func TestBoltAuditTamper(t *testing.T) {
	cases := []struct {
		name   string
		tamper func(b *bbolt.Bucket) error
		want   string
		good   int // the entries that verify before the one named
	}{
		{"edit_field", func(b *bbolt.Bucket) error {
			return editEntry(b, 2, func(m map[string]any) { m["decision"] = "executed_by_nobody" })
		}, "audit entry 2:", 1},
		{"edit_state", func(b *bbolt.Bucket) error {
			return editEntry(b, 3, func(m map[string]any) { m["state_after"] = "failed" })
		}, "audit entry 3:", 2},
		{"edit_and_rehash", func(b *bbolt.Bucket) error {
			var e ledger.AuditEntry
			if err := json.Unmarshal(b.Get(be64(2)), &e); err != nil {
				return err
			}
			e.Decision = "forged"
			if err := chain(&e, e.PrevHash); err != nil { // a consistent hash of its own …
				return err
			}
			v, _ := json.Marshal(e)
			return b.Put(be64(2), v) // … breaks the link from entry 3
		}, "audit entry 3:", 2},
		{"delete_middle", func(b *bbolt.Bucket) error { return b.Delete(be64(2)) }, "audit entry 3: it follows entry 1, entry 2 is missing", 1},
		{"cut_tail", func(b *bbolt.Bucket) error { return b.Delete(be64(6)) }, "numbers audit entry 6, but the log ends at entry 5", 5},
		{"move_entry", func(b *bbolt.Bucket) error {
			v := b.Get(be64(2))
			return b.Put(be64(3), append([]byte(nil), v...))
		}, "stored under sequence 3", 2},
		{"not_json", func(b *bbolt.Bucket) error { return b.Put(be64(2), []byte("{garbage")) }, "0000000000000002", 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ledger.db")
			ctx := context.Background()
			s := mustOpenPath(t, path, ledger.Options{})
			ap := &applier{}
			for i := range 6 { // one entry each
				c := newClaim("t1", "create_order", fmt.Sprintf("fp-%d", i))
				if _, err := s.Execute(ctx, c, ap.succeed(ledgertest.ResultOrder)); err != nil {
					t.Fatal(err)
				}
			}
			n, err := s.VerifyAudit(ctx)
			if err != nil || n != 6 {
				t.Fatalf("VerifyAudit before tampering = %d, %v; want 6, nil", n, err)
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			rawUpdate(t, path, func(tx *bbolt.Tx) error { return tc.tamper(tx.Bucket(bucketAudit)) })

			s = mustOpenPath(t, path, ledger.Options{})
			n, err = s.VerifyAudit(ctx)
			if err == nil {
				t.Fatalf("VerifyAudit after tampering passed (%d entries)", n)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("VerifyAudit error %q does not name %q", err, tc.want)
			}
			if n != tc.good {
				t.Errorf("VerifyAudit counted %d good entries; want %d", n, tc.good)
			}
		})
	}
}

// editEntry rewrites audit entry seq through a generic map, keeping its
// stored hash, as a hand edit of the file would.
func editEntry(b *bbolt.Bucket, seq uint64, edit func(map[string]any)) error {
	var m map[string]any
	if err := json.Unmarshal(b.Get(be64(seq)), &m); err != nil {
		return err
	}
	edit(m)
	v, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return b.Put(be64(seq), v)
}

func TestBoltOpenErrors(t *testing.T) {
	t.Run("missing_directory", func(t *testing.T) {
		s, err := Open(filepath.Join(t.TempDir(), "no", "such", "dir", "ledger.db"), ledger.Options{})
		if err == nil {
			s.Close()
			t.Fatal("Open in a missing directory succeeded")
		}
	})
	for _, version := range []string{"1", "3", "999", "not-a-number"} {
		t.Run("schema_"+version, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ledger.db")
			s := mustOpenPath(t, path, ledger.Options{})
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			rawUpdate(t, path, func(tx *bbolt.Tx) error {
				return tx.Bucket(bucketMeta).Put(keySchemaVersion, []byte(version))
			})
			s2, err := Open(path, ledger.Options{})
			if !errors.Is(err, ledger.ErrSchemaVersion) {
				if s2 != nil {
					s2.Close()
				}
				t.Fatalf("Open of schema %q: err = %v, want ErrSchemaVersion", version, err)
			}
		})
	}
	t.Run("current_schema_reopens", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "ledger.db")
		s := mustOpenPath(t, path, ledger.Options{})
		s.Close()
		mustOpenPath(t, path, ledger.Options{})
	})
}

// TestBoltSweepForgetsIssuedKeyCompletedAtSameInstant: the expiry index
// is keyed by (due time, tenant, key) only, so an issued key and the
// record of the same key that are due at the same instant share one index
// entry and one of the two sweeps is lost. With a coarse or fake clock,
// IssueKey and a fast Execute land on the same instant.
func TestBoltSweepForgetsIssuedKeyCompletedAtSameInstant(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	clock := newFakeClock()
	o := ledgertest.Opts()
	o.Now, o.Elapsed = clock.Now, clock.Elapsed
	o.RequireIssuedKeys = true
	ctx := context.Background()
	s := mustOpenPath(t, path, o)
	c := newClaim("t1", "create_order", "fp-1")
	if err := s.IssueKey(ctx, "t1", c.Key); err != nil {
		t.Fatal(err)
	}
	if d, err := s.Execute(ctx, c, (&applier{}).succeed(`{}`)); err != nil || d.Kind != ledger.DecisionExecuted {
		t.Fatalf("Execute = %q, %v", d.Kind, err)
	}
	clock.Advance(o.Retention)
	if n, _, err := s.Sweep(ctx); err != nil || n != 1 {
		t.Fatalf("Sweep = %d compacted, %v; want 1", n, err)
	}
	var issuedLeft bool
	if err := s.view(func(tx *bbolt.Tx) error {
		issuedLeft = tx.Bucket(bucketIssued).Get(recordKey("t1", c.Key)) != nil
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if issuedLeft {
		t.Errorf("the issued key outlived its retention: its expiry entry was overwritten by the record's compaction entry")
	}
}

// TestSettleSupersedesPendingApproval: settling an operation while its
// re-run approval is pending (a late answer, a reconciliation) retires the
// approval, so it can no longer be used to send the request again.
func TestSettleSupersedesPendingApproval(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, ledger.Options{})
	a := ledger.Actor{Tenant: "t1", Principal: "agent"}
	d, err := s.Claim(ctx, ledger.Claim{Actor: a, Key: "k1", Tool: "create_order", Fingerprint: "f1", OnLeaseExpiry: ledger.StateUnknown})
	if err != nil || d.Kind != ledger.DecisionClaimed {
		t.Fatalf("Claim = %v, %v", d.Kind, err)
	}
	if _, err := s.Complete(ctx, a, "k1", d.Record.Generation, ledger.Outcome{State: ledger.StateUnknown}); err != nil {
		t.Fatal(err)
	}
	held, err := s.Settle(ctx, ledger.SettleRequest{Actor: a, Key: "k1", From: []ledger.State{ledger.StateUnknown}, Outcome: ledger.Outcome{State: ledger.StateAwaitingApproval}, Why: "absent"})
	if err != nil || held.Approval == nil || held.Approval.Status != ledger.ApprovalPending {
		t.Fatalf("Settle to awaiting_approval = %+v, %v", held, err)
	}
	done, err := s.Settle(ctx, ledger.SettleRequest{Actor: a, Key: "k1", From: []ledger.State{ledger.StateAwaitingApproval}, Outcome: ledger.Outcome{State: ledger.StateSucceeded, Result: []byte(`{"order":{"order_id":"o1"}}`)}, Why: "late answer"})
	if err != nil || done.State != ledger.StateSucceeded || done.Approval.Status != ledger.ApprovalSuperseded {
		t.Fatalf("late Settle = %+v, %v; want succeeded with the approval superseded", done, err)
	}
	if pending, err := s.PendingApprovals(ctx, "t1", "", 10); err != nil || len(pending) != 0 {
		t.Errorf("pending approvals after the settle = %d, %v; want none", len(pending), err)
	}
	_, err = s.Decide(ctx, ledger.DecideRequest{Approver: ledger.Actor{Tenant: "t1", Principal: "boss", Role: "approver"}, ApprovalID: held.Approval.ID, Approve: true}, nil)
	if !errors.Is(err, ledger.ErrAlreadyDecided) {
		t.Errorf("Decide on the superseded approval: %v, want ErrAlreadyDecided", err)
	}
}

// TestOpenRecordsPages: the sweep's pages cover every unknown record once,
// in order, whatever the page size.
func TestOpenRecordsPages(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t, ledger.Options{})
	a := ledger.Actor{Tenant: "t1", Principal: "agent"}
	for _, k := range []string{"k1", "k2", "k3", "k4", "k5"} {
		d, err := s.Claim(ctx, ledger.Claim{Actor: a, Key: k, Tool: "create_order", Fingerprint: "f-" + k, OnLeaseExpiry: ledger.StateUnknown})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Complete(ctx, a, k, d.Record.Generation, ledger.Outcome{State: ledger.StateUnknown}); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	after := ""
	for page := 0; page < 10; page++ {
		recs, err := s.OpenRecords(ctx, ledger.StateUnknown, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			seen = append(seen, r.Key)
		}
		if len(recs) < 2 {
			break
		}
		after = recs[len(recs)-1].Tenant + "\x00" + recs[len(recs)-1].Key
	}
	if got := strings.Join(seen, ","); got != "k1,k2,k3,k4,k5" {
		t.Errorf("pages covered %s, want k1,k2,k3,k4,k5", got)
	}
}

// TestNewerResultFormatIsRefused: a record written by a newer build (a
// higher result format) is not replayed by this one.
func TestNewerResultFormatIsRefused(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	s, err := Open(path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	a := ledger.Actor{Tenant: "t1", Principal: "p"}
	c := ledger.Claim{Actor: a, Key: "k1", Tool: "create_order", Fingerprint: "f1"}
	apply := func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		return ledger.Outcome{State: ledger.StateSucceeded, Result: []byte(`{"order":{}}`)}, nil
	}
	if _, err := s.Execute(ctx, c, apply); err != nil {
		t.Fatal(err)
	}
	s.Close()
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bbolt.Tx) error {
		rec, err := getRecord(tx, "t1", "k1")
		if err != nil {
			return err
		}
		rec.ResultFormat = ledger.ResultFormat + 1
		return putRecord(tx, rec)
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	s = mustOpenPath(t, path, ledger.Options{})
	if _, err := s.Execute(ctx, c, apply); !errors.Is(err, ledger.ErrSchemaVersion) {
		t.Errorf("replay of a newer-format record: %v, want ErrSchemaVersion", err)
	}
	if _, err := s.Get(ctx, "t1", "k1"); !errors.Is(err, ledger.ErrSchemaVersion) {
		t.Errorf("Get of a newer-format record: %v, want ErrSchemaVersion", err)
	}
}
