package tools

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"

	"idemgate/ledger"
)

// The embedded order store keeps orders in the ledger's own store, so an
// order and its operation's outcome commit in one transaction.
const (
	collOrders     = "orders"             // tenant \x00 order_id → Order
	collByCustomer = "orders_by_customer" // tenant \x00 customer \x00 inverted created (16 hex) order_id → ""
)

// Item is one order line.
type Item struct {
	SKU            string `json:"sku"`
	Quantity       int64  `json:"quantity"`
	UnitPriceMinor int64  `json:"unit_price_minor"`
}

// Address is a shipping address.
type Address struct {
	Name       string `json:"name"`
	Line1      string `json:"line1"`
	Line2      string `json:"line2,omitempty"`
	City       string `json:"city"`
	Region     string `json:"region,omitempty"`
	PostalCode string `json:"postal_code"`
	Country    string `json:"country"`
}

// Order is an order of the embedded store.
type Order struct {
	OrderID               string    `json:"order_id"`
	Version               int       `json:"version"`
	Status                string    `json:"status"` // placed, cancelled
	CustomerID            string    `json:"customer_id"`
	Items                 []Item    `json:"items"`
	Currency              string    `json:"currency"`
	TotalMinor            int64     `json:"total_minor"`
	ShipTo                *Address  `json:"ship_to,omitempty"`
	RequestedDeliveryDate string    `json:"requested_delivery_date,omitempty"`
	Note                  string    `json:"note,omitempty"`
	CancelReason          string    `json:"cancel_reason,omitempty"`
	OperationKey          string    `json:"operation_key"`
	CreatedAt             time.Time `json:"created_at"`
	UpdatedAt             time.Time `json:"updated_at"`
}

// orderID derives an order's id from its operation, named by opRef: the
// same operation always names the same order, even when re-run after a
// retryable stop or run by an approver, and two operations under one key
// (the second after the first's tombstone was deleted) name two orders.
func orderID(tenant, ref string) string {
	sum := sha256.Sum256([]byte("order\x00" + tenant + "\x00" + ref))
	return "ord_" + hex.EncodeToString(sum[:12])
}

// opRef names an operation to its downstreams: order and message ids are
// derived from it, and the order API's Idempotency-Key is
// <tenant>:<opRef>. It is the key and the record's incarnation,
// "<key>:<incarnation>", so it is unique per operation, not per key (a key
// is free again once its tombstone is deleted). A record written before
// incarnations existed has none; its name is the key alone, as it was
// then, so its replays, re-runs and reconciliations name what they named.
func opRef(rec *ledger.Record) string { return opRefOf(rec.Key, rec.Incarnation) }

func opRefOf(key, incarnation string) string {
	if incarnation == "" {
		return key
	}
	return key + ":" + incarnation
}

// errOrderExists: an order with the id a create derived already exists.
// Ids are unique per operation, so this is a fault, never a retry: the
// create is rolled back instead of overwriting an order it did not make.
var errOrderExists = errors.New("embedded order store: an order with this id already exists; refusing to overwrite it")

// total sums the items, refusing an overflow.
func total(items []Item) (int64, error) {
	var t int64
	for _, it := range items {
		if it.Quantity != 0 && it.UnitPriceMinor > (math.MaxInt64-t)/it.Quantity {
			return 0, fmt.Errorf("order total overflows")
		}
		t += it.Quantity * it.UnitPriceMinor
	}
	return t, nil
}

func orderKey(tenant, id string) string { return tenant + "\x00" + id }

func customerPrefix(tenant, customer string) string { return tenant + "\x00" + customer + "\x00" }

// putOrder writes a new order and its customer index entry. It never
// overwrites: an order with o's id is errOrderExists.
func putOrder(tx ledger.Tx, tenant string, o *Order) error {
	if cur, err := tx.Get(collOrders, orderKey(tenant, o.OrderID)); err != nil {
		return err
	} else if cur != nil {
		return fmt.Errorf("%w: %s", errOrderExists, o.OrderID)
	}
	v, err := json.Marshal(o)
	if err != nil {
		return err
	}
	if err := tx.Put(collOrders, orderKey(tenant, o.OrderID), v); err != nil {
		return err
	}
	var inv [8]byte
	binary.BigEndian.PutUint64(inv[:], math.MaxUint64-uint64(o.CreatedAt.UnixNano()))
	return tx.Put(collByCustomer, customerPrefix(tenant, o.CustomerID)+hex.EncodeToString(inv[:])+o.OrderID, nil)
}

// replaceOrder writes a changed order; its customer index entry is keyed
// by creation time and stays as it is.
func replaceOrder(tx ledger.Tx, tenant string, o *Order) error {
	v, err := json.Marshal(o)
	if err != nil {
		return err
	}
	return tx.Put(collOrders, orderKey(tenant, o.OrderID), v)
}

// getOrderTx reads an order, or nil.
func getOrderTx(tx ledger.Tx, tenant, id string) (*Order, error) {
	v, err := tx.Get(collOrders, orderKey(tenant, id))
	if err != nil || v == nil {
		return nil, err
	}
	var o Order
	if err := json.Unmarshal(v, &o); err != nil {
		return nil, fmt.Errorf("order %s: %w", id, err)
	}
	return &o, nil
}

// listOrdersTx returns a customer's orders, newest first: at most limit,
// those after the index position after ("" from the newest), and the
// position of the last one returned when more follow ("" on the last page).
// A position is the customer index key's suffix (inverted creation time,
// order id), so orders created while a client pages sort before its
// position: later pages neither repeat nor skip the older orders.
func listOrdersTx(tx ledger.Tx, tenant, customer, after string, limit int) ([]*Order, string, error) {
	var out []*Order
	var next, last string
	prefix := customerPrefix(tenant, customer)
	err := tx.Scan(collByCustomer, prefix, false, func(k string, _ []byte) (bool, error) {
		pos := k[len(prefix):]
		if after != "" && pos <= after {
			return true, nil // before the page: keys only, no order read
		}
		if len(out) == limit {
			next = last // one more exists
			return false, nil
		}
		o, err := getOrderTx(tx, tenant, pos[16:])
		if err != nil {
			return false, err
		}
		if o != nil {
			out = append(out, o)
			last = pos
		}
		return true, nil
	})
	return out, next, err
}
