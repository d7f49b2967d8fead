package e2e

// The audit log under an attacker who can write the ledger file (issue
// 18, defect 8): a cut tail is found by the numbers the ledger keeps
// outside the chain (audit_checkpoint_test.go: by a signed checkpoint
// when those were rewritten too); a broken entry is reported with the
// count of the good entries before it.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"idemgate/ledger"
)

// tamperAudit edits the closed ledger file's buckets with bbolt directly,
// as an attacker with write access to the file would.
func tamperAudit(t *testing.T, db string, edit func(audit, meta, records, byKey *bolt.Bucket) error) {
	t.Helper()
	bdb, err := bolt.Open(db, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer bdb.Close()
	if err := bdb.Update(func(tx *bolt.Tx) error {
		return edit(tx.Bucket([]byte("audit")), tx.Bucket([]byte("meta")), tx.Bucket([]byte("records")), tx.Bucket([]byte("audit_by_key")))
	}); err != nil {
		t.Fatal(err)
	}
}

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// lastSeq is the newest entry's sequence number.
func lastSeq(audit *bolt.Bucket) uint64 {
	k, _ := audit.Cursor().Last()
	return binary.BigEndian.Uint64(k)
}

// recordNumbered is the newest audit entry any record numbers.
func recordNumbered(t *testing.T, records *bolt.Bucket) uint64 {
	var newest uint64
	records.ForEach(func(k, v []byte) error {
		r, err := ledger.DecodeRecord(v)
		if err != nil {
			t.Fatalf("record %q: %v", k, err)
		}
		for _, s := range r.AuditSeqs {
			newest = max(newest, s)
		}
		return nil
	})
	return newest
}

// mustVerify runs audit verify with args and wants exit 0.
func mustVerify(t *testing.T, db string, args ...string) cliResult {
	t.Helper()
	r := runCLI(t, 30*time.Second, append([]string{"audit", "verify", "--db", db}, args...)...)
	if r.Code != 0 || !strings.Contains(r.Stdout, "audit chain intact") {
		t.Fatalf("audit verify %v: exit %d\n%s%s", args, r.Code, r.Stdout, r.Stderr)
	}
	return r
}

// verifyFails runs audit verify with args and wants exit 1 with a message
// holding every one of want.
func verifyFails(t *testing.T, db string, args []string, want ...string) {
	t.Helper()
	r := runCLI(t, 30*time.Second, append([]string{"audit", "verify", "--db", db}, args...)...)
	if r.Code != 1 {
		t.Fatalf("audit verify %v: exit %d, want 1\n%s%s", args, r.Code, r.Stdout, r.Stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.Stderr, w) {
			t.Errorf("audit verify %v says %q; want it to say %q", args, strings.TrimSpace(r.Stderr), w)
		}
	}
}

// TestAuditVerifyFindsCutTail: deleting the newest audit entries from a
// ledger a real server wrote is reported by audit verify — by the index's
// watermark when only the entry is deleted, by the record that numbers an
// entry when the watermark is set back too.
func TestAuditVerifyFindsCutTail(t *testing.T) {
	t.Run("newest_entry", func(t *testing.T) {
		db := filledLedger(t, 3)
		mustVerify(t, db)
		var last uint64
		tamperAudit(t, db, func(audit, _, _, _ *bolt.Bucket) error {
			last = lastSeq(audit)
			return audit.Delete(seqKey(last))
		})
		verifyFails(t, db, nil, fmt.Sprintf("numbers audit entry %d, but the log ends at entry %d: its newest entries were removed", last, last-1),
			fmt.Sprintf("broken after %d good entries", last-1))
	})
	t.Run("through_a_recorded_transition", func(t *testing.T) {
		db := filledLedger(t, 3)
		var numbered uint64
		tamperAudit(t, db, func(audit, meta, records, _ *bolt.Bucket) error {
			numbered = recordNumbered(t, records)
			for seq := lastSeq(audit); seq >= numbered; seq-- {
				if err := audit.Delete(seqKey(seq)); err != nil {
					return err
				}
			}
			return meta.Put([]byte("audit_indexed"), seqKey(numbered-1))
		})
		verifyFails(t, db, nil, "record ", fmt.Sprintf("numbers audit entry %d, but the log ends at entry %d", numbered, numbered-1))
	})
}

// TestAuditVerifyCountsGoodEntries: an entry edited or deleted in the
// middle is named, after the count of the good entries before it.
func TestAuditVerifyCountsGoodEntries(t *testing.T) {
	for _, tc := range []struct {
		name   string
		tamper func(audit *bolt.Bucket) error
		want   string
	}{
		{"edited", func(audit *bolt.Bucket) error {
			v := append([]byte(nil), audit.Get(seqKey(6))...)
			return audit.Put(seqKey(6), bytes.Replace(v, []byte(`"tool":"create_order"`), []byte(`"tool":"create_orders"`), 1))
		}, "audit entry 6: content does not match its hash"},
		{"deleted", func(audit *bolt.Bucket) error { return audit.Delete(seqKey(6)) },
			"audit entry 7: it follows entry 5, entry 6 is missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := filledLedger(t, 8)
			tamperAudit(t, db, func(audit, _, _, _ *bolt.Bucket) error {
				if lastSeq(audit) < 8 {
					t.Fatalf("the ledger has %d audit entries; the test wants 8 or more", lastSeq(audit))
				}
				return tc.tamper(audit)
			})
			verifyFails(t, db, nil, "audit chain broken after 5 good entries", tc.want)
		})
	}
}
