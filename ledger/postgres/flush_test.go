package postgres

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

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

// TestBeginWriteReadsWhatTheLastBatchRead: an Update starts with the meta
// rows and the last rows the previous one read already in memory (one
// round trip with BEGIN and the lock), and what it finds there is the
// database's state under the lock — another replica's writes in between
// included, a row it deleted absent.
func TestBeginWriteReadsWhatTheLastBatchRead(t *testing.T) {
	ba, bb := twoReplicas(t)
	ctx := context.Background()
	const coll = "warm_test"
	meta := []byte(ledger.MetaCollection)
	write := func(be ledger.Backend, x, gone string, last string) {
		t.Helper()
		err := be.Update(ctx, func(tx ledger.BTx) error {
			m := tx.Bucket(meta)
			m.Put([]byte("warm-x"), []byte(x))
			if gone == "" {
				m.Delete([]byte("warm-gone"))
			} else {
				m.Put([]byte("warm-gone"), []byte(gone))
			}
			b, _ := tx.Data(coll, true)
			return b.Put([]byte(last), []byte("v-"+last))
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	read := func(tx ledger.BTx) (x, gone, last string) {
		m := tx.Bucket(meta)
		b, _ := tx.Data(coll, true)
		k, _ := b.Cursor().Last()
		return string(m.Get([]byte("warm-x"))), string(m.Get([]byte("warm-gone"))), string(k)
	}
	write(ba, "1", "here", "k1")
	// A reads the rows: the next Update of A fetches them with its BEGIN.
	if err := ba.Update(ctx, func(tx ledger.BTx) error { read(tx); return nil }); err != nil {
		t.Fatal(err)
	}
	if !containsStr(ba.warm.keys, "warm-x") || !containsStr(ba.warm.keys, "warm-gone") || !containsStr(ba.warm.tails, "data:"+coll) {
		t.Fatalf("after reading them, the next Update would not fetch them: %+v", ba.warm)
	}
	write(bb, "2", "", "k2") // another replica changes all three
	err := ba.Update(ctx, func(ltx ledger.BTx) error {
		tx := ltx.(*btx)
		if _, ok := tx.cache[ledger.MetaCollection]["warm-x"]; !ok {
			t.Error("warm-x was not fetched with BEGIN")
		}
		if _, ok := tx.tails["data:"+coll]; !ok {
			t.Error("the last row was not fetched with BEGIN")
		}
		x, gone, last := read(tx)
		if x != "2" || gone != "" || last != "k2" {
			t.Errorf("read %q %q %q, want the other replica's writes: %q %q %q", x, gone, last, "2", "", "k2")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A transaction that reads none of them: the next one fetches nothing.
	if err := ba.Update(ctx, func(tx ledger.BTx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if len(ba.warm.keys) != 0 || len(ba.warm.tails) != 0 {
		t.Errorf("after an Update that read nothing: %+v, want nothing to fetch", ba.warm)
	}
}

// TestCarriedRowsOnlyWhileNoOneElseWrites: an Update starts with the rows
// the last Updates of its process touched — unless any other transaction
// was given an id since (another replica's write), after which it reads
// the database again; a transaction that rolled back carries nothing, and
// a row untouched for carryBatches Updates is dropped.
func TestCarriedRowsOnlyWhileNoOneElseWrites(t *testing.T) {
	ba, bb := twoReplicas(t)
	ctx := context.Background()
	const coll = "carry_test"
	dc := "data:" + coll
	update := func(be ledger.Backend, fn func(tx *btx, b ledger.Bucket) error) error {
		return be.Update(ctx, func(ltx ledger.BTx) error {
			b, _ := ltx.Data(coll, true)
			tx, _ := ltx.(*btx)
			return fn(tx, b)
		})
	}
	mustUpdate := func(be ledger.Backend, fn func(tx *btx, b ledger.Bucket) error) {
		t.Helper()
		if err := update(be, fn); err != nil {
			t.Fatal(err)
		}
	}
	carriedAtStart := func(tx *btx, key string) (string, bool) {
		r, ok := tx.cache[dc][key]
		return string(r.v), ok && r.present
	}
	mustUpdate(ba, func(_ *btx, b ledger.Bucket) error {
		b.Put([]byte("k"), []byte("a1"))
		return b.Put([]byte("j"), []byte("j1"))
	})
	mustUpdate(ba, func(tx *btx, b ledger.Bucket) error {
		if v, ok := carriedAtStart(tx, "k"); !ok || v != "a1" {
			t.Errorf("k at the start of the next Update: %q, %v; want a1 carried", v, ok)
		}
		return nil
	})
	mustUpdate(bb, func(_ *btx, b ledger.Bucket) error { return b.Put([]byte("k"), []byte("b1")) })
	mustUpdate(ba, func(tx *btx, b ledger.Bucket) error {
		if _, ok := carriedAtStart(tx, "j"); ok {
			t.Error("rows carried past another replica's write")
		}
		if got := string(b.Get([]byte("k"))); got != "b1" {
			t.Errorf("k after another replica wrote it: %q, want b1", got)
		}
		return nil
	})
	errRefused := fmt.Errorf("refused")
	if err := update(ba, func(_ *btx, b ledger.Bucket) error {
		b.Put([]byte("k"), []byte("rolled back"))
		b.Cursor().First() // sends the write
		return errRefused
	}); err != errRefused {
		t.Fatalf("a refused Update: %v", err)
	}
	mustUpdate(ba, func(tx *btx, b ledger.Bucket) error {
		if got := string(b.Get([]byte("k"))); got != "b1" {
			t.Errorf("k after a rolled-back write of it: %q, want b1", got)
		}
		b.Put([]byte("large"), make([]byte, maxCarriedValue+1))
		return b.Put([]byte("j"), []byte("j2"))
	})
	for i := range carryBatches + 1 {
		mustUpdate(ba, func(tx *btx, b ledger.Bucket) error {
			if _, ok := tx.cache[dc]["large"]; ok && i == 0 {
				t.Error("a value larger than maxCarriedValue was carried")
			}
			_, ok := carriedAtStart(tx, "j")
			if i < carryBatches && !ok {
				t.Errorf("j not carried into the %d-th Update after it was written", i+1)
			}
			if i == carryBatches && ok {
				t.Errorf("j still carried %d Updates after it was last touched", carryBatches)
			}
			return nil
		})
	}
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
