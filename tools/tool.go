package tools

import (
	"context"
	"encoding/json"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/orders"
)

// descriptor is one tool, defined in one place (the tool's own file): its
// Spec (name, texts, behaviour hints; its input schema is the schemas
// package's file of the same name, checked by New), the handler of its
// typed arguments, and — for a tool that changes something through the
// ledger — its effect. Adding a tool is a file with its descriptor, its
// schema file, and one line in registry.
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
		// The JSON of the arguments is kept for the ledger (execute), so
		// they are encoded once per call (or known from preparing them).
		b := c.args
		if b == nil {
			var err error
			if b, err = json.Marshal(c.req.Args); err != nil {
				return s.ledgerError(c, err)
			}
		}
		var a A
		if err := json.Unmarshal(b, &a); err != nil {
			return s.ledgerError(c, err)
		}
		c.args, c.decoded = b, a
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
// effect itself — inside the ledger's transaction (the embedded order
// store, the outbox) or, for order tools when a remote order system is
// configured, as a write to that system — and the steps that follow it.
type sideEffect[A any] struct {
	// noun is what answers call one such operation ("order"); "" for
	// the tool's name.
	noun string
	// facts is what the approval policy evaluates (nil: no facts but
	// alwaysApprove).
	facts func(a A) approvals.Facts
	// alwaysApprove says every request of the tool needs a human approver
	// (approvals.Facts.AlwaysApprove).
	alwaysApprove bool
	// downstream names the system apply writes to, in the ledger's
	// records and the audit ("outbox"), for a tool without remote; an
	// order tool's is the order system's own (Orders.Downstream).
	downstream string
	// apply is the effect inside the ledger's transaction; an order tool
	// reaches the embedded order store as s.local.
	apply func(s *Service, tenant string, a A) (ledger.ApplyFunc, error)
	// remote, when set, marks an order tool: with a remote order system
	// (RemoteOrders) configured, its effect is this write, sent with the
	// operation's reference ref (opRef) and no transaction open, instead
	// of apply. Its answer becomes the outcome by outcomeOf, with
	// remoteSummary ("order", "changed order") naming a success.
	remote        func(ctx context.Context, api RemoteOrders, tenant, ref string, a A) (*orders.Order, error)
	remoteSummary string
	// followUps, when set, is the steps an operation rec adds once it has
	// succeeded with order o (create_order's confirmation); none when the
	// arguments ask for none. Every outcome built outside the transaction
	// (a remote answer, reconciliation, approval, resolution) gets them
	// through Service.withFollowUps; an apply that succeeds queues them in
	// its own transaction (queueSteps).
	followUps func(tenant string, rec *ledger.Record, a A, o *orders.Order) []followUp
}

// effect is a sideEffect with its argument type erased: every method takes
// the arguments as saved in a ledger record.
type effect interface {
	// human is what answers call one such operation.
	human() string
	// policyFacts is what the approval policy evaluates. decoded, when
	// not nil, is args already decoded as the tool's arguments (a call's
	// call.decoded), which saves decoding them again.
	policyFacts(args json.RawMessage, decoded any) (approvals.Facts, error)
	// applier builds the effect inside the ledger's transaction; decoded
	// as for policyFacts.
	applier(s *Service, tenant string, args json.RawMessage, decoded any) (ledger.ApplyFunc, error)
	// onOrders reports whether the effect goes to the order system.
	onOrders() bool
	// writesTo is the downstream of an effect not onOrders.
	writesTo() string
	// remoteWrite builds the write to a remote order system (only when
	// onOrders), to be sent with the operation's reference, and the
	// summary that names its success.
	remoteWrite(api RemoteOrders, tenant string, args json.RawMessage) (write func(ctx context.Context, ref string) (*orders.Order, error), summary string, err error)
	// steps is followUps over the arguments args (none when they do not
	// decode).
	steps(tenant string, rec *ledger.Record, args json.RawMessage, o *orders.Order) []followUp
}

func (e *sideEffect[A]) decode(args json.RawMessage) (A, error) {
	var a A
	err := json.Unmarshal(args, &a)
	return a, err
}

// decodeOnce is decoded when it holds the arguments as an A (decoded
// from args by define), else args decoded.
func (e *sideEffect[A]) decodeOnce(args json.RawMessage, decoded any) (A, error) {
	if a, ok := decoded.(A); ok {
		return a, nil
	}
	return e.decode(args)
}

func (e *sideEffect[A]) human() string { return e.noun }

func (e *sideEffect[A]) policyFacts(args json.RawMessage, decoded any) (approvals.Facts, error) {
	a, err := e.decodeOnce(args, decoded)
	if err != nil {
		return approvals.Facts{}, err
	}
	var f approvals.Facts
	if e.facts != nil {
		f = e.facts(a)
	}
	f.AlwaysApprove = e.alwaysApprove
	return f, nil
}

func (e *sideEffect[A]) applier(s *Service, tenant string, args json.RawMessage, decoded any) (ledger.ApplyFunc, error) {
	a, err := e.decodeOnce(args, decoded)
	if err != nil {
		return nil, err
	}
	return e.apply(s, tenant, a)
}

func (e *sideEffect[A]) onOrders() bool { return e.remote != nil }

func (e *sideEffect[A]) writesTo() string { return e.downstream }

func (e *sideEffect[A]) remoteWrite(api RemoteOrders, tenant string, args json.RawMessage) (func(ctx context.Context, ref string) (*orders.Order, error), string, error) {
	a, err := e.decode(args)
	if err != nil {
		return nil, "", err
	}
	return func(ctx context.Context, ref string) (*orders.Order, error) {
		return e.remote(ctx, api, tenant, ref, a)
	}, e.remoteSummary, nil
}

func (e *sideEffect[A]) steps(tenant string, rec *ledger.Record, args json.RawMessage, o *orders.Order) []followUp {
	if e.followUps == nil {
		return nil
	}
	a, err := e.decode(args)
	if err != nil {
		return nil
	}
	return e.followUps(tenant, rec, a, o)
}
