package forward_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/ledger/bolt/forward"
)

var ctx = context.Background()

// newWriter opens a new ledger in this process (its writer, serving it on
// a socket) and returns a dial function to that socket.
func newWriter(t *testing.T) func() (net.Conn, error) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "l.db")
	f, err := bolt.Open(path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	b, err := os.ReadFile(path + ".writer")
	if err != nil {
		t.Fatal(err)
	}
	sock := strings.TrimSpace(string(b))
	return func() (net.Conn, error) { return net.Dial("unix", sock) }
}

func newClient(t *testing.T, dial func() (net.Conn, error)) *forward.Client {
	c := forward.NewClient(dial)
	t.Cleanup(func() { c.Close() })
	return c
}

func update(t *testing.T, c *forward.Client, fn func(ledger.BTx) error) {
	t.Helper()
	if err := c.Update(ctx, forward.NewMarker(), fn); err != nil {
		t.Fatal(err)
	}
}

func coll(t *testing.T, tx ledger.BTx) ledger.Bucket {
	t.Helper()
	b, err := tx.Data("t", false)
	if err != nil || b == nil {
		t.Fatalf("Data(t) = %v, %v", b, err)
	}
	return b
}

// seed commits the pairs k1, v1, k2, v2, … in collection "t", creating it.
func seed(t *testing.T, c *forward.Client, kv ...string) {
	t.Helper()
	update(t, c, func(tx ledger.BTx) error {
		b, err := tx.Data("t", true)
		if err != nil {
			return err
		}
		for i := 0; i+1 < len(kv); i += 2 {
			put(t, b, kv[i], kv[i+1])
		}
		return nil
	})
}

func put(t *testing.T, b ledger.Bucket, k, v string) {
	t.Helper()
	if err := b.Put([]byte(k), []byte(v)); err != nil {
		t.Fatal(err)
	}
}

// reads is a transaction that reads a, then walks the collection from its
// first key; the walk's keys and values are returned as "k=v" strings.
func reads(t *testing.T, tx ledger.BTx, before func(ledger.Bucket)) (a string, walk []string) {
	b := coll(t, tx)
	if before != nil {
		before(b)
	}
	a = string(b.Get([]byte("a")))
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		walk = append(walk, string(k)+"="+string(v))
	}
	return a, walk
}

// learn runs the reads transaction until the Client prefetches them.
func learn(t *testing.T, c *forward.Client) {
	t.Helper()
	for range 3 {
		update(t, c, func(tx ledger.BTx) error { reads(t, tx, nil); return nil })
	}
	hits := c.PrefetchHits()
	update(t, c, func(tx ledger.BTx) error { reads(t, tx, nil); return nil })
	if c.PrefetchHits()-hits != 2 { // the Get of a and the cursor's First
		t.Fatalf("after learning, %d reads were prefetched, want 2", c.PrefetchHits()-hits)
	}
}

// TestPrefetchIsExact: a prefetched read answers what the read itself
// would have: the value committed by another process since the last
// transaction, the transaction's own writes, a cursor that continues
// where the prefetched first move left it, and a new first key written
// before the cursor's first move.
func TestPrefetchIsExact(t *testing.T) {
	dial := newWriter(t)
	c, other := newClient(t, dial), newClient(t, dial)
	seed(t, c, "a", "1", "b", "2")
	learn(t, c)

	// Another client's commit since: the prefetch is read in the
	// transaction, not remembered from the last one.
	update(t, other, func(tx ledger.BTx) error { put(t, coll(t, tx), "a", "3"); return nil })
	var a string
	var walk []string
	hits := c.PrefetchHits()
	update(t, c, func(tx ledger.BTx) error { a, walk = reads(t, tx, nil); return nil })
	if a != "3" || strings.Join(walk, " ") != "a=3 b=2" {
		t.Errorf("after another commit: a=%q, walk %v; want 3, [a=3 b=2]", a, walk)
	}
	if c.PrefetchHits()-hits != 2 {
		t.Errorf("%d reads prefetched, want 2", c.PrefetchHits()-hits)
	}

	// The transaction's own writes before its reads: a key it wrote, and
	// a new first key of the collection the cursor walks.
	rollBack := errors.New("roll back")
	err := update2(c, func(tx ledger.BTx) error {
		a, walk = reads(t, tx, func(b ledger.Bucket) {
			put(t, b, "a", "mine")
			put(t, b, "0", "new")
		})
		return rollBack
	})
	if !errors.Is(err, rollBack) {
		t.Fatalf("Update = %v, want %v", err, rollBack)
	}
	if a != "mine" || strings.Join(walk, " ") != "0=new a=mine b=2" {
		t.Errorf("after own writes: a=%q, walk %v; want mine, [0=new a=mine b=2]", a, walk)
	}

	// A delete: the key is gone for the rest of the transaction.
	update(t, c, func(tx ledger.BTx) error {
		a, walk = reads(t, tx, func(b ledger.Bucket) {
			if err := b.Delete([]byte("a")); err != nil {
				t.Fatal(err)
			}
		})
		return nil
	})
	if a != "" || strings.Join(walk, " ") != "b=2" {
		t.Errorf("after a delete: a=%q, walk %v; want \"\", [b=2]", a, walk)
	}

	// What committed is what the other client reads.
	if err := other.View(ctx, func(tx ledger.BTx) error {
		a, walk = reads(t, tx, nil)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if a != "" || strings.Join(walk, " ") != "b=2" {
		t.Errorf("committed: a=%q, walk %v; want \"\", [b=2]", a, walk)
	}
}

func update2(c *forward.Client, fn func(ledger.BTx) error) error {
	return c.Update(ctx, forward.NewMarker(), fn)
}

// TestCollectionOfRolledBackTransactionNotRemembered: a collection
// created in a transaction that did not commit does not exist for the
// next one, on the same connection.
func TestCollectionOfRolledBackTransactionNotRemembered(t *testing.T) {
	c := newClient(t, newWriter(t))
	failed := errors.New("fail")
	err := update2(c, func(tx ledger.BTx) error {
		if b, err := tx.Data("gone", true); err != nil || b == nil {
			t.Fatalf("Data(gone, create) = %v, %v", b, err)
		}
		return failed
	})
	if !errors.Is(err, failed) {
		t.Fatalf("Update = %v, want %v", err, failed)
	}
	for range 2 { // the second time with the first one's answer remembered, if it were
		update(t, c, func(tx ledger.BTx) error {
			if b, err := tx.Data("gone", false); err != nil || b != nil {
				t.Errorf("Data(gone) after the rollback = %v, %v; want nil, nil", b, err)
			}
			return nil
		})
	}
	// A collection that committed is remembered: asked once, not again.
	update(t, c, func(tx ledger.BTx) error { _, err := tx.Data("t", true); return err })
	trips := c.RoundTrips()
	update(t, c, func(tx ledger.BTx) error { coll(t, tx); return nil })
	if n := c.RoundTrips() - trips; n != 0 {
		t.Errorf("a collection seen to exist in a committed transaction cost %d round trips, want 0", n)
	}
}

// TestVersion1Writer: a writer that does not know msgHello (it closes the
// connection there, as version 1 did) is still served, without
// prefetches.
func TestVersion1Writer(t *testing.T) {
	c := newClient(t, v1Proxy(t, newWriter(t)))
	seed(t, c, "a", "1")
	for range 5 {
		var a string
		update(t, c, func(tx ledger.BTx) error { a, _ = reads(t, tx, nil); return nil })
		if a != "1" {
			t.Fatalf("a = %q, want 1", a)
		}
	}
	if c.PrefetchHits() != 0 {
		t.Errorf("%d prefetch hits from a version 1 writer", c.PrefetchHits())
	}
	found, err := c.ReadBack(ctx, forward.NewMarker())
	if err != nil || found {
		t.Errorf("ReadBack of an unknown marker = %v, %v; want false, nil", found, err)
	}
}

// TestViewedKeyPrefetchedFresh: a key a View just read is prefetched for
// the next Update, read again in the Update's transaction: a commit in
// between is seen, not the View's value.
func TestViewedKeyPrefetchedFresh(t *testing.T) {
	dial := newWriter(t)
	c, other := newClient(t, dial), newClient(t, dial)
	seed(t, c, "x", "old")
	var got string
	if err := c.View(ctx, func(tx ledger.BTx) error { got = string(coll(t, tx).Get([]byte("x"))); return nil }); err != nil {
		t.Fatal(err)
	}
	if got != "old" {
		t.Fatalf("View read x = %q, want old", got)
	}
	update(t, other, func(tx ledger.BTx) error { put(t, coll(t, tx), "x", "new"); return nil })
	hits, trips := c.PrefetchHits(), c.RoundTrips()
	update(t, c, func(tx ledger.BTx) error { got = string(coll(t, tx).Get([]byte("x"))); return nil })
	if got != "new" {
		t.Errorf("the Update read x = %q, want new (committed after the View)", got)
	}
	if c.PrefetchHits()-hits != 1 || c.RoundTrips() != trips {
		t.Errorf("the Update's read of the viewed key: %d prefetched, %d round trips; want 1, 0", c.PrefetchHits()-hits, c.RoundTrips()-trips)
	}
}

// v1Proxy serves dial's writer to clients that speak version 1 only: it
// closes a connection whose first message is msgHello, as a version 1
// writer does, and relays every other one.
func v1Proxy(t *testing.T, dial func() (net.Conn, error)) func() (net.Conn, error) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "v1.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				var first [1]byte
				if _, err := io.ReadFull(in, first[:]); err != nil || first[0] == 'H' {
					return
				}
				out, err := dial()
				if err != nil {
					return
				}
				defer out.Close()
				out.Write(first[:])
				go io.Copy(in, out)
				io.Copy(out, in)
			}()
		}
	}()
	return func() (net.Conn, error) { return net.Dial("unix", ln.Addr().String()) }
}

// updater runs fn in one read-write transaction, committed when fn
// returns nil.
type updater func(fn func(ledger.BTx) error) error

func clientUpdater(c *forward.Client) updater {
	return func(fn func(ledger.BTx) error) error { return c.Update(ctx, forward.NewMarker(), fn) }
}

// directUpdater runs fn in a transaction of a bbolt file of its own, with
// the data collections nested in "data" as the ledger keeps them: what
// every read of a forwarded transaction must return is what the same
// read returns there.
func directUpdater(t *testing.T) updater {
	db, err := bbolt.Open(filepath.Join(t.TempDir(), "direct.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bbolt.Tx) error { _, err := tx.CreateBucket([]byte("data")); return err }); err != nil {
		t.Fatal(err)
	}
	return func(fn func(ledger.BTx) error) error {
		return db.Update(func(tx *bbolt.Tx) error { return fn(directTx{tx}) })
	}
}

type directTx struct{ tx *bbolt.Tx }

func (d directTx) Bucket(name []byte) ledger.Bucket { return nil } // the walks use data collections only

func (d directTx) Data(name string, create bool) (ledger.Bucket, error) {
	data := d.tx.Bucket([]byte("data"))
	b := data.Bucket([]byte(name))
	if b == nil && create {
		var err error
		if b, err = data.CreateBucket([]byte(name)); err != nil {
			return nil, err
		}
	}
	if b == nil {
		return nil, nil
	}
	return directBucket{b}, nil
}

type directBucket struct{ *bbolt.Bucket }

func (b directBucket) Cursor() ledger.Cursor { return b.Bucket.Cursor() }

// contents returns every pair of collection name, as "k=v" strings.
func contents(t *testing.T, u updater, name string) []string {
	t.Helper()
	var all []string
	if err := u(func(tx ledger.BTx) error {
		all = nil
		b, err := tx.Data(name, false)
		if err != nil || b == nil {
			return fmt.Errorf("Data(%s) = %v, %v", name, b, err)
		}
		cur := b.Cursor()
		for k, v := cur.First(); k != nil; k, v = cur.Next() {
			all = append(all, string(k)+"="+string(v))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return all
}

// noteMove is how the walks record a read: what, its key, and its value's
// length and head (the values tell one write of a key from another).
func noteMove(what string, k, v []byte) string {
	return fmt.Sprintf("%s:%s=%d/%.6s", what, k, len(v), v)
}

// near is the walks' key d keys from the one at, "k" and two digits
// ("k00" to "k69"; a suffix of at is dropped).
func near(at []byte, d int) string {
	n := 0
	if len(at) >= 3 {
		n = int(at[1]-'0')*10 + int(at[2]-'0')
	}
	return fmt.Sprintf("k%02d", min(max(n+d, 0), 69))
}

// walkValue is a value of key of about n bytes, told apart by tag.
func walkValue(key, tag string, n int) []byte {
	return []byte((key + tag + strings.Repeat(".", n))[:max(n, len(key)+len(tag))])
}

// TestReadAheadIsExact: cursors that walk a collection forwards and
// backwards, turning, seeking, deleting and inserting as they go, and
// writing to another collection between their moves (as the ledger does),
// return through a version 2 Client (prefetches, read-ahead) and through a
// version 1 one (every move a round trip to the writer's own cursor)
// exactly what they return in a bbolt transaction of their own, and leave
// the same collections behind. The collection spans several pages.
func TestReadAheadIsExact(t *testing.T) {
	dial := newWriter(t)
	v2, v1 := newClient(t, dial), newClient(t, v1Proxy(t, dial))
	walk := func(u updater, name string) (all []string, final []string) {
		other := name + "-log"
		if err := u(func(tx ledger.BTx) error {
			b, err := tx.Data(name, true)
			if err != nil {
				return err
			}
			if _, err := tx.Data(other, true); err != nil {
				return err
			}
			for i := range 40 {
				k := fmt.Sprintf("k%02d", i)
				put(t, b, k, string(walkValue(k, "", i*23)))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var moves []string
		for round := range 3 { // later rounds with what the Client learned
			if err := u(func(tx ledger.BTx) error {
				moves = moves[:0] // fn may run again
				b, _ := tx.Data(name, false)
				log, _ := tx.Data(other, false)
				cur := b.Cursor()
				note := func(k, v []byte) []byte {
					moves = append(moves, noteMove("", k, v))
					return k
				}
				i := 0
				for k := note(cur.First()); k != nil && i < 30; k = note(cur.Next()) {
					i++
					switch {
					case i%7 == 0:
						if err := b.Delete(k); err != nil {
							return err
						}
					case i%11 == 0:
						put(t, b, string(k)+"x", "inserted")
					case i%13 == 0:
						note(cur.Prev())
						note(cur.Prev())
					case i%4 == 0:
						put(t, log, fmt.Sprintf("r%d-%02d", round, i), string(k))
					case i%9 == 0:
						lk := []byte(fmt.Sprintf("r%d-%02d", round-1, i-1))
						note(lk, log.Get(lk))
						if err := log.Delete(lk); err != nil {
							return err
						}
					}
				}
				for k := note(cur.Last()); k != nil && i < 45; k = note(cur.Prev()) {
					i++
					if i%5 == 0 {
						put(t, log, fmt.Sprintf("r%d-%02d", round, i), string(k))
					}
				}
				note(cur.Seek([]byte(fmt.Sprintf("k%02d", 20+round))))
				note(cur.Next())
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			all = append(all, moves...)
		}
		return all, append(contents(t, u, name), contents(t, u, other)...)
	}
	hits := v2.PrefetchHits()
	m2, f2 := walk(clientUpdater(v2), "walk2")
	if v2.PrefetchHits()-hits < 20 {
		t.Errorf("only %d moves were read ahead or prefetched", v2.PrefetchHits()-hits)
	}
	m1, f1 := walk(clientUpdater(v1), "walk1")
	md, fd := walk(directUpdater(t), "walk")
	for _, c := range []struct {
		name string
		m, f []string
	}{{"version 2", m2, f2}, {"version 1", m1, f1}} {
		if strings.Join(c.m, " ") != strings.Join(md, " ") {
			t.Errorf("moves differ:\n%s: %v\nbbolt:     %v", c.name, c.m, md)
		}
		if strings.Join(c.f, " ") != strings.Join(fd, " ") {
			t.Errorf("collections differ:\n%s: %v\nbbolt:     %v", c.name, c.f, fd)
		}
	}
	if v1.PrefetchHits() != 0 {
		t.Errorf("the version 1 client had %d prefetch hits", v1.PrefetchHits())
	}
}

// TestReadAheadRandomWalks: random mixes of every cursor move and Gets,
// with Puts and Deletes between the moves, to the walked collection and
// to another one, return through a version 2 Client and through a
// version 1 one exactly what they return in a bbolt transaction of their
// own. A write between a cursor's moves is where a read-ahead must stop:
// the moves taken from it are made on the writer's cursor first (msgSkip)
// and the rest is dropped, else a later move returns a stale pair.
func TestReadAheadRandomWalks(t *testing.T) {
	dial := newWriter(t)
	v2, v1 := newClient(t, dial), newClient(t, v1Proxy(t, dial))
	run := func(u updater, name string, seed int64, size int) (string, []string) {
		other := name + "-other"
		if err := u(func(tx ledger.BTx) error {
			b, err := tx.Data(name, true)
			if err != nil {
				return err
			}
			o, err := tx.Data(other, true)
			if err != nil {
				return err
			}
			for i := range 60 {
				k := fmt.Sprintf("k%02d", i)
				put(t, b, k, string(walkValue(k, "", (i*53)%size)))
				put(t, o, k, "o")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		var out, rounds []string
		for round := range 4 {
			if err := u(func(tx ledger.BTx) error {
				out = out[:0] // fn may run again
				r := rand.New(rand.NewSource(seed*10 + int64(round)))
				b, _ := tx.Data(name, false)
				o, _ := tx.Data(other, false)
				cur := b.Cursor()
				note := func(what string, k, v []byte) { out = append(out, noteMove(what, k, v)) }
				var at []byte
				for j := range 150 {
					key := []byte(fmt.Sprintf("k%02d", r.Intn(70)))
					tag := fmt.Sprintf("-%d.%d", round, j)
					var k, v []byte
					switch n := r.Intn(28); {
					case n < 8:
						k, v = cur.Next()
						note("next", k, v)
					case n < 11:
						k, v = cur.Prev()
						note("prev", k, v)
					case n < 12:
						k, v = cur.First()
						note("first", k, v)
					case n < 13:
						k, v = cur.Last()
						note("last", k, v)
					case n < 16:
						k, v = cur.Seek(key)
						note("seek", k, v)
					case n < 17:
						note("get", key, b.Get(key))
					case n < 18 && at != nil: // the pair the cursor is at, rewritten
						if err := b.Put(at, walkValue(string(at), tag, r.Intn(size))); err != nil {
							return err
						}
					case n < 19 && at != nil:
						if err := b.Delete(at); err != nil {
							return err
						}
					case n < 20 && at != nil: // a new pair just after the cursor's
						put(t, b, string(at)+"a", tag)
					case n < 21 && at != nil: // a pair a few keys ahead or behind, rewritten
						put(t, b, near(at, r.Intn(7)-3), string(walkValue("", tag, r.Intn(size))))
					case n < 22 && at != nil:
						if err := b.Delete([]byte(near(at, r.Intn(7)-3))); err != nil {
							return err
						}
					case n < 23:
						put(t, b, string(key)+"p", tag)
					case n < 24:
						if err := b.Delete(key); err != nil {
							return err
						}
					case n < 26: // another collection, as the ledger writes while it walks
						put(t, o, string(key), tag)
					case n < 27:
						note("other", key, o.Get(key))
						if err := o.Delete(key); err != nil {
							return err
						}
					}
					if k != nil {
						at = k
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			rounds = append(rounds, out...)
		}
		return strings.Join(rounds, " "), append(contents(t, u, name), contents(t, u, other)...)
	}
	direct := directUpdater(t)
	// Values of up to 17 bytes keep a collection in one page; of up to
	// 300, it spans several (a cursor created before a write sees it on
	// the pages it enters after the write, not on the one it is on).
	for _, size := range []int{17, 300} {
		for seed := range int64(8) {
			name := fmt.Sprintf("w%d-%d", size, seed)
			want, wantAll := run(direct, name, seed, size)
			for _, c := range []struct {
				name string
				u    updater
			}{{"version 2", clientUpdater(v2)}, {"version 1", clientUpdater(v1)}} {
				got, all := run(c.u, name+c.name[len(c.name)-1:], seed, size)
				if got != want {
					t.Errorf("values ≤ %d bytes, seed %d: %s moved\n%s\nbbolt\n%s", size, seed, c.name, got, want)
				}
				if strings.Join(all, " ") != strings.Join(wantAll, " ") {
					t.Errorf("values ≤ %d bytes, seed %d: %s left\n%v\nbbolt\n%v", size, seed, c.name, all, wantAll)
				}
			}
		}
	}
	if v2.PrefetchHits() < 50 {
		t.Errorf("only %d reads were read ahead or prefetched", v2.PrefetchHits())
	}
}

// TestOldMarkersPruned: a forwarded Update's commit drops the markers
// older than ten minutes (a few at a time) and keeps the newer ones, its
// own among them.
func TestOldMarkersPruned(t *testing.T) {
	c := newClient(t, newWriter(t))
	marker := func(age time.Duration) []byte {
		m := forward.NewMarker()
		binary.BigEndian.PutUint64(m, uint64(time.Now().Add(-age).UnixNano()))
		return m
	}
	old, recent := marker(11*time.Minute), marker(9*time.Minute)
	update(t, c, func(tx ledger.BTx) error {
		b, err := tx.Data(forward.MarkerCollection, true)
		if err != nil {
			return err
		}
		put(t, b, string(old), "")
		put(t, b, string(recent), "")
		return nil
	})
	mine := forward.NewMarker()
	if err := c.Update(ctx, mine, func(ledger.BTx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := c.View(ctx, func(tx ledger.BTx) error {
		for _, m := range []struct {
			name   string
			marker []byte
			want   bool
		}{{"11 minutes old", old, false}, {"9 minutes old", recent, true}, {"the Update's own", mine, true}} {
			if got := forward.Committed(tx, m.marker); got != m.want {
				t.Errorf("the marker %s is kept: %v, want %v", m.name, got, m.want)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestLedgerCollectionRemembered: a ledger collection seen to exist on a
// connection is not asked for again there (a writable backend never drops
// one).
func TestLedgerCollectionRemembered(t *testing.T) {
	c := newClient(t, newWriter(t))
	bucket := func(tx ledger.BTx) error {
		if tx.Bucket([]byte(ledger.AuditCollection)) == nil {
			t.Errorf("Bucket(%s) = nil", ledger.AuditCollection)
		}
		return nil
	}
	update(t, c, bucket) // the one connection, idle between transactions
	trips := c.RoundTrips()
	update(t, c, bucket)
	if err := c.View(ctx, bucket); err != nil {
		t.Fatal(err)
	}
	if n := c.RoundTrips() - trips; n != 0 {
		t.Errorf("a ledger collection seen before cost %d round trips, want 0", n)
	}
}

// TestReadAheadBoundedInBytes: a read-ahead stops after the pair that
// passes 16 KiB, so a walk over values of 10 KiB takes at most two moves
// from each read-ahead, and still reads every pair.
func TestReadAheadBoundedInBytes(t *testing.T) {
	c := newClient(t, newWriter(t))
	var kv []string
	for i := range 12 {
		kv = append(kv, fmt.Sprintf("k%02d", i), strings.Repeat(strconv.Itoa(i%10), 10<<10))
	}
	seed(t, c, kv...)
	run, maxRun, n := 0, 0, 0
	if err := c.View(ctx, func(tx ledger.BTx) error {
		cur := coll(t, tx).Cursor()
		for k, v := cur.First(); k != nil; {
			if want := fmt.Sprintf("k%02d", n); string(k) != want || len(v) != 10<<10 {
				t.Errorf("move %d: %s, %d bytes; want %s, 10 KiB", n, k, len(v), want)
			}
			n++
			hits := c.PrefetchHits()
			k, v = cur.Next()
			if c.PrefetchHits() > hits {
				run++
				maxRun = max(maxRun, run)
			} else {
				run = 0
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != 12 {
		t.Errorf("the walk read %d pairs, want 12", n)
	}
	if maxRun == 0 || maxRun > 2 {
		t.Errorf("the walk took up to %d moves in a row from a read-ahead, want 1 or 2", maxRun)
	}
}
