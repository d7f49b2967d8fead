package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/postgres/pgtest"
)

// TestFlushWritesEveryRowAsLastWritten: a transaction's writes, sent as
// multi-row statements (flush), leave each key as the transaction last
// wrote it — a put then a delete of one key leaves it absent, a delete
// then a put leaves the put — byte for byte, for keys with bytes 0x00 and
// 0xff, empty values, values of several MB (more than one statement's
// worth), more rows than one statement carries, and across a flush in the
// middle of the transaction (a cursor query sends the writes before it).
func TestFlushWritesEveryRowAsLastWritten(t *testing.T) {
	be, err := OpenBackend(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	ctx := context.Background()
	const coll, other = "flush_test", "flush_other"
	rng := rand.New(rand.NewPCG(1, 2))
	big := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	want := map[string][]byte{} // coll \x01 key → value; absent: deleted
	put := func(b ledger.Bucket, c, k string, v []byte) {
		t.Helper()
		if err := b.Put([]byte(k), v); err != nil {
			t.Fatal(err)
		}
		want[c+"\x01"+k] = v
	}
	del := func(b ledger.Bucket, c, k string) {
		t.Helper()
		if err := b.Delete([]byte(k)); err != nil {
			t.Fatal(err)
		}
		delete(want, c+"\x01"+k)
	}

	// Rows committed before, for the deletes and overwrites below.
	err = be.Update(ctx, func(tx ledger.BTx) error {
		b, _ := tx.Data(coll, true)
		put(b, coll, "old-deleted", []byte("x"))
		put(b, coll, "old-overwritten", []byte("x"))
		put(b, coll, "\xff\xff", []byte("old"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	const many = 2*maxChunkRows + 17
	bigs := [][]byte{big(7 << 20), big(7 << 20), big(5 << 20)} // > maxChunkBytes together
	err = be.Update(ctx, func(tx ledger.BTx) error {
		b, _ := tx.Data(coll, true)
		o, _ := tx.Data(other, true)
		for _, k := range []string{"\x00", "\x00\x00", "a\x00b", "\xff", "\xff\x00", "\x00\xff"} {
			put(b, coll, k, []byte(k+"-value\x00\xff"))
		}
		put(b, coll, "empty", []byte{})
		put(b, coll, "put-then-delete", []byte("gone"))
		del(b, coll, "put-then-delete")
		del(b, coll, "delete-then-put")
		put(b, coll, "delete-then-put", []byte("back"))
		put(b, coll, "put-twice", []byte("first"))
		put(b, coll, "put-twice", []byte("second"))
		del(b, coll, "old-deleted")
		del(b, coll, "never-there")
		put(b, coll, "old-overwritten", []byte("new"))
		put(b, coll, "\xff\xff", []byte("new"))
		for i, v := range bigs {
			put(b, coll, fmt.Sprintf("big%d", i), v)
		}
		for i := range many {
			put(o, other, fmt.Sprintf("row%05d", i), []byte(fmt.Sprint(i)))
		}
		// A cursor on coll sends its writes now; the rest go at COMMIT.
		if k, _ := b.Cursor().Seek([]byte("a")); string(k) != "a\x00b" {
			t.Errorf("seek after the first flush: %q, want %q", k, "a\x00b")
		}
		if got := b.Get([]byte("put-twice")); string(got) != "second" {
			t.Errorf("put-twice read after the flush: %q", got)
		}
		if got := b.Get([]byte("put-then-delete")); got != nil {
			t.Errorf("put-then-delete read after the flush: %q", got)
		}
		del(b, coll, "put-twice")
		put(b, coll, "put-then-delete", []byte("again"))
		del(b, coll, "\x00\x00")
		del(o, other, "row00003")
		put(o, other, "row00004", []byte("changed"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	got := map[string][]byte{}
	err = be.View(ctx, func(tx ledger.BTx) error {
		for _, c := range []string{coll, other} {
			b, _ := tx.Data(c, false)
			cur := b.Cursor()
			for k, v := cur.First(); k != nil; k, v = cur.Next() {
				got[c+"\x01"+string(k)] = bytes.Clone(v)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for k, w := range want {
		g, ok := got[k]
		switch {
		case !ok:
			t.Errorf("%q: absent, want %d bytes", k, len(w))
		case !bytes.Equal(g, w):
			t.Errorf("%q: %d bytes %.40q, want %d bytes %.40q", k, len(g), g, len(w), w)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("%q: present, want absent", k)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d rows, want %d", len(got), len(want))
	}
}

// TestRowChunksBound: rows are split into statements of at most
// maxChunkRows rows and, past a statement's first row, maxChunkBytes; a
// row larger than that travels alone; deletes carry no values.
func TestRowChunksBound(t *testing.T) {
	var r rowChunks
	for i := range maxChunkRows + 1 {
		v := []byte{byte(i)}
		r.add("c", []byte{byte(i)}, &v)
	}
	if len(r) != 2 || len(r[0].keys) != maxChunkRows || len(r[1].keys) != 1 {
		t.Errorf("%d+1 rows: %d chunks", maxChunkRows, len(r))
	}
	var b rowChunks
	huge := make([]byte, maxChunkBytes+1)
	small := []byte("s")
	b.add("c", []byte("a"), &small)
	b.add("c", []byte("b"), &huge)
	b.add("c", []byte("c"), &small)
	if len(b) != 3 || len(b[1].keys) != 1 || len(b[1].values[0]) != len(huge) {
		t.Errorf("a row larger than a chunk: %d chunks, want 3 (it alone in the second)", len(b))
	}
	var d rowChunks
	var null []byte
	d.add("c", []byte("x"), nil)
	d.add("c", []byte("y"), &null)
	if len(d) != 1 || len(d[0].keys) != 2 || len(d[0].values) != 1 || d[0].values[0] == nil {
		t.Errorf("a delete and a put of a nil value: %+v, want two keys, one non-nil empty value", d)
	}
	for _, ch := range append(append(r, b...), d...) {
		if len(ch.colls) != len(ch.keys) {
			t.Errorf("chunk with %d collections for %d keys", len(ch.colls), len(ch.keys))
		}
	}
}

// TestUpdatesOfOtherKeysDoNotWait: while one replica's Update is open
// (between two statements, as a frozen replica would leave it), another
// replica's Updates of other keys commit; two replicas incrementing the
// same key from many goroutines lose no increment (the conflicts are
// refused by the database and run again).
func TestUpdatesOfOtherKeysDoNotWait(t *testing.T) {
	ba, bb := twoReplicas(t)
	ctx := context.Background()
	meta := []byte(ledger.MetaCollection)
	inside, release := make(chan struct{}), make(chan struct{})
	held := make(chan error, 1)
	go func() {
		held <- ba.Update(ctx, func(tx ledger.BTx) error {
			if err := tx.Bucket(meta).Put([]byte("held-key"), []byte("a")); err != nil {
				return err
			}
			tx.Bucket(meta).Get([]byte("held-read"))
			select {
			case inside <- struct{}{}:
			default: // run again after a conflict: already signalled
			}
			<-release
			return nil
		})
	}()
	<-inside
	start := time.Now()
	for i := range 20 {
		err := bb.Update(ctx, func(tx ledger.BTx) error {
			k := []byte(fmt.Sprintf("other-%d", i))
			if tx.Bucket(meta).Get(k) != nil {
				return errors.New("written twice")
			}
			return tx.Bucket(meta).Put(k, []byte("b"))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("20 Updates of other keys took %v while another was open: they waited for it", d)
	}
	close(release)
	if err := <-held; err != nil {
		t.Fatal(err)
	}

	const perReplica, goroutines = 25, 4
	var wg sync.WaitGroup
	errs := make(chan error, 2*goroutines)
	for _, be := range []ledger.Backend{ba, bb} {
		for range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perReplica {
					err := be.Update(ctx, func(tx ledger.BTx) error {
						n := 0
						if v := tx.Bucket(meta).Get([]byte("counter")); v != nil {
							n, _ = strconv.Atoi(string(v))
						}
						return tx.Bucket(meta).Put([]byte("counter"), []byte(strconv.Itoa(n+1)))
					})
					if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var got string
	if err := ba.View(ctx, func(tx ledger.BTx) error {
		got = string(tx.Bucket(meta).Get([]byte("counter")))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(2 * goroutines * perReplica); got != want {
		t.Errorf("counter = %s after %s increments from two replicas: increments were lost", got, want)
	}
	t.Logf("conflicts run again: %d", ba.conflicts+bb.(*backend).conflicts)
}

// twoReplicas opens two backends on one new database, as two replicas
// would: the first as this package sees it, the second through the
// exported constructor. Both are closed when the test ends.
func twoReplicas(t *testing.T) (*backend, ledger.Backend) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	ba, err := openBackend(url, true, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ba.Close() })
	bb, err := OpenBackend(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bb.Close() })
	return ba, bb
}
