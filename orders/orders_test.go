package orders

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
)

func mustOpen(t *testing.T) *bolt.File {
	t.Helper()
	s, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// TestPutOrderNeverOverwrites: a create whose order id exists fails (and
// rolls back) instead of replacing the order.
func TestPutOrderNeverOverwrites(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t)
	o := &Order{OrderID: "ord_x", Version: 1, Status: "placed", CustomerID: "c1", TotalMinor: 100, CreatedAt: time.Now()}
	if err := s.Update(ctx, func(tx ledger.Tx) error { return putOrder(tx, "t1", o, false) }); err != nil {
		t.Fatal(err)
	}
	o2 := *o
	o2.TotalMinor = 999
	if err := s.Update(ctx, func(tx ledger.Tx) error { return putOrder(tx, "t1", &o2, false) }); !errors.Is(err, ErrExists) {
		t.Fatalf("second put: %v, want ErrExists", err)
	}
	s.View(ctx, func(tx ledger.Tx) error {
		got, _ := getOrderTx(tx, "t1", "ord_x")
		if got == nil || got.TotalMinor != 100 {
			t.Errorf("order now %+v, want the first", got)
		}
		return nil
	})
}

// TestEmbeddedChanges: a change of the embedded store refuses a missing
// order (ErrNotFound), a moved or cancelled one (*StaleError) and an
// overflowing total (ErrTotalOverflow), writing nothing; otherwise it
// writes the next version.
func TestEmbeddedChanges(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t)
	e := NewEmbedded(s)
	var o *Order
	if err := s.Update(ctx, func(tx ledger.Tx) (err error) {
		o, err = e.CreateTx(tx, "t1", "k1", "k1:01", false, CreateRequest{CustomerID: "c1", Items: []Item{{SKU: "a", Quantity: 1, UnitPriceMinor: 100}}, Currency: "EUR"})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if o.OrderID != ID("t1", "k1:01") || o.Version != 1 || o.Status != StatusPlaced || o.TotalMinor != 100 {
		t.Fatalf("created %+v", o)
	}
	change := func(req UpdateRequest) (*Order, error) {
		var n *Order
		err := s.Update(ctx, func(tx ledger.Tx) (err error) { n, err = e.UpdateTx(tx, "t1", req); return err })
		return n, err
	}
	note := "hi"
	if _, err := change(UpdateRequest{OrderID: "ord_none", ExpectedVersion: 1}); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing order: %v, want ErrNotFound", err)
	}
	var stale *StaleError
	if _, err := change(UpdateRequest{OrderID: o.OrderID, ExpectedVersion: 2}); !errors.As(err, &stale) || stale.Order.Version != 1 {
		t.Errorf("wrong version: %v, want a StaleError at version 1", err)
	}
	if _, err := change(UpdateRequest{OrderID: o.OrderID, ExpectedVersion: 1, Changes: Changes{Items: []Item{{Quantity: 2, UnitPriceMinor: 1 << 62}}}}); !errors.Is(err, ErrTotalOverflow) {
		t.Errorf("overflow: %v, want ErrTotalOverflow", err)
	}
	n, err := change(UpdateRequest{OrderID: o.OrderID, ExpectedVersion: 1, Changes: Changes{Note: &note}})
	if err != nil || n.Version != 2 || n.Note != "hi" {
		t.Fatalf("update = %+v, %v; want version 2 with the note", n, err)
	}
	if err := s.Update(ctx, func(tx ledger.Tx) (err error) {
		n, err = e.CancelTx(tx, "t1", CancelRequest{OrderID: o.OrderID, ExpectedVersion: 2, Reason: "r"})
		return err
	}); err != nil || n.Status != StatusCancelled || n.Version != 3 {
		t.Fatalf("cancel = %+v, %v", n, err)
	}
	if _, err := change(UpdateRequest{OrderID: o.OrderID, ExpectedVersion: 3}); !errors.As(err, &stale) || stale.Order.Status != StatusCancelled {
		t.Errorf("change of a cancelled order: %v, want a StaleError", err)
	}
	got, err := e.Get(ctx, "t1", o.OrderID)
	if err != nil || got.Version != 3 || got.Note != "hi" {
		t.Errorf("order now %+v, %v; want version 3", got, err)
	}
	if list, next, err := e.List(ctx, "t1", "c1", 10, ""); err != nil || len(list) != 1 || next != "" {
		t.Errorf("List = %d orders, next %q, %v; want 1, last page", len(list), next, err)
	}
}

// TestIDStableAndTimeOrdered: an operation recorded before incarnations
// were time-ordered (its key alone, or 16 random hex digits) keeps the id
// it was given then, byte for byte, so a re-run finds its order; an
// operation with a time-ordered incarnation gets an id of the same shape
// that sorts by its creation time, distinct per operation.
func TestIDStableAndTimeOrdered(t *testing.T) {
	for ref, want := range map[string]string{ // the ids of the build before
		"k1":      "ord_4de16e2cc2ac5045a7474709",
		"k1:00ff": "ord_e6d44f1a5d157e02a0f72d71",
		"0b7e6a52-0f3c-4a53-9d1e-3f0c1a2b4c5d:0123456789abcdef": "ord_1e013ed1a5fe2dc0f79313d0",
		"k:t0000000000000000000000000x":                         "ord_246f0bce0d785a41fd1e26ec", // not hex: not time-ordered
	} {
		if got := ID("t1", ref); got != want {
			t.Errorf("ID(t1, %q) = %s, want %s as before", ref, got, want)
		}
	}
	early := ID("t1", "k2:t019ada3c5e1"+"0123456789abc")
	late := ID("t1", "k1:t019ada3c5e2"+"0000000000000")
	same := ID("t1", "k3:t019ada3c5e1"+"0123456789abc")
	if !strings.HasPrefix(early, "ord_019ada3c5e1") || !strings.HasPrefix(late, "ord_019ada3c5e2") || len(early) != len("ord_")+24 {
		t.Errorf("time-ordered id %s: want ord_ and 24 hex digits, the creation time first", early)
	}
	if !(early < late) || early == same {
		t.Errorf("ids %s, %s, %s: want them ordered by creation time and distinct per operation", early, late, same)
	}
}
