// Package orders holds idemgate's order downstreams: the embedded order
// store (Embedded), whose writes commit inside the ledger's transaction
// together with the operation's outcome, and the client of an HTTP order
// API (API), whose writes are remote calls that may end with an unknown
// outcome and are then looked up by their Idempotency-Key. Both read
// orders (Get) and page through a customer's orders (List). Ids are
// derived from the operation (ID), so a re-run names the same order.
package orders

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"idemgate/ledger"
)

// The embedded order store keeps orders in the ledger's own store, so an
// order and its operation's outcome commit in one transaction.
const (
	// Collection holds the orders: tenant \x00 order_id → Order (JSON).
	Collection     = "orders"
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

// Order is an order: as the embedded store keeps it, and as the order
// API answers it (the same JSON).
type Order struct {
	OrderID               string    `json:"order_id"`
	Version               int       `json:"version"`
	Status                string    `json:"status"` // StatusPlaced, StatusCancelled
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

// Order statuses.
const (
	StatusPlaced    = "placed"
	StatusCancelled = "cancelled"
)

// CreateRequest is what a new order is made of. It is also the body
// POSTed to the order API (NotifyCustomer included, as the API has always
// received it; the confirmation itself is idemgate's outbox step).
type CreateRequest struct {
	CustomerID            string   `json:"customer_id"`
	Items                 []Item   `json:"items"`
	Currency              string   `json:"currency"`
	ShipTo                *Address `json:"ship_to,omitempty"`
	RequestedDeliveryDate string   `json:"requested_delivery_date,omitempty"`
	Note                  string   `json:"note,omitempty"`
	NotifyCustomer        bool     `json:"notify_customer"`
}

// Changes are the fields an update changes; nil fields stay as they are.
// It is also the body PATCHed to the order API.
type Changes struct {
	Items                 []Item   `json:"items,omitempty"`
	ShipTo                *Address `json:"ship_to,omitempty"`
	RequestedDeliveryDate *string  `json:"requested_delivery_date,omitempty"`
	Note                  *string  `json:"note,omitempty"`
}

// Apply returns a copy of o with ch applied; its version and times are
// not touched. ErrTotalOverflow when the new items' total does not fit.
func (ch Changes) Apply(o *Order) (*Order, error) {
	n := *o
	if ch.Items != nil {
		sum, err := Total(ch.Items)
		if err != nil {
			return nil, err
		}
		n.Items, n.TotalMinor = ch.Items, sum
	}
	if ch.ShipTo != nil {
		n.ShipTo = ch.ShipTo
	}
	if ch.RequestedDeliveryDate != nil {
		n.RequestedDeliveryDate = *ch.RequestedDeliveryDate
	}
	if ch.Note != nil {
		n.Note = *ch.Note
	}
	return &n, nil
}

// UpdateRequest changes order OrderID, which must be at ExpectedVersion.
type UpdateRequest struct {
	OrderID         string
	ExpectedVersion int
	Changes         Changes
}

// CancelRequest cancels order OrderID, which must be at ExpectedVersion.
type CancelRequest struct {
	OrderID         string
	ExpectedVersion int
	Reason          string
}

// ID derives an order's id from its operation, named by ref (the
// operation's "<key>:<incarnation>", or its key alone for an operation
// recorded before incarnations existed): the same operation always names
// the same order, even when re-run after a retryable stop or run by an
// approver, and two operations under one key (the second after the first's
// tombstone was deleted) name two orders. An id is "ord_" and 24 hex
// digits; for an operation whose incarnation is time-ordered
// (ledger.IncarnationTime) the first 11 are its creation time, so new
// orders are appended to the collection; other operations keep the id
// they always had.
func ID(tenant, ref string) string {
	sum := sha256.Sum256([]byte("order\x00" + tenant + "\x00" + ref))
	h := hex.EncodeToString(sum[:12])
	if i := strings.LastIndexByte(ref, ':'); i >= 0 {
		if at, ok := ledger.IncarnationTime(ref[i+1:]); ok {
			return "ord_" + at + h[:13]
		}
	}
	return "ord_" + h
}

// Errors of the embedded store.
var (
	// ErrExists is returned by CreateTx when an order with the id a create
	// derived already exists. Ids are unique per operation, so this is a
	// fault, never a retry: the create is rolled back instead of
	// overwriting an order it did not make.
	ErrExists = errors.New("embedded order store: an order with this id already exists; refusing to overwrite it")
	// ErrNotFound is returned by UpdateTx and CancelTx when the order does
	// not exist.
	ErrNotFound = errors.New("no such order")
	// ErrTotalOverflow is returned when an order's total does not fit in
	// 64-bit minor units.
	ErrTotalOverflow = errors.New("order total overflows")
)

// StaleError is returned by UpdateTx and CancelTx when the order may not
// change at the version asked for: it is cancelled, or at another version.
// Nothing was written.
type StaleError struct {
	Order    *Order // the order as it is
	Expected int
}

func (e *StaleError) Error() string {
	if e.Order.Status == StatusCancelled {
		return fmt.Sprintf("order %s is cancelled (version %d)", e.Order.OrderID, e.Order.Version)
	}
	return fmt.Sprintf("order %s is at version %d, not %d", e.Order.OrderID, e.Order.Version, e.Expected)
}

// Total sums the items' quantity × unit price; ErrTotalOverflow when the
// sum does not fit in an int64.
func Total(items []Item) (int64, error) {
	var t int64
	for _, it := range items {
		if it.Quantity != 0 && it.UnitPriceMinor > (math.MaxInt64-t)/it.Quantity {
			return 0, ErrTotalOverflow
		}
		t += it.Quantity * it.UnitPriceMinor
	}
	return t, nil
}

func orderKey(tenant, id string) string { return tenant + "\x00" + id }

func customerPrefix(tenant, customer string) string { return tenant + "\x00" + customer + "\x00" }

// putOrder writes a new order and its customer index entry. It never
// overwrites: an order with o's id is ErrExists. Unless fresh (o's id is
// derived from an operation created in tx, see CreateTx), it reads
// whether the id is free first.
func putOrder(tx ledger.Tx, tenant string, o *Order, fresh bool) error {
	if !fresh {
		cur, err := tx.Get(Collection, orderKey(tenant, o.OrderID))
		if err != nil {
			return err
		}
		if cur != nil {
			return fmt.Errorf("%w: %s", ErrExists, o.OrderID)
		}
	}
	v, err := json.Marshal(o)
	if err != nil {
		return err
	}
	if err := tx.Put(Collection, orderKey(tenant, o.OrderID), v); err != nil {
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
	return tx.Put(Collection, orderKey(tenant, o.OrderID), v)
}

// getOrderTx reads an order, or nil.
func getOrderTx(tx ledger.Tx, tenant, id string) (*Order, error) {
	v, err := tx.Get(Collection, orderKey(tenant, id))
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

// Viewer runs read-only transactions on the ledger (ledger.Store does).
type Viewer interface {
	View(ctx context.Context, fn func(tx ledger.Tx) error) error
}

// Embedded is the embedded order store: orders live in the ledger's own
// store. Its writes (CreateTx, UpdateTx, CancelTx) run inside the caller's
// ledger transaction, so an order and the outcome of the operation that
// wrote it commit together or not at all. Safe for concurrent use.
type Embedded struct {
	store Viewer
}

// NewEmbedded returns the embedded store over the ledger store.
func NewEmbedded(store Viewer) *Embedded { return &Embedded{store: store} }

// Downstream names the embedded store in the ledger's records.
func (e *Embedded) Downstream() string { return "embedded" }

// Get reads an order; (nil, nil) when the tenant has none with this id.
func (e *Embedded) Get(ctx context.Context, tenant, id string) (*Order, error) {
	var o *Order
	err := e.store.View(ctx, func(tx ledger.Tx) error {
		var err error
		o, err = getOrderTx(tx, tenant, id)
		return err
	})
	return o, err
}

// List returns a customer's orders, newest first: at most limit, after
// cursor ("" from the newest), and the cursor of the next page ("" on the
// last page). Orders created while a client pages sort before its cursor,
// so later pages neither repeat nor skip the older orders.
func (e *Embedded) List(ctx context.Context, tenant, customer string, limit int, cursor string) ([]*Order, string, error) {
	var out []*Order
	var next string
	err := e.store.View(ctx, func(tx ledger.Tx) error {
		var err error
		out, next, err = listOrdersTx(tx, tenant, customer, cursor, limit)
		return err
	})
	return out, next, err
}

// CreateTx places the order req describes inside tx, as version 1 with id
// ID(tenant, ref), recording key as its operation_key and the
// transaction's time as its creation time. ErrTotalOverflow, ErrExists, or
// the transaction's error; the caller's transaction should then roll back.
// fresh says ref names an operation created in tx (ledger.Record.Fresh),
// so that no order can have the id yet: it is written without first
// reading whether it is free, which on PostgreSQL saves a round trip.
func (e *Embedded) CreateTx(tx ledger.Tx, tenant, key, ref string, fresh bool, req CreateRequest) (*Order, error) {
	sum, err := Total(req.Items)
	if err != nil {
		return nil, err
	}
	now := tx.Now()
	o := &Order{
		OrderID: ID(tenant, ref), Version: 1, Status: StatusPlaced,
		CustomerID: req.CustomerID, Items: req.Items, Currency: req.Currency, TotalMinor: sum,
		ShipTo: req.ShipTo, RequestedDeliveryDate: req.RequestedDeliveryDate, Note: req.Note,
		OperationKey: key, CreatedAt: now, UpdatedAt: now,
	}
	if err := putOrder(tx, tenant, o, fresh); err != nil {
		return nil, err
	}
	return o, nil
}

// UpdateTx applies req's changes inside tx and returns the order's next
// version. Errors, with nothing written: ErrNotFound, a *StaleError (the
// order is cancelled or not at req.ExpectedVersion), ErrTotalOverflow, or
// the transaction's error.
func (e *Embedded) UpdateTx(tx ledger.Tx, tenant string, req UpdateRequest) (*Order, error) {
	return changeTx(tx, tenant, req.OrderID, req.ExpectedVersion, req.Changes.Apply)
}

// CancelTx cancels the order inside tx, with req.Reason, and returns its
// next version. Errors as UpdateTx's.
func (e *Embedded) CancelTx(tx ledger.Tx, tenant string, req CancelRequest) (*Order, error) {
	return changeTx(tx, tenant, req.OrderID, req.ExpectedVersion, func(o *Order) (*Order, error) {
		n := *o
		n.Status, n.CancelReason = StatusCancelled, req.Reason
		return &n, nil
	})
}

// changeTx re-reads order id in tx, refuses a vanished, cancelled or moved
// one, and otherwise writes change's result as the next version.
func changeTx(tx ledger.Tx, tenant, id string, expected int, change func(*Order) (*Order, error)) (*Order, error) {
	o, err := getOrderTx(tx, tenant, id)
	if err != nil {
		return nil, err
	}
	if o == nil {
		return nil, ErrNotFound
	}
	if o.Status == StatusCancelled || o.Version != expected {
		return nil, &StaleError{Order: o, Expected: expected}
	}
	n, err := change(o)
	if err != nil {
		return nil, err
	}
	n.Version++
	n.UpdatedAt = tx.Now()
	if err := replaceOrder(tx, tenant, n); err != nil {
		return nil, err
	}
	return n, nil
}
