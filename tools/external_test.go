package tools

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/orders"
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

	hangBeforeNext bool          // the next POST hangs past the client's timeout and never commits
	postArrived    chan struct{} // when set, receives once per POST that arrives (non-blocking)
	lookupDelay    time.Duration // every lookup takes this long
	lookupDown     bool          // every lookup answers 503
	busyNext       string        // when set, the next POST answers 429 with this Retry-After
}

func (a *miniAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := r.Header.Get("Idempotency-Key")
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/orders":
		if a.postArrived != nil {
			select {
			case a.postArrived <- struct{}{}:
			default:
			}
		}
		if a.busyNext != "" {
			w.Header().Set("Retry-After", a.busyNext)
			a.busyNext = ""
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		if a.hangBeforeNext {
			a.hangBeforeNext = false
			a.mu.Unlock()
			select { // past the client's timeout; it hangs up and nothing is committed
			case <-time.After(2 * time.Second):
			case <-r.Context().Done():
			}
			a.mu.Lock()
			http.Error(w, "gave up before committing", 500)
			return
		}
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
		if a.lookupDelay > 0 {
			a.mu.Unlock()
			time.Sleep(a.lookupDelay)
			a.mu.Lock()
		}
		if a.lookupDown {
			http.Error(w, "lookup unavailable", http.StatusServiceUnavailable)
			return
		}
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
	return externalServiceWith(t, safeRetry, Options{})
}

// externalServiceWith is externalService with opts (its zero fields take
// the suite's defaults: 1 s lease, 200 ms call timeout).
func externalServiceWith(t *testing.T, safeRetry bool, opts Options) (*Service, *miniAPI) {
	t.Helper()
	fake := &miniAPI{byKey: map[string]string{}}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	if opts.Lease == 0 {
		opts.Lease = time.Second
	}
	if opts.CallTimeout == 0 {
		opts.CallTimeout = 200 * time.Millisecond
	}
	api, err := orders.NewAPI(srv.URL, opts.CallTimeout, safeRetry)
	if err != nil {
		t.Fatal(err)
	}
	store, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{Lease: opts.Lease})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	v, _ := schemas.New()
	opts.OutboxDir, opts.OrdersAPI = t.TempDir(), api
	svc, err := New(store, v, opts)
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

// TestExternalDuplicatesWaitForRerun: the first attempt of a create hangs
// past the call timeout without committing (unknown); 16 duplicates with
// the same key arrive meanwhile. With safe retries on, one of them re-runs
// it after the lookup proves it absent; every other duplicate — including
// those whose reconciliation lost the race to that re-run — waits for the
// re-run and answers its order, reporting progress that keeps increasing
// across its waits. One order, one lookup, and every answer obeys
// isError ⇔ error.
func TestExternalDuplicatesWaitForRerun(t *testing.T) {
	ctx := context.Background()
	svc, fake := externalService(t, true)
	fake.hangBeforeNext = true
	fake.postArrived = make(chan struct{}, 1)
	fake.lookupDelay = 20 * time.Millisecond
	args := orderArgs(uuid.NewString(), 1)

	first := make(chan *Response, 1)
	go func() { first <- svc.Call(ctx, agent, "create_order", args, nil) }()
	select {
	case <-fake.postArrived:
	case <-time.After(5 * time.Second):
		t.Fatal("the first attempt did not reach the API")
	}
	const n = 16
	answers := make([]*Response, n)
	progress := make([][]float64, n)
	var wg sync.WaitGroup
	for i := range n {
		report := func(p, total float64, _ string) {
			progress[i] = append(progress[i], p)
			if p > total {
				t.Errorf("duplicate %d: progress %v above its total %v", i, p, total)
			}
		}
		wg.Go(func() { answers[i] = svc.Call(ctx, agent, "create_order", args, report) })
	}
	wg.Wait()
	for i, ps := range progress {
		if len(ps) == 0 {
			t.Errorf("duplicate %d waited without progress", i)
		}
		for j := 1; j < len(ps); j++ {
			if ps[j] <= ps[j-1] {
				t.Errorf("duplicate %d: progress %v does not keep increasing (MCP requires it)", i, ps)
				break
			}
		}
	}
	if f := <-first; f.Status != ledger.StateUnknown || f.Error == nil || f.Error.Code != "outcome_unknown" {
		t.Errorf("first attempt = %+v, want unknown/outcome_unknown", f)
	}
	var result string
	for i, r := range answers {
		if r.IsError != (r.Error != nil) || (r.Error != nil && !documentedCode(r.Error.Code)) {
			t.Errorf("duplicate %d: isError=%v error=%+v: breaks isError ⇔ documented error", i, r.IsError, r.Error)
		}
		if r.Status != ledger.StateSucceeded || r.IsError {
			t.Errorf("duplicate %d = status %s next %s error %+v, want succeeded with the re-run's order", i, r.Status, r.NextAction, r.Error)
			continue
		}
		if result == "" {
			result = string(r.Result)
		}
		if string(r.Result) != result {
			t.Errorf("duplicate %d result %s, want the same bytes as %s", i, r.Result, result)
		}
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if fake.creates != 1 {
		t.Errorf("the API created %d orders, want 1", fake.creates)
	}
	if fake.lookupCalls != 1 {
		t.Errorf("the API saw %d lookups for one key, want 1 (coalesced)", fake.lookupCalls)
	}
}

// TestLookupsCoalesced: concurrent lookups of one key are one request at
// the API, and every caller gets the order; a caller that gives up does
// not fail the others.
func TestLookupsCoalesced(t *testing.T) {
	ctx := context.Background()
	svc, fake := externalService(t, false)
	fake.byKey["t1:k1"] = `{"order_id":"ext-1","version":1,"status":"placed"}`
	fake.lookupDelay = 100 * time.Millisecond
	const n = 16
	got := make([]*orders.Order, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	impatient, cancel := context.WithCancel(ctx)
	wg.Go(func() { // starts the flight, then gives up
		_, err := svc.remote.Lookup(impatient, "t1", "k1")
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the impatient caller got %v, want context.Canceled", err)
		}
	})
	time.Sleep(10 * time.Millisecond)
	for i := range n {
		wg.Go(func() { got[i], errs[i] = svc.remote.Lookup(ctx, "t1", "k1") })
	}
	time.Sleep(10 * time.Millisecond)
	cancel()
	wg.Wait()
	for i := range n {
		if errs[i] != nil || got[i] == nil || got[i].OrderID != "ext-1" {
			t.Errorf("caller %d: %+v %v, want order ext-1", i, got[i], errs[i])
		}
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if fake.lookupCalls != 1 {
		t.Errorf("the API saw %d lookups, want 1", fake.lookupCalls)
	}
}

// TestRetryableAdvisesSameKey: an attempt the API refused before acting
// (429) answers retryable with next_action retry_same_key and the delay
// the API asked for; the same-key retry then runs it.
func TestRetryableAdvisesSameKey(t *testing.T) {
	ctx := context.Background()
	svc, fake := externalService(t, false)
	fake.busyNext = "7"
	args := orderArgs(uuid.NewString(), 1)
	r := svc.Call(ctx, agent, "create_order", args, nil)
	if r.Status != ledger.StateRetryable || r.NextAction != "retry_same_key" || r.Error == nil || r.Error.Code != "downstream_error" {
		t.Fatalf("429 answer = %+v, want retryable / retry_same_key / downstream_error", r)
	}
	var details struct {
		RetryAfter int `json:"retry_after_seconds"`
	}
	if err := json.Unmarshal(r.Error.Details, &details); err != nil || details.RetryAfter != 7 {
		t.Errorf("error.details = %s, want retry_after_seconds 7", r.Error.Details)
	}
	if !strings.Contains(r.Error.Message, "7 seconds") || !strings.Contains(r.Error.Message, "same operation_key") {
		t.Errorf("message %q does not say to call again with the same key after 7 seconds", r.Error.Message)
	}
	again := svc.Call(ctx, agent, "create_order", args, nil)
	if again.Status != ledger.StateSucceeded || again.Attempts != 2 {
		t.Fatalf("same-key retry = %+v, want succeeded on attempt 2", again)
	}
}

// TestOutcomeOfClasses: each class of a failed order API call maps to the
// operation's state and error code — not sent is retryable, definitive is
// failed with the API's code, indeterminate is unknown — and a success to
// succeeded (with TestOrderAPIClassification in orders, which maps each
// HTTP answer to its class).
func TestOutcomeOfClasses(t *testing.T) {
	tests := []struct {
		name  string
		err   error
		state ledger.State
		code  string
	}{
		{"success", nil, ledger.StateSucceeded, ""},
		{"not sent", &orders.APIError{Class: orders.NotSent, Status: 429}, ledger.StateRetryable, "downstream_error"},
		{"definitive 400", &orders.APIError{Class: orders.Definitive, Status: 400, Code: "downstream_error"}, ledger.StateFailed, "downstream_error"},
		{"definitive 404", &orders.APIError{Class: orders.Definitive, Status: 404, Code: "not_found"}, ledger.StateFailed, "not_found"},
		{"definitive 412", &orders.APIError{Class: orders.Definitive, Status: 412, Code: "precondition_failed"}, ledger.StateFailed, "precondition_failed"},
		{"indeterminate", &orders.APIError{Class: orders.Indeterminate, Status: 503}, ledger.StateUnknown, "outcome_unknown"},
		{"unclassified", errors.New("boom"), ledger.StateUnknown, "outcome_unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var o *orders.Order
			if tt.err == nil {
				o = &orders.Order{OrderID: "o1", Version: 1, Status: "placed"}
			}
			out := outcomeOf(o, tt.err, "order")
			if out.State != tt.state || (tt.code != "" && (out.Error == nil || out.Error.Code != tt.code)) {
				t.Errorf("outcome %s %+v, want %s %s", out.State, out.Error, tt.state, tt.code)
			}
		})
	}
}

// TestRefusedConnectionIsRetryable: a create that never reached the API
// (nothing listens) leaves the operation retryable.
func TestRefusedConnectionIsRetryable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens here now
	api, err := orders.NewAPI("http://"+addr, time.Second, false)
	if err != nil {
		t.Fatal(err)
	}
	o, err := api.Create(context.Background(), "t1", "k1", orders.CreateRequest{})
	if out := outcomeOf(o, err, "order"); out.State != ledger.StateRetryable {
		t.Errorf("outcome %s, want retryable", out.State)
	}
}

// logBuffer is a goroutine-safe sink for a test's logs.
type logBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func captureLogs(level slog.Level) (*slog.Logger, *logBuffer) {
	b := &logBuffer{}
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: level})), b
}

// TestLookupOutageLoggedOnce: while the API's lookup is down, sweeps over
// many unknown operations log the outage once; the first answer after it
// logs one recovered line with the count.
func TestLookupOutageLoggedOnce(t *testing.T) {
	ctx := context.Background()
	logger, logs := captureLogs(slog.LevelInfo)
	svc, fake := externalServiceWith(t, false, Options{Logger: logger})
	const n = 3
	for i := range n {
		fake.mu.Lock()
		fake.hangNext = true // commits, reply lost: unknown
		fake.mu.Unlock()
		if r := svc.Call(ctx, agent, "create_order", orderArgs(uuid.NewString(), i+1), nil); r.Status != ledger.StateUnknown {
			t.Fatalf("call %d = %+v, want unknown", i, r)
		}
	}
	fake.mu.Lock()
	fake.lookupDown = true
	fake.mu.Unlock()
	for range 3 {
		if _, reconciled, err := svc.Sweep(ctx); err != nil || reconciled != 0 {
			t.Fatalf("sweep during the outage: reconciled %d, %v", reconciled, err)
		}
	}
	if c := strings.Count(logs.String(), "reconciliation lookups are failing"); c != 1 {
		t.Errorf("the outage was logged %d times over %d failed lookups, want once:\n%s", c, 3*n, logs)
	}
	if strings.Contains(logs.String(), "recovered") {
		t.Errorf("recovered logged during the outage:\n%s", logs)
	}
	fake.mu.Lock()
	fake.lookupDown = false
	fake.mu.Unlock()
	if _, reconciled, err := svc.Sweep(ctx); err != nil || reconciled != n {
		t.Fatalf("sweep after the outage: reconciled %d, %v; want %d", reconciled, err, n)
	}
	out := logs.String()
	if c := strings.Count(out, "reconciliation lookups recovered"); c != 1 || !strings.Contains(out, fmt.Sprintf("failed_lookups=%d", 3*n)) || !strings.Contains(out, fmt.Sprintf("operations_affected=%d", n)) {
		t.Errorf("want one recovered line with failed_lookups=%d operations_affected=%d:\n%s", 3*n, n, out)
	}
	if c := strings.Count(out, "level=WARN"); c != 1 {
		t.Errorf("%d warnings, want 1 (the outage):\n%s", c, out)
	}
}

// TestLeaseRenewalQuietOnTimeout: a renewal that fails because the
// downstream call ended or timed out as the tick came is not a lost lease
// and logs no warning; a lease really lost is one.
func TestLeaseRenewalQuietOnTimeout(t *testing.T) {
	logger, logs := captureLogs(slog.LevelWarn)
	svc, _ := externalServiceWith(t, true, Options{Logger: logger})
	rec := &ledger.Record{Tenant: "t1", Key: "k1", Generation: 1}

	ended, cancel := context.WithTimeout(context.Background(), 0)
	defer cancel()
	<-ended.Done()
	err := svc.ledger.RenewLease(ended, rec.Tenant, rec.Key, rec.Generation) // what the renewer gets at that tick
	if err == nil {
		t.Fatal("RenewLease with an ended context succeeded")
	}
	svc.renewalFailed(ended, rec, err)
	if out := logs.String(); out != "" {
		t.Errorf("a renewal at the end of a timed-out call logged:\n%s", out)
	}

	svc.renewalFailed(context.Background(), rec, ledger.ErrStaleGeneration)
	if out := logs.String(); strings.Count(out, "level=WARN") != 1 || !strings.Contains(out, "lease lost") {
		t.Errorf("a lease really lost: want one warning, got:\n%s", out)
	}
}

// TestExternalMismatchWhileInFlightAnswersAtOnce: a changed request under
// the key of a running operation is refused at once; it never waits for,
// nor answers with, the other request's outcome.
func TestExternalMismatchWhileInFlightAnswersAtOnce(t *testing.T) {
	ctx := context.Background()
	svc, fake := externalServiceWith(t, true, Options{CallTimeout: time.Second})
	fake.hangBeforeNext = true
	fake.postArrived = make(chan struct{}, 1)
	key := uuid.NewString()
	done := make(chan *Response, 1)
	go func() { done <- svc.Call(ctx, agent, "create_order", orderArgs(key, 1), nil) }()
	<-fake.postArrived
	started := time.Now()
	r := svc.Call(ctx, agent, "create_order", orderArgs(key, 2), nil)
	if r.Error == nil || r.Error.Code != "key_reused_with_different_request" || !r.IsError {
		t.Errorf("changed request while in flight = %+v %+v, want key_reused_with_different_request", r, r.Error)
	}
	if d := time.Since(started); d > 500*time.Millisecond {
		t.Errorf("the refusal took %v: it waited for the other request", d)
	}
	<-done
}

// TestCloseWaitsForDetachedReconcile: a reconciliation whose caller gave
// up keeps running (others may be waiting on it), and Close waits for it:
// the ledger is never closed under it. After Close, no new one starts.
func TestCloseWaitsForDetachedReconcile(t *testing.T) {
	ctx := context.Background()
	svc, fake := externalService(t, false)
	key := uuid.NewString()
	args, _ := json.Marshal(orderArgs(key, 1))
	d, err := svc.ledger.Claim(ctx, ledger.Claim{Actor: agent, Key: key, Tool: "create_order", Fingerprint: "fp",
		OnLeaseExpiry: ledger.StateUnknown, Args: args, Downstream: svc.downstream("create_order")})
	if err != nil || d.Kind != ledger.DecisionClaimed {
		t.Fatalf("claim = %+v, %v", d, err)
	}
	rec, err := svc.ledger.Complete(ctx, agent, key, d.Record.Generation, ledger.Outcome{State: ledger.StateUnknown})
	if err != nil {
		t.Fatal(err)
	}
	fake.mu.Lock()
	fake.byKey["t1:"+opRef(rec)] = `{"order_id":"ext-9","version":1,"status":"placed"}`
	fake.lookupDelay = 120 * time.Millisecond // within the 200 ms call timeout
	fake.mu.Unlock()
	impatient, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := svc.reconcile(impatient, agent, rec); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("impatient reconcile: %v, want its deadline", err)
	}
	svc.Close() // waits for the flight the impatient caller started
	got, err := svc.ledger.Get(ctx, "t1", key)
	if err != nil || got.State != ledger.StateSucceeded {
		t.Fatalf("after Close the record is %+v (%v); want succeeded: Close returned before the reconciliation finished", got, err)
	}
	other := uuid.NewString()
	if _, err := svc.reconcile(ctx, agent, &ledger.Record{Tenant: "t1", Key: other, State: ledger.StateUnknown}); !errors.Is(err, errServiceClosed) {
		t.Errorf("reconcile after Close: %v, want errServiceClosed", err)
	}
}
