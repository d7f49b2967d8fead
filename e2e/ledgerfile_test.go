package e2e

// The ledger file under abuse (issue 8, defect 5): empty, foreign, cut
// short and overwritten files are refused by every command with one line
// naming the file and what to do — never a Go panic or a fault dump — and
// nothing is written to them; read-only commands never write; a backup of
// a live ledger opens and verifies.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// filledLedger returns a ledger written by a real server: n orders.
func filledLedger(t *testing.T, n int) string {
	t.Helper()
	db := filepath.Join(t.TempDir(), "ledger.db")
	s := startServer(t, mcpGoModern, serverConfig{DB: db, Tenant: aprTenant, Principal: "alice"})
	for i := range n {
		placeOrder(t, s, fmt.Sprintf("customer-%d", i))
	}
	s.Close()
	stopOwner(t, db)
	return db
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// usedPages returns the ids of two consecutive pages in the middle of the
// file that bbolt uses (not free), and the page size.
func usedPages(t *testing.T, path string) (int64, int64) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, PreLoadFreelist: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var found int64 = -1
	ps := int64(db.Info().PageSize)
	db.View(func(tx *bolt.Tx) error {
		hwm := int(tx.Size() / ps)
		for d := 0; d < hwm/2; d++ {
			for _, id := range []int{hwm/2 + d, hwm/2 - d} {
				if id < 2 || id+1 >= hwm {
					continue
				}
				p0, err0 := tx.Page(id)
				p1, err1 := tx.Page(id + 1)
				if err0 == nil && err1 == nil && p0 != nil && p1 != nil && p0.Type != "free" && p1.Type != "free" && p0.Type != "freelist" {
					found = int64(id)
					return nil
				}
			}
		}
		return nil
	})
	if found < 0 {
		t.Fatal("no two consecutive used pages in the ledger")
	}
	return found, ps
}

// refusedByEveryCommand runs the commands that open the ledger on db and
// checks each exits non-zero with one line of stderr containing every
// string of want, no panic or fault dump, and the file unchanged.
func refusedByEveryCommand(t *testing.T, db string, want ...string) {
	t.Helper()
	before := fileSum(t, db)
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	addToken(t, tokens, "alice", aprTenant, "agent")
	for _, args := range [][]string{
		{"serve", "--db", db, "--log-level", "warn"},
		{"serve", "--db", db, "--http", "127.0.0.1:0", "--tokens", tokens},
		{"ops", "list", "--db", db, "--json"},
		{"ops", "show", "k1", "--db", db},
		{"audit", "verify", "--db", db},
		{"audit", "export", "--db", db},
		{"stats", "--db", db},
		{"approvals", "list", "--db", db, "--principal", "boss", "--tenant", aprTenant},
		{"check", "--db", db},
		{"backup", filepath.Join(t.TempDir(), "copy.db"), "--db", db},
	} {
		r := runCLI(t, 30*time.Second, args...)
		name := strings.Join(args[:2], " ")
		if r.Code == 0 {
			t.Errorf("%s: exit 0 on a bad ledger file\nstdout: %s", name, r.Stdout)
			continue
		}
		for _, bad := range []string{"goroutine", "panic", "SIGSEGV", "SIGBUS", "fatal error"} {
			if strings.Contains(r.Stderr, bad) {
				t.Errorf("%s: stderr has %q:\n%s", name, bad, r.Stderr)
			}
		}
		lines := strings.Split(strings.TrimSpace(r.Stderr), "\n")
		t.Logf("%s: %s", name, lines[len(lines)-1])
		if len(lines) != 1 {
			t.Errorf("%s: stderr has %d lines, want one:\n%s", name, len(lines), r.Stderr)
		}
		for _, w := range append([]string{db}, want...) {
			if !strings.Contains(lines[len(lines)-1], w) {
				t.Errorf("%s: stderr does not say %q:\n%s", name, w, r.Stderr)
			}
		}
	}
	if fileSum(t, db) != before {
		t.Errorf("the refused file was changed")
	}
}

// TestLedgerFileRefused: empty, foreign, cut short, overwritten and
// non-bbolt files, through the real binary.
func TestLedgerFileRefused(t *testing.T) {
	good := filledLedger(t, 40)
	goodBytes, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	variant := func(t *testing.T, b []byte) string {
		db := filepath.Join(t.TempDir(), "ledger.db")
		if err := os.WriteFile(db, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return db
	}

	t.Run("empty", func(t *testing.T) {
		db := variant(t, nil)
		refusedByEveryCommand(t, db, "the ledger file is empty", "restore a backup, or delete it and run idemgate init")
		if r := runCLI(t, 10*time.Second, "init", "--db", db); r.Code == 0 {
			t.Errorf("init over an existing empty file succeeded")
		}
	})
	t.Run("not_bbolt", func(t *testing.T) {
		refusedByEveryCommand(t, variant(t, bytes.Repeat([]byte("not a database\n"), 1000)), "not an idemgate ledger")
	})
	t.Run("foreign_bbolt", func(t *testing.T) {
		db := filepath.Join(t.TempDir(), "other.db")
		bdb, err := bolt.Open(db, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = bdb.Update(func(tx *bolt.Tx) error {
			m, err := tx.CreateBucket([]byte("meta"))
			if err != nil {
				return err
			}
			if err := m.Put([]byte("owner"), []byte("another program")); err != nil {
				return err
			}
			u, err := tx.CreateBucket([]byte("users"))
			if err != nil {
				return err
			}
			return u.Put([]byte("alice"), []byte(`{"admin":true}`))
		})
		bdb.Close()
		if err != nil {
			t.Fatal(err)
		}
		refusedByEveryCommand(t, db, "not an idemgate ledger", `"users"`)
	})
	t.Run("foreign_meta_only", func(t *testing.T) {
		// A file with idemgate's bucket names but another program's meta.
		db := filepath.Join(t.TempDir(), "other.db")
		bdb, err := bolt.Open(db, 0o600, nil)
		if err != nil {
			t.Fatal(err)
		}
		bdb.Update(func(tx *bolt.Tx) error {
			m, _ := tx.CreateBucket([]byte("meta"))
			m.Put([]byte("schema_version"), []byte("1"))
			m.Put([]byte("app"), []byte("inventory"))
			_, err := tx.CreateBucket([]byte("records"))
			return err
		})
		bdb.Close()
		refusedByEveryCommand(t, db, "not an idemgate ledger")
	})
	t.Run("cut_in_half", func(t *testing.T) {
		db := variant(t, goodBytes)
		// Cut below the pages bbolt uses (its file may extend past them).
		id, ps := usedPages(t, db)
		if err := os.Truncate(db, id*ps); err != nil {
			t.Fatal(err)
		}
		refusedByEveryCommand(t, db, "damaged", "cut short", "restore it from a backup")
	})
	for _, shift := range []int64{0, 2048} {
		t.Run("8KiB_garbage_"+map[int64]string{0: "aligned", 2048: "unaligned"}[shift], func(t *testing.T) {
			db := variant(t, goodBytes)
			id, ps := usedPages(t, db)
			garbage := make([]byte, 8192)
			rng := rand.New(rand.NewPCG(1, uint64(shift)))
			for i := range garbage {
				garbage[i] = byte(rng.Uint32())
			}
			f, err := os.OpenFile(db, os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(garbage, id*ps+shift); err != nil {
				t.Fatal(err)
			}
			f.Close()
			refusedByEveryCommand(t, db, "damaged", "restore it from a backup")
		})
	}
}

// TestUndecodableRecordReported: a ledger whose pages are sound but one
// record and one audit entry hold bytes that do not decode: the commands
// that read them fail with one line naming the key or entry, check lists
// both, nothing panics.
func TestUndecodableRecordReported(t *testing.T) {
	db := filledLedger(t, 3)
	var recKey, auditKey []byte
	bdb, err := bolt.Open(db, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = bdb.Update(func(tx *bolt.Tx) error {
		k, _ := tx.Bucket([]byte("records")).Cursor().First()
		recKey = bytes.Clone(k)
		if err := tx.Bucket([]byte("records")).Put(k, []byte("{\"state\":")); err != nil {
			return err
		}
		k, _ = tx.Bucket([]byte("audit")).Cursor().Last()
		auditKey = bytes.Clone(k)
		return tx.Bucket([]byte("audit")).Put(k, []byte("\xff\x00"))
	})
	bdb.Close()
	if err != nil {
		t.Fatal(err)
	}
	_, key, _ := bytes.Cut(recKey, []byte{0})
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"ops", "list", "--json", "--tenant", aprTenant}, string(key)},
		{[]string{"ops", "show", string(key), "--tenant", aprTenant}, string(key)},
		{[]string{"audit", "verify"}, fmt.Sprintf("%x", auditKey)},
		{[]string{"audit", "export"}, fmt.Sprintf("%x", auditKey)},
		{[]string{"check"}, "2 problem(s)"},
	} {
		r := runCLI(t, 30*time.Second, append(c.args, "--db", db)...)
		name := strings.Join(c.args, " ")
		lines := strings.Split(strings.TrimSpace(r.Stderr), "\n")
		if r.Code == 0 || len(lines) != 1 || !strings.Contains(r.Stderr, c.want) || strings.Contains(r.Stderr, "panic") || strings.Contains(r.Stderr, "goroutine") {
			t.Errorf("%s: exit %d, stderr %q; want one line naming %q", name, r.Code, r.Stderr, c.want)
		}
		if c.args[0] == "check" && (!strings.Contains(r.Stdout, string(key)) || !strings.Contains(r.Stdout, fmt.Sprintf("%x", auditKey))) {
			t.Errorf("check does not list both problems:\n%s", r.Stdout)
		}
	}
}

// TestReadOnlyCommandsNeverWrite: the read commands open the ledger
// read-only: the file's bytes and modification time are unchanged after
// each, and they work on a read-only file in a read-only directory.
func TestReadOnlyCommandsNeverWrite(t *testing.T) {
	db := filledLedger(t, 3)
	dir := filepath.Dir(db)
	r := runCLI(t, 10*time.Second, "ops", "list", "--db", db, "--tenant", aprTenant, "--json")
	if r.Code != 0 {
		t.Fatalf("ops list: %s", r.Stderr)
	}
	var recs []struct {
		Key string `json:"key"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &recs); err != nil || len(recs) != 3 {
		t.Fatalf("ops list: %v %s", err, r.Stdout)
	}
	os.RemoveAll(filepath.Join(dir, "outbox"))
	if err := os.Chmod(db, 0o444); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o755); os.Chmod(db, 0o644) })
	old := time.Now().Add(-time.Hour).Truncate(time.Second)
	os.Chmod(dir, 0o755)
	if err := os.Chtimes(db, old, old); err != nil {
		t.Fatal(err)
	}
	os.Chmod(dir, 0o555)
	sum := fileSum(t, db)
	for _, args := range [][]string{
		{"ops", "list", "--json"},
		{"ops", "show", recs[0].Key, "--tenant", aprTenant},
		{"audit", "verify"},
		{"audit", "tail"},
		{"audit", "export"},
		{"stats"},
		{"approvals", "list", "--principal", "boss", "--tenant", aprTenant},
		{"check"},
	} {
		r := runCLI(t, 30*time.Second, append(args, "--db", db)...)
		if r.Code != 0 {
			t.Errorf("%s: exit %d: %s", strings.Join(args, " "), r.Code, r.Stderr)
		}
		fi, err := os.Stat(db)
		if err != nil {
			t.Fatal(err)
		}
		if !fi.ModTime().Equal(old) || fileSum(t, db) != sum {
			t.Fatalf("%s changed the ledger file (mtime %v, want %v)", strings.Join(args, " "), fi.ModTime(), old)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("the read commands created files beside the ledger: %v", names)
	}
}

// TestBackupWhileServing: idemgate backup copies a ledger that a server
// is writing to; the copy opens, its audit chain verifies, and a copy
// taken once writing stops holds exactly the live ledger's records.
func TestBackupWhileServing(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	s := startServer(t, mcpGoModern, serverConfig{DB: db, Tenant: aprTenant, Principal: "alice"})
	placeOrder(t, s, "first")
	var stop atomic.Bool
	var wg sync.WaitGroup
	var placed atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for !stop.Load() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			e, err := s.call(ctx, "create_order", orderArgs(newKey(), fmt.Sprintf("busy-%d", placed.Load()), coffee, map[string]any{"notify_customer": false}))
			cancel()
			if err != nil || e.Status != "succeeded" {
				t.Errorf("create_order during backup: %v %s", err, e)
				return
			}
			placed.Add(1)
		}
	}()
	backups := t.TempDir()
	for i := range 3 {
		for placed.Load() < int64(5*(i+1)) && !t.Failed() {
			time.Sleep(10 * time.Millisecond)
		}
		copyPath := filepath.Join(backups, "during-"+string(rune('0'+i))+".db")
		if r := runCLI(t, 30*time.Second, "backup", copyPath, "--db", db); r.Code != 0 {
			t.Fatalf("backup while serving: exit %d: %s", r.Code, r.Stderr)
		}
		if r := runCLI(t, 30*time.Second, "audit", "verify", "--db", copyPath); r.Code != 0 || !strings.Contains(r.Stdout, "audit chain intact") {
			t.Fatalf("audit verify of the backup: %d %s %s", r.Code, r.Stdout, r.Stderr)
		}
	}
	stop.Store(true)
	wg.Wait()
	final := filepath.Join(backups, "final.db")
	if r := runCLI(t, 30*time.Second, "backup", final, "--db", db); r.Code != 0 {
		t.Fatalf("backup: %s", r.Stderr)
	}
	if r := runCLI(t, 10*time.Second, "backup", final, "--db", db); r.Code == 0 {
		t.Errorf("backup over an existing file succeeded")
	}
	list := func(path string) string {
		r := runCLI(t, 30*time.Second, "ops", "list", "--db", path, "--tenant", "", "--limit", "10000", "--json")
		if r.Code != 0 {
			t.Fatalf("ops list %s: %s", path, r.Stderr)
		}
		return r.Stdout
	}
	live, copied := list(db), list(final)
	if live != copied {
		t.Errorf("the backup's records differ from the live ledger's")
	}
	var recs []json.RawMessage
	json.Unmarshal([]byte(copied), &recs)
	if int64(len(recs)) != placed.Load()+1 {
		t.Errorf("backup holds %d records, want %d", len(recs), placed.Load()+1)
	}
	// The copy serves: its orders are there.
	s2 := startServer(t, mcpGoModern, serverConfig{DB: final, Tenant: aprTenant, Principal: "alice"})
	if ids := s2.listOrderIDs(t, "first"); len(ids) != 1 {
		t.Errorf("the restored ledger lists %d orders of customer first, want 1", len(ids))
	}
}

// TestMissingLedgerNotCreated: only serve and init start a new ledger. A
// command that changes a ledger (approve, resolve, requeue) pointed at a
// path where none exists refuses, and leaves nothing behind: an empty
// ledger there would remember no key.
func TestMissingLedgerNotCreated(t *testing.T) {
	dir := t.TempDir()
	db := filepath.Join(dir, "sub", "ledger.db")
	for _, args := range [][]string{
		{"approvals", "approve", "apr_x", "--principal", "boss", "--db", db},
		{"approvals", "reject", "apr_x", "--principal", "boss", "--db", db},
		{"resolve", "11111111-2222-4333-8444-555555555555", "--outcome", "succeeded", "--evidence", "call log", "--principal", "boss", "--db", db},
		{"reconcile", "11111111-2222-4333-8444-555555555555", "--db", db},
		{"outbox", "requeue", "msg_x", "--db", db},
		{"ops", "list", "--db", db},
	} {
		r := runCLI(t, 10*time.Second, args...)
		if r.Code == 0 || !strings.Contains(r.Stderr, "no ledger file") || !strings.Contains(r.Stderr, "idemgate init") {
			t.Errorf("%v: exit %d, stderr %q; want a refusal naming idemgate init", args, r.Code, r.Stderr)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("the commands left %d entries behind (first %q); want none", len(entries), entries[0].Name())
	}
}
