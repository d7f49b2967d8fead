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
	// saved arguments args; ifMatch, when not "", is the version of the
	// resource the approver saw (Current), sent as the request's
	// precondition. Errors are *orders.APIError, classified.
	Send(ctx context.Context, tenant, ref string, args json.RawMessage, ifMatch string) (*RemoteResult, error)
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

// CurrentReader is a RemoteOp that changes an existing resource and can
// read it as it is now: an approver is shown the change as a diff from
// it, and the approved request carries the version read as its
// precondition (If-Match), so a resource changed since fails
// (precondition_failed) rather than being overwritten.
type CurrentReader interface {
	// Current reads the resource the arguments args would change.
	// Errors are *orders.APIError, classified.
	Current(ctx context.Context, tenant string, args json.RawMessage) (*Current, error)
}

// Current is a resource as it is now, and what a request would change.
type Current struct {
	ID      string
	Version string // the ETag (or version field) read; "" when none
	// Before and After are the fields the request sets: as they are, and
	// as the request would make them.
	Before, After map[string]any
}

// currentView is what an approval keeps of a Current (as its Resource).
type currentView struct {
	ID      string         `json:"id,omitempty"`
	Version string         `json:"version,omitempty"`
	Before  map[string]any `json:"current"`
}

// approvedVersion is the version an approval of rec was given for, ""
// when none.
func approvedVersion(rec *ledger.Record) string {
	if rec.Approval == nil || len(rec.Approval.Resource) == 0 {
		return ""
	}
	var v currentView
	if json.Unmarshal(rec.Approval.Resource, &v) != nil {
		return ""
	}
	return v.Version
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
			cur, resp := s.currentOf(ctx, c, d.Op)
			if resp != nil {
				return resp
			}
			return s.execute(ctx, c, func() proposal {
				if cur != nil {
					diff := approvals.UpdateDiff(d.Op.Noun(), cur.ID, 0, cur.Before, cur.After)
					return proposal{diff: diff, resource: currentView{ID: cur.ID, Version: cur.Version, Before: cur.Before}}
				}
				return declaredProposal(d.Op, c.req.Args)
			})
		},
		effect: declaredEffect{op: d.Op},
	}
}

// currentOf reads what a declared tool's call would change, when its op
// can (CurrentReader) and the ledger has no record for the key yet (a
// record decides by itself: replay, pending approval, mismatch). A
// failed read answers the call, with nothing recorded.
func (s *Service) currentOf(ctx context.Context, c *call, op RemoteOp) (*Current, *Response) {
	cr, ok := op.(CurrentReader)
	if !ok {
		return nil, nil
	}
	if _, err := s.ledger.Get(ctx, c.actor.Tenant, c.req.OperationKey); err == nil {
		return nil, nil
	} else if !errors.Is(err, ledger.ErrNotFound) {
		return nil, s.ledgerError(c, err)
	}
	args := c.args
	if args == nil {
		b, err := json.Marshal(c.req.Args)
		if err != nil {
			return nil, s.ledgerError(c, err)
		}
		args = b
	}
	cur, err := cr.Current(ctx, c.actor.Tenant, args)
	if err != nil {
		var ae *orders.APIError
		if errors.As(err, &ae) && ae.Status == 404 {
			return nil, errorResponse(c.req.OperationKey, ledger.StateRejected, CodeNotFound,
				"What this call would change does not exist at "+op.Downstream()+" ("+ae.Error()+"). Nothing was recorded; check the arguments and call again with the same operation_key.", NextFixRetry)
		}
		return nil, errorResponse(c.req.OperationKey, ledger.StateRejected, CodeDownstreamError,
			"The current state could not be read from "+op.Downstream()+" ("+err.Error()+"). Nothing was recorded or sent; call again with the same operation_key shortly.", NextFixRetry)
	}
	return cur, nil
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
	kind := op.Noun()
	if r, ok := op.(interface {
		Recipient(args map[string]any) string
	}); ok {
		if who := r.Recipient(args); who != "" {
			kind += " for " + who
		}
	}
	return proposal{diff: approvals.CreateDiff(kind, preview)}
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
