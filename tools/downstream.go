package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"idemgate/ledger"
	"idemgate/orders"
	"idemgate/outbox"
)

// Orders is the order system the order tools act on, as tools needs it:
// read one order, page through a customer's orders, and name itself for
// the ledger's records. Its writes come in one of two kinds, and an
// implementation has exactly one of them:
//
//   - LocalOrders writes inside the ledger's transaction, together with
//     the operation's outcome (the embedded store, orders.Embedded): an
//     operation either happened and is recorded, or neither.
//   - RemoteOrders writes by calls made with no transaction open (the HTTP
//     order API, orders.API): a call may end with its outcome unknown, and
//     is then settled by looking the operation up by its reference.
//
// Implementations are safe for concurrent use.
type Orders interface {
	// Downstream names the order system in the ledger's records; an
	// operation recorded for one system is never run against another.
	Downstream() string
	// Get returns the tenant's order id, or (nil, nil) when there is none.
	Get(ctx context.Context, tenant, id string) (*orders.Order, error)
	// List returns a customer's orders, newest first: at most limit, after
	// cursor ("" from the first page), and the cursor of the next page (""
	// on the last page). A cursor is the implementation's own, opaque to
	// tools (which wraps it in its own signed cursor).
	List(ctx context.Context, tenant, customer string, limit int, cursor string) ([]*orders.Order, string, error)
}

// LocalOrders is an order system whose writes commit inside the ledger's
// transaction. Each write returns the order as written; errors: for a
// create orders.ErrExists, for a change orders.ErrNotFound and
// *orders.StaleError (nothing written); orders.ErrTotalOverflow; or the
// transaction's error. A write's error rolls the transaction back unless
// the caller turns it into a saved failure.
type LocalOrders interface {
	Orders
	// CreateTx places an order for the operation key, named ref (opRef), with
	// the id orders.ID(tenant, ref); fresh is the record's Fresh (the id
	// cannot be taken yet, and is not read first).
	CreateTx(tx ledger.Tx, tenant, key, ref string, fresh bool, req orders.CreateRequest) (*orders.Order, error)
	UpdateTx(tx ledger.Tx, tenant string, req orders.UpdateRequest) (*orders.Order, error)
	CancelTx(tx ledger.Tx, tenant string, req orders.CancelRequest) (*orders.Order, error)
}

// RemoteOrders is an order system reached by calls. Every write carries
// the operation's reference ref (opRef), so that the system acts on it
// once however often it is sent, and Lookup can later say what became of
// it. Errors of writes are *orders.APIError, classified (NotSent,
// Definitive, Indeterminate); outcomeOf maps them to the operation's
// outcome.
type RemoteOrders interface {
	Orders
	Create(ctx context.Context, tenant, ref string, req orders.CreateRequest) (*orders.Order, error)
	Update(ctx context.Context, tenant, ref string, req orders.UpdateRequest) (*orders.Order, error)
	Cancel(ctx context.Context, tenant, ref string, req orders.CancelRequest) (*orders.Order, error)
	// Lookup returns the order the write of operation ref made or changed,
	// orders.ErrAbsent when none took effect, or another error when the
	// system cannot tell now.
	Lookup(ctx context.Context, tenant, ref string) (*orders.Order, error)
	// SafeRetry reports whether a write repeated with the same reference
	// returns its first outcome instead of acting twice: only then is an
	// operation proven absent re-sent without a human.
	SafeRetry() bool
}

// The two order systems idemgate ships.
var (
	_ LocalOrders  = (*orders.Embedded)(nil)
	_ RemoteOrders = (*orders.API)(nil)
)

// opRef names an operation to its downstreams: order and message ids are
// derived from it, and the order API's Idempotency-Key is
// <tenant>:<opRef>. It is the key and the record's incarnation,
// "<key>:<incarnation>", so it is unique per operation, not per key (a key
// is free again once its tombstone is deleted). A record written before
// incarnations existed has none; its name is the key alone, as it was
// then, so its replays, re-runs and reconciliations name what they named.
func opRef(rec *ledger.Record) string { return outbox.OpRef(rec.Key, rec.Incarnation) }

// total sums an order's items, refusing an overflow.
func total(items []orders.Item) (int64, error) { return orders.Total(items) }

// followUp is a step that follows an operation's side effect: a message
// queued in the transaction that records the operation as succeeded.
// A tool's descriptor defines its steps (sideEffect.followUps).
type followUp struct {
	name  string         // the member of the result that shows it, e.g. "confirmation"
	view  map[string]any // what the result shows of it
	queue func(tx ledger.Tx) error
}

// followUps returns the follow-up steps of the operation rec in tenant,
// whose arguments are args and whose order (as made or found) is o: those
// the descriptor of rec's tool defines. Every way an operation comes to
// succeed — run on the embedded store, answered by the order API,
// reconciled by lookup, reconciled at approval, settled by hand — records
// these steps with it. Today a create_order with notify_customer has one,
// the customer's confirmation; other operations have none.
func (s *Service) followUps(tenant string, rec *ledger.Record, args json.RawMessage, o *orders.Order) []followUp {
	e := s.effectOf(rec.Tool)
	if e == nil {
		return nil
	}
	return e.steps(tenant, rec, args, o)
}

// withFollowUps adds the follow-up steps of rec (in tenant, with
// arguments args) to a succeeded outcome: result (the outcome's result
// members, e.g. {"order": o}) gains one member per step and becomes
// out.Result, and out.Also queues the steps in the transaction that
// records the outcome. Any other outcome, or one without steps, is
// returned as it is.
func (s *Service) withFollowUps(out ledger.Outcome, tenant string, rec *ledger.Record, args json.RawMessage, o *orders.Order, result map[string]any) ledger.Outcome {
	if out.State != ledger.StateSucceeded {
		return out
	}
	steps := s.followUps(tenant, rec, args, o)
	if len(steps) == 0 {
		return out
	}
	for _, st := range steps {
		result[st.name] = st.view
	}
	out.Result = mustJSON(result)
	out.Also = func(tx ledger.Tx) error { return queueSteps(tx, steps, nil) }
	return out
}

// queueSteps queues steps in tx, the transaction that records their
// operation as succeeded, and adds each step's view to result (when not
// nil) under its name.
func queueSteps(tx ledger.Tx, steps []followUp, result map[string]any) error {
	for _, st := range steps {
		if err := st.queue(tx); err != nil {
			return err
		}
		if result != nil {
			result[st.name] = st.view
		}
	}
	return nil
}

// enqueue queues m, a message of rec's operation, inside tx: without
// reading first whether its id is taken when rec was created in tx.
func enqueue(tx ledger.Tx, rec *ledger.Record, m *outbox.Message) error {
	if rec.Fresh {
		return outbox.EnqueueFresh(tx, m)
	}
	return outbox.Enqueue(tx, m)
}

// outcomeOf maps a remote write's answer to the operation's outcome.
func outcomeOf(o *orders.Order, err error, summary string) ledger.Outcome {
	if err == nil {
		return ledger.Outcome{State: ledger.StateSucceeded, Result: mustJSON(map[string]any{"order": o}), Summary: summary + " " + o.OrderID, DownstreamRef: o.OrderID}
	}
	return failureOutcome(err, "The order system")
}

// failureOutcome is the outcome of a failed remote write (err, an
// *orders.APIError when classified; anything else is indeterminate), in
// words naming the system ("The order system").
func failureOutcome(err error, system string) ledger.Outcome {
	var ae *orders.APIError
	if !errors.As(err, &ae) {
		ae = &orders.APIError{Class: orders.Indeterminate, Msg: err.Error()}
	}
	switch ae.Class {
	case orders.NotSent:
		e := opError(CodeDownstreamError, system+" could not take the request, and it was never delivered or acted on ("+ae.Error()+"). Nothing happened and the arguments are fine: call again with the same operation_key and the same arguments.")
		withRetryAfter(e, ae.RetryAfter, system, "call again")
		return ledger.Outcome{State: ledger.StateRetryable, Error: e}
	case orders.Definitive:
		code := ae.Code
		if code == "" {
			code = CodeDownstreamError
		}
		return ledger.Outcome{State: ledger.StateFailed, Error: opError(code, system+" refused the request: "+ae.Error()+". Nothing was changed."), Summary: string(code)}
	}
	e := opError(CodeOutcomeUnknown, system+" may or may not have done it ("+ae.Error()+"). It will not be re-sent blindly: idemgate reconciles with its lookup by key. Do NOT retry under a new key.")
	withRetryAfter(e, ae.RetryAfter, system, "call again with the same operation_key")
	return ledger.Outcome{State: ledger.StateUnknown, Error: e}
}

// withRetryAfter adds the delay the API asked for to e: in the message and
// as error.details.retry_after_seconds.
func withRetryAfter(e *ledger.OpError, d time.Duration, system, what string) {
	if d <= 0 {
		return
	}
	secs := int64(d / time.Second)
	e.Message += fmt.Sprintf(" %s asked to wait %d seconds: %s no sooner.", system, secs, what)
	e.Details = mustJSON(map[string]any{"retry_after_seconds": secs})
}
