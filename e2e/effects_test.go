package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
)

// outboxFiles lists the delivered message files of an --outbox-dir
// (temporary files of the sink start with a dot and are ignored).
func outboxFiles(t testing.TB, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	slices.Sort(out)
	return out
}

// deliveredMessage is a file written by the directory sink.
type deliveredMessage struct {
	MessageID    string   `json:"message_id"`
	Channel      string   `json:"channel"`
	To           []string `json:"to"`
	Subject      string   `json:"subject"`
	Body         string   `json:"body"`
	OrderID      string   `json:"order_id"`
	OperationKey string   `json:"operation_key"`
	Step         string   `json:"step"`
}

func readMessage(t testing.TB, path string) deliveredMessage {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var m deliveredMessage
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v\n%s", path, err, b)
	}
	return m
}

// waitDelivered polls get_operation_status until every delivery of key is
// delivered, and returns the deliveries.
func waitDelivered(t testing.TB, s *session, key string) opStatus {
	t.Helper()
	return waitDeliveredWithin(t, s, key, 5*time.Second)
}

// waitDeliveredWithin is waitDelivered with a bound of its own.
func waitDeliveredWithin(t testing.TB, s *session, key string, within time.Duration) opStatus {
	t.Helper()
	var st opStatus
	ok := eventually(within, func() bool {
		st, _, _ = s.status(t, key)
		if len(st.Deliveries) == 0 {
			return false
		}
		for _, d := range st.Deliveries {
			if d.State != "delivered" {
				return false
			}
		}
		return true
	})
	if !ok {
		t.Fatalf("deliveries of %s not delivered within %s: %+v", key, within, st.Deliveries)
	}
	return st
}

// TestNotificationSentOnce: send_notification twice with one key from one
// process and once more from a second process (same ledger, same outbox
// directory) delivers exactly one message, with the body that was sent, and
// get_operation_status reports it delivered.
func TestNotificationSentOnce(t *testing.T) {
	dir := t.TempDir()
	db, outbox := newLedger(t), filepath.Join(dir, "sink")
	a := startServer(t, mcpGoModern, serverConfig{DB: db, OutboxDir: outbox})
	b := startServer(t, goSDKLegacy, serverConfig{DB: db, OutboxDir: outbox})
	key := newKey()
	args := map[string]any{
		"operation_key": key, "channel": "email", "to": []string{"ada@example.com"},
		"subject": "Your parcel", "body": "Your parcel left the warehouse today.",
	}
	first := a.mustSucceed(t, "send_notification", args)
	var res struct {
		Message struct {
			MessageID string `json:"message_id"`
		} `json:"message"`
	}
	if err := json.Unmarshal(first.Result, &res); err != nil || res.Message.MessageID == "" {
		t.Fatalf("send_notification result has no message id: %s", first)
	}
	if e := a.mustSucceed(t, "send_notification", args); !e.Replayed {
		t.Errorf("second send from the same process: %s", e)
	}
	if e := b.mustSucceed(t, "send_notification", args); !e.Replayed {
		t.Errorf("send from the second process: %s", e)
	}

	st := waitDelivered(t, a, key)
	if len(st.Deliveries) != 1 || st.Deliveries[0].MessageID != res.Message.MessageID {
		t.Errorf("deliveries %+v, want one, of message %s", st.Deliveries, res.Message.MessageID)
	}
	// Both processes run a deliverer that scans the outbox every second:
	// give them time to (wrongly) deliver again before counting.
	time.Sleep(1500 * time.Millisecond)
	files := outboxFiles(t, outbox)
	if len(files) != 1 || files[0] != res.Message.MessageID+".json" {
		t.Fatalf("outbox holds %v, want exactly [%s.json]", files, res.Message.MessageID)
	}
	m := readMessage(t, filepath.Join(outbox, files[0]))
	if m.Body != args["body"] || m.Subject != args["subject"] || m.Channel != "email" ||
		!slices.Equal(m.To, []string{"ada@example.com"}) || m.OperationKey != key || m.MessageID != res.Message.MessageID {
		t.Errorf("delivered message %+v does not match what was sent", m)
	}
	if st, _, _ := b.status(t, key); len(st.Deliveries) != 1 || st.Deliveries[0].State != "delivered" || st.Deliveries[0].Attempts != 1 {
		t.Errorf("second process sees deliveries %+v, want one delivered in one attempt", st.Deliveries)
	}
}

// TestOrderConfirmation: create_order with notify_customer left at its
// default queues exactly one confirmation, delivered once even when the
// order is replayed; notify_customer false sends nothing.
func TestOrderConfirmation(t *testing.T) {
	dir := t.TempDir()
	outbox := filepath.Join(dir, "sink")
	s := startServer(t, goSDKModern, serverConfig{DB: newLedger(t), OutboxDir: outbox})
	key := newKey()
	args := orderArgs(key, "cust-confirm", coffee, nil)
	e := s.mustSucceed(t, "create_order", args)
	s.mustSucceed(t, "create_order", args) // replay: no second confirmation
	st := waitDelivered(t, s, key)
	if len(st.Deliveries) != 1 || st.Deliveries[0].Step != "confirmation" {
		t.Fatalf("deliveries %+v, want one confirmation", st.Deliveries)
	}
	quiet := newKey()
	s.mustSucceed(t, "create_order", orderArgs(quiet, "cust-quiet", coffee, map[string]any{"notify_customer": false}))
	time.Sleep(1500 * time.Millisecond)
	files := outboxFiles(t, outbox)
	if len(files) != 1 {
		t.Fatalf("outbox holds %v, want exactly one confirmation", files)
	}
	m := readMessage(t, filepath.Join(outbox, files[0]))
	if m.Step != "confirmation" || m.OperationKey != key || !strings.Contains(m.Body, e.orderID()) ||
		!slices.Equal(m.To, []string{"customer:cust-confirm"}) {
		t.Errorf("confirmation %+v does not confirm order %s to cust-confirm", m, e.orderID())
	}
	if st, _, _ := s.status(t, quiet); len(st.Deliveries) != 0 {
		t.Errorf("notify_customer=false queued %+v", st.Deliveries)
	}
}

// TestSuspectedDuplicate: a new key with exactly the request of an order
// made moments ago (the "retry minted a new key" bug) runs nothing and is
// held for approval, naming the earlier key; retrying it changes nothing.
// With --suspect-window 1ns the same pattern runs.
func TestSuspectedDuplicate(t *testing.T) {
	s := startServer(t, mcpGoLegacy, serverConfig{})
	firstKey := newKey()
	first := s.mustSucceed(t, "create_order", orderArgs(firstKey, "cust-dup", coffee, nil))
	dupKey := newKey()
	for attempt := range 2 {
		e := s.mustFail(t, "create_order", orderArgs(dupKey, "cust-dup", coffee, nil), "approval_required")
		if e.Status != "awaiting_approval" || e.NextAction != "await_approval" || len(e.Result) != 0 {
			t.Errorf("attempt %d: %s", attempt, e)
		}
		if e.Approval == nil || e.Approval.ApprovalID == "" || e.Approval.Status != "pending" {
			t.Errorf("attempt %d: no pending approval: %s", attempt, e)
		}
		if attempt == 0 {
			var d struct {
				EarlierKey string `json:"earlier_operation_key"`
			}
			if err := json.Unmarshal(e.Error.Details, &d); err != nil || d.EarlierKey != firstKey {
				t.Errorf("error.details.earlier_operation_key = %q, want %q (%s)", d.EarlierKey, firstKey, e.Error.Details)
			}
			if !strings.Contains(e.Error.Message, firstKey) {
				t.Errorf("message does not name the earlier key: %s", e.Error.Message)
			}
		}
	}
	if ids := s.listOrderIDs(t, "cust-dup"); len(ids) != 1 || ids[0] != first.orderID() {
		t.Errorf("list_orders = %v, want only the first order %s", ids, first.orderID())
	}
	if st, _, _ := s.status(t, dupKey); st.State != "awaiting_approval" {
		t.Errorf("get_operation_status(held key) state %q, want awaiting_approval", st.State)
	}

	t.Run("window 1ns", func(t *testing.T) {
		s := startServer(t, mcpGoLegacy, serverConfig{Args: []string{"--suspect-window", "1ns"}})
		a := s.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-dup", coffee, nil))
		b := s.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-dup", coffee, nil))
		if a.orderID() == b.orderID() || b.Replayed {
			t.Errorf("second intent: %s", b)
		}
		if n := s.orderCount(t, "cust-dup"); n != 2 {
			t.Errorf("list_orders count %d, want 2", n)
		}
	})
}

// TestNewOperationKey: new_operation_key hands out a fresh random UUID on
// every call, each usable as an operation key.
func TestNewOperationKey(t *testing.T) {
	s := startServer(t, goSDKModern, serverConfig{})
	seen := map[string]bool{}
	for range 20 {
		e := s.mustSucceed(t, "new_operation_key", map[string]any{})
		var r struct {
			Key string `json:"operation_key"`
		}
		_ = json.Unmarshal(e.Result, &r)
		u, err := uuid.Parse(r.Key)
		if err != nil || u.Version() != 4 || u.String() != r.Key || e.OperationKey != r.Key {
			t.Fatalf("new_operation_key returned %q (answer key %q): not a lowercase v4 UUID", r.Key, e.OperationKey)
		}
		if seen[r.Key] {
			t.Fatalf("new_operation_key returned %s twice", r.Key)
		}
		seen[r.Key] = true
	}
	for k := range seen {
		s.mustSucceed(t, "create_order", orderArgs(k, "cust-newkey", coffee, nil))
		break
	}
}

// TestRequireIssuedKeys: with --require-issued-keys a key the server did not
// hand out is refused as invalid_arguments and leaves no record; an issued
// key works (and replays); a key issued in another tenant is not issued here.
func TestRequireIssuedKeys(t *testing.T) {
	db := newLedger(t)
	s := startServer(t, mcpGoModern, serverConfig{DB: db, Args: []string{"--require-issued-keys"}})
	random := newKey()
	e := s.mustFail(t, "create_order", orderArgs(random, "cust-issued", coffee, nil), "invalid_arguments")
	if !strings.Contains(e.Error.Message, "new_operation_key") {
		t.Errorf("refusal does not point to new_operation_key: %s", e.Error.Message)
	}
	if _, e, found := s.status(t, random); found {
		t.Errorf("a refused key left a record: %s", e)
	}
	issued := s.mustSucceed(t, "new_operation_key", nil).OperationKey
	o := s.mustSucceed(t, "create_order", orderArgs(issued, "cust-issued", coffee, nil))
	if o.Replayed {
		t.Errorf("issued key: %s", o)
	}
	if r := s.mustSucceed(t, "create_order", orderArgs(issued, "cust-issued", coffee, nil)); !r.Replayed || r.orderID() != o.orderID() {
		t.Errorf("issued key replay: %s", r)
	}
	if r := s.mustSucceed(t, "create_order", orderArgs(strings.ToUpper(issued), "cust-issued", coffee, nil)); !r.Replayed {
		t.Errorf("issued key in upper case: %s", r)
	}
	if n := s.orderCount(t, "cust-issued"); n != 1 {
		t.Errorf("list_orders count %d, want 1", n)
	}

	other := startServer(t, goSDKLegacy, serverConfig{DB: db, Tenant: "elsewhere", Args: []string{"--require-issued-keys"}})
	otherKey := s.mustSucceed(t, "new_operation_key", nil).OperationKey
	other.mustFail(t, "create_order", orderArgs(otherKey, "cust-issued", coffee, nil), "invalid_arguments")
}

// TestOutboxSurvivesCrash: the confirmation is queued in the same
// transaction as the order, so a server SIGKILLed right after answering
// loses nothing: the next server process on the ledger delivers it, once.
func TestOutboxSurvivesCrash(t *testing.T) {
	dir := t.TempDir()
	db, outbox := newLedger(t), filepath.Join(dir, "sink")
	s := startServer(t, mcpGoLegacy, serverConfig{DB: db, OutboxDir: outbox})
	key := newKey()
	s.mustSucceed(t, "create_order", orderArgs(key, "cust-outbox-crash", coffee, nil))
	s.Kill()

	s2 := startServer(t, mcpGoLegacy, serverConfig{DB: db, OutboxDir: outbox})
	st := waitDelivered(t, s2, key)
	if len(st.Deliveries) != 1 {
		t.Fatalf("deliveries %+v, want one", st.Deliveries)
	}
	if files := outboxFiles(t, outbox); len(files) != 1 || files[0] != st.Deliveries[0].MessageID+".json" {
		t.Errorf("outbox holds %v, want exactly [%s.json]", files, st.Deliveries[0].MessageID)
	}
}
