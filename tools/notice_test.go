package tools

import (
	"context"
	"encoding/json"
	"path/filepath"
	"sync"
	"testing"

	"github.com/google/uuid"

	"idemgate/approvals"
	"idemgate/ledger"
	"idemgate/ledger/bolt"
	"idemgate/outbox"
	"idemgate/schemas"
)

// noticeSink records the notices it is handed.
type noticeSink struct {
	mu      sync.Mutex
	notices map[string]approvals.Notice // by message id
}

func (s *noticeSink) Deliver(_ context.Context, m *outbox.Message) error {
	var n approvals.Notice
	if err := json.Unmarshal([]byte(m.Body), &n); err != nil {
		return &outbox.PermanentError{Err: err}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.notices == nil {
		s.notices = map[string]approvals.Notice{}
	}
	s.notices[m.MessageID] = n
	return nil
}

func (s *noticeSink) Flush() error { return nil }

func (s *noticeSink) byApproval(id string) (approvals.Notice, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	var found approvals.Notice
	for _, v := range s.notices {
		if v.ApprovalID == id {
			found = v
			n++
		}
	}
	return found, n
}

// TestNoticeOfEachHold: each approval request queues one notice, with the
// total each tool knows — the new order's for a create, the changed
// order's for an update, the cancelled order's for a cancel — and none
// for a call that runs or a retry of a held one. Customer notifications
// never reach the notice sink.
func TestNoticeOfEachHold(t *testing.T) {
	ctx := context.Background()
	store, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	v, err := schemas.New()
	if err != nil {
		t.Fatal(err)
	}
	sink := &noticeSink{}
	svc, err := New(store, v, Options{OutboxDir: t.TempDir(), NoticeSink: sink, ConsoleURL: "https://gate.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	deliver := func() {
		t.Helper()
		if _, err := svc.Deliverer().DeliverPending(ctx); err != nil {
			t.Fatal(err)
		}
	}

	o := resultOrder(t, svc.Call(ctx, agent, "create_order", orderArgs(uuid.NewString(), 3), nil)) // 1500 minor: runs
	deliver()
	if len(sink.notices) != 0 {
		t.Fatalf("an order that ran queued notices: %v", sink.notices)
	}

	createKey := uuid.NewString()
	big := orderArgs(createKey, 200) // 100000 minor: at the threshold
	held := svc.Call(ctx, agent, "create_order", big, nil)
	svc.Call(ctx, agent, "create_order", big, nil) // a retry while pending
	update := svc.Call(ctx, agent, "update_order", map[string]any{"operation_key": uuid.NewString(), "order_id": o.OrderID, "expected_version": float64(1),
		"changes": map[string]any{"items": []any{map[string]any{"sku": "s1", "quantity": float64(4), "unit_price_minor": float64(500)}}}}, nil)
	cancel := svc.Call(ctx, agent, "cancel_order", map[string]any{"operation_key": uuid.NewString(), "order_id": o.OrderID, "expected_version": float64(1), "reason": "asked"}, nil)
	deliver()

	for _, tc := range []struct {
		what   string
		r      *Response
		amount int64
	}{{"create", held, 100000}, {"update", update, 2000}, {"cancel", cancel, 1500}} {
		if tc.r.Approval == nil {
			t.Fatalf("%s was not held: %+v", tc.what, tc.r)
		}
		n, count := sink.byApproval(tc.r.Approval.ID)
		if count != 1 {
			t.Errorf("%s: %d notices, want 1", tc.what, count)
			continue
		}
		if n.Total == nil || n.Total.AmountMinor != tc.amount || n.Total.Currency != "EUR" {
			t.Errorf("%s: total %+v, want %d EUR", tc.what, n.Total, tc.amount)
		}
		if n.Tenant != agent.Tenant || n.RequestedBy != agent.Principal || n.ConsoleURL != "https://gate.example.com/ui/approvals/"+tc.r.Approval.ID {
			t.Errorf("%s: notice %+v", tc.what, n)
		}
	}
	if len(sink.notices) != 3 {
		t.Errorf("notices: %d, want 3 (one per approval request)", len(sink.notices))
	}
}
