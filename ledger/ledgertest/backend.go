package ledgertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	"idemgate/ledger"
)

// RunBackend checks a ledger.Backend below the ledger: the guarantees the
// package documentation lists (atomicity, isolation, ordering, the data
// collections, read-only views, Close), each in isolation, so a backend
// that fails Run can be told where. open returns a fresh, empty, writable
// backend; RunBackend closes it (once) at the end of each case.
func RunBackend(t *testing.T, open func(t *testing.T) ledger.Backend) {
	cases := []struct {
		name string
		run  func(t *testing.T, b ledger.Backend)
	}{
		{"EveryCollectionExists", backendCollections},
		{"GetPutDelete", backendGetPutDelete},
		{"ErrorRollsBackEverything", backendRollback},
		{"PanicRollsBackAndReachesCaller", backendPanic},
		{"BytewiseOrder", backendOrder},
		{"DataCollections", backendData},
		{"ViewDoesNotWrite", backendViewReadOnly},
		{"UpdatesAreSerializable", backendSerializable},
		{"ClosedRefusesTransactions", backendClosed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := open(t)
			closed := false
			t.Cleanup(func() {
				if !closed {
					b.Close()
				}
			})
			if tc.name == "ClosedRefusesTransactions" {
				closed = true
			}
			tc.run(t, b)
		})
	}
}

var bctx = context.Background()

func metaBucket(t *testing.T, tx ledger.BTx) ledger.Bucket {
	t.Helper()
	b := tx.Bucket([]byte(ledger.MetaCollection))
	if b == nil {
		t.Fatal("the meta collection does not exist")
	}
	return b
}

func backendCollections(t *testing.T, b ledger.Backend) {
	check := func(tx ledger.BTx) error {
		for _, c := range ledger.Collections() {
			if tx.Bucket([]byte(c)) == nil {
				t.Errorf("collection %q does not exist", c)
			}
		}
		return nil
	}
	if err := b.Update(bctx, check); err != nil {
		t.Fatal(err)
	}
	if err := b.View(bctx, check); err != nil {
		t.Fatal(err)
	}
	if b.ReadOnly() {
		t.Error("a fresh backend says it is read-only")
	}
}

func backendGetPutDelete(t *testing.T, b ledger.Backend) {
	err := b.Update(bctx, func(tx ledger.BTx) error {
		m := metaBucket(t, tx)
		if v := m.Get([]byte("k")); v != nil {
			t.Errorf("Get of a missing key = %q, want nil", v)
		}
		if err := m.Put([]byte("k"), []byte("value")); err != nil {
			return err
		}
		if err := m.Put([]byte("empty"), []byte{}); err != nil {
			return err
		}
		if v := m.Get([]byte("k")); string(v) != "value" {
			t.Errorf("Get in the writing transaction = %q, want value", v)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	b.View(bctx, func(tx ledger.BTx) error {
		m := metaBucket(t, tx)
		if v := m.Get([]byte("k")); string(v) != "value" {
			t.Errorf("Get after commit = %q, want value", v)
		}
		if v := m.Get([]byte("empty")); v == nil || len(v) != 0 {
			t.Errorf("Get of an empty value = %v, want a non-nil empty slice", v)
		}
		return nil
	})
	if err := b.Update(bctx, func(tx ledger.BTx) error {
		m := metaBucket(t, tx)
		if err := m.Delete([]byte("k")); err != nil {
			return err
		}
		return m.Delete([]byte("never-there")) // deleting a missing key is no error
	}); err != nil {
		t.Fatal(err)
	}
	b.View(bctx, func(tx ledger.BTx) error {
		if v := metaBucket(t, tx).Get([]byte("k")); v != nil {
			t.Errorf("Get after Delete = %q, want nil", v)
		}
		return nil
	})
}

var errRollback = errors.New("ledgertest: roll back")

// written reports what the rollback cases' writes left behind.
func written(t *testing.T, b ledger.Backend) []string {
	t.Helper()
	var found []string
	b.View(bctx, func(tx ledger.BTx) error {
		if v := metaBucket(t, tx).Get([]byte("doomed")); v != nil {
			found = append(found, "meta/doomed")
		}
		if v := tx.Bucket([]byte(ledger.RecordsCollection)).Get([]byte("doomed")); v != nil {
			found = append(found, "records/doomed")
		}
		if d, err := tx.Data("doomed_collection", false); err != nil || d != nil {
			found = append(found, fmt.Sprintf("data collection (err %v)", err))
		}
		return nil
	})
	return found
}

func doomedWrites(tx ledger.BTx) error {
	if err := tx.Bucket([]byte(ledger.MetaCollection)).Put([]byte("doomed"), []byte("1")); err != nil {
		return err
	}
	if err := tx.Bucket([]byte(ledger.RecordsCollection)).Put([]byte("doomed"), []byte("1")); err != nil {
		return err
	}
	d, err := tx.Data("doomed_collection", true)
	if err != nil {
		return err
	}
	return d.Put([]byte("k"), []byte("v"))
}

func backendRollback(t *testing.T, b ledger.Backend) {
	err := b.Update(bctx, func(tx ledger.BTx) error {
		if err := doomedWrites(tx); err != nil {
			return err
		}
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatalf("Update returned %v, want the function's error", err)
	}
	if got := written(t, b); len(got) > 0 {
		t.Errorf("a failed Update left %v", got)
	}
}

func backendPanic(t *testing.T, b ledger.Backend) {
	func() {
		defer func() {
			if r := recover(); r == nil {
				t.Fatal("the function's panic did not reach the caller of Update")
			}
		}()
		b.Update(bctx, func(tx ledger.BTx) error {
			if err := doomedWrites(tx); err != nil {
				return err
			}
			panic("ledgertest: a bug in a downstream")
		})
	}()
	if got := written(t, b); len(got) > 0 {
		t.Errorf("a panicking Update left %v", got)
	}
	// The backend still works.
	if err := b.Update(bctx, func(tx ledger.BTx) error { return metaBucket(t, tx).Put([]byte("after"), []byte("1")) }); err != nil {
		t.Fatalf("Update after a panic: %v", err)
	}
}

func backendOrder(t *testing.T, b ledger.Backend) {
	keys := []string{"a", "a\x00", "a\x00b", "a\xff", "ab", "b", "\xff", "\xff\xff", "\x00"}
	want := slices.Clone(keys)
	slices.SortFunc(want, func(x, y string) int { return bytes.Compare([]byte(x), []byte(y)) })
	if err := b.Update(bctx, func(tx ledger.BTx) error {
		d, err := tx.Data("order", true)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if err := d.Put([]byte(k), []byte("v:"+k)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b.View(bctx, func(tx ledger.BTx) error {
		d, err := tx.Data("order", false)
		if err != nil || d == nil {
			t.Fatalf("Data(order) = %v, %v", d, err)
		}
		c := d.Cursor()
		var fwd, back []string
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if string(v) != "v:"+string(k) {
				t.Errorf("cursor value at %q = %q", k, v)
			}
			fwd = append(fwd, string(k))
		}
		for k, _ := c.Last(); k != nil; k, _ = c.Prev() {
			back = append(back, string(k))
		}
		if !slices.Equal(fwd, want) {
			t.Errorf("forward walk = %q, want %q", fwd, want)
		}
		slices.Reverse(back)
		if !slices.Equal(back, want) {
			t.Errorf("backward walk (reversed) = %q, want %q", back, want)
		}
		for seek, at := range map[string]string{"": want[0], "a\x00a": "a\x00b", "aa": "ab", "a\xff\x00": "b", "\xff\xff\x00": ""} {
			k, _ := c.Seek([]byte(seek))
			if string(k) != at {
				t.Errorf("Seek(%q) = %q, want %q", seek, k, at)
			}
		}
		if k, _ := c.Seek([]byte("b")); string(k) != "b" {
			t.Fatalf("Seek(b) = %q", k)
		}
		if k, _ := c.Prev(); string(k) != "a\xff" {
			t.Errorf("Prev after Seek(b) = %q, want a\\xff", k)
		}
		return nil
	})
}

func backendData(t *testing.T, b ledger.Backend) {
	b.View(bctx, func(tx ledger.BTx) error {
		if d, err := tx.Data("orders", false); err != nil || d != nil {
			t.Errorf("Data of a collection never written = %v, %v; want nil, nil", d, err)
		}
		return nil
	})
	if err := b.Update(bctx, func(tx ledger.BTx) error {
		d, err := tx.Data("orders", true)
		if err != nil {
			return err
		}
		if err := d.Put([]byte("k"), []byte("order")); err != nil {
			return err
		}
		// A data collection is apart from the ledger's collection of the same name.
		if v := tx.Bucket([]byte(ledger.RecordsCollection)).Get([]byte("k")); v != nil {
			t.Errorf("a data write shows in the records collection")
		}
		again, err := tx.Data("orders", true)
		if err != nil || again == nil || string(again.Get([]byte("k"))) != "order" {
			t.Errorf("Data(create) of an existing collection = %v, %v", again, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	b.View(bctx, func(tx ledger.BTx) error {
		d, err := tx.Data("orders", false)
		if err != nil || d == nil || string(d.Get([]byte("k"))) != "order" {
			t.Errorf("after commit: Data(orders) = %v, %v", d, err)
		}
		return nil
	})
}

func backendViewReadOnly(t *testing.T, b ledger.Backend) {
	b.View(bctx, func(tx ledger.BTx) error {
		if err := metaBucket(t, tx).Put([]byte("k"), []byte("v")); err == nil {
			t.Error("Put in a View succeeded")
		}
		return nil
	})
	b.View(bctx, func(tx ledger.BTx) error {
		if v := metaBucket(t, tx).Get([]byte("k")); v != nil {
			t.Errorf("a View's Put is visible: %q", v)
		}
		return nil
	})
}

func backendSerializable(t *testing.T, b ledger.Backend) {
	const n = 64
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			errs[i] = b.Update(bctx, func(tx ledger.BTx) error {
				m := tx.Bucket([]byte(ledger.MetaCollection))
				c := 0
				if v := m.Get([]byte("counter")); v != nil {
					fmt.Sscan(string(v), &c)
				}
				return m.Put([]byte("counter"), []byte(fmt.Sprint(c+1)))
			})
		})
		if i%8 == 0 {
			wg.Go(func() {
				b.View(bctx, func(tx ledger.BTx) error {
					tx.Bucket([]byte(ledger.MetaCollection)).Get([]byte("counter"))
					return nil
				})
			})
		}
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("Update %d: %v", i, err)
		}
	}
	b.View(bctx, func(tx ledger.BTx) error {
		if v := string(metaBucket(t, tx).Get([]byte("counter"))); v != fmt.Sprint(n) {
			t.Errorf("counter after %d concurrent increments = %s (an increment was lost)", n, v)
		}
		return nil
	})
}

func backendClosed(t *testing.T, b ledger.Backend) {
	if err := b.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := b.Update(bctx, func(ledger.BTx) error { return nil }); !errors.Is(err, ledger.ErrClosed) {
		t.Errorf("Update after Close: %v, want ErrClosed", err)
	}
	if err := b.View(bctx, func(ledger.BTx) error { return nil }); !errors.Is(err, ledger.ErrClosed) {
		t.Errorf("View after Close: %v, want ErrClosed", err)
	}
}
