package bolt

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/google/uuid"
	bbolt "go.etcd.io/bbolt"

	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
)

// TestLayoutPages is a model, not a test of this package's code: it writes
// a create's keys and values (the sizes measured in a ledger of the tool
// service) in raw bbolt files of two layouts — the one this build writes,
// and the merged layout of issue 12's design (see layouts) — and logs the
// pages (bbolt's TxStats.Write) of one create's commit after n creates.
// Measured (4 KiB pages, pages per create commit): 35.2 current, 21.9
// merged, 16.8 floor, 10.8 deferred (and 2.1 per create in the deferred
// commits) at 10 000 creates; 41.1, 25.8, 18.8, 11.8 (and 3.3) at 100 000.
// It runs with IDEMGATE_LAYOUT_RECORDS=n (10000, 100000: the fill takes a
// few seconds per 100 000) and logs with -v.
func TestLayoutPages(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("IDEMGATE_LAYOUT_RECORDS"))
	if n <= 0 {
		t.Skip("set IDEMGATE_LAYOUT_RECORDS to the ledger's size")
	}
	for _, ps := range []int{4096, 8192, 16384} {
		for _, l := range layouts {
			pages, bytes := layoutPages(t, l, n, ps)
			t.Logf("%-9s %2d KiB pages, %7d creates: %5.2f pages, %7.0f bytes per create commit", l.name, ps/1024, n, pages, bytes)
		}
	}
}

// A layout is the puts of one create, numbered i (i orders them in time),
// and, when it defers some, the puts of creates from to to-1 done by a
// later commit of their own (every 64 creates).
type layout struct {
	name  string
	put   func(tx *bbolt.Tx, i int) error
	flush func(tx *bbolt.Tx, from, to int) error
}

// simIndexes are the two indexes keyed by hashes, as the floor layout
// writes them.
func simIndexes(tx *bbolt.Tx, i int) error {
	now := int64(i) * 1e6
	oid := cat(be8(now), simRand(8))
	if err := simPut(tx, "fp_index", false, cat([]byte(simTenant+"\x00"), simRand(32)), simRand(simFP)); err != nil {
		return err
	}
	return simPut(tx, "orders_by_customer", false, cat([]byte(simTenant+"\x00"), simRand(8), oid), nil)
}

// The sizes of a create's keys and values, as written by the tool service
// (bench __in-process, 10 000 records: bbolt's bucket stats).
const (
	simRecord   = 366 // records: tenant \x00 key → the record, compressed
	simFP       = 83  // fp_index value
	simAudit    = 850 // the executed transition's audit entry
	simOrder    = 359 // the embedded order
	simMessage  = 439 // the outbox message
	simTenant   = "bench"
	simRetainNs = int64(30 * 24 * 3600 * 1e9)
)

func simRand(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func simHex(n int) string { return hex.EncodeToString(simRand(n))[:n] }

func be8(v int64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(v))
	return b[:]
}

func cat(parts ...[]byte) []byte {
	var out []byte
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// simBucket is a bucket of the model, created on first use; append
// buckets are filled as the backend fills its appendBuckets.
func simBucket(tx *bbolt.Tx, name string, appendOnly bool) (*bbolt.Bucket, error) {
	b, err := tx.CreateBucketIfNotExists([]byte(name))
	if err != nil {
		return nil, err
	}
	if appendOnly {
		b.FillPercent = appendFillPercent
	}
	return b, nil
}

func simPut(tx *bbolt.Tx, bucket string, appendOnly bool, k, v []byte) error {
	b, err := simBucket(tx, bucket, appendOnly)
	if err != nil {
		return err
	}
	return b.Put(k, v)
}

func simMeta(tx *bbolt.Tx, i int) error {
	for _, k := range []string{"audit_indexed", "clock_high_water", "clock_trusted"} {
		if err := simPut(tx, "meta", false, []byte(k), be8(int64(i))); err != nil {
			return err
		}
	}
	return nil
}

// layouts: "current" is this build's (ten trees, the downstream ones
// nested in "data"; the outbox's pending index growing, as with the
// deliverer stopped). "merged" is the design: one tree keyed by the
// operation (its record, and its outbox messages keyed by operation and
// step, which replaces outbox and outbox_by_op), one append-only log
// keyed by time (audit entries, the by_time index, the orders, whose ids
// begin with their time, and the expiry index, whose keys begin with a due
// time), and the two indexes keyed by hashes (fingerprints, customers).
// "floor" is "merged" with what a create need not write at all: no
// pending index (the deliverer keeping up keeps it inline), no expiry
// entry (a sweep that finds records due for compaction by their time in
// the log), and fingerprints and customers as raw bytes, not hex.
// "deferred" is "floor" with the two hash-keyed indexes written by a
// commit of their own for every 64 creates (their pages reported apart,
// per create).
var layouts = []layout{
	{name: "current", put: func(tx *bbolt.Tx, i int) error {
		now := int64(i) * 1e6
		key := []byte(simTenant + "\x00" + simHex(36))
		msg := []byte("msg_" + simHex(32))
		oid := simHex(0) + fmt.Sprintf("%016x", now) + simHex(16)
		data, err := tx.CreateBucketIfNotExists(bucketData)
		if err != nil {
			return err
		}
		nested := func(name string, appendOnly bool, k, v []byte) error {
			b, err := data.CreateBucketIfNotExists([]byte(name))
			if err != nil {
				return err
			}
			if appendOnly {
				b.FillPercent = appendFillPercent
			}
			return b.Put(k, v)
		}
		for _, err := range []error{
			simMeta(tx, i),
			simPut(tx, "records", false, key, simRand(simRecord)),
			simPut(tx, "by_time", true, cat(be8(now), key), nil),
			simPut(tx, "expiry", true, cat(be8(now+simRetainNs), []byte{1}, key), []byte{1}),
			simPut(tx, "fp_index", false, []byte(simTenant+"\x00"+simHex(64)), simRand(simFP)),
			simPut(tx, "audit", true, be8(int64(i)), simRand(simAudit)),
			nested("orders", true, []byte(simTenant+"\x00"+oid), simRand(simOrder)),
			nested("orders_by_customer", false, []byte(simTenant+"\x00c"+simHex(20)+"\x00"+simHex(16)+oid), nil),
			nested("outbox", false, msg, simRand(simMessage)),
			nested("outbox_pending", false, msg, nil),
			nested("outbox_by_op", false, cat(key, []byte("\x00confirmation")), msg),
		} {
			if err != nil {
				return err
			}
		}
		return nil
	}},
	{name: "merged", put: func(tx *bbolt.Tx, i int) error {
		now := int64(i) * 1e6
		key := []byte(simTenant + "\x00" + simHex(36))
		oid := fmt.Sprintf("%016x", now) + simHex(16)
		for _, err := range []error{
			simMeta(tx, i),
			simPut(tx, "ops", false, cat(key, []byte("\x00r")), simRand(simRecord)),
			simPut(tx, "ops", false, cat(key, []byte("\x00m\x00confirmation")), simRand(simMessage)),
			simPut(tx, "log", true, cat(be8(now), []byte("a"), be8(int64(i))), simRand(simAudit)),
			simPut(tx, "log", true, cat(be8(now), []byte("t"), key), nil),
			simPut(tx, "log", true, cat(be8(now), []byte("o"+simTenant+"\x00"+oid)), simRand(simOrder)),
			simPut(tx, "log", true, cat(be8(now+simRetainNs), []byte("e\x01"), key), []byte{1}),
			simPut(tx, "pending", true, cat(be8(now), key), nil),
			simPut(tx, "fp_index", false, []byte(simTenant+"\x00"+simHex(64)), simRand(simFP)),
			simPut(tx, "orders_by_customer", false, []byte(simTenant+"\x00c"+simHex(20)+"\x00"+simHex(16)+oid), nil),
		} {
			if err != nil {
				return err
			}
		}
		return nil
	}},
	{name: "floor", put: func(tx *bbolt.Tx, i int) error {
		if err := simFloorOwn(tx, i); err != nil {
			return err
		}
		return simIndexes(tx, i)
	}},
	{name: "deferred", put: simFloorOwn, flush: func(tx *bbolt.Tx, from, to int) error {
		for i := from; i < to; i++ {
			if err := simIndexes(tx, i); err != nil {
				return err
			}
		}
		return nil
	}},
}

// simFloorOwn writes a create in the floor layout but for its two
// hash-keyed indexes (simIndexes), which "deferred" writes later.
func simFloorOwn(tx *bbolt.Tx, i int) error {
	now := int64(i) * 1e6
	key := []byte(simTenant + "\x00" + simHex(36))
	oid := cat(be8(now), simRand(8))
	for _, err := range []error{
		simMeta(tx, i),
		simPut(tx, "ops", false, cat(key, []byte("\x00r")), simRand(simRecord)),
		simPut(tx, "ops", false, cat(key, []byte("\x00m\x00confirmation")), simRand(simMessage)),
		simPut(tx, "log", true, cat(be8(now), []byte("a"), be8(int64(i))), simRand(simAudit)),
		simPut(tx, "log", true, cat(be8(now), []byte("t"), key), nil),
		simPut(tx, "log", true, cat(be8(now), []byte("o"+simTenant+"\x00"), oid), simRand(simOrder)),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}

// layoutPages fills a new file of page size ps with n creates of l (64
// to a commit, as the bench's concurrent fill groups them), then returns
// the pages and bytes bbolt wrote per commit of one create, over 256.
func layoutPages(t *testing.T, l layout, n, ps int) (pages, bytes float64) {
	t.Helper()
	path := filepath.Join(t.TempDir(), l.name+".db")
	db, err := bbolt.Open(path, 0o600, &bbolt.Options{PageSize: ps, NoSync: true, NoFreelistSync: false})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for i := 0; i < n; {
		err := db.Update(func(tx *bbolt.Tx) error {
			from := i
			for j := 0; j < 64 && i < n; j++ {
				if err := l.put(tx, i); err != nil {
					return err
				}
				i++
			}
			if l.flush != nil {
				return l.flush(tx, from, i)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	const m = 256
	var writes, flushWrites int64
	for k := range m {
		err := db.Update(func(tx *bbolt.Tx) error {
			tx.OnCommit(func() { st := tx.Stats(); writes += st.GetWrite() })
			return l.put(tx, n+k)
		})
		if err != nil {
			t.Fatal(err)
		}
		if l.flush != nil && (k+1)%64 == 0 {
			err := db.Update(func(tx *bbolt.Tx) error {
				tx.OnCommit(func() { st := tx.Stats(); flushWrites += st.GetWrite() })
				return l.flush(tx, n+k+1-64, n+k+1)
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	pages = float64(writes) / m
	if l.flush != nil {
		t.Logf("%-9s %2d KiB pages, %7d creates: and %5.2f pages per create in the deferred commits", l.name, ps/1024, n, float64(flushWrites)/m)
	}
	// Every write but the meta page's is a page and its overflow; the
	// model's values never overflow (each is under a page).
	return pages, pages * float64(ps)
}

// TestCreatePages: a claim+complete commit on a file of 300 records
// writes pages (bbolt's TxStats.Write, through CommitStats) and no entry
// of the expiry index: the sweep finds records due for compaction by
// their first-seen time. Run with -v for the pages per commit.
func TestCreatePages(t *testing.T) {
	ctx := context.Background()
	s := mustOpenPath(t, filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{})
	ap := &applier{}
	create := func() {
		if _, err := s.Execute(ctx, newClaim("t1", "create_order", uuid.NewString()), ap.succeed(ledgertest.ResultOrder)); err != nil {
			t.Fatal(err)
		}
	}
	for range 300 {
		create()
	}
	const n = 100
	s0 := s.CommitStats()
	for range n {
		create()
	}
	s1 := s.CommitStats()
	commits, pages := s1.Commits-s0.Commits, s1.PageWrites-s0.PageWrites
	if commits < 1 || commits > n || pages < commits {
		t.Fatalf("%d creates: %d commits, %d pages", n, commits, pages)
	}
	t.Logf("%.2f pages per create commit, %.2f commits per create", float64(pages)/float64(commits), float64(commits)/n)
	if err := s.view(func(tx *bbolt.Tx) error {
		if k, _ := tx.Bucket([]byte("expiry")).Cursor().First(); k != nil {
			t.Errorf("a create wrote an expiry entry: %q", k)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
