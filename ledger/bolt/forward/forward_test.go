package forward_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

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

// TestReadAheadIsExact: cursors that walk a collection forwards and
// backwards, turning, seeking, deleting and inserting as they go, return
// through a version 2 Client (prefetches, read-ahead) exactly what they
// return through a version 1 one (every move a round trip to the
// writer's own cursor), and leave the same collection behind.
func TestReadAheadIsExact(t *testing.T) {
	dial := newWriter(t)
	v2, v1 := newClient(t, dial), newClient(t, v1Proxy(t, dial))
	walk := func(c *forward.Client, name string) (moves []string, final []string) {
		update(t, c, func(tx ledger.BTx) error {
			b, err := tx.Data(name, true)
			if err != nil {
				return err
			}
			for i := range 40 {
				put(t, b, fmt.Sprintf("k%02d", i), strings.Repeat("v", i))
			}
			return nil
		})
		for round := range 3 { // later rounds with what the Client learned
			update(t, c, func(tx ledger.BTx) error {
				moves = moves[:0]
				b, _ := tx.Data(name, false)
				cur := b.Cursor()
				note := func(k, v []byte) []byte {
					moves = append(moves, fmt.Sprintf("%s=%d", k, len(v)))
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
					}
				}
				for k := note(cur.Last()); k != nil && i < 45; k = note(cur.Prev()) {
					i++
				}
				note(cur.Seek([]byte(fmt.Sprintf("k%02d", 20+round))))
				note(cur.Next())
				return nil
			})
		}
		if err := c.View(ctx, func(tx ledger.BTx) error {
			b, _ := tx.Data(name, false)
			cur := b.Cursor()
			final = nil
			for k, v := cur.First(); k != nil; k, v = cur.Next() {
				final = append(final, string(k)+"="+string(v))
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return moves, final
	}
	hits := v2.PrefetchHits()
	m2, f2 := walk(v2, "walk2")
	if v2.PrefetchHits()-hits < 20 {
		t.Errorf("only %d moves were read ahead or prefetched", v2.PrefetchHits()-hits)
	}
	m1, f1 := walk(v1, "walk1")
	if strings.Join(m1, " ") != strings.Join(m2, " ") {
		t.Errorf("moves differ:\nversion 1: %v\nversion 2: %v", m1, m2)
	}
	if strings.Join(f1, " ") != strings.Join(f2, " ") {
		t.Errorf("collections differ:\nversion 1: %v\nversion 2: %v", f1, f2)
	}
	if v1.PrefetchHits() != 0 {
		t.Errorf("the version 1 client had %d prefetch hits", v1.PrefetchHits())
	}
}

// TestReadAheadRandomWalks: random mixes of every cursor move, Gets,
// Puts and Deletes return the same through a version 2 Client as through
// a version 1 one.
func TestReadAheadRandomWalks(t *testing.T) {
	dial := newWriter(t)
	v2, v1 := newClient(t, dial), newClient(t, v1Proxy(t, dial))
	run := func(c *forward.Client, name string, seed int64) string {
		update(t, c, func(tx ledger.BTx) error {
			b, err := tx.Data(name, true)
			if err != nil {
				return err
			}
			for i := range 60 {
				put(t, b, fmt.Sprintf("k%02d", i), strings.Repeat("v", i%17))
			}
			return nil
		})
		var out []string
		for round := range 4 {
			update(t, c, func(tx ledger.BTx) error {
				out = out[:0]
				r := rand.New(rand.NewSource(seed*10 + int64(round)))
				b, _ := tx.Data(name, false)
				cur := b.Cursor()
				note := func(what string, k, v []byte) {
					out = append(out, fmt.Sprintf("%s:%s=%d", what, k, len(v)))
				}
				var at []byte
				for range 80 {
					key := []byte(fmt.Sprintf("k%02d", r.Intn(70)))
					var k, v []byte
					switch n := r.Intn(20); {
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
					case n < 15:
						k, v = cur.Seek(key)
						note("seek", k, v)
					case n < 16:
						note("get", key, b.Get(key))
					case n < 18 && at != nil:
						if err := b.Delete(at); err != nil {
							return err
						}
					case n < 20:
						put(t, b, string(key)+"p", "x")
					}
					if k != nil {
						at = k
					}
				}
				return nil
			})
		}
		return strings.Join(out, " ")
	}
	for seed := range int64(6) {
		name := fmt.Sprintf("w%d", seed)
		if got, want := run(v2, name+"a", seed), run(v1, name+"b", seed); got != want {
			t.Errorf("seed %d: version 2 moved\n%s\nversion 1\n%s", seed, got, want)
		}
	}
	if v2.PrefetchHits() < 50 {
		t.Errorf("only %d reads were read ahead or prefetched", v2.PrefetchHits())
	}
}
