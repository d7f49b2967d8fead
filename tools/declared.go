package tools

import (
	"context"
	"encoding/json"
	"errors"
	"maps"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/orders"
)

// RemoteOp is a side effect made by one request to an HTTP API of its
// own: a declared tool (package declared builds them from configuration).
// It goes through the same path as an order tool over the order API —
// policy, claim, lease, the request sent with no transaction open and
// classified, an unknown outcome reconciled by Lookup, approvals, audit —
// and differs only in what it sends and how it reads the answers.
// Implementations are safe for concurrent use.
type RemoteOp interface {
	// Downstream names the API in the ledger's records (e.g.
	// "declared create_refund https://payments.example"): an operation
	// recorded for one downstream is never run against another.
	Downstream() string
	// Noun is what answers call one such operation ("refund"), and the
	// member of the saved result that holds the API's answer.
	Noun() string
	// Facts is what the approval policy sees of the arguments.
	Facts(args json.RawMessage) (approvals.Facts, error)
	// Send makes the request of the operation named ref (opRef; its
	// downstream key is orders.IdempotencyKey(tenant, ref)) with the
	// saved arguments args. Errors are *orders.APIError, classified.
	Send(ctx context.Context, tenant, ref string, args json.RawMessage) (*RemoteResult, error)
	// Lookup asks what the request of the operation named ref did: its
	// result, orders.ErrAbsent when it provably took no effect, or
	// another error when the API cannot tell now.
	Lookup(ctx context.Context, tenant, ref string, args json.RawMessage) (*RemoteResult, error)
	// SafeRetry reports whether the API acts once on a request repeated
	// with the same key: only then is an operation proven absent re-sent
	// without a human.
	SafeRetry() bool
}

// RemoteResult is what a RemoteOp's API answered: the resource as JSON
// (saved as the operation's result, under the op's Noun) and its id at
// the API ("" when it names none).
type RemoteResult struct {
	Resource json.RawMessage
	ID       string
}

// Declared is a side-effecting tool defined outside Go: its Spec (with
// InputSchema, which the validator must also know), and its effect.
type Declared struct {
	Spec Spec
	Op   RemoteOp
}

// declaredTool is the descriptor of a declared tool: its calls go through
// execute like create_order's, the effect being op.
func declaredTool(d Declared) descriptor {
	return descriptor{
		Spec: d.Spec,
		run: func(s *Service, ctx context.Context, c *call) *Response {
			return s.execute(ctx, c, func() proposal { return declaredProposal(d.Op, c.req.Args) })
		},
		effect: declaredEffect{op: d.Op},
	}
}

// declaredProposal is what an approver is shown of a declared tool's
// call: every argument but the key, and the amount the policy read as
// total_minor (with its currency), which the approval's Total and the
// console show.
func declaredProposal(op RemoteOp, args map[string]any) proposal {
	preview := maps.Clone(args)
	delete(preview, "operation_key")
	if b, err := json.Marshal(args); err == nil {
		if f, err := op.Facts(b); err == nil && f.HasAmount {
			preview["total_minor"] = f.Amount
			if f.Currency != "" {
				preview["currency"] = f.Currency
			}
		}
	}
	return proposal{diff: approvals.CreateDiff(op.Noun(), preview)}
}

// declaredEffect is a RemoteOp as a tool's effect.
type declaredEffect struct{ op RemoteOp }

func (e declaredEffect) human() string { return e.op.Noun() }

func (e declaredEffect) policyFacts(args json.RawMessage, _ any) (approvals.Facts, error) {
	return e.op.Facts(args)
}

func (e declaredEffect) applier(*Service, string, json.RawMessage, any) (ledger.ApplyFunc, error) {
	return nil, errors.New("a declared tool has no effect inside the ledger's transaction")
}

func (e declaredEffect) onOrders() bool { return false }

func (e declaredEffect) writesTo() string { return e.op.Downstream() }

func (e declaredEffect) remoteWrite(RemoteOrders, string, json.RawMessage) (func(context.Context, string) (*orders.Order, error), string, error) {
	return nil, "", errors.New("a declared tool writes to no order system")
}

func (e declaredEffect) steps(string, *ledger.Record, json.RawMessage, *orders.Order) []followUp {
	return nil
}

func (e declaredEffect) remoteOp() RemoteOp { return e.op }

// remoteOpOf is the RemoteOp of tool, nil when it is not a declared tool.
func (s *Service) remoteOpOf(tool string) RemoteOp {
	if e, ok := s.effectOf(tool).(declaredEffect); ok {
		return e.op
	}
	return nil
}

// reconcilable reports whether an unknown operation of tool can be looked
// up: a declared tool, or any other with the order API.
func (s *Service) reconcilable(tool string) bool {
	return s.remoteOpOf(tool) != nil || s.remote != nil
}

// declaredOutcome is a declared tool's answer as the operation's outcome.
func declaredOutcome(op RemoteOp, r *RemoteResult, err error) ledger.Outcome {
	if err == nil {
		return declaredSuccess(op, r)
	}
	return failureOutcome(err, "The API "+op.Downstream())
}

// declaredSuccess is the outcome of a declared tool's operation that the
// API did: its resource under the op's noun.
func declaredSuccess(op RemoteOp, r *RemoteResult) ledger.Outcome {
	res := r.Resource
	if len(res) == 0 {
		res = json.RawMessage("null")
	}
	summary := op.Noun()
	if r.ID != "" {
		summary += " " + r.ID
	}
	return ledger.Outcome{State: ledger.StateSucceeded, Result: mustJSON(map[string]json.RawMessage{op.Noun(): res}), Summary: summary, DownstreamRef: r.ID}
}

// lookupOutcome asks the downstream of rec what became of it: the
// succeeded outcome (with the order tools' follow-up steps) and words
// naming what was found; orders.ErrAbsent when it provably took no
// effect; another error when the downstream cannot tell now. The
// downstream's request is reported to the observer of ctx.
func (s *Service) lookupOutcome(ctx context.Context, rec *ledger.Record) (ledger.Outcome, string, error) {
	if op := s.remoteOpOf(rec.Tool); op != nil {
		r, err := op.Lookup(ctx, rec.Tenant, opRef(rec), rec.Args)
		if err != nil {
			return ledger.Outcome{}, "", err
		}
		found := op.Noun()
		if r.ID != "" {
			found += " " + r.ID
		}
		return declaredSuccess(op, r), found, nil
	}
	if s.remote == nil {
		return ledger.Outcome{}, "", errors.New("no downstream to look the operation up in")
	}
	o, err := s.remote.Lookup(ctx, rec.Tenant, opRef(rec))
	if err != nil {
		return ledger.Outcome{}, "", err
	}
	return s.withFollowUps(outcomeOf(o, nil, "order"), rec.Tenant, rec, rec.Args, o, map[string]any{"order": o}), "order " + o.OrderID, nil
}

// safeRetry reports whether rec's downstream acts once on a request
// repeated with the same key.
func (s *Service) safeRetry(tool string) bool {
	if op := s.remoteOpOf(tool); op != nil {
		return op.SafeRetry()
	}
	return s.remote != nil && s.remote.SafeRetry()
}

// systemOf is how the audit's downstream calls name tool's downstream.
func (s *Service) systemOf(tool string) string {
	if s.remoteOpOf(tool) != nil {
		return "declared"
	}
	return "orders_api"
}
