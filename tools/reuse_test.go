package tools

import (
	"context"
	"errors"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/orders"
	"idemgate/outbox"
	"idemgate/schemas"
)

// testClock is a ledger clock a test moves by hand.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *testClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// reuseService is a service on a ledger with short retentions and a hand
// clock; api, when not nil, is the order API's base URL.
func reuseService(t *testing.T, clock *testClock, api string) (*Service, *bolt.File) {
	t.Helper()
	store, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{
		Retention: time.Minute, TombstoneRetention: time.Minute, Now: clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	opts := Options{OutboxDir: t.TempDir(), Lease: time.Second, CallTimeout: 200 * time.Millisecond}
	if api != "" {
		a, err := orders.NewAPI(api, 200*time.Millisecond, false)
		if err != nil {
			t.Fatal(err)
		}
		opts.OrdersAPI = a
	}
	v, _ := schemas.New()
	svc, err := New(store, v, opts)
	if err != nil {
		t.Fatal(err)
	}
	return svc, store
}

// freeKey moves the clock past retention and tombstone retention and
// sweeps, so key's record is deleted.
func freeKey(t *testing.T, clock *testClock, store *bolt.File, key string) {
	t.Helper()
	clock.Add(3 * time.Minute)
	if _, _, err := store.Sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Get(context.Background(), "t1", key); !errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("record of %s after the sweep: %v, want deleted", key, err)
	}
}

// TestKeyReuseEmbeddedIsANewOrder: on the embedded store an operation under
// a key freed by the sweep makes a second order and a second confirmation,
// and the first order stays as it was.
func TestKeyReuseEmbeddedIsANewOrder(t *testing.T) {
	ctx := context.Background()
	clock := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	svc, store := reuseService(t, clock, "")
	key := uuid.NewString()
	first := svc.Call(ctx, agent, "create_order", orderArgs(key, 2), nil)
	if first.Status != ledger.StateSucceeded {
		t.Fatalf("first = %+v", first)
	}
	freeKey(t, clock, store, key)
	second := svc.Call(ctx, agent, "create_order", orderArgs(key, 5), nil)
	if second.Status != ledger.StateSucceeded || second.Replayed {
		t.Fatalf("second = %+v %s", second, second.Result)
	}
	o1, o2 := resultOrder(t, first), resultOrder(t, second)
	if o1.OrderID == o2.OrderID {
		t.Fatalf("both operations name order %s", o1.OrderID)
	}
	got, err := svc.orders.Get(ctx, "t1", o1.OrderID)
	if err != nil || got == nil || got.TotalMinor != 1000 {
		t.Errorf("first order now %+v (%v), want total 1000 as placed", got, err)
	}
	list, _, _ := svc.orders.List(ctx, "t1", "c1", 10, "")
	if len(list) != 2 || list[0].OrderID == list[1].OrderID {
		t.Errorf("list = %d orders, want 2 different", len(list))
	}
	store.View(ctx, func(tx ledger.Tx) error {
		n := 0
		tx.Scan(outbox.Collection, "", false, func(string, []byte) (bool, error) { n++; return true, nil })
		if n != 2 {
			t.Errorf("%d outbox messages, want 2 confirmations", n)
		}
		return nil
	})
}

// TestKeyReuseExternalIsANewOrder: at the order API, an operation under a
// freed key sends an Idempotency-Key of its own, so an API that still
// remembers the first operation's key makes a new order instead of
// answering with the old one.
func TestKeyReuseExternalIsANewOrder(t *testing.T) {
	ctx := context.Background()
	fake := &miniAPI{byKey: map[string]string{}}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	clock := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	svc, store := reuseService(t, clock, srv.URL)
	key := uuid.NewString()
	first := svc.Call(ctx, agent, "create_order", orderArgs(key, 2), nil)
	if first.Status != ledger.StateSucceeded {
		t.Fatalf("first = %+v %s", first, first.Result)
	}
	freeKey(t, clock, store, key)
	second := svc.Call(ctx, agent, "create_order", orderArgs(key, 5), nil)
	if second.Status != ledger.StateSucceeded || second.Replayed {
		t.Fatalf("second = %+v %s", second, second.Result)
	}
	if resultOrder(t, first).OrderID == resultOrder(t, second).OrderID || fake.creates != 2 {
		t.Fatalf("orders %s and %s, API creates %d; want two orders", resultOrder(t, first).OrderID, resultOrder(t, second).OrderID, fake.creates)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	for k := range fake.byKey {
		if !strings.HasPrefix(k, "t1:"+key+":") {
			t.Errorf("Idempotency-Key %q, want t1:%s:<incarnation>", k, key)
		}
	}
}

// TestLegacyRecordKeepsItsIdentities: a record without an incarnation
// (written before incarnations existed) names what it named then.
func TestLegacyRecordKeepsItsIdentities(t *testing.T) {
	rec := &ledger.Record{Tenant: "t1", Key: "k"}
	if got, want := orders.ID("t1", opRef(rec)), "ord_"; !strings.HasPrefix(got, want) || got != orders.ID("t1", "k") {
		t.Errorf("legacy order id %s", got)
	}
	if orders.IdempotencyKey("t1", opRef(rec)) != "t1:k" {
		t.Errorf("legacy Idempotency-Key %s, want t1:k", orders.IdempotencyKey("t1", opRef(rec)))
	}
	rec.Incarnation = "00ff"
	if orders.IdempotencyKey("t1", opRef(rec)) != "t1:k:00ff" || orders.ID("t1", opRef(rec)) == orders.ID("t1", "k") {
		t.Errorf("incarnation not in the identities: %s %s", orders.IdempotencyKey("t1", opRef(rec)), orders.ID("t1", opRef(rec)))
	}
}
