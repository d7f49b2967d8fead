package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
)

func mustOpen(t testing.TB) *bolt.File {
	t.Helper()
	s, err := bolt.Open(filepath.Join(t.TempDir(), "ledger.db"), ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func queue(t *testing.T, s ledger.Store, key string) *Message {
	t.Helper()
	m := &Message{Tenant: "t1", OperationKey: key, Step: "notification", Channel: "email", To: []string{"a@example.com"}, Body: "hello " + key}
	if err := s.Update(context.Background(), func(tx ledger.Tx) error { return Enqueue(tx, m) }); err != nil {
		t.Fatal(err)
	}
	return m
}

func files(t *testing.T, dir string) []string {
	t.Helper()
	got, err := filepath.Glob(filepath.Join(dir, "msg_*.json"))
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// A redelivery — the sink wrote the file but the process stopped before
// marking the message delivered — must not add or change a file.
func TestRedeliveryWritesOneFile(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t)
	dir := t.TempDir()
	sink, err := NewDirSink(dir)
	if err != nil {
		t.Fatal(err)
	}
	d := NewDeliverer(s, sink, nil)
	m := queue(t, s, "k1")
	if n, err := d.DeliverPending(ctx); err != nil || n != 1 {
		t.Fatalf("first delivery: n=%d err=%v, want 1 <nil>", n, err)
	}
	first, err := os.ReadFile(filepath.Join(dir, m.MessageID+".json"))
	if err != nil {
		t.Fatal(err)
	}
	// Put the message back as if the mark-delivered transaction was lost.
	putBackQueued(t, s, m)
	if n, err := d.DeliverPending(ctx); err != nil || n != 1 {
		t.Fatalf("redelivery: n=%d err=%v, want 1 <nil>", n, err)
	}
	if got := files(t, dir); len(got) != 1 {
		t.Fatalf("files after redelivery = %v, want exactly one", got)
	}
	again, err := os.ReadFile(filepath.Join(dir, m.MessageID+".json"))
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(first) {
		t.Errorf("redelivery changed the message file:\n got %s\nwant %s", again, first)
	}
}

// Two deliverers (two processes in production) racing over the same
// outbox still leave one file per message.
func TestConcurrentDeliverersWriteOneFilePerMessage(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t)
	dir := t.TempDir()
	for i := range 20 {
		queue(t, s, "key-"+string(rune('a'+i)))
	}
	var wg sync.WaitGroup
	for range 4 {
		sink, err := NewDirSink(dir)
		if err != nil {
			t.Fatal(err)
		}
		d := NewDeliverer(s, sink, nil)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := d.DeliverPending(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if got := files(t, dir); len(got) != 20 {
		t.Fatalf("got %d files, want 20", len(got))
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".tmp-*"))
	if len(leftovers) != 0 {
		t.Errorf("temporary files left behind: %v", leftovers)
	}
	var pending int
	s.View(ctx, func(tx ledger.Tx) error {
		return tx.Scan(collPending, "", false, func(string, []byte) (bool, error) { pending++; return true, nil })
	})
	if pending != 0 {
		t.Errorf("%d messages still pending after delivery", pending)
	}
}

func TestMessageIDIsStablePerStep(t *testing.T) {
	a := MessageID("t1", "k", "confirmation")
	if b := MessageID("t1", "k", "confirmation"); a != b {
		t.Errorf("same operation and step gave %s and %s", a, b)
	}
	for _, other := range []string{MessageID("t2", "k", "confirmation"), MessageID("t1", "k2", "confirmation"), MessageID("t1", "k", "notification")} {
		if other == a {
			t.Errorf("different tenant, key or step gave the same id %s", a)
		}
	}
}

// TestDirSinkRefusesDifferentContent: a message whose id names a file that
// holds a different message is neither written over it nor recorded as
// delivered: it is dead-lettered, and the file keeps what it held. (Ids are
// unique per operation; this is the check behind that.)
func TestDirSinkRefusesDifferentContent(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t)
	dir := t.TempDir()
	sink, err := NewDirSink(dir)
	if err != nil {
		t.Fatal(err)
	}
	d := NewDeliverer(s, sink, nil)
	m := queue(t, s, "k1")
	if n, err := d.DeliverPending(ctx); err != nil || n != 1 {
		t.Fatalf("first delivery: n=%d err=%v, want 1 <nil>", n, err)
	}
	path := filepath.Join(dir, m.MessageID+".json")
	first, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The same id queued again with another body.
	if err := s.Update(ctx, func(tx ledger.Tx) error {
		cur, err := getMessage(tx, m.MessageID)
		if err != nil {
			return err
		}
		cur.State, cur.Body = MessageQueued, "a different message"
		v, _ := json.Marshal(cur)
		if err := tx.Put(Collection, m.MessageID, v); err != nil {
			return err
		}
		return tx.Put(collPending, m.MessageID, nil)
	}); err != nil {
		t.Fatal(err)
	}
	n, err := d.DeliverPending(ctx)
	if n != 0 || err == nil || !strings.Contains(err.Error(), "different message") {
		t.Fatalf("delivery over a different file: n=%d err=%v, want 0 and a refusal", n, err)
	}
	again, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(again) != string(first) {
		t.Errorf("the file was changed:\n got %s\nwant %s", again, first)
	}
	var state string
	s.View(ctx, func(tx ledger.Tx) error {
		cur, err := getMessage(tx, m.MessageID)
		if cur != nil {
			state = cur.State
		}
		return err
	})
	if state != MessageDead {
		t.Errorf("message state %q, want %q (never delivered)", state, MessageDead)
	}
}

// TestEnqueueNeverOverwrites: enqueueing a message whose id exists with
// other content fails (rolling back its transaction); the same message
// again leaves the first as it is.
func TestEnqueueNeverOverwrites(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t)
	m := queue(t, s, "k1")
	same := &Message{Tenant: "t1", OperationKey: "k1", Step: "notification", Channel: "email", To: []string{"a@example.com"}, Body: "hello k1"}
	if err := s.Update(ctx, func(tx ledger.Tx) error { return Enqueue(tx, same) }); err != nil {
		t.Fatalf("the same message again: %v", err)
	}
	other := &Message{Tenant: "t1", OperationKey: "k1", Step: "notification", Channel: "email", To: []string{"a@example.com"}, Body: "another body"}
	err := s.Update(ctx, func(tx ledger.Tx) error { return Enqueue(tx, other) })
	if !errors.Is(err, errMessageExists) {
		t.Fatalf("a different message under an existing id: %v, want errMessageExists", err)
	}
	s.View(ctx, func(tx ledger.Tx) error {
		cur, _ := getMessage(tx, m.MessageID)
		if cur == nil || cur.Body != "hello k1" {
			t.Errorf("stored message %+v, want the first", cur)
		}
		return nil
	})
	// Another incarnation of the key is another message.
	next := &Message{Tenant: "t1", OperationKey: "k1", Incarnation: "0011223344556677", Step: "notification", Channel: "email", To: []string{"a@example.com"}, Body: "another body"}
	if err := s.Update(ctx, func(tx ledger.Tx) error { return Enqueue(tx, next) }); err != nil || next.MessageID == m.MessageID {
		t.Errorf("a message of another incarnation: id %s (first %s), err %v; want a new id", next.MessageID, m.MessageID, err)
	}
}

// TestDeliveredMessageKeepsDigestOnly: once delivered, a message is
// stored without its payload, with the payload's digest; the sink got the
// whole message; the same message enqueued again matches it (and keeps
// its payload in the caller's copy), a different one under its id is
// refused. Queued and dead messages, and delivered ones stored whole by
// builds before, keep their payload.
func TestDeliveredMessageKeepsDigestOnly(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t)
	dir := t.TempDir()
	sink, err := NewDirSink(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := queue(t, s, "k1")
	if n, err := NewDeliverer(s, sink, nil).DeliverPending(ctx); err != nil || n != 1 {
		t.Fatalf("delivery: n=%d err=%v", n, err)
	}
	file, err := os.ReadFile(filepath.Join(dir, m.MessageID+".json"))
	if err != nil || !strings.Contains(string(file), `"body": "hello k1"`) || !strings.Contains(string(file), "a@example.com") {
		t.Fatalf("delivered file %s, %v: want the whole message", file, err)
	}
	raw := func() string {
		var v string
		s.View(ctx, func(tx ledger.Tx) error {
			b, err := tx.Get(Collection, m.MessageID)
			v = string(b)
			return err
		})
		return v
	}
	stored := raw()
	if strings.Contains(stored, "hello k1") || strings.Contains(stored, "a@example.com") || !strings.Contains(stored, `"state":"delivered"`) {
		t.Errorf("delivered message stored as %s: want no payload", stored)
	}
	var got *Message
	s.View(ctx, func(tx ledger.Tx) error { got, err = Get(tx, m.MessageID); return err })
	if got == nil || got.State != MessageDelivered || got.Body != "" || got.To != nil || got.PayloadSHA256 != payloadDigest(payloadOf(m)) || got.Attempts != 1 || got.OperationKey != "k1" {
		t.Errorf("delivered message read back: %+v", got)
	}

	same := &Message{Tenant: "t1", OperationKey: "k1", Step: "notification", Channel: "email", To: []string{"a@example.com"}, Body: "hello k1"}
	if err := s.Update(ctx, func(tx ledger.Tx) error { return Enqueue(tx, same) }); err != nil {
		t.Fatalf("the same message again after delivery: %v", err)
	}
	if same.State != MessageDelivered || same.Body != "hello k1" || len(same.To) != 1 || same.PayloadSHA256 != "" {
		t.Errorf("the same message enqueued again: %+v, want it delivered, with its payload", same)
	}
	if after := raw(); after != stored {
		t.Errorf("enqueueing the same message again rewrote it: %s, was %s", after, stored)
	}
	for _, other := range []*Message{
		{Tenant: "t1", OperationKey: "k1", Step: "notification", Channel: "email", To: []string{"a@example.com"}, Body: "another body"},
		{Tenant: "t1", OperationKey: "k1", Step: "notification", Channel: "email", To: []string{"b@example.com"}, Body: "hello k1"},
		{Tenant: "t1", OperationKey: "k1", Step: "notification", Channel: "sms", To: []string{"a@example.com"}, Body: "hello k1"},
	} {
		if err := s.Update(ctx, func(tx ledger.Tx) error { return Enqueue(tx, other) }); !errors.Is(err, errMessageExists) {
			t.Errorf("a different message (%v %s %q) under a delivered one's id: %v, want errMessageExists", other.To, other.Channel, other.Body, err)
		}
	}

	// As builds before stored a delivered message: whole. It compares by
	// its payload, as it did.
	whole := *m
	whole.State, whole.Attempts = MessageDelivered, 1
	v, _ := json.Marshal(whole)
	if err := s.Update(ctx, func(tx ledger.Tx) error { return tx.Put(Collection, m.MessageID, v) }); err != nil {
		t.Fatal(err)
	}
	again := &Message{Tenant: "t1", OperationKey: "k1", Step: "notification", Channel: "email", To: []string{"a@example.com"}, Body: "hello k1"}
	if err := s.Update(ctx, func(tx ledger.Tx) error { return Enqueue(tx, again) }); err != nil || again.State != MessageDelivered || again.Body != "hello k1" {
		t.Errorf("the same message again over a whole delivered one: %+v, %v", again, err)
	}
	other := &Message{Tenant: "t1", OperationKey: "k1", Step: "notification", Channel: "email", To: []string{"a@example.com"}, Body: "x"}
	if err := s.Update(ctx, func(tx ledger.Tx) error { return Enqueue(tx, other) }); !errors.Is(err, errMessageExists) {
		t.Errorf("a different message over a whole delivered one: %v, want errMessageExists", err)
	}

	// Queued and dead messages are stored whole.
	for _, st := range []string{MessageQueued, MessageDead} {
		w := *m
		w.State = st
		if err := s.Update(ctx, func(tx ledger.Tx) error { return putMessage(tx, &w) }); err != nil {
			t.Fatal(err)
		}
		var back *Message
		s.View(ctx, func(tx ledger.Tx) error { back, err = Get(tx, m.MessageID); return err })
		if back == nil || back.Body != "hello k1" || len(back.To) != 1 || back.PayloadSHA256 != "" {
			t.Errorf("%s message read back: %+v, want its payload", st, back)
		}
	}
}

// A backlog larger than one pass drains without waiting for the interval
// between full passes: after one kick, Run delivers everything well
// before Interval (an hour here) could have started a second pass — with
// the directory sink and with the segment sink.
func TestFullPassStartsNextAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sink      func(dir string) (Sink, error)
		delivered func(t *testing.T, dir string) int
	}{
		{"files", func(dir string) (Sink, error) { return NewDirSink(dir) }, func(t *testing.T, dir string) int { return len(files(t, dir)) }},
		{"segments", func(dir string) (Sink, error) { return NewSegmentSink(dir, nil) }, func(t *testing.T, dir string) int { return len(segmentPayloads(t, dir)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s := mustOpen(t)
			dir := t.TempDir()
			sink, err := tc.sink(dir)
			if err != nil {
				t.Fatal(err)
			}
			const total = 2*passLimit + 7
			if err := s.Update(ctx, func(tx ledger.Tx) error {
				for i := range total {
					m := &Message{Tenant: "t1", OperationKey: fmt.Sprintf("k%05d", i), Step: "notification", Channel: "email", To: []string{"a@example.com"}, Body: "hello"}
					if err := Enqueue(tx, m); err != nil {
						return err
					}
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			d := NewDeliverer(s, sink, nil)
			d.Interval = time.Hour
			done := make(chan struct{})
			go func() { d.Run(ctx); close(done) }()
			pending := func() int {
				n := 0
				if err := s.View(context.Background(), func(tx ledger.Tx) error {
					return tx.Scan(collPending, "", false, func(string, []byte) (bool, error) { n++; return true, nil })
				}); err != nil {
					t.Fatal(err)
				}
				return n
			}
			deadline := time.Now().Add(20 * time.Second)
			for pending() > 0 && time.Now().Before(deadline) {
				time.Sleep(20 * time.Millisecond)
			}
			cancel()
			<-done
			if n := pending(); n != 0 {
				t.Fatalf("%d of %d messages still pending: a full pass did not start the next", n, total)
			}
			if got := tc.delivered(t, dir); got != total {
				t.Fatalf("%d messages delivered, want %d", got, total)
			}
		})
	}
}

// A pass is made durable with one sync on Linux (syncfs), not one per
// message; both ways of creating a file and all three ways of syncing
// deliver every message exactly once, as a whole file.
func TestPassSyncsAndCreateModes(t *testing.T) {
	for _, tc := range []struct {
		name     string
		portable bool
		mode     int32
	}{
		{"tmpfile,syncfs", false, syncFS},
		{"tmpfile,staged", false, syncStaged},
		{"createtemp,each", true, syncEach},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			s := mustOpen(t)
			dir := t.TempDir()
			sink, err := NewDirSink(dir)
			if err != nil {
				t.Fatal(err)
			}
			sink.noTmpfile.Store(tc.portable)
			sink.syncMode.Store(tc.mode)
			const n = 40
			var msgs []*Message
			for i := range n {
				msgs = append(msgs, queue(t, s, fmt.Sprintf("k%02d", i)))
			}
			d := NewDeliverer(s, sink, nil)
			if got, err := d.DeliverPending(ctx); err != nil || got != n {
				t.Fatalf("delivered %d, %v; want %d", got, err, n)
			}
			if got := len(files(t, dir)); got != n {
				t.Fatalf("%d files, want %d", got, n)
			}
			if left, _ := filepath.Glob(filepath.Join(dir, ".tmp-*")); len(left) != 0 {
				t.Fatalf("temporary files left: %v", left)
			}
			for _, m := range msgs {
				b, err := os.ReadFile(filepath.Join(dir, m.MessageID+".json"))
				if err != nil {
					t.Fatal(err)
				}
				var got deliveryPayload
				if err := json.Unmarshal(b, &got); err != nil || !samePayload(got, payloadOf(m)) {
					t.Fatalf("file of %s holds %s (%v)", m.MessageID, b, err)
				}
			}
			syncs := sink.syncs.Load()
			switch {
			case tc.mode == syncFS && sink.syncMode.Load() == syncFS && syncs != 1:
				t.Fatalf("a pass of %d messages took %d syncs, want 1", n, syncs)
			case tc.mode != syncFS && syncs != n+1:
				t.Fatalf("a pass of %d messages took %d fsyncs, want %d (each file and the directory)", n, syncs, n+1)
			}
		})
	}
}

// deadFixture writes five messages — t1's dead, queued, delivered and
// dead again, t2's dead — and returns t1's dead ones' ids.
func deadFixture(t *testing.T, s ledger.Store) map[string]bool {
	t.Helper()
	want := map[string]bool{}
	for i, c := range []struct{ tenant, state string }{
		{"t1", MessageDead}, {"t1", MessageQueued}, {"t1", MessageDelivered}, {"t2", MessageDead}, {"t1", MessageDead},
	} {
		m := &Message{Tenant: c.tenant, OperationKey: fmt.Sprintf("k%d", i), Step: "notification", Channel: "email", To: []string{"a@example.com"}, Body: "hi"}
		if err := s.Update(context.Background(), func(tx ledger.Tx) error {
			if err := Enqueue(tx, m); err != nil {
				return err
			}
			m.State = c.state
			return putMessage(tx, m)
		}); err != nil {
			t.Fatal(err)
		}
		if c.tenant == "t1" && c.state == MessageDead {
			want[m.MessageID] = true
		}
	}
	return want
}

// readCounter is a transaction that counts the values its scans read.
type readCounter struct {
	ledger.Tx
	read int
}

func (r *readCounter) Scan(collection, prefix string, reverse bool, fn func(string, []byte) (bool, error)) error {
	return r.Tx.Scan(collection, prefix, reverse, func(k string, v []byte) (bool, error) {
		r.read++
		return fn(k, v)
	})
}

func deadLetters(t *testing.T, s ledger.Store, tenant string, limit, scan int) (*DeadLetterList, int) {
	t.Helper()
	var out *DeadLetterList
	var read int
	if err := s.View(context.Background(), func(tx ledger.Tx) error {
		rc := &readCounter{Tx: tx}
		var err error
		out, err = DeadLetters(rc, tenant, limit, scan)
		read = rc.read
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return out, read
}

// TestDeadLetters: DeadLetters lists the tenant's dead-lettered messages
// only — not its queued or delivered ones, not another tenant's — and at
// most limit of them.
func TestDeadLetters(t *testing.T) {
	s := mustOpen(t)
	want := deadFixture(t, s)
	all, _ := deadLetters(t, s, "t1", 10, 100)
	got := map[string]bool{}
	for _, m := range all.Messages {
		got[m.MessageID] = true
		if m.Tenant != "t1" || m.State != MessageDead {
			t.Errorf("listed %s of %s in state %s", m.MessageID, m.Tenant, m.State)
		}
	}
	if len(all.Messages) != len(want) || len(got) != len(want) || all.Scanned != 5 || all.Truncated || len(all.Undecodable) != 0 {
		t.Errorf("DeadLetters(t1) = %v, scanned %d, truncated %v; want %v, all 5 read", got, all.Scanned, all.Truncated, want)
	}
	one, _ := deadLetters(t, s, "t1", 1, 100)
	if len(one.Messages) != 1 || !want[one.Messages[0].MessageID] {
		t.Errorf("DeadLetters(t1, limit 1) = %d messages, want one of t1's dead letters", len(one.Messages))
	}
}

// TestDeadLettersBounded: DeadLetters reads at most scan messages of the
// outbox (counted by the transaction, not by its own word) and says when
// it stopped with messages left unread; reading them all is not
// truncated.
func TestDeadLettersBounded(t *testing.T) {
	s := mustOpen(t)
	deadFixture(t, s)
	for _, c := range []struct {
		scan      int
		truncated bool
	}{{1, true}, {3, true}, {4, true}, {5, false}, {6, false}} {
		got, read := deadLetters(t, s, "t1", 10, c.scan)
		if got.Scanned != min(c.scan, 5) || got.Truncated != c.truncated || read > c.scan+1 {
			t.Errorf("scan %d: scanned %d, truncated %v, %d values read; want %d scanned, truncated %v, at most %d read",
				c.scan, got.Scanned, got.Truncated, read, min(c.scan, 5), c.truncated, c.scan+1)
		}
	}
}

// TestDeadLettersSkipsUndecodable: a message that is not valid JSON —
// another tenant's, or of no tenant one can tell — is skipped and named,
// and the tenant's dead letters are listed all the same.
func TestDeadLettersSkipsUndecodable(t *testing.T) {
	s := mustOpen(t)
	want := deadFixture(t, s)
	bad := []string{"msg_0000", "msg_ffff"} // before and after every other id
	if err := s.Update(context.Background(), func(tx ledger.Tx) error {
		for _, id := range bad {
			if err := tx.Put(Collection, id, []byte(`{"message_id":`)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got, _ := deadLetters(t, s, "t1", 10, 100)
	ids := map[string]bool{}
	for _, m := range got.Messages {
		ids[m.MessageID] = true
	}
	if len(ids) != len(want) || !slices.Equal(got.Undecodable, bad) || got.Scanned != 7 {
		t.Errorf("DeadLetters with two undecodable messages = %v, undecodable %q, scanned %d; want %v, %q, 7", ids, got.Undecodable, got.Scanned, want, bad)
	}
}

// TestGet: Get returns a message by its id as stored, and nil for an id
// with no message.
func TestGet(t *testing.T) {
	s := mustOpen(t)
	m := queue(t, s, "k1")
	var got, none *Message
	if err := s.View(context.Background(), func(tx ledger.Tx) error {
		var err error
		if got, err = Get(tx, m.MessageID); err != nil {
			return err
		}
		none, err = Get(tx, "msg_doesnotexist")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got == nil || got.MessageID != m.MessageID || got.Tenant != "t1" || got.State != MessageQueued || got.Body != m.Body {
		t.Errorf("Get = %+v, want the queued message %s", got, m.MessageID)
	}
	if none != nil {
		t.Errorf("Get of no message = %+v, want nil", none)
	}
}
