package outbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
)

// retryClock is the ledger's clock in these tests; safe for concurrent use.
type retryClock struct {
	mu  sync.Mutex
	now time.Time
}

func newRetryClock() *retryClock {
	return &retryClock{now: time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)}
}

func (c *retryClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *retryClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func openWithClock(t *testing.T, clock *retryClock) *bolt.File {
	t.Helper()
	s, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// stored reads message id from the outbox.
func stored(t *testing.T, s ledger.Store, id string) *Message {
	t.Helper()
	var m *Message
	err := s.View(context.Background(), func(tx ledger.Tx) error {
		var err error
		m, err = getMessage(tx, id)
		return err
	})
	if err != nil || m == nil {
		t.Fatalf("message %s: %v, %v", id, m, err)
	}
	return m
}

func isPending(t *testing.T, s ledger.Store, id string) bool {
	t.Helper()
	found := false
	err := s.View(context.Background(), func(tx ledger.Tx) error {
		return tx.Scan(collPending, id, false, func(k string, _ []byte) (bool, error) {
			found = found || k == id
			return true, nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// always is a gateway script of n answers with status code.
func always(code, n int) []gatewayAnswer {
	out := make([]gatewayAnswer, n)
	for i := range out {
		out[i] = gatewayAnswer{Status: code}
	}
	return out
}

// fixedRand returns v for every draw.
func fixedRand(v float64) func() float64 { return func() float64 { return v } }

// A message goes through delivery passes against a scripted gateway; the
// clock moves past any backoff between passes. After it settles, further
// passes must not call the gateway again.
func TestWebhookDeliveryOutcomes(t *testing.T) {
	const budget = 4
	ok := gatewayAnswer{Status: 200}
	for _, tc := range []struct {
		name         string
		script       []gatewayAnswer
		wantState    string
		wantAttempts int
		wantRequests int
		wantAccepted int      // 2xx answers the gateway gave
		wantStored   int      // distinct messages the gateway stored
		wantErrHas   []string // in LastError
	}{
		{
			name:      "503 twice then accepted",
			script:    []gatewayAnswer{{Status: 503}, {Status: 503}, ok},
			wantState: MessageDelivered, wantAttempts: 3, wantRequests: 3, wantAccepted: 1, wantStored: 1,
		},
		{
			name:      "429 and 409 are retried",
			script:    []gatewayAnswer{{Status: 429}, {Status: 409}, ok},
			wantState: MessageDelivered, wantAttempts: 3, wantRequests: 3, wantAccepted: 1, wantStored: 1,
		},
		{
			name:      "permanent 400 is dead-lettered at once",
			script:    []gatewayAnswer{{Status: 400, Body: "unknown channel"}},
			wantState: MessageDead, wantAttempts: 1, wantRequests: 1, wantAccepted: 0, wantStored: 0,
			wantErrHas: []string{"permanent", "400", "unknown channel"},
		},
		{
			name:      "constant 500 spends the budget",
			script:    []gatewayAnswer{{Status: 500}, {Status: 500}, {Status: 500}, {Status: 500}, {Status: 500}, {Status: 500}},
			wantState: MessageDead, wantAttempts: budget, wantRequests: budget, wantAccepted: 0, wantStored: 0,
			wantErrHas: []string{"gave up after 4 failed attempts", "500"},
		},
		{
			// The gateway stores the message, then the connection drops
			// before the answer: the deliverer must retry, and the same
			// Idempotency-Key makes the retry harmless.
			name:      "accepted but the answer is lost",
			script:    []gatewayAnswer{{Lost: true}, ok},
			wantState: MessageDelivered, wantAttempts: 2, wantRequests: 2, wantAccepted: 1, wantStored: 1,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clock := newRetryClock()
			s := openWithClock(t, clock)
			g := newIdemGateway(t, tc.script...)
			d := NewDeliverer(s, mustWebhook(t, g.srv.URL+"/notify", 5*time.Second), nil)
			d.RetryBudget = budget
			m := queue(t, s, "k1")
			for pass := 0; pass < 10; pass++ {
				d.DeliverPending(ctx)
				clock.Advance(d.RetryCap) // past any backoff
			}
			got := stored(t, s, m.MessageID)
			if got.State != tc.wantState || got.Attempts != tc.wantAttempts {
				t.Errorf("message state=%s attempts=%d, want %s %d (last error %q)", got.State, got.Attempts, tc.wantState, tc.wantAttempts, got.LastError)
			}
			for _, s := range tc.wantErrHas {
				if !strings.Contains(got.LastError, s) {
					t.Errorf("last error %q does not contain %q", got.LastError, s)
				}
			}
			if tc.wantState == MessageDelivered && (got.LastError != "" || got.DeliveredAt.IsZero() || !got.NextAttemptAt.IsZero()) {
				t.Errorf("delivered message: last_error=%q delivered_at=%v next_attempt_at=%v", got.LastError, got.DeliveredAt, got.NextAttemptAt)
			}
			if isPending(t, s, m.MessageID) {
				t.Errorf("a %s message is still in the pending index", got.State)
			}
			reqs := g.Requests()
			if len(reqs) != tc.wantRequests {
				t.Errorf("gateway saw %d requests, want %d", len(reqs), tc.wantRequests)
			}
			for i, r := range reqs {
				if r.Key != m.MessageID || r.Payload.MessageID != m.MessageID {
					t.Errorf("request %d: Idempotency-Key %q, payload message_id %q; want %q", i, r.Key, r.Payload.MessageID, m.MessageID)
				}
			}
			if n := g.Accepted(); n != tc.wantAccepted {
				t.Errorf("gateway accepted %d POSTs, want %d", n, tc.wantAccepted)
			}
			if st := g.Stored(); len(st) != tc.wantStored {
				t.Errorf("gateway stored %d distinct messages, want %d", len(st), tc.wantStored)
			}
			// Settled: more passes, much later, do not call the gateway.
			for range 3 {
				clock.Advance(time.Hour)
				if n, err := d.DeliverPending(ctx); n != 0 || err != nil {
					t.Errorf("pass after settling: n=%d err=%v, want 0 <nil>", n, err)
				}
			}
			if n := len(g.Requests()); n != len(reqs) {
				t.Errorf("gateway saw %d more requests after the message settled", n-len(reqs))
			}
		})
	}
}

// A pass before NextAttemptAt leaves the message alone; at NextAttemptAt
// it is tried. With a fixed jitter draw r the delays are r·min(cap,
// base·2^(n-1)): they double, then stay under the cap.
func TestWebhookBackoffIsRespected(t *testing.T) {
	const base, limit = time.Second, 8 * time.Second
	for _, tc := range []struct {
		name   string
		r      float64
		delays []time.Duration // after failure 1, 2, …
	}{
		{"half", 0.5, []time.Duration{500 * time.Millisecond, time.Second, 2 * time.Second, 4 * time.Second, 4 * time.Second, 4 * time.Second}},
		{"almost one", 0.999, []time.Duration{999 * time.Millisecond, 1998 * time.Millisecond, 3996 * time.Millisecond, 7992 * time.Millisecond, 7992 * time.Millisecond}},
		{"zero retries at once", 0, []time.Duration{0, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clock := newRetryClock()
			s := openWithClock(t, clock)
			g := newIdemGateway(t, always(503, 100)...)
			d := NewDeliverer(s, mustWebhook(t, g.srv.URL, 5*time.Second), nil)
			d.RetryBase, d.RetryCap, d.RetryBudget, d.Rand = base, limit, 100, fixedRand(tc.r)
			m := queue(t, s, "k1")
			for i, want := range tc.delays {
				before := len(g.Requests())
				failedAt := clock.Now()
				if _, err := d.DeliverPending(ctx); err == nil {
					t.Fatalf("attempt %d: no error from a 503", i+1)
				}
				if n := len(g.Requests()); n != before+1 {
					t.Fatalf("attempt %d: gateway saw %d requests, want 1", i+1, n-before)
				}
				got := stored(t, s, m.MessageID)
				if got.State != MessageQueued || got.Attempts != i+1 {
					t.Fatalf("after attempt %d: state=%s attempts=%d", i+1, got.State, got.Attempts)
				}
				delay := got.NextAttemptAt.Sub(failedAt)
				if delay != want {
					t.Errorf("delay after failure %d = %v, want %v", i+1, delay, want)
				}
				if delay >= limit {
					t.Errorf("delay after failure %d = %v, not under the cap %v", i+1, delay, limit)
				}
				if delay > 0 {
					// Just before it is due: no call.
					clock.Advance(delay - time.Millisecond)
					if _, err := d.DeliverPending(ctx); err != nil {
						t.Fatalf("early pass: %v", err)
					}
					if n := len(g.Requests()); n != before+1 {
						t.Fatalf("a pass %v before next_attempt_at called the gateway", time.Millisecond)
					}
					clock.Advance(time.Millisecond)
				}
			}
		})
	}
}

// backoff itself, far past the point where the doubling reaches the cap.
func TestBackoffStaysUnderCap(t *testing.T) {
	d := &Deliverer{RetryBase: time.Second, RetryCap: 5 * time.Minute, Rand: fixedRand(0.999999)}
	prev := time.Duration(0)
	for n := 1; n <= 200; n++ {
		got := d.backoff(n)
		if got >= 5*time.Minute || got < prev {
			t.Fatalf("backoff(%d) = %v (previous %v): want non-decreasing and under 5m", n, got, prev)
		}
		prev = got
	}
	if prev < 299*time.Second {
		t.Errorf("backoff never got near the cap: %v", prev)
	}
	for _, r := range []float64{-1, 1, 2} { // a misbehaving Rand
		d.Rand = fixedRand(r)
		if got := d.backoff(3); got < 0 || got >= 4*time.Second {
			t.Errorf("Rand()=%v: backoff(3) = %v, want in [0, 4s)", r, got)
		}
	}
	def := NewDeliverer(nil, nil, nil)
	if def.RetryBase != time.Second || def.RetryCap != 5*time.Minute || def.RetryBudget != DefaultRetryBudget || def.Rand == nil {
		t.Errorf("defaults: base=%v cap=%v budget=%d rand=%v", def.RetryBase, def.RetryCap, def.RetryBudget, def.Rand != nil)
	}
}

// A delivered message left in the pending index (an older build, a
// crash) is not delivered again, and the stale entry is removed.
func TestDeliveredMessageIsNotRedelivered(t *testing.T) {
	ctx := context.Background()
	clock := newRetryClock()
	s := openWithClock(t, clock)
	g := newIdemGateway(t)
	d := NewDeliverer(s, mustWebhook(t, g.srv.URL, 5*time.Second), nil)
	m := queue(t, s, "k1")
	if n, err := d.DeliverPending(ctx); n != 1 || err != nil {
		t.Fatalf("first pass: n=%d err=%v, want 1 <nil>", n, err)
	}
	if err := s.Update(ctx, func(tx ledger.Tx) error { return tx.Put(collPending, m.MessageID, nil) }); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if n, err := d.DeliverPending(ctx); n != 0 || err != nil {
			t.Fatalf("pass: n=%d err=%v, want 0 <nil>", n, err)
		}
	}
	if n := len(g.Requests()); n != 1 {
		t.Errorf("gateway saw %d requests, want 1", n)
	}
	if isPending(t, s, m.MessageID) {
		t.Errorf("stale pending entry of a delivered message was not removed")
	}
	if got := stored(t, s, m.MessageID); got.State != MessageDelivered || got.Attempts != 1 {
		t.Errorf("state=%s attempts=%d, want delivered 1", got.State, got.Attempts)
	}
}

// operator is who requeues in these tests.
var operator = ledger.Actor{Principal: "ops-anna", Role: "approver", ClientName: "idemgate-cli"}

func TestRequeue(t *testing.T) {
	ctx := context.Background()
	t.Run("dead message is delivered after requeue", func(t *testing.T) {
		clock := newRetryClock()
		s := openWithClock(t, clock)
		g := newIdemGateway(t, gatewayAnswer{Status: 403})
		d := NewDeliverer(s, mustWebhook(t, g.srv.URL, 5*time.Second), nil)
		m := queue(t, s, "k1")
		d.DeliverPending(ctx)
		if got := stored(t, s, m.MessageID); got.State != MessageDead {
			t.Fatalf("state after 403 = %s, want dead", got.State)
		}
		if err := d.Requeue(ctx, m.MessageID, operator); err != nil {
			t.Fatalf("Requeue: %v", err)
		}
		got := stored(t, s, m.MessageID)
		if got.State != MessageQueued || got.Attempts != 1 || !got.NextAttemptAt.IsZero() || !isPending(t, s, m.MessageID) {
			t.Fatalf("after Requeue: state=%s attempts=%d next=%v pending=%v; want queued 1 zero true",
				got.State, got.Attempts, got.NextAttemptAt, isPending(t, s, m.MessageID))
		}
		// The requeue is in the audit log: who, which message, when.
		tail, err := s.AuditTail(ctx, 1)
		if err != nil || len(tail) != 1 {
			t.Fatalf("AuditTail: %v %v", tail, err)
		}
		e := tail[0]
		if e.Event != ledger.EventOperator || !e.Is(ledger.AuditRequeued) || e.Actor.Principal != operator.Principal ||
			e.Actor.Tenant != m.Tenant || e.Key != m.OperationKey || e.Call == nil || len(e.Call.MessageIDs) != 1 ||
			e.Call.MessageIDs[0] != m.MessageID || !e.At.Equal(clock.Now()) || !strings.Contains(e.Detail, m.MessageID) {
			t.Errorf("requeue audit entry = %+v (call %+v), want operator/requeued by %s of %s at %v", e, e.Call, operator.Principal, m.MessageID, clock.Now())
		}
		if _, err := s.VerifyAudit(ctx); err != nil {
			t.Errorf("VerifyAudit after the requeue: %v", err)
		}
		if n, err := d.DeliverPending(ctx); n != 1 || err != nil {
			t.Fatalf("pass after Requeue: n=%d err=%v, want 1 <nil>", n, err)
		}
		if got := stored(t, s, m.MessageID); got.State != MessageDelivered || got.Attempts != 2 {
			t.Errorf("state=%s attempts=%d, want delivered 2", got.State, got.Attempts)
		}
		if len(g.Stored()) != 1 {
			t.Errorf("gateway stored %d messages, want 1", len(g.Stored()))
		}
	})
	t.Run("requeue gives a fresh budget", func(t *testing.T) {
		clock := newRetryClock()
		s := openWithClock(t, clock)
		g := newIdemGateway(t, gatewayAnswer{Status: 500}, gatewayAnswer{Status: 500}, gatewayAnswer{Status: 500}, gatewayAnswer{Status: 500})
		d := NewDeliverer(s, mustWebhook(t, g.srv.URL, 5*time.Second), nil)
		d.RetryBudget = 2
		m := queue(t, s, "k1")
		pass := func() {
			d.DeliverPending(ctx)
			clock.Advance(d.RetryCap)
		}
		pass()
		pass()
		if got := stored(t, s, m.MessageID); got.State != MessageDead || got.Attempts != 2 {
			t.Fatalf("state=%s attempts=%d, want dead 2", got.State, got.Attempts)
		}
		if err := d.Requeue(ctx, m.MessageID, operator); err != nil {
			t.Fatal(err)
		}
		pass()
		if got := stored(t, s, m.MessageID); got.State != MessageQueued || got.Attempts != 3 {
			t.Fatalf("after one failure past Requeue: state=%s attempts=%d, want queued 3", got.State, got.Attempts)
		}
		pass()
		if got := stored(t, s, m.MessageID); got.State != MessageDead || got.Attempts != 4 {
			t.Fatalf("state=%s attempts=%d, want dead 4", got.State, got.Attempts)
		}
	})
	t.Run("refusals", func(t *testing.T) {
		clock := newRetryClock()
		s := openWithClock(t, clock)
		g := newIdemGateway(t)
		d := NewDeliverer(s, mustWebhook(t, g.srv.URL, 5*time.Second), nil)
		delivered := queue(t, s, "k1")
		d.DeliverPending(ctx)
		queued := queue(t, s, "k2")
		for _, tc := range []struct {
			name, id string
			want     error
		}{
			{"unknown", "msg_doesnotexist", ErrMessageNotFound},
			{"delivered", delivered.MessageID, ErrMessageNotDead},
			{"queued", queued.MessageID, ErrMessageNotDead},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if err := d.Requeue(ctx, tc.id, operator); !errors.Is(err, tc.want) {
					t.Errorf("Requeue(%s) = %v, want %v", tc.id, err, tc.want)
				}
			})
		}
		if got := stored(t, s, delivered.MessageID); got.State != MessageDelivered {
			t.Errorf("refused Requeue changed a delivered message to %s", got.State)
		}
		log, err := s.AuditLog(ctx, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range log {
			if e.Event == ledger.EventOperator {
				t.Errorf("a refused Requeue left an audit entry: %+v", e)
			}
		}
	})
}

// Several deliverers (processes) racing over one outbox against one
// gateway. When the gateway accepts, every message ends delivered and the
// gateway stores each once. When it fails, each message's failure is
// counted once per pass, however many deliverers tried it at once.
func TestConcurrentWebhookDeliverers(t *testing.T) {
	for _, tc := range []struct {
		name         string
		script       []gatewayAnswer
		wantState    string
		wantAttempts int
		wantStored   int
	}{
		{"gateway accepts", nil, MessageDelivered, -1, 10},
		{"gateway fails", always(503, 1000), MessageQueued, 1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clock := newRetryClock()
			s := openWithClock(t, clock)
			g := newIdemGateway(t, tc.script...)
			var ids []string
			for i := range 10 {
				ids = append(ids, queue(t, s, fmt.Sprintf("key-%d", i)).MessageID)
			}
			var wg sync.WaitGroup
			for range 4 {
				d := NewDeliverer(s, mustWebhook(t, g.srv.URL, 5*time.Second), nil)
				d.Rand = fixedRand(0.5) // never due again in this test
				wg.Add(1)
				go func() {
					defer wg.Done()
					d.DeliverPending(ctx)
				}()
			}
			wg.Wait()
			if st := g.Stored(); len(st) != tc.wantStored {
				t.Errorf("gateway stored %d distinct messages, want %d", len(st), tc.wantStored)
			}
			for _, id := range ids {
				got := stored(t, s, id)
				if got.State != tc.wantState || (tc.wantAttempts >= 0 && got.Attempts != tc.wantAttempts) {
					t.Errorf("%s: state=%s attempts=%d, want %s %d", id, got.State, got.Attempts, tc.wantState, tc.wantAttempts)
				}
				if pend := isPending(t, s, id); pend != (tc.wantState == MessageQueued) {
					t.Errorf("%s: pending=%v in state %s", id, pend, got.State)
				}
			}
		})
	}
}
