package outbox

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"idemgate/ledger"
)

// countingSink counts the deliveries of each message id; each takes
// delay, so deliverers racing over one outbox overlap.
type countingSink struct {
	mu     sync.Mutex
	counts map[string]int
	delay  time.Duration
}

func newCountingSink(delay time.Duration) *countingSink {
	return &countingSink{counts: map[string]int{}, delay: delay}
}

func (c *countingSink) Deliver(ctx context.Context, m *Message) error {
	c.mu.Lock()
	c.counts[m.MessageID]++
	c.mu.Unlock()
	select {
	case <-time.After(c.delay):
	case <-ctx.Done():
	}
	return nil
}

func (c *countingSink) Flush() error { return nil }

func (c *countingSink) count(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[id]
}

// TestDeliverersShareMessagesOnce: four deliverers (as four processes
// or replicas on one ledger would run) pass over one outbox at the same
// time against a slow sink. Every message is handed to the sink exactly
// once — not once per deliverer that saw it queued — and ends delivered.
func TestDeliverersShareMessagesOnce(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t)
	var ids []string
	for i := range 40 {
		ids = append(ids, queue(t, s, fmt.Sprintf("share-%d", i)).MessageID)
	}
	sink := newCountingSink(5 * time.Millisecond)
	var wg sync.WaitGroup
	for range 4 {
		d := NewDeliverer(s, sink, nil)
		wg.Go(func() {
			for range 3 { // more passes than needed: none may redeliver
				if _, err := d.DeliverPending(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for _, id := range ids {
		if n := sink.count(id); n != 1 {
			t.Errorf("%s handed to the sink %d times, want 1", id, n)
		}
		if m := stored(t, s, id); m.State != MessageDelivered || m.Attempts != 1 {
			t.Errorf("%s: %s after %d attempts, want delivered after 1", id, m.State, m.Attempts)
		}
	}
	claims := 0
	s.View(ctx, func(tx ledger.Tx) error {
		return tx.Scan(collClaims, "", false, func(string, []byte) (bool, error) { claims++; return true, nil })
	})
	if claims != 0 {
		t.Errorf("%d claims left after every outcome was recorded, want 0", claims)
	}
}

// TestClaimOfDeadDelivererExpires: a deliverer claims a message and dies
// before delivering it (its claim is written, nothing else). Another
// deliverer leaves the message alone while the claim lasts, and takes
// it over — delivering it once — when the claim has expired by the
// ledger's clock.
func TestClaimOfDeadDelivererExpires(t *testing.T) {
	ctx := context.Background()
	clock := newRetryClock()
	s := openWithClock(t, clock)
	m := queue(t, s, "dead-deliverer")
	dead := NewDeliverer(s, newCountingSink(0), nil)
	dead.ClaimLease = 10 * time.Second
	got, _, err := dead.claim(ctx, []*Message{m})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %v %v", got, err)
	}
	sink := newCountingSink(0)
	other := NewDeliverer(s, sink, nil)
	if n, err := other.DeliverPending(ctx); err != nil || n != 0 || sink.count(m.MessageID) != 0 {
		t.Fatalf("while claimed by another: delivered %d (%d to the sink), %v; want none", n, sink.count(m.MessageID), err)
	}
	clock.Advance(9 * time.Second)
	if n, _ := other.DeliverPending(ctx); n != 0 {
		t.Fatalf("delivered %d a second before the claim expired, want 0", n)
	}
	clock.Advance(2 * time.Second)
	if n, err := other.DeliverPending(ctx); err != nil || n != 1 {
		t.Fatalf("after the claim expired: delivered %d, %v; want 1", n, err)
	}
	if c := sink.count(m.MessageID); c != 1 {
		t.Errorf("handed to the sink %d times, want 1", c)
	}
	if st := stored(t, s, m.MessageID); st.State != MessageDelivered {
		t.Errorf("state %s, want delivered", st.State)
	}
}

// TestPassStopsStartingWhenClaimRunsLow: a pass starts deliveries only
// while half of its claim is left; the messages it did not start are
// released for the next pass, and none is lost.
func TestPassStopsStartingWhenClaimRunsLow(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t)
	var ids []string
	for i := range 6 {
		ids = append(ids, queue(t, s, fmt.Sprintf("low-%d", i)).MessageID)
	}
	sink := newCountingSink(60 * time.Millisecond)
	d := NewDeliverer(s, sink, nil)
	d.ClaimLease = 200 * time.Millisecond // half: room for about two deliveries
	n, err := d.DeliverPending(ctx)
	if err != nil || n < 1 || n >= len(ids) {
		t.Fatalf("first pass delivered %d, %v; want some but not all", n, err)
	}
	total := n
	for pass := 0; total < len(ids) && pass < 10; pass++ {
		k, err := d.DeliverPending(ctx)
		if err != nil {
			t.Fatal(err)
		}
		total += k
	}
	for _, id := range ids {
		if c := sink.count(id); c != 1 {
			t.Errorf("%s handed to the sink %d times, want 1", id, c)
		}
	}
	if total != len(ids) {
		t.Errorf("delivered %d of %d", total, len(ids))
	}
}
