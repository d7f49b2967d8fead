package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	bbolt "go.etcd.io/bbolt"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
)

// smallDeepLimit stands in for deepCheckLimit in these tests: every ledger
// file is bigger, so an open runs only the cheap checks, as it does for a
// file over 32 MiB.
const smallDeepLimit = 4096

// leafPage is one leaf page of a bucket's B+tree as the file holds it.
type leafPage struct {
	id   uint64
	keys []string // in order
}

// bucketLeaves reads the leaf pages of the bucket that bucket returns, in
// key order, from the closed ledger file at path; the pages of its tree
// that are neither branch nor leaf (damaged), and the file's page size.
func bucketLeaves(t *testing.T, path string, bucket func(*bbolt.Tx) *bbolt.Bucket) (leaves []leafPage, bad []uint64, ps int) {
	t.Helper()
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	var root uint64
	db.View(func(tx *bbolt.Tx) error {
		root = uint64(bucket(tx).Root())
		return nil
	})
	ps = db.Info().PageSize
	db.Close()
	file := readFile(t, path)
	// bbolt's page: id u64, flags u16, count u16, overflow u32, then the
	// elements (16 bytes each); an element's key lies pos bytes after it.
	le := binary.NativeEndian
	var walk func(id uint64)
	walk = func(id uint64) {
		p := file[int(id)*ps:]
		flags, count := le.Uint16(p[8:]), int(le.Uint16(p[10:]))
		if le.Uint64(p) != id || (flags != 0x01 && flags != 0x02) {
			bad = append(bad, id)
			return
		}
		for i := range count {
			e := p[16+16*i:]
			switch flags {
			case 0x01: // branch: pos, ksize, pgid
				walk(le.Uint64(e[8:]))
			case 0x02: // leaf: flags, pos, ksize, vsize
				if i == 0 {
					leaves = append(leaves, leafPage{id: id})
				}
				pos, ksize := le.Uint32(e[4:]), le.Uint32(e[8:])
				l := &leaves[len(leaves)-1]
				l.keys = append(l.keys, string(e[pos:pos+ksize]))
			}
		}
	}
	walk(root)
	return leaves, bad, ps
}

// damageSite is a bucket whose page a test damages, and how its keys
// name an operation key of a tenant.
type damageSite struct {
	name   string
	bucket func(*bbolt.Tx) *bbolt.Bucket
	// prefix and suffix around an operation key of tenant t1 in the
	// bucket's keys.
	prefix, suffix string
}

var (
	// The records bucket: read by every call for its key.
	recordsSite = damageSite{name: "records", prefix: "t1\x00",
		bucket: func(tx *bbolt.Tx) *bbolt.Bucket { return tx.Bucket(bucketRecords) }}
	// The applier's data collection: written only by the transaction that
	// executes an operation, as the embedded orders are.
	effectsSite = damageSite{name: "data/" + effectsCollection, prefix: "t1:", suffix: "/1",
		bucket: func(tx *bbolt.Tx) *bbolt.Bucket { return tx.Bucket(bucketData).Bucket([]byte(effectsCollection)) }}
)

// damagedFile is a ledger file that damagedLedger wrote and damaged.
type damagedFile struct {
	path   string
	t2     map[string]string // the t2 records as they were: key → JSON
	victim uint64            // the damaged page
	lost   []string          // the operation keys whose keys were on it
	next   []string          // the bucket's keys on the leaf after it
	page   []byte            // its bytes as damaged
}

// damagedLedger writes a ledger holding n succeeded operations in each of
// the tenants t1 and t2, then overwrites one leaf page of site's bucket
// that holds only t1 keys (not the first or last leaf) with random bytes.
func damagedLedger(t *testing.T, n int, site damageSite) damagedFile {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.db")
	s, err := open(path, ledgertest.Opts(), openReadWrite, true, smallDeepLimit)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ap := &applier{}
	t2 := map[string]string{}
	for range n {
		for _, tenant := range []string{"t1", "t2"} {
			d, err := s.Execute(ctx, newClaim(tenant, "create_order", "fp"), ap.succeed(`{"order":{"order_id":"o"}}`))
			if err != nil {
				t.Fatal(err)
			}
			if tenant == "t2" {
				t2[d.Record.Key] = recordJSON(t, d.Record)
			}
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	leaves, bad, ps := bucketLeaves(t, path, site.bucket)
	if len(bad) > 0 {
		t.Fatalf("pages %v of the new ledger are damaged", bad)
	}
	var mid []int // leaves holding only t1's keys, neither first nor last
	for i, l := range leaves {
		if i > 0 && i < len(leaves)-1 && strings.HasPrefix(l.keys[0], site.prefix) && strings.HasPrefix(l.keys[len(l.keys)-1], site.prefix) {
			mid = append(mid, i)
		}
	}
	if len(mid) < 2 {
		t.Fatalf("bucket %s has %d leaves, %d of them t1's only: too few to damage one", site.name, len(leaves), len(mid))
	}
	i := mid[len(mid)/2]
	victim := leaves[i]
	var lost []string
	for _, k := range victim.keys {
		lost = append(lost, strings.TrimSuffix(strings.TrimPrefix(k, site.prefix), site.suffix))
	}
	page := make([]byte, ps)
	rnd := rand.New(rand.NewPCG(8, 8))
	for i := range page {
		page[i] = byte(rnd.Uint32())
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(page, int64(victim.id)*int64(ps)); err != nil {
		t.Fatal(err)
	}
	return damagedFile{path: path, t2: t2, victim: victim.id, lost: lost, next: leaves[i+1].keys, page: page}
}

// wantDamaged fails the test unless err is ErrDamaged in one line naming
// the file.
func wantDamaged(t *testing.T, what string, err error, path string) {
	t.Helper()
	if !errors.Is(err, ErrDamaged) {
		t.Errorf("%s: %v, want ErrDamaged", what, err)
		return
	}
	if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, path) || !strings.Contains(msg, "idemgate check") {
		t.Errorf("%s: %q, want one line naming the file and what to do", what, msg)
	}
}

// TestDamageFoundAfterOpen: a ledger over the deep check's limit opens
// with the cheap checks only, so a damaged page they do not read is found
// by the first transaction that reads it, where bbolt panics on the page:
// a leaf of the records bucket (read by every call for a key on it), or of
// a data collection (read only by the write that executes an operation,
// in a group commit). Each such read and write returns ErrDamaged in one
// line (guard recovers bbolt's panic; no crash), and every other request
// is served: before and after, alone or in the same group commit as a
// failing one. Nothing spreads the damage (see guard): a failed write left
// nothing in any bucket, the damaged page is never rewritten, and after
// the store is closed every sound record reads as it was.
func TestDamageFoundAfterOpen(t *testing.T) {
	for _, site := range []damageSite{recordsSite, effectsSite} {
		t.Run(site.name, func(t *testing.T) { testDamageFoundAfterOpen(t, site) })
	}
}

func testDamageFoundAfterOpen(t *testing.T, site damageSite) {
	df := damagedLedger(t, 400, site) // enough t1 leaves in either bucket, whatever the random keys
	path, t2, victim, lost, page := df.path, df.t2, df.victim, df.lost, df.page
	ctx := context.Background()

	// The deep check at open would have refused the file; the cheap checks
	// do not read the page.
	if s, err := Open(path, ledger.Options{}); err == nil {
		s.Close()
		t.Fatal("Open with the default limit accepted the damaged file: the test's damage is not one the deep check finds")
	} else {
		wantDamaged(t, "Open with the default limit", err, path)
	}
	s, err := open(path, ledgertest.Opts(), openReadWrite, false, smallDeepLimit)
	if err != nil {
		t.Fatalf("open over the limit (cheap checks only): %v", err)
	}
	defer s.Close()

	sound := func(when string) {
		t.Helper()
		for key, want := range t2 {
			rec, err := s.Get(ctx, "t2", key)
			if err != nil {
				t.Fatalf("%s: Get of a sound record: %v", when, err)
			}
			if got := recordJSON(t, rec); got != want {
				t.Fatalf("%s: record %s = %s, want %s", when, key, got, want)
			}
		}
		if recs, err := s.List(ctx, ledger.Filter{Tenant: "t2", Limit: 1000}); err != nil || len(recs) != len(t2) {
			t.Fatalf("%s: List of t2 = %d records, %v; want %d", when, len(recs), err, len(t2))
		}
	}
	sound("before the damage is seen")

	if site.name == recordsSite.name {
		_, err = s.Get(ctx, "t1", lost[1])
		wantDamaged(t, "Get of a record on the damaged page", err, path)
		_, err = s.List(ctx, ledger.Filter{Tenant: "t1", Limit: 1000})
		wantDamaged(t, "List of the damaged tenant", err, path)
		sound("after a read found the damage")
	}

	// Writes, started together so that they share group commits. Keys
	// that sort onto the damaged page fail, in the transaction's function;
	// the others succeed. Then, in the data collection, deletes that empty
	// the leaf after the damaged one fail too: committing them merges that
	// leaf with its sibling, so there the commit reads the damaged page,
	// and the batch's other members succeed all the same.
	ap := &applier{}
	var failed []string
	var mu sync.Mutex
	soundWrite := func() {
		d, err := s.Execute(ctx, newClaim("t2", "create_order", "fp"), ap.succeed(`{}`))
		mu.Lock()
		defer mu.Unlock()
		if err != nil || d.Kind != ledger.DecisionExecuted {
			t.Errorf("Execute of a sound key beside the damaged ones: %v %v", d.Kind, err)
			return
		}
		t2[d.Record.Key] = recordJSON(t, d.Record)
	}
	together := func(n int, fn func(i int)) {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				fn(i)
			}()
		}
		close(start)
		wg.Wait()
	}
	together(24, func(i int) {
		if i%3 != 0 {
			soundWrite()
			return
		}
		c := newClaim("t1", "create_order", "fp")
		// Between the page's first and second key ('0' sorts after the '/'
		// of an effect's key).
		c.Key = lost[0] + fmt.Sprintf("0%02d", i)
		_, err := s.Execute(ctx, c, ap.succeed(`{}`))
		mu.Lock()
		defer mu.Unlock()
		failed = append(failed, c.Key)
		wantDamaged(t, "Execute of a key on the damaged page", err, path)
	})
	if site.name == effectsSite.name {
		together(24, func(i int) {
			if i%4 != 0 {
				soundWrite()
				return
			}
			err := s.Update(ctx, func(tx ledger.Tx) error {
				for _, k := range df.next[1:] {
					if err := tx.Delete(effectsCollection, k); err != nil {
						return err
					}
				}
				return nil
			})
			wantDamaged(t, "a commit whose rebalance reads the damaged page", err, path)
		})
	}
	if site.name == recordsSite.name {
		if got := ap.n(); got != 16 {
			t.Errorf("%d applies ran, want 16 (the sound keys; none for a key whose record is on the damaged page)", got)
		}
	} else {
		for _, key := range failed {
			if _, err := s.Get(ctx, "t1", key); !errors.Is(err, ledger.ErrNotFound) {
				t.Errorf("Get of %s after its execution failed on the damaged page: %v, want ErrNotFound (rolled back)", key, err)
			}
		}
	}
	sound("after the writes")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	// Nothing spread. The damaged tree holds one damaged page, the one
	// damaged, still in its place with the bytes it was damaged with: no
	// commit rewrote, freed or reused it, or copied it elsewhere.
	_, bad, ps := bucketLeaves(t, path, site.bucket)
	if len(bad) != 1 || bad[0] != victim {
		t.Errorf("damaged pages of bucket %s after the writes: %v, want only page %d", site.name, bad, victim)
	}
	if at := int(victim) * ps; !bytes.Equal(readFile(t, path)[at:at+ps], page) {
		t.Errorf("page %d no longer holds the bytes it was damaged with: a commit wrote over it", victim)
	}
	// The failed writes left nothing: their keys are in no sound bucket,
	// and every sound record reads as it was.
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = guard(path, func() error {
		return db.View(func(tx *bbolt.Tx) error {
			for key, want := range t2 {
				if got := string(tx.Bucket(bucketRecords).Get(recordKey("t2", key))); !jsonSame(got, want) {
					t.Errorf("after Close: record %s = %s, want %s", key, got, want)
				}
			}
			damaged := site.bucket(tx)
			if site.name == effectsSite.name {
				for _, k := range df.next {
					if damaged.Get([]byte(k)) == nil {
						t.Errorf("key %q is gone: the failed delete was committed", k)
					}
				}
			}
			return tx.ForEach(func(name []byte, b *bbolt.Bucket) error {
				return walkSound(b, damaged, func(k, v []byte) {
					for _, key := range failed {
						if bytes.Contains(k, []byte(key)) || bytes.Contains(v, []byte(key)) {
							t.Errorf("bucket %s holds %q of a failed write: %.200q", name, key, v)
						}
					}
				})
			})
		})
	})
	if err != nil {
		t.Fatalf("a raw read of the sound buckets: %v", err)
	}
}

// walkSound calls fn for every key and value of b and its nested buckets,
// skipping the bucket damaged.
func walkSound(b, damaged *bbolt.Bucket, fn func(k, v []byte)) error {
	if b.Root() == damaged.Root() {
		return nil
	}
	return b.ForEach(func(k, v []byte) error {
		fn(k, v)
		if v == nil {
			if child := b.Bucket(k); child != nil {
				return walkSound(child, damaged, fn)
			}
		}
		return nil
	})
}

// jsonSame reports whether stored, a record as the records bucket keeps
// it, holds the record whose JSON is want.
func jsonSame(stored, want string) bool {
	ra, err := ledger.DecodeRecord([]byte(stored))
	var rb ledger.Record
	if err != nil || json.Unmarshal([]byte(want), &rb) != nil {
		return false
	}
	ja, _ := json.Marshal(ra)
	jb, _ := json.Marshal(rb)
	return string(ja) == string(jb)
}

// TestFaultOnMappedFileIsDamage: a transaction that faults on the mapped
// file — here its pages were cut off by a truncation while it ran, so the
// read raises SIGBUS — gets ErrDamaged in one line (guard's memory-fault
// path), and the process goes on: the next open refuses the cut file
// with ErrDamaged as well.
func TestFaultOnMappedFileIsDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	s, err := open(path, ledgertest.Opts(), openReadWrite, true, smallDeepLimit)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	ap := &applier{}
	var keys []string
	for range 100 {
		d, err := s.Execute(ctx, newClaim("t1", "create_order", "fp"), ap.succeed(`{}`))
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, d.Record.Key)
	}
	err = s.view(func(tx *bbolt.Tx) error {
		if err := os.Truncate(path, 2*int64(tx.DB().Info().PageSize)); err != nil {
			t.Fatal(err)
		}
		v := tx.Bucket(bucketRecords).Get(recordKey("t1", keys[50]))
		t.Errorf("a read of a page cut off the file returned %d bytes", len(v))
		return nil
	})
	wantDamaged(t, "a read that faults on the mapped file", err, path)
	if err != nil && !strings.Contains(err.Error(), "mapped file faulted") {
		t.Errorf("the fault is not named as one: %v", err)
	}
	_, err = s.Get(ctx, "t1", keys[0])
	wantDamaged(t, "Get after the file was cut", err, path)
}
