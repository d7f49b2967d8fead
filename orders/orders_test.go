package orders

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"idemgate/ledger"
)

func mustOpen(t *testing.T) *ledger.BoltStore {
	t.Helper()
	s, err := ledger.OpenBolt(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{})
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
	if err := s.Update(ctx, func(tx ledger.Tx) error { return putOrder(tx, "t1", o) }); err != nil {
		t.Fatal(err)
	}
	o2 := *o
	o2.TotalMinor = 999
	if err := s.Update(ctx, func(tx ledger.Tx) error { return putOrder(tx, "t1", &o2) }); !errors.Is(err, ErrExists) {
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
