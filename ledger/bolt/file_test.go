package bolt

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"idemgate/ledger"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bbolt "go.etcd.io/bbolt"
)

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDevelopmentLedgerRefused: a ledger of schema version 1, written by a
// development build before the format was reset, is refused by both
// opens (ErrSchemaVersion, naming idemgate init) and not written to.
func TestDevelopmentLedgerRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	mustOpenPath(t, path, ledger.Options{}).Close()
	rawUpdate(t, path, func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keySchemaVersion, []byte("1"))
	})
	before := readFile(t, path)
	for mode, open := range map[string]func(string, ledger.Options, ...OpenOption) (*File, error){"Open": Open, "OpenReadOnly": OpenReadOnly} {
		s, err := open(path, ledger.Options{})
		if !errors.Is(err, ledger.ErrSchemaVersion) || !strings.Contains(err.Error(), "idemgate init") {
			if s != nil {
				s.Close()
			}
			t.Errorf("%s of a schema-1 ledger: %v, want ErrSchemaVersion naming idemgate init", mode, err)
		}
	}
	if !bytes.Equal(before, readFile(t, path)) {
		t.Error("the file was changed")
	}
}

// TestForeignFileRefusedUntouched: another program's bbolt file, even one
// with idemgate's bucket names, is refused and not written to.
func TestForeignFileRefusedUntouched(t *testing.T) {
	for name, fill := range map[string]func(tx *bbolt.Tx) error{
		"other_buckets": func(tx *bbolt.Tx) error {
			b, err := tx.CreateBucket([]byte("sessions"))
			if err != nil {
				return err
			}
			return b.Put([]byte("x"), []byte("y"))
		},
		"other_meta": func(tx *bbolt.Tx) error {
			b, err := tx.CreateBucket([]byte("meta"))
			if err != nil {
				return err
			}
			b.Put([]byte("schema_version"), []byte("1"))
			return b.Put([]byte("owner"), []byte("inventory"))
		},
		"empty_bbolt": func(tx *bbolt.Tx) error { return nil },
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "other.db")
			rawUpdate(t, path, fill)
			before := readFile(t, path)
			for mode, open := range map[string]func(string, ledger.Options, ...OpenOption) (*File, error){"Open": Open, "OpenReadOnly": OpenReadOnly} {
				s, err := open(path, ledger.Options{})
				if !errors.Is(err, ErrNotLedger) {
					if s != nil {
						s.Close()
					}
					t.Fatalf("%s of a foreign file: %v, want ErrNotLedger", mode, err)
				}
				if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "idemgate init") {
					t.Errorf("%s: message does not name the file and what to do: %v", mode, err)
				}
			}
			if !bytes.Equal(before, readFile(t, path)) {
				t.Error("the foreign file was changed")
			}
		})
	}
}

// TestEmptyFileRefused: a zero-length file is not made into a new ledger.
func TestEmptyFileRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := Open(path, ledger.Options{})
	if !errors.Is(err, ErrEmptyFile) {
		if s != nil {
			s.Close()
		}
		t.Fatalf("Open of an empty file: %v, want ErrEmptyFile", err)
	}
	if fi, _ := os.Stat(path); fi.Size() != 0 {
		t.Error("the empty file was written")
	}
	if err := Init(path); !errors.Is(err, ErrExists) {
		t.Errorf("InitBolt over an existing file: %v, want ErrExists", err)
	}
	os.Remove(path)
	if err := Init(path); err != nil {
		t.Fatal(err)
	}
	mustOpenPath(t, path, ledger.Options{})
}

// TestDeletedLedgerIsNotRecreated: a ledger file removed while a process
// has it open is not silently re-created empty, and no commit is made to
// the removed file (it would be lost with the process): the next claim
// fails with ErrNoLedger.
func TestDeletedLedgerIsNotRecreated(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	s := mustOpenPath(t, path, ledger.Options{})
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	_, err := s.Claim(context.Background(), newClaim("t1", "create_order", "fp"))
	if !errors.Is(err, ErrNoLedger) {
		t.Fatalf("claim after the file was deleted: %v, want ErrNoLedger", err)
	}
	if _, err := os.Stat(path); err == nil {
		t.Error("the deleted ledger was re-created")
	}
}

// TestReadOnlyStoreNeverWrites: every write of a read-only store fails with
// ErrReadOnly, and the file is unchanged.
func TestReadOnlyStoreNeverWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	s := mustOpenPath(t, path, ledger.Options{})
	s.Close()
	before := readFile(t, path)
	ro, err := OpenReadOnly(path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	ctx := context.Background()
	if _, err := ro.Claim(ctx, newClaim("t1", "create_order", "fp")); !errors.Is(err, ErrReadOnly) {
		t.Errorf("Claim: %v, want ErrReadOnly", err)
	}
	if err := ro.IssueKey(ctx, "t1", "k"); !errors.Is(err, ErrReadOnly) {
		t.Errorf("IssueKey: %v, want ErrReadOnly", err)
	}
	ro.Audit(ledger.AuditEntry{Event: "call"})
	if _, err := ro.AuditTail(ctx, 10); err != nil {
		t.Error(err)
	}
	ro.Close()
	if !bytes.Equal(before, readFile(t, path)) {
		t.Error("a read-only store changed the file")
	}
}

// TestUndecodableRecordIsReported: a record whose bytes are not a record
// is an error naming its key for List and Get, and a problem for Check,
// never a panic.
func TestUndecodableRecordIsReported(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	s := mustOpenPath(t, path, ledger.Options{})
	ctx := context.Background()
	if _, err := s.Execute(ctx, newClaim("t1", "create_order", "fp"), (&applier{}).succeed(`{}`)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	var key []byte
	rawUpdate(t, path, func(tx *bbolt.Tx) error {
		k, _ := tx.Bucket(bucketRecords).Cursor().First()
		key = bytes.Clone(k)
		return tx.Bucket(bucketRecords).Put(k, []byte("\x00\xffnot json"))
	})
	_, keyName, _ := bytes.Cut(key, []byte{0})
	ro, err := OpenReadOnly(path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if _, err := ro.List(ctx, ledger.Filter{}); err == nil || !strings.Contains(err.Error(), string(keyName)) {
		t.Errorf("List over an undecodable record: %v, want an error naming %s", err, keyName)
	}
	rep, err := Check(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) != 1 || !strings.Contains(rep.Problems[0].Error(), string(keyName)) {
		t.Errorf("Check problems %v, want one naming %s", rep.Problems, keyName)
	}
}

// TestBackupIsConsistentCopy: Backup writes a copy that opens with the
// same records, and never overwrites a file.
func TestBackupIsConsistentCopy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	s := mustOpenPath(t, path, ledger.Options{})
	ctx := context.Background()
	for i := range 20 {
		c := newClaim("t1", "create_order", "fp")
		c.Key = "k" + string(rune('a'+i))
		c.Fingerprint = "fp-" + c.Key
		if _, err := s.Execute(ctx, c, (&applier{}).succeed(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	dst := filepath.Join(t.TempDir(), "copy.db")
	if _, err := s.Backup(dst); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Backup(dst); !errors.Is(err, ErrExists) {
		t.Errorf("second Backup to the same file: %v, want ErrExists", err)
	}
	rep, err := Check(dst)
	if err != nil || len(rep.Problems) > 0 || rep.Records != 20 {
		t.Fatalf("Check of the backup: %+v %v", rep, err)
	}
	c, err := OpenReadOnly(dst, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if n, err := c.VerifyAudit(ctx); err != nil || n == 0 {
		t.Errorf("VerifyAudit of the backup: %d %v", n, err)
	}
}

// TestHealthFollowsCommits: a healthy store is OK; a refused claim is not
// a failed commit; when commits fail (here: the file was deleted) Health
// is not OK, with the commit error and a failed probe.
func TestHealthFollowsCommits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	s := mustOpenPath(t, path, ledger.Options{RequireIssuedKeys: true})
	ctx := context.Background()
	if h := s.Health(ctx); !h.OK || h.LastCommitError != "" || h.FreeBytes == 0 || h.Probe != "" {
		t.Fatalf("healthy store: %+v", h)
	}
	if _, err := s.Claim(ctx, newClaim("t1", "create_order", "fp")); !errors.Is(err, ledger.ErrKeyNotIssued) {
		t.Fatalf("claim of an unissued key: %v", err)
	}
	if h := s.Health(ctx); !h.OK || h.LastCommitError != "" {
		t.Fatalf("after a refused claim: %+v", h)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := s.IssueKey(ctx, "t1", "k"); err == nil {
		t.Fatal("IssueKey succeeded without a ledger file")
	}
	h := s.Health(ctx)
	if h.OK || !strings.Contains(h.LastCommitError, "no ledger file") || !strings.Contains(h.Probe, "no ledger file") || h.Problem == "" {
		t.Fatalf("with every commit failing: %+v", h)
	}
	if strings.Contains(h.LastCommitError, path) {
		t.Errorf("health names the file's path: %s", h.LastCommitError)
	}
}

// TestHealthTextOfADeletedLedger: the health text of a ledger deleted
// under a running server names no path and reads as one sentence.
func TestHealthTextOfADeletedLedger(t *testing.T) {
	b := &backend{path: "/srv/data/ledger.db"}
	got := b.healthText(fmt.Errorf("reopen: %w", noLedgerError(b.path)))
	if want := "the ledger file: no ledger file"; got != want {
		t.Errorf("healthText = %q, want %q", got, want)
	}
}
