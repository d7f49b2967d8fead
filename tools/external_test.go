package tools

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/schemas"
)

// miniAPI is a minimal order API: it commits orders by Idempotency-Key and
// can be told to hang after committing (the reply is lost to a timeout).
type miniAPI struct {
	mu          sync.Mutex
	byKey       map[string]string // idempotency key → order JSON
	creates     int               // real side effects
	hangNext    bool
	absentNext  bool // the next POST fails with 500 before committing
	lookupCalls int
}

func (a *miniAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := r.Header.Get("Idempotency-Key")
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/orders":
		if a.absentNext {
			a.absentNext = false
			http.Error(w, "boom before commit", 500)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var args map[string]any
		json.Unmarshal(body, &args)
		if o, ok := a.byKey[key]; ok {
			io.WriteString(w, o)
			return
		}
		a.creates++
		o := `{"order_id":"ext-` + key[len(key)-8:] + `","version":1,"status":"placed","customer_id":"` + args["customer_id"].(string) + `"}`
		a.byKey[key] = o
		if a.hangNext {
			a.hangNext = false
			a.mu.Unlock()
			time.Sleep(500 * time.Millisecond) // past the client's timeout
			a.mu.Lock()
		}
		io.WriteString(w, o)
	case r.Method == http.MethodGet && r.URL.Query().Get("idempotency_key") != "":
		a.lookupCalls++
		if o, ok := a.byKey[r.URL.Query().Get("idempotency_key")]; ok {
			io.WriteString(w, o)
			return
		}
		http.NotFound(w, r)
	default:
		http.NotFound(w, r)
	}
}

func externalService(t *testing.T, safeRetry bool) (*Service, *miniAPI) {
	t.Helper()
	fake := &miniAPI{byKey: map[string]string{}}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	api, err := NewOrderAPI(srv.URL, 200*time.Millisecond, safeRetry)
	if err != nil {
		t.Fatal(err)
	}
	store, err := ledger.OpenBolt(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{Lease: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	v, _ := schemas.New()
	svc, err := New(store, v, Options{OutboxDir: t.TempDir(), OrdersAPI: api, Lease: time.Second, CallTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return svc, fake
}

func TestExternalTimeoutAfterCommitIsReconciled(t *testing.T) {
	ctx := context.Background()
	svc, fake := externalService(t, false)
	args := orderArgs(uuid.NewString(), 1)
	fake.hangNext = true
	first := svc.Call(ctx, agent, "create_order", args, nil)
	if first.Status != ledger.StateUnknown || first.NextAction != "reconcile" {
		t.Fatalf("first = %+v, want unknown/reconcile", first)
	}
	again := svc.Call(ctx, agent, "create_order", args, nil)
	if again.Status != ledger.StateSucceeded || !strings.HasPrefix(resultOrder(t, again).OrderID, "ext-") {
		t.Fatalf("retry = %+v %s, want succeeded with the API's order", again, again.Result)
	}
	third := svc.Call(ctx, agent, "create_order", args, nil)
	if !third.Replayed || string(third.Result) != string(again.Result) {
		t.Fatalf("third = %+v, want a replay", third)
	}
	if fake.creates != 1 {
		t.Errorf("the API created %d orders, want 1", fake.creates)
	}
}

func TestExternalAbsentNeedsApprovalWithoutSafeRetry(t *testing.T) {
	ctx := context.Background()
	svc, fake := externalService(t, false)
	args := orderArgs(uuid.NewString(), 1)
	fake.absentNext = true
	if first := svc.Call(ctx, agent, "create_order", args, nil); first.Status != ledger.StateUnknown {
		t.Fatalf("first = %+v, want unknown", first)
	}
	held := svc.Call(ctx, agent, "create_order", args, nil)
	if held.Status != ledger.StateAwaitingApproval || held.Approval == nil || held.Approval.Rule != "rerun_after_unknown" {
		t.Fatalf("retry = %+v, want awaiting_approval for a re-run", held)
	}
	done := svc.Call(ctx, approver, "decide_approval", map[string]any{"approval_id": held.Approval.ID, "decision": "approve"}, nil)
	if done.Status != ledger.StateSucceeded {
		t.Fatalf("approve = %+v %s", done, done.Result)
	}
	if fake.creates != 1 {
		t.Errorf("the API created %d orders, want 1", fake.creates)
	}
}

func TestExternalAbsentRunsAgainWithSafeRetry(t *testing.T) {
	ctx := context.Background()
	svc, fake := externalService(t, true)
	args := orderArgs(uuid.NewString(), 1)
	fake.absentNext = true
	svc.Call(ctx, agent, "create_order", args, nil)
	again := svc.Call(ctx, agent, "create_order", args, nil)
	if again.Status != ledger.StateSucceeded || again.Attempts != 2 {
		t.Fatalf("retry = %+v, want succeeded on attempt 2", again)
	}
	if fake.creates != 1 {
		t.Errorf("the API created %d orders, want 1", fake.creates)
	}
}

// TestApprovalRefusedOnAnotherDownstream: an operation held by a server
// that keeps orders at the order API is not run in the embedded store by
// an approver whose process lacks --orders-api (and the reverse).
func TestApprovalRefusedOnAnotherDownstream(t *testing.T) {
	ctx := context.Background()
	withAPI, fake := externalService(t, false)
	held := withAPI.Call(ctx, agent, "create_order", orderArgs(uuid.NewString(), 1000), nil) // above the threshold
	if held.Status != ledger.StateAwaitingApproval {
		t.Fatalf("large order = %+v, want awaiting_approval", held)
	}
	v, _ := schemas.New()
	embedded, err := New(withAPI.ledger, v, Options{OutboxDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	r := embedded.Call(ctx, approver, "decide_approval", map[string]any{"approval_id": held.Approval.ID, "decision": "approve"}, nil)
	if r.Error == nil || r.Error.Code != "internal" || !strings.Contains(r.Error.Message, "orders_api") {
		t.Fatalf("approval from an embedded-store process = %+v, want a refusal naming the order API", r)
	}
	list := embedded.Call(ctx, agent, "list_orders", map[string]any{"customer_id": "c1"}, nil)
	if strings.Contains(string(list.Result), "ord_") {
		t.Errorf("an order was placed in the embedded store: %s", list.Result)
	}
	ok := withAPI.Call(ctx, approver, "decide_approval", map[string]any{"approval_id": held.Approval.ID, "decision": "approve"}, nil)
	if ok.Status != ledger.StateSucceeded || fake.creates != 1 {
		t.Fatalf("approval from the right process = %+v (API creates %d), want succeeded once", ok, fake.creates)
	}
}
