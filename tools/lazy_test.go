package tools

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

	"idemgate/ledger"
)

// countingEffect counts how often a tool's applier is built.
type countingEffect struct {
	effect
	built *atomic.Int64
}

func (e countingEffect) applier(s *Service, tenant string, args json.RawMessage, decoded any) (ledger.ApplyFunc, error) {
	e.built.Add(1)
	return e.effect.applier(s, tenant, args, decoded)
}

func countApplier(svc *Service, tool string) *atomic.Int64 {
	n := new(atomic.Int64)
	d := svc.tools[tool]
	d.effect = countingEffect{effect: d.effect, built: n}
	svc.tools[tool] = d
	return n
}

// A replay builds no applier: it is built when the ledger runs the claim,
// not before the ledger is asked (issue 12, cheaper calls).
func TestReplayBuildsNoApplier(t *testing.T) {
	ctx := context.Background()
	svc := newService(t, nil, nil)
	built := countApplier(svc, "create_order")
	args := orderArgs(uuid.NewString(), 2)
	first := svc.Call(ctx, agent, "create_order", args, nil)
	if first.IsError || first.Replayed {
		t.Fatalf("first call = %+v", first)
	}
	if n := built.Load(); n != 1 {
		t.Fatalf("the first call built the applier %d times, want 1", n)
	}
	for range 3 {
		if r := svc.Call(ctx, agent, "create_order", args, nil); !r.Replayed || r.Status != first.Status || string(r.Result) != string(first.Result) {
			t.Fatalf("replay = %+v, want the first answer replayed", r)
		}
	}
	if n := built.Load(); n != 1 {
		t.Fatalf("3 replays built the applier: %d builds in all, want 1 (the first call's)", n)
	}
}

// proposalSpy counts how often the ledger has a claim's proposal built.
type proposalSpy struct {
	ledger.Store
	built atomic.Int64
}

func (p *proposalSpy) wrap(c ledger.Claim) ledger.Claim {
	if build := c.BuildProposal; build != nil {
		c.BuildProposal = func() *ledger.Approval { p.built.Add(1); return build() }
	}
	return c
}

func (p *proposalSpy) Execute(ctx context.Context, c ledger.Claim, apply ledger.ApplyFunc) (ledger.Decision, error) {
	return p.Store.Execute(ctx, p.wrap(c), apply)
}

func (p *proposalSpy) Claim(ctx context.Context, c ledger.Claim) (ledger.Decision, error) {
	return p.Store.Claim(ctx, p.wrap(c))
}

// The approval diff is built only when a claim is held for approval — and
// then it is what it always was; a replay, and a call that runs, build
// none.
func TestProposalBuiltOnlyWhenHeld(t *testing.T) {
	ctx := context.Background()
	base := newService(t, nil, nil)
	spy := &proposalSpy{Store: base.ledger}
	svc, err := New(spy, base.schemas, Options{OutboxDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	small := orderArgs(uuid.NewString(), 2)
	if r := svc.Call(ctx, agent, "create_order", small, nil); r.IsError {
		t.Fatalf("small order = %+v", r)
	}
	svc.Call(ctx, agent, "create_order", small, nil)
	if n := spy.built.Load(); n != 0 {
		t.Fatalf("an order that ran, and its replay, built %d proposals, want 0", n)
	}
	key := uuid.NewString()
	big := orderArgs(key, 1000) // 1000 × 500 = 500 000: held for approval
	held := svc.Call(ctx, agent, "create_order", big, nil)
	if held.Status != ledger.StateAwaitingApproval {
		t.Fatalf("large order = %+v, want awaiting_approval", held)
	}
	again := svc.Call(ctx, agent, "create_order", big, nil)
	if again.Status != ledger.StateAwaitingApproval {
		t.Fatalf("retry of the held order = %+v", again)
	}
	if n := spy.built.Load(); n != 1 {
		t.Fatalf("a held order and its retry built %d proposals, want 1", n)
	}
	rec, err := spy.Get(ctx, agent.Tenant, key)
	if err != nil {
		t.Fatal(err)
	}
	a := rec.Approval
	const wantDiff = `[{"path":"currency","before":null,"after":"EUR"},{"path":"customer_id","before":null,"after":"c1"},{"path":"items","before":null,"after":[{"quantity":1000,"sku":"s1","unit_price_minor":500}]},{"path":"notify_customer","before":null,"after":true},{"path":"total_minor","before":null,"after":500000}]`
	const wantText = "create order:\n  + currency: \"EUR\"\n  + customer_id: \"c1\"\n  + items: [{\"quantity\":1000,\"sku\":\"s1\",\"unit_price_minor\":500}]\n  + notify_customer: true\n  + total_minor: 500000\n"
	if string(a.Diff) != wantDiff || a.DiffText != wantText || a.Rule == "" || a.Reason == "" {
		t.Fatalf("held approval: rule %q reason %q\ndiff %s\ntext %q\nwant diff %s\ntext %q", a.Rule, a.Reason, a.Diff, a.DiffText, wantDiff, wantText)
	}
}

// A replay's "call" audit entry leaves out what the operation's transition
// entries already hold — its fingerprint, its state before (= after) and
// its downstream — and keeps the rest.
func TestReplayCallEntryIsLean(t *testing.T) {
	ctx := context.Background()
	svc := newService(t, nil, nil)
	key := uuid.NewString()
	args := orderArgs(key, 2)
	svc.Call(ctx, agent, "create_order", args, nil)
	if r := svc.Call(ctx, agent, "create_order", args, nil); !r.Replayed {
		t.Fatalf("second call = %+v, want a replay", r)
	}
	var call *ledger.AuditEntry
	deadline := time.Now().Add(5 * time.Second)
	for call == nil && time.Now().Before(deadline) {
		entries, err := svc.ledger.AuditTail(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		for i := range entries {
			if entries[i].Event == "call" && entries[i].Decision == ledger.AuditDecision(ledger.DecisionReplay) {
				call = &entries[i]
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if call == nil {
		t.Fatal("no replay call entry was written")
	}
	if call.Fingerprint != "" || call.StateBefore != "" || call.Downstream != "" {
		t.Errorf("replay entry repeats the operation's fingerprint %q, state_before %q, downstream %q", call.Fingerprint, call.StateBefore, call.Downstream)
	}
	if call.Key != key || call.Tool != "create_order" || call.StateAfter != ledger.StateSucceeded || call.Attempt != 1 ||
		call.PolicyRule == "" || call.PolicyAction == "" || call.Actor.Principal != agent.Principal {
		t.Errorf("replay entry lost a field: %+v", call)
	}
}

// The arguments a call decoded are what the policy and the applier see:
// decodeOnce gives them back, and decodes the saved bytes when it is given
// none, or a value of another type.
func TestDecodeOnce(t *testing.T) {
	e := &sideEffect[createOrderArgs]{}
	args := json.RawMessage(`{"customer_id":"c-1","currency":"EUR","items":[{"sku":"A","quantity":2,"unit_price_minor":150}],"notify_customer":true}`)
	fromBytes, err := e.decodeOnce(args, nil)
	if err != nil || fromBytes.CustomerID != "c-1" || len(fromBytes.Items) != 1 || !fromBytes.NotifyCustomer {
		t.Fatalf("decodeOnce(args, nil) = %+v, %v", fromBytes, err)
	}
	decoded := createOrderArgs{CustomerID: "c-2"}
	if got, _ := e.decodeOnce(args, decoded); got.CustomerID != "c-2" {
		t.Errorf("decodeOnce with the call's decoded arguments = %+v, want them", got)
	}
	if got, _ := e.decodeOnce(args, sendNotificationArgs{}); got.CustomerID != "c-1" {
		t.Errorf("decodeOnce with another tool's arguments = %+v, want the bytes decoded", got)
	}
}

// Arguments given as the client's JSON are the same request as the same
// arguments decoded: a call with the JSON (other key order, another
// spelling of a number) replays the order placed with the map, and a
// refusal of JSON arguments still names their operation_key.
func TestCallWithRawArguments(t *testing.T) {
	ctx := context.Background()
	svc := newService(t, nil, nil)
	key := uuid.NewString()
	first := svc.Call(ctx, agent, "create_order", orderArgs(key, 2), nil)
	if first.IsError {
		t.Fatalf("first call = %+v", first)
	}
	raw := json.RawMessage(`{"items":[{"unit_price_minor":5e2,"quantity":2.0,"sku":"s1"}],"currency":"EUR","customer_id":"c1","operation_key":"` + key + `"}`)
	r := svc.Call(ctx, agent, "create_order", raw, nil)
	if !r.Replayed || string(r.Result) != string(first.Result) {
		t.Fatalf("the same arguments as JSON = %+v, want the first answer replayed", r)
	}
	bad := json.RawMessage(`{"operation_key":"` + uuid.NewString() + `","customer_id":"c-1","currency":"EUR","items":"none"}`)
	var badKey struct {
		Key string `json:"operation_key"`
	}
	json.Unmarshal(bad, &badKey)
	if r := svc.Call(ctx, agent, "create_order", bad, nil); r.Error == nil || r.Error.Code != string(CodeInvalidArguments) || r.OperationKey != badKey.Key {
		t.Fatalf("invalid JSON arguments = %+v, want invalid_arguments naming key %s", r, badKey.Key)
	}
}
