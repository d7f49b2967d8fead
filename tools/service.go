// Package tools implements idemgate's tools: each one turns validated
// arguments into a ledger claim, runs the downstream side effect at most
// once, and answers with the result envelope of DESIGN §4. It knows nothing
// of MCP: the server package maps Specs and Responses onto the protocol.
package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"
	"golang.org/x/sync/singleflight"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/orders"
	"idemgate/outbox"
	"idemgate/schemas"
	"idemgate/telemetry"
)

// Options configure a Service. Zero values take the defaults.
type Options struct {
	// WaitInProgress bounds how long a duplicate waits for a running
	// operation before answering in_progress.
	WaitInProgress time.Duration // default 5s
	// Policy decides approvals and denials (approvals.Default() when nil).
	Policy *approvals.Policy
	// OrdersAPI, when set, is where orders live instead of the embedded
	// store (orders.API, the HTTP order API).
	OrdersAPI RemoteOrders
	// Lease is the ledger's lease; external calls renew it at a third.
	Lease time.Duration // default 30s
	// CallTimeout bounds one external downstream call.
	CallTimeout time.Duration // default 10s
	// OutboxDir is where the directory sink writes one file per message.
	OutboxDir string
	// Sink, when set, replaces the directory sink (the webhook sink).
	Sink outbox.Sink
	// NoticeSink, when set, reaches approvers: every new approval request
	// queues a notice (outbox channel approval_notice) in the transaction
	// that records it, delivered here. Unset, no notice is queued, and a
	// notice another process queued fails here (outbox.UnconfiguredSink)
	// rather than reach Sink.
	NoticeSink outbox.Sink
	// ConsoleURL is the console's public URL, the base of the notices'
	// links (approvals.CheckPublicURL); required with NoticeSink.
	ConsoleURL string
	Logger     *slog.Logger
	// Telemetry, when set, traces the calls (see trace.go): the server
	// puts each call under its MCP request's span, and the service adds
	// its attributes and the spans of the ledger, the wait and the order
	// API. nil: off, at no cost. The downstreams' HTTP transports are
	// wrapped by whoever builds them (Telemetry.Transport).
	Telemetry *telemetry.Provider
	// Declared are the side-effecting tools declared in configuration
	// (package declared): each goes through the same path as an order
	// tool over the order API. Their input schemas must be known to the
	// Validator given to New (schemas.NewWith).
	Declared []Declared
}

// Service runs the tools against one ledger.
type Service struct {
	ledger  ledger.Store
	schemas *schemas.Validator
	opts    Options
	log     *slog.Logger
	tracer  trace.Tracer // nil: not traced
	outbox  *outbox.Deliverer
	policy  approvals.Policy
	// orders is where orders live: local (the embedded store, writes in
	// the ledger's transaction) or remote (the order API); exactly one of
	// local and remote is set, and is orders.
	orders Orders
	local  LocalOrders
	remote RemoteOrders
	// sweepAfter is where the next Sweep pass continues in the unknown
	// records; only the sweeping goroutine touches it.
	sweepAfter string
	// reconciling coalesces reconciliations of one (tenant, key);
	// lookups logs outages of the order API's lookup (external.go).
	reconciling singleflight.Group
	// flights counts the reconciliations running detached from their
	// callers; Close waits for them. flightsMu orders flights.Add against
	// Close, which sets closed.
	flights   sync.WaitGroup
	flightsMu sync.Mutex
	closed    bool
	lookups   lookupHealth
	tools     map[string]descriptor
	// hasDeclared: some tool is declared (its operations may be unknown
	// and are reconciled by Sweep, with or without an order API).
	hasDeclared bool
	// prepared is how the latest side-effecting calls' arguments were
	// prepared (prepare.go).
	prepared preparedCalls
}

// registry lists every tool's descriptor. Adding a tool is its own file
// (spec, typed arguments, handler and, for a side-effecting tool, its
// effect and policy facts), its input schema schemas/<name>.json (the
// published contract, which stays with the other schemas: see
// docs/development.md, "Adding a tool"), and one line here.
func registry() []descriptor {
	return []descriptor{
		createOrderTool(),
		sendNotificationTool(),
		getOrderTool(),
		listOrdersTool(),
		newOperationKeyTool(),
		getOperationStatusTool(),
		updateOrderTool(),
		cancelOrderTool(),
		listPendingApprovalsTool(),
		decideApprovalTool(),
		reconcileOperationTool(),
		resolveOperationTool(),
	}
}

// Spec describes a tool for registration: name, texts and the behaviour
// hints every MCP client shows or relies on. Each hint is set deliberately.
type Spec struct {
	Name         string
	ApproverOnly bool // listed and callable only for the approver role
	Title        string
	Description  string
	ReadOnly     bool
	Destructive  bool
	Idempotent   bool
	OpenWorld    bool
	// InputSchema is the published input schema of a declared tool; nil
	// for a built-in one, whose schema is schemas.InputSchema(Name).
	InputSchema json.RawMessage
}

// call is one tool call in progress.
type call struct {
	actor    ledger.Actor
	req      *schemas.Request
	progress Progress
	started  time.Time
	// policy is the policy's verdict, for the audit (zero: not evaluated).
	policy approvals.Verdict
	// refused is set when the call was refused before the ledger was asked.
	refused *refusal
	// args is c.req.Args as JSON (nil: not yet), kept from preparing
	// them or decoding them, and decoded those bytes as the tool's
	// argument type (nil: not yet).
	args    json.RawMessage
	decoded any
	// early is the answer given to the ledger for its decision's audit
	// entry (answerFor); nil when none was asked for.
	early *early
	// traced is what a traced call notes for its span; nil when the
	// service does not trace. A pointer: executeExternal works on a copy
	// of the call.
	traced *traced
}

// Progress reports progress of a long call to the client (MCP progress
// notifications); it is a no-op when the client did not ask for progress.
type Progress func(progress, total float64, message string)

// New returns a Service. The deliverer of the outbox is started by Run.
func New(store ledger.Store, v *schemas.Validator, opts Options) (*Service, error) {
	ts := registry()
	for _, d := range opts.Declared {
		ts = append(ts, declaredTool(d))
	}
	return newWith(store, v, opts, ts)
}

// newWith is New with the tools ts (registry's, or a test's with its
// own), each checked: a name of its own, an input schema v knows, and —
// for a side-effecting tool — a downstream named.
func newWith(store ledger.Store, v *schemas.Validator, opts Options, ts []descriptor) (*Service, error) {
	if v == nil {
		return nil, errors.New("tools: a schemas.Validator is required")
	}
	if opts.WaitInProgress <= 0 {
		opts.WaitInProgress = 5 * time.Second
	}
	if opts.Lease <= 0 {
		opts.Lease = 30 * time.Second
	}
	if opts.CallTimeout <= 0 {
		opts.CallTimeout = 10 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	sink := opts.Sink
	if sink == nil {
		if opts.OutboxDir == "" {
			return nil, errors.New("tools: OutboxDir or Sink is required")
		}
		dir, err := outbox.NewDirSink(opts.OutboxDir)
		if err != nil {
			return nil, err
		}
		sink = dir
	}
	if opts.NoticeSink != nil && opts.ConsoleURL == "" {
		return nil, errors.New("tools: NoticeSink needs ConsoleURL, the base of the notices' links")
	}
	sink = routeNotices(sink, opts.NoticeSink)
	s := &Service{ledger: store, schemas: v, opts: opts, log: opts.Logger, policy: approvals.Default(), tracer: opts.Telemetry.Tracer()}
	if opts.OrdersAPI != nil {
		s.orders, s.remote = opts.OrdersAPI, opts.OrdersAPI
	} else {
		embedded := orders.NewEmbedded(store)
		s.orders, s.local = embedded, embedded
	}
	if opts.Policy != nil {
		s.policy = *opts.Policy
	}
	s.outbox = outbox.NewDeliverer(store, sink, opts.Logger)
	// A message is claimed by one deliverer for the ledger's lease (at
	// least 5 s), as an operation is owned by one executor.
	s.outbox.ClaimLease = max(opts.Lease, 5*time.Second)
	s.tools = map[string]descriptor{}
	known := v.Tools()
	for _, t := range ts {
		if !slices.Contains(known, t.Name) {
			return nil, fmt.Errorf("tools: no schema for tool %q", t.Name)
		}
		if _, dup := s.tools[t.Name]; dup {
			return nil, fmt.Errorf("tools: tool %q registered twice", t.Name)
		}
		if e := t.effect; e != nil && !e.onOrders() && e.writesTo() == "" {
			return nil, fmt.Errorf("tools: tool %q names no downstream for its effect", t.Name)
		}
		s.tools[t.Name] = t
		if _, ok := t.effect.(declaredEffect); ok {
			s.hasDeclared = true
		}
	}
	return s, nil
}

// effectOf is the side effect of the tool named tool, nil when it has
// none (or there is no such tool).
func (s *Service) effectOf(tool string) effect {
	return s.tools[tool].effect
}

// human is what answers call one operation of tool ("order").
func (s *Service) human(tool string) string {
	if e := s.effectOf(tool); e != nil && e.human() != "" {
		return e.human()
	}
	return tool
}

// Screen reads a call's arguments token by token, before anything decodes
// them, and returns the refusal the tool's schema gives them when it can
// tell one without decoding (schemas.Validator.Screen); Call, given it as
// the arguments, answers with that refusal. nil: Call decides.
func (s *Service) Screen(tool string, args schemas.TokenSource) *schemas.Screened {
	return s.schemas.Screen(tool, args)
}

// Specs lists the tools, sorted by name.
func (s *Service) Specs() []Spec {
	out := make([]Spec, 0, len(s.tools))
	for _, t := range s.tools {
		out = append(out, t.Spec)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Deliverer is the outbox deliverer the server runs in the background.
func (s *Service) Deliverer() *outbox.Deliverer { return s.outbox }

// Call runs one tool call for actor. It never returns nil and never panics
// into the caller: a panic becomes an internal-error Response. Arguments are
// validated before anything touches the ledger, so invalid calls leave no
// record and the key may be reused with corrected arguments. Every call of a
// side-effecting tool, and every refusal, ends with an audit entry of what
// was answered (see audit). args are the arguments decoded (a
// map[string]any, as an MCP library gives them) or as JSON
// (json.RawMessage, as the client sent them).
func (s *Service) Call(ctx context.Context, actor ledger.Actor, name string, args any, progress Progress) (resp *Response) {
	t, ok := s.tools[name]
	if !ok {
		return errorResponse("", ledger.StateRejected, CodeInvalidArguments, fmt.Sprintf("there is no tool named %q", name), NextFixRetry)
	}
	c := &call{actor: actor, progress: progress, started: time.Now()}
	if s.tracer != nil {
		c.traced = &traced{span: trace.SpanFromContext(ctx)}
	}
	defer s.finish(c, name, t.ReadOnly, t.effect != nil, &resp)
	var req *schemas.Request
	var err error
	if t.effect != nil { // retried with the same arguments by design
		req, c.args, err = s.prepared.prepare(s.schemas, name, args)
	} else {
		req, err = s.schemas.Prepare(name, args)
	}
	if err != nil {
		var ve *schemas.ValidationError
		if !errors.As(err, &ve) {
			s.log.Error("prepare arguments", "tool", name, "err", err)
			return internalError("")
		}
		key := operationKeyOf(args)
		c.refused = &refusal{code: CodeInvalidArguments, detail: ve.Error(), key: key}
		msg := "The arguments were refused: " + ve.Error() + ". Fix them and call again."
		next := NextFixRetry
		switch {
		case keyRefused(ve):
			// Reusing a refused key can never work: point at a fresh one.
			key = ""
			msg = "The arguments were refused and nothing was recorded or executed: " + ve.Error() +
				". Get a fresh key for this intent from new_operation_key, then call again with it (and reuse that key on every retry)."
			next = NextNewKey
		case !t.ReadOnly:
			msg = "The arguments were refused and nothing was recorded or executed: " + ve.Error() + ". Fix them and call again with the same operation_key."
		}
		r := errorResponse(key, ledger.StateRejected, CodeInvalidArguments, msg, next)
		r.Error.Details = mustJSON(map[string]any{"problems": ve.Problems})
		return r
	}
	if c.progress == nil {
		c.progress = func(float64, float64, string) {}
	}
	c.req = req
	return t.run(s, ctx, c)
}

// operationKeyOf is the operation_key string among arguments as Call
// takes them (a decoded map, or JSON), "" when there is none or it is
// longer than a key can be.
func operationKeyOf(args any) string {
	var key string
	switch a := args.(type) {
	case map[string]any:
		key, _ = a["operation_key"].(string)
	case *schemas.Screened:
		key = a.OperationKey
	case json.RawMessage:
		var m map[string]any // the exact name, as in a decoded map
		if json.Unmarshal(a, &m) == nil {
			key, _ = m["operation_key"].(string)
		}
	}
	if len(key) > 64 {
		return ""
	}
	return key
}

// finish ends a call (deferred by Call): a panic becomes an internal-error
// answer in *resp, and the call is audited with its answer (and its span
// annotated, when traced).
func (s *Service) finish(c *call, name string, readOnly, sideEffect bool, resp **Response) {
	if r := recover(); r != nil {
		s.log.Error("tool panicked", "tool", name, "panic", r)
		*resp = internalError("")
	}
	s.audit(c, name, readOnly, *resp)
	c.annotate(sideEffect, *resp)
}

// keyRefused reports whether the operation key itself was refused
// (missing, malformed or a placeholder).
func keyRefused(ve *schemas.ValidationError) bool {
	for _, p := range ve.Problems {
		if p.Path == "operation_key" {
			return true
		}
	}
	return slices.Contains(ve.Missing, "operation_key")
}

// proposal is what an approver would be shown for a call.
type proposal struct {
	diff            approvals.Diff
	resourceVersion int
	// resource is what the operation acts on as it is now (the order a
	// change or a cancel is asked for), kept on the approval as
	// ledger.Approval.Resource; nil for none.
	resource any
	// total is the order total the approvers' notice shows, when the
	// policy's facts have none (a change or a cancel).
	total *approvals.Total
}

// execute runs a side-effecting call: the policy may deny it (forbidden,
// no record) or hold it for approval; otherwise the ledger claims it and
// runs its applier at most once (embedded downstreams: claim, effect and
// outcome in one transaction). Duplicates get the recorded answer.
//
// propose (nil: an empty proposal) builds what an approver is shown; it
// and the effect's applier are built only when the ledger needs them — a
// new claim held for approval, a claim that runs — so a replay, which
// needs neither, pays for neither.
func (s *Service) execute(ctx context.Context, c *call, propose func() proposal) *Response {
	key := c.req.OperationKey
	eff := s.effectOf(c.req.Tool)
	if eff == nil {
		s.log.Error("no effect for a side-effecting call", "tool", c.req.Tool)
		return internalError(key)
	}
	args, decoded := c.args, c.decoded
	if args == nil {
		b, err := json.Marshal(c.req.Args)
		if err != nil {
			return s.ledgerError(c, err)
		}
		args, decoded = b, nil
	}
	facts, err := eff.policyFacts(args, decoded)
	if err != nil {
		return s.ledgerError(c, err)
	}
	v := s.policy.Evaluate(c.actor.Principal, c.req.Tool, facts)
	c.policy = v
	if v.Action == approvals.Deny {
		c.refused = &refusal{code: CodeForbidden, detail: v.Rule + ": " + v.Reason, key: key}
		return errorResponse(key, ledger.StateRejected, CodeForbidden,
			"Refused by policy ("+v.Rule+"): "+v.Reason+". Nothing was recorded or executed; do not retry this request under any key.", NextDoNotRetry)
	}
	tenant := c.actor.Tenant
	var total *approvals.Total
	if facts.HasAmount {
		total = &approvals.Total{AmountMinor: facts.Amount, Currency: facts.Currency}
	}
	apply := audited(s.downstream(c.req.Tool), func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		run, err := eff.applier(s, tenant, args, decoded)
		if err != nil {
			return ledger.Outcome{}, err // rolls the claim back: nothing is recorded
		}
		return run(tx, rec)
	})
	claim := ledger.Claim{
		Actor: c.actor, Key: key, Tool: c.req.Tool, Fingerprint: c.req.Fingerprint,
		OnLeaseExpiry:     ledger.StateRetryable,
		SuspectDuplicates: s.policy.SuspectedDuplicates,
		RequireApproval:   v.Action == approvals.Approve,
		BuildProposal: func() *ledger.Approval {
			var p proposal
			if propose != nil {
				p = propose()
			}
			if p.total != nil {
				total = p.total
			}
			diff, _ := json.Marshal(p.diff.Changes)
			var resource json.RawMessage
			if p.resource != nil {
				resource, _ = json.Marshal(p.resource)
			}
			return &ledger.Approval{Reason: v.Reason, Rule: v.Rule, Diff: diff, DiffText: p.diff.Text, ResourceVersion: p.resourceVersion, Resource: resource}
		},
		Args:         args,
		PolicyRule:   v.Rule,
		PolicyAction: v.Action,
		Downstream:   s.downstream(c.req.Tool),
		OnHeld:       s.heldNotice(func() *approvals.Total { return total }),
	}
	if run, ok, err := s.external(c.req.Tool, c.actor.Tenant, args); ok {
		if err != nil {
			return s.ledgerError(c, err)
		}
		claim.Answer = s.answerFor(c, externalFinal)
		return s.executeExternal(ctx, c, claim, run)
	}
	// Every decision but a busy one (waited for below) is answered as it
	// is: its audit entry carries the answer.
	claim.Answer = s.answerFor(c, func(d ledger.Decision) bool { return d.Kind != ledger.DecisionBusy })
	lctx, span := s.startSpan(ctx, "ledger execute")
	d, err := s.ledger.Execute(lctx, claim, apply)
	endLedgerSpan(span, d, err)
	if err != nil {
		return s.ledgerError(c, err)
	}
	c.noteBefore(d)
	switch d.Kind {
	case ledger.DecisionExecuted, ledger.DecisionApprovalRequested, ledger.DecisionSuspectedDuplicate:
		s.outbox.Kick() // a confirmation, or an approvers' notice, is queued
	case ledger.DecisionBusy:
		rec, err := s.waitForOutcome(ctx, c, d.Record)
		if err != nil {
			return s.ledgerError(c, err)
		}
		return s.respond(decisionFor(rec))
	}
	if r := c.answered(d); r != nil {
		return r
	}
	return s.respond(d)
}

// waitForOutcome waits for a running operation until it leaves
// in_progress or WaitInProgress passes, reporting progress meanwhile, and
// returns the record as it then stands. Only a final record is a replay;
// the caller decides what an unknown or retryable one means. Over a store
// that can be watched (ledger.Watcher) the wait is woken by the commit
// that changes the record — on a PostgreSQL ledger, in whichever replica
// it happens — and re-reads it then, or on the store's slow safety poll;
// over any other store it re-reads every 20 ms.
func (s *Service) waitForOutcome(ctx context.Context, c *call, rec *ledger.Record) (_ *ledger.Record, err error) {
	ctx, span := s.startSpan(ctx, "wait for outcome")
	defer func() { endRecordSpan(span, rec, err) }()
	wait := s.opts.WaitInProgress
	deadline := time.Now().Add(wait)
	watcher, _ := s.ledger.(ledger.Watcher)
	poll := 20 * time.Millisecond
	var changed <-chan struct{} // nil (never ready) without a watcher
	stop := func() {}
	defer func() { stop() }()
	// read re-reads the record, watching it first so that a commit
	// between the read and the wait still wakes the wait.
	read := func() error {
		if watcher != nil {
			stop()
			changed, stop = watcher.Watch(c.actor.Tenant, c.req.OperationKey)
		}
		var r *ledger.Record
		var err error
		if watcher != nil {
			r, err = watcher.GetWatched(ctx, c.actor.Tenant, c.req.OperationKey)
		} else {
			r, err = s.ledger.Get(ctx, c.actor.Tenant, c.req.OperationKey)
		}
		if err == nil {
			rec = r
		}
		return err
	}
	if watcher != nil {
		poll = watcher.WaitPoll()
		if err := read(); err != nil {
			return nil, err
		}
	}
	var wakes, polls int // how each re-read came about, for the debug log
	last := "first read"
	nextPoll := time.Now().Add(poll)
	lastReport := time.Time{}
	for rec.State == ledger.StateInProgress && time.Now().Before(deadline) {
		if time.Since(lastReport) >= 250*time.Millisecond {
			waited := wait - time.Until(deadline)
			c.progress(waited.Seconds(), wait.Seconds(), "another call with this operation_key is running; waiting for its outcome")
			lastReport = time.Now()
		}
		next := min(time.Until(nextPoll), 250*time.Millisecond-time.Since(lastReport), time.Until(deadline))
		timer := time.NewTimer(max(next, 0))
		select {
		case <-ctx.Done():
			timer.Stop()
			return rec, nil
		case <-changed:
			wakes, last = wakes+1, "woken"
		case <-timer.C:
			if time.Now().Before(nextPoll) {
				continue // time to report progress, or the deadline: not to read
			}
			polls, last = polls+1, "polled"
		}
		timer.Stop()
		nextPoll = time.Now().Add(poll)
		if err := read(); err != nil {
			return nil, err
		}
	}
	s.log.Debug("waited for a running operation", "key", c.req.OperationKey, "state", rec.State, "last_read", last, "woken", wakes, "polled", polls)
	return rec, nil
}

// decisionFor is how a call answers a record it did not run itself.
func decisionFor(rec *ledger.Record) ledger.Decision {
	switch {
	case rec.Tombstone:
		return ledger.Decision{Kind: ledger.DecisionExpired, Record: rec}
	case rec.State.Final():
		return ledger.Decision{Kind: ledger.DecisionReplay, Record: rec}
	case rec.State == ledger.StateInProgress:
		return ledger.Decision{Kind: ledger.DecisionBusy, Record: rec}
	}
	return ledger.Decision{Kind: ledger.DecisionHeld, Record: rec}
}

// downstream names where tool's side effect goes from this process: for
// an order tool the order system's name (the embedded store, or the order
// API at its base URL), for another the one its descriptor names
// (notifications: the outbox); "" for no such tool.
func (s *Service) downstream(tool string) string {
	e := s.effectOf(tool)
	switch {
	case e == nil:
		return ""
	case e.onOrders():
		return s.orders.Downstream()
	}
	return e.writesTo()
}

// ledgerError maps a ledger error to a response; unknown errors are logged
// whole and answered as internal.
func (s *Service) ledgerError(c *call, err error) *Response {
	return s.failed(c.req.Tool, c.req.OperationKey, err)
}

// failed is ledgerError for a call of tool about key ("" for none).
func (s *Service) failed(tool, key string, err error) *Response {
	switch {
	case errors.Is(err, ledger.ErrKeyNotIssued):
		return errorResponse(key, ledger.StateRejected, CodeInvalidArguments,
			"This server only accepts operation keys issued by new_operation_key, and this key was not issued to you. Call new_operation_key once for this intent and reuse that key on every retry.",
			NextFixRetry)
	case errors.Is(err, ledger.ErrDownstreamMismatch):
		s.log.Error("downstream mismatch", "tool", tool, "key", key, "err", err)
		var dm *ledger.DownstreamMismatchError
		what := "the operation belongs to another downstream than this process's"
		if errors.As(err, &dm) {
			what = "the operation belongs to " + dm.Recorded + ", this process is configured for " + dm.Configured
		}
		return errorResponse(key, ledger.StateRejected, CodeInternal,
			"Nothing was run: "+what+
				". The server handling this call is configured for a different order system than the one this operation was recorded for; an operator must fix the configuration (--orders-api / --config).",
			NextDoNotRetry)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return errorResponse(key, ledger.StateInProgress, CodeInProgress,
			"The call was cancelled before the ledger answered. Nothing is lost: call get_operation_status with this operation_key, or call again with the same key and arguments.",
			NextWaitPoll)
	}
	s.log.Error("ledger", "tool", tool, "key", key, "err", err)
	return internalError(key)
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only called with values built here
	}
	return b
}

// Close waits for the work the service runs detached from its callers (a
// reconciliation whose caller gave up, bounded by the order API's timeout)
// and refuses new such work, so the caller may then close the ledger:
// nothing the service started writes to a closed store. Calls made after
// Close that need such work answer with an internal error.
func (s *Service) Close() {
	s.flightsMu.Lock()
	s.closed = true
	s.flightsMu.Unlock()
	s.flights.Wait()
}

// startFlight registers one detached run; false after Close.
func (s *Service) startFlight() bool {
	s.flightsMu.Lock()
	defer s.flightsMu.Unlock()
	if s.closed {
		return false
	}
	s.flights.Add(1)
	return true
}
