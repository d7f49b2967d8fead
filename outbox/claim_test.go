package outbox

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
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

// flushCountingSink is a countingSink that also counts Flush calls (one
// per delivery pass that delivered something).
type flushCountingSink struct {
	*countingSink
	flushes atomic.Int64
}

func (f *flushCountingSink) Flush() error { f.flushes.Add(1); return nil }

// waitDelivered waits until no message is pending.
func waitDelivered(t *testing.T, s ledger.Store) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		n := 0
		if err := s.View(context.Background(), func(tx ledger.Tx) error {
			return tx.Scan(collPending, "", false, func(string, []byte) (bool, error) { n++; return true, nil })
		}); err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages still pending", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRunClaimRidesCalls: while messages are being queued one commit
// after another (as sequential creates queue their confirmations), a
// running deliverer's passes commit their claims, and record their
// outcomes, with those commits rather than with commits of their own.
// With a pass per message (no gathering) a claim of its own per pass
// made it about two commits per message.
func TestRunClaimRidesCalls(t *testing.T) {
	s := mustOpen(t)
	sink := newCountingSink(0)
	d := NewDeliverer(s, sink, nil)
	d.Gather = 0 // a pass per kick: the most claims
	d.Interval = time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	const n = 100
	var ids []string
	s0 := s.CommitStats()
	for i := range n {
		ids = append(ids, queue(t, s, fmt.Sprintf("ride-%d", i)).MessageID)
		d.Kick()
		time.Sleep(time.Millisecond) // the pass takes this one message
	}
	waitDelivered(t, s)
	commits := s.CommitStats().Commits - s0.Commits
	t.Logf("%d commits for %d messages queued and delivered", commits, n)
	// n for the queueing; the rest are claims and records that found no
	// commit to ride (the last passes', and any that waited carryWait).
	if limit := int64(n + n/2); commits > limit {
		t.Errorf("%d commits for %d messages queued and delivered, want at most %d", commits, n, limit)
	}
	for _, id := range ids {
		if c := sink.count(id); c != 1 {
			t.Errorf("%s handed to the sink %d times, want 1", id, c)
		}
	}
}

// TestRunDeliverersShareMessagesOnce: three running deliverers (their
// claims carried by the ledger's next write) over one outbox while
// messages are queued: every message is handed to the sink exactly once.
func TestRunDeliverersShareMessagesOnce(t *testing.T) {
	s := mustOpen(t)
	sink := newCountingSink(2 * time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ds []*Deliverer
	for range 3 {
		d := NewDeliverer(s, sink, nil)
		d.Gather, d.Interval = time.Millisecond, 10*time.Millisecond
		ds = append(ds, d)
		wg.Go(func() { d.Run(ctx) })
	}
	var ids []string
	for i := range 90 {
		ids = append(ids, queue(t, s, fmt.Sprintf("run-share-%d", i)).MessageID)
		ds[i%3].Kick()
	}
	waitDelivered(t, s)
	cancel()
	wg.Wait()
	for _, id := range ids {
		if c := sink.count(id); c != 1 {
			t.Errorf("%s handed to the sink %d times, want 1", id, c)
		}
		if m := stored(t, s, id); m.State != MessageDelivered || m.Attempts != 1 {
			t.Errorf("%s: %s after %d attempts, want delivered after 1", id, m.State, m.Attempts)
		}
	}
}

// TestGatherWaitsForTricklingMessages: messages queued one by one, a
// little apart, are delivered in a few passes (a pass waits up to
// GatherMax while fewer than gatherFill were queued), not in a pass per
// Gather; and the last is delivered within GatherMax of being queued
// (with room for a slow machine).
func TestGatherWaitsForTricklingMessages(t *testing.T) {
	s := mustOpen(t)
	sink := &flushCountingSink{countingSink: newCountingSink(0)}
	d := NewDeliverer(s, sink, nil)
	d.Gather, d.GatherMax, d.Interval = 10*time.Millisecond, 200*time.Millisecond, time.Hour
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	const n = 40
	start := time.Now()
	var last string
	for i := range n {
		last = queue(t, s, fmt.Sprintf("trickle-%d", i)).MessageID
		d.Kick()
		time.Sleep(2 * time.Millisecond)
	}
	queued := time.Now()
	for sink.count(last) == 0 && time.Since(queued) < 20*time.Second {
		time.Sleep(time.Millisecond)
	}
	elapsed, lag := time.Since(start), time.Since(queued)
	waitDelivered(t, s)
	passes := sink.flushes.Load()
	t.Logf("%d passes for %d messages queued over %v; the last delivered %v after it was queued", passes, n, queued.Sub(start), lag)
	// A pass at most every GatherMax while they trickle, and one for the
	// last of them; a pass per Gather would be elapsed/Gather.
	if limit := int64(elapsed/d.GatherMax) + 2; passes > limit {
		t.Errorf("%d passes over %v, want at most %d", passes, elapsed, limit)
	}
	if lag > d.GatherMax+2*time.Second {
		t.Errorf("the last message was delivered %v after it was queued, want about GatherMax (%v)", lag, d.GatherMax)
	}
}

// heldLater is a ledger file whose Later holds the writes back until the
// test runs them (and never reports them done).
type heldLater struct {
	*bolt.File
	mu   sync.Mutex
	held []func(ledger.Tx) error
}

func (h *heldLater) Later(fn func(ledger.Tx) error, _ func(error)) {
	h.mu.Lock()
	h.held = append(h.held, fn)
	h.mu.Unlock()
}

// runHeld runs the held writes from the i-th on, in one transaction.
func (h *heldLater) runHeld(t *testing.T, i int) {
	t.Helper()
	h.mu.Lock()
	fns := h.held[i:]
	h.mu.Unlock()
	if err := h.File.Update(context.Background(), func(tx ledger.Tx) error {
		for _, fn := range fns {
			if err := fn(tx); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func (h *heldLater) claims(t *testing.T) int {
	t.Helper()
	n := 0
	if err := h.View(context.Background(), func(tx ledger.Tx) error {
		return tx.Scan(collClaims, "", false, func(string, []byte) (bool, error) { n++; return true, nil })
	}); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAbandonedCarriedClaimLeavesNone: a pass that stops (its context
// done) while its claim waits for a write to carry it leaves no claim
// behind — neither when the claim is written later (by the ledger's
// flush at close) nor when a transaction already under way wrote it —
// so a stopping process does not keep its messages from the other
// deliverers for a lease.
func TestAbandonedCarriedClaimLeavesNone(t *testing.T) {
	for _, written := range []bool{false, true} {
		t.Run(fmt.Sprintf("written=%v", written), func(t *testing.T) {
			h := &heldLater{File: mustOpen(t)}
			m := queue(t, h, "abandoned")
			d := NewDeliverer(h, newCountingSink(0), nil)
			ctx, cancel := context.WithCancel(context.Background())
			type result struct {
				got []*Message
				err error
			}
			res := make(chan result, 1)
			go func() {
				got, _, err := d.claimCarried(ctx, h, []*Message{m})
				res <- result{got, err}
			}()
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				h.mu.Lock()
				n := len(h.held)
				h.mu.Unlock()
				if n == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the claim was not queued")
				}
			}
			if written {
				h.runHeld(t, 0) // a commit under way carries the claim
				if n := h.claims(t); n != 1 {
					t.Fatalf("%d claims written, want 1", n)
				}
			}
			cancel()
			r := <-res
			if r.err == nil || len(r.got) != 0 {
				t.Fatalf("claimCarried = %v, %v; want nothing and the context's error", r.got, r.err)
			}
			from := 1
			if !written {
				from = 0 // the flush at close runs the claim and what follows it
			}
			h.runHeld(t, from)
			if n := h.claims(t); n != 0 {
				t.Errorf("%d claims left by a pass that gave up its claim, want 0", n)
			}
		})
	}
}
