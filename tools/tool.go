package tools

import (
	"context"
	"encoding/json"

	"idemgate/approvals"
	"idemgate/ledger"
)

// descriptor is one tool, defined in one place (the tool's own file): its
// Spec (name, texts, behaviour hints; its input schema is the schemas
// package's file of the same name, checked by New), the handler of its
// typed arguments, and — for a tool that changes something through the
// ledger — its effect. Adding a tool is a file with its descriptor and one
// line in registry.
type descriptor struct {
	Spec
	// run answers one call whose arguments were validated.
	run func(s *Service, ctx context.Context, c *call) *Response
	// effect is nil for tools that run no side effect through the ledger.
	effect effect
}

// define makes the descriptor of a tool whose handler takes its arguments
// as A, decoded from the validated arguments (JSON field names as in the
// schema). eff, when not nil, is the tool's side effect over the same A.
func define[A any](spec Spec, run func(s *Service, ctx context.Context, c *call, a A) *Response, eff *sideEffect[A]) descriptor {
	d := descriptor{Spec: spec, run: func(s *Service, ctx context.Context, c *call) *Response {
		var a A
		if err := c.req.Decode(&a); err != nil {
			return s.ledgerError(c, err)
		}
		return run(s, ctx, c, a)
	}}
	if eff != nil {
		d.effect = eff
	}
	return d
}

// noArgs is the argument type of a tool that reads none of its own
// (besides the operation_key every call carries in c.req).
type noArgs struct{}

// sideEffect is what a side-effecting tool does, over its typed arguments
// A as saved in the ledger record: what the policy sees of it, and the
// effect itself — inside the ledger's transaction (the embedded store,
// the outbox) or, for order tools when an order API is configured, as a
// call to that API.
type sideEffect[A any] struct {
	// noun is what answers call one such operation ("order"); "" for
	// the tool's name.
	noun string
	// facts is what the approval policy evaluates.
	facts func(a A) approvals.Facts
	// apply is the effect inside the ledger's transaction.
	apply func(tenant string, a A) (ledger.ApplyFunc, error)
	// remote, when set, marks an order tool: with an order API configured
	// its effect is this call instead of apply.
	remote func(api *OrderAPI, tenant string, a A) runner
	// afterOrder, when set, is the step an operation of rec adds once its
	// order o exists (create_order's confirmation message); nil when the
	// arguments ask for none.
	afterOrder func(tenant string, rec *ledger.Record, a A, o *Order) *step
}

// effect is a sideEffect with its argument type erased: every method takes
// the arguments as saved in a ledger record.
type effect interface {
	// human is what answers call one such operation.
	human() string
	// policyFacts is what the approval policy evaluates.
	policyFacts(args json.RawMessage) (approvals.Facts, error)
	// applier builds the effect inside the ledger's transaction.
	applier(tenant string, args json.RawMessage) (ledger.ApplyFunc, error)
	// onOrders reports whether the effect goes to the order system.
	onOrders() bool
	// runner builds the call to the order API (only when onOrders).
	runner(api *OrderAPI, tenant string, args json.RawMessage) (runner, error)
	// followUp is afterOrder over rec's saved arguments (nil: no step).
	followUp(tenant string, rec *ledger.Record, o *Order) *step
}

func (e *sideEffect[A]) decode(args json.RawMessage) (A, error) {
	var a A
	err := json.Unmarshal(args, &a)
	return a, err
}

func (e *sideEffect[A]) human() string { return e.noun }

func (e *sideEffect[A]) policyFacts(args json.RawMessage) (approvals.Facts, error) {
	a, err := e.decode(args)
	if err != nil || e.facts == nil {
		return approvals.Facts{}, err
	}
	return e.facts(a), nil
}

func (e *sideEffect[A]) applier(tenant string, args json.RawMessage) (ledger.ApplyFunc, error) {
	a, err := e.decode(args)
	if err != nil {
		return nil, err
	}
	return e.apply(tenant, a)
}

func (e *sideEffect[A]) onOrders() bool { return e.remote != nil }

func (e *sideEffect[A]) runner(api *OrderAPI, tenant string, args json.RawMessage) (runner, error) {
	a, err := e.decode(args)
	if err != nil {
		return nil, err
	}
	return e.remote(api, tenant, a), nil
}

func (e *sideEffect[A]) followUp(tenant string, rec *ledger.Record, o *Order) *step {
	if e.afterOrder == nil {
		return nil
	}
	a, err := e.decode(rec.Args)
	if err != nil {
		return nil
	}
	return e.afterOrder(tenant, rec, a, o)
}

// step is a further step of an operation whose order exists: its name
// (the result's key for view), what the result shows of it, and the write
// that queues it in the transaction that records the outcome.
type step struct {
	name  string
	view  map[string]any
	queue func(ledger.Tx) error
}

// withStep adds st (when not nil) to a succeeded outcome for order o: the
// result shows the order and the step, and the step is queued with the
// outcome.
func withStep(out ledger.Outcome, o *Order, st *step) ledger.Outcome {
	if out.State != ledger.StateSucceeded || st == nil {
		return out
	}
	out.Result = mustJSON(map[string]any{"order": o, st.name: st.view})
	out.Also = st.queue
	return out
}

// withFollowUp is withStep with eff's step for rec's saved arguments,
// computed only for a succeeded outcome.
func withFollowUp(out ledger.Outcome, eff effect, tenant string, rec *ledger.Record, o *Order) ledger.Outcome {
	if out.State != ledger.StateSucceeded || eff == nil {
		return out
	}
	return withStep(out, o, eff.followUp(tenant, rec, o))
}
