package tools

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/uuid"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/orders"
	"idemgate/schemas"
)

// fakeOp is a RemoteOp whose sends all lose their answer after the effect
// (indeterminate) and whose lookup finds what was sent.
type fakeOp struct {
	mu    sync.Mutex
	sent  map[string]int
	found bool
}

func (f *fakeOp) Downstream() string { return "declared fake_transfer http://fake" }
func (f *fakeOp) Noun() string       { return "transfer" }
func (f *fakeOp) SafeRetry() bool    { return true }
func (f *fakeOp) Facts(json.RawMessage) (approvals.Facts, error) {
	return approvals.Facts{ThresholdMinor: -1}, nil
}
func (f *fakeOp) Send(_ context.Context, tenant, ref string, _ json.RawMessage, _ string) (*RemoteResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent[orders.IdempotencyKey(tenant, ref)]++
	return nil, &orders.APIError{Class: orders.Indeterminate, Msg: "connection reset"}
}
func (f *fakeOp) Lookup(context.Context, string, string, json.RawMessage) (*RemoteResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.found {
		return nil, &orders.APIError{Class: orders.Indeterminate, Status: 503, Msg: "down"}
	}
	return &RemoteResult{Resource: json.RawMessage(`{"id":"tr_7","amount":5}`), ID: "tr_7"}, nil
}

func declaredService(t *testing.T, op RemoteOp) *Service {
	t.Helper()
	schema, err := schemas.CheckRules([]byte(`{"type":"object","additionalProperties":false,"required":["amount"],"properties":{"amount":{"type":"integer","minimum":1,"maximum":1000}}}`))
	if err != nil {
		t.Fatal(err)
	}
	v, err := schemas.NewWith(fstest.MapFS{"fake_transfer.json": {Data: schema}})
	if err != nil {
		t.Fatal(err)
	}
	store, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	svc, err := New(store, v, Options{OutboxDir: t.TempDir(), CallTimeout: time.Second, Lease: time.Second,
		Declared: []Declared{{Spec: Spec{Name: "fake_transfer", Idempotent: true, InputSchema: schema}, Op: op}}})
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// TestDeclaredResolvedByHand: an unknown operation of a declared tool,
// whose lookup cannot tell, resolved by an approver as succeeded, keeps
// the shape its other outcomes have — the resource under the tool's noun,
// read by the lookup once it answers — with the resolution beside it;
// nothing is sent again.
func TestDeclaredResolvedByHand(t *testing.T) {
	op := &fakeOp{sent: map[string]int{}}
	svc := declaredService(t, op)
	ctx := context.Background()
	key := uuid.NewString()
	args := map[string]any{"operation_key": key, "amount": 5}
	if r := svc.Call(ctx, agent, "fake_transfer", args, nil); r.Status != ledger.StateUnknown {
		t.Fatalf("first call: %+v", r)
	}
	if r := svc.Call(ctx, agent, "fake_transfer", args, nil); r.Status != ledger.StateUnknown {
		t.Fatalf("with the lookup down: %+v", r)
	}
	op.mu.Lock()
	op.found = true
	op.mu.Unlock()
	r := svc.Resolve(ctx, approver, ResolveRequest{OperationKey: key, Outcome: "succeeded", Evidence: "seen in the bank's portal"})
	if r.IsError || r.Status != ledger.StateSucceeded {
		t.Fatalf("resolve: %+v %+v", r, r.Error)
	}
	var res struct {
		Transfer   *struct{ ID string }       `json:"transfer"`
		Resolution map[string]json.RawMessage `json:"resolution"`
	}
	if err := json.Unmarshal(r.Result, &res); err != nil || res.Transfer == nil || res.Transfer.ID != "tr_7" || res.Resolution["evidence"] == nil {
		t.Errorf("resolved result %s: want the transfer and the resolution", r.Result)
	}
	if n := len(op.sent); n != 1 {
		t.Errorf("sent %v, want one key sent once", op.sent)
	}
	for k, c := range op.sent {
		if c != 1 {
			t.Errorf("%s sent %d times", k, c)
		}
	}
}
