package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"idemgate/ledger"
)

func mustSegmentSink(t testing.TB, outboxDir string) *SegmentSink {
	t.Helper()
	s, err := NewSegmentSink(outboxDir, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// segmentBytes is every segment of outboxDir, concatenated in order.
func segmentBytes(t testing.TB, outboxDir string) []byte {
	t.Helper()
	seqs, err := segments(filepath.Join(outboxDir, "segments"))
	if err != nil {
		t.Fatal(err)
	}
	var all []byte
	for _, seq := range seqs {
		b, err := os.ReadFile(filepath.Join(outboxDir, "segments", segmentName(seq)))
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return all
}

// segmentPayloads reads every line of the segments of outboxDir, failing
// unless each is a whole line holding one payload and no id comes twice.
func segmentPayloads(t testing.TB, outboxDir string) map[string]deliveryPayload {
	t.Helper()
	all := segmentBytes(t, outboxDir)
	if len(all) > 0 && all[len(all)-1] != '\n' {
		t.Fatalf("the segments end in a line without its newline: %q", all[max(0, len(all)-80):])
	}
	out := map[string]deliveryPayload{}
	for line := range bytes.Lines(all) {
		var p deliveryPayload
		if err := json.Unmarshal(line, &p); err != nil || p.MessageID == "" {
			t.Fatalf("line %q: %v", line, err)
		}
		if _, dup := out[p.MessageID]; dup {
			t.Fatalf("message %s appended twice", p.MessageID)
		}
		out[p.MessageID] = p
	}
	return out
}

// deliverPass hands msgs to sink as a deliverer's pass does: Deliver
// each, then Flush.
func deliverPass(t testing.TB, sink Sink, msgs []*Message) {
	t.Helper()
	for _, m := range msgs {
		if err := sink.Deliver(context.Background(), m); err != nil {
			t.Fatalf("deliver %s: %v", m.MessageID, err)
		}
	}
	if err := sink.Flush(); err != nil {
		t.Fatalf("flush: %v", err)
	}
}

// putBackQueued makes a delivered message queued again, as if the
// transaction recording its delivery was lost in a crash: m is the
// message as it was queued (the delivered one no longer holds its
// payload).
func putBackQueued(t *testing.T, s ledger.Store, m *Message) {
	t.Helper()
	if err := s.Update(context.Background(), func(tx ledger.Tx) error {
		q := *m
		q.State = MessageQueued
		if err := putMessage(tx, &q); err != nil {
			return err
		}
		return tx.Put(collPending, m.MessageID, nil)
	}); err != nil {
		t.Fatal(err)
	}
}

// A redelivery through the deliverer — by the same sink, and by a sink
// opened afresh (a restart) — leaves the segments byte for byte as the
// first delivery wrote them: one line of the message's payload.
func TestSegmentRedeliveryByteForByte(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t)
	dir := t.TempDir()
	sink := mustSegmentSink(t, dir)
	m := queue(t, s, "k1")
	if n, err := NewDeliverer(s, sink, nil).DeliverPending(ctx); err != nil || n != 1 {
		t.Fatalf("first delivery: n=%d err=%v, want 1 <nil>", n, err)
	}
	first := segmentBytes(t, dir)
	want, _ := json.Marshal(payloadOf(m))
	if string(first) != string(want)+"\n" {
		t.Fatalf("segments hold %q, want the payload on one line %q", first, want)
	}
	for _, name := range []string{"same sink", "restarted"} {
		if name == "restarted" {
			sink = mustSegmentSink(t, dir)
		}
		putBackQueued(t, s, m)
		if n, err := NewDeliverer(s, sink, nil).DeliverPending(ctx); err != nil || n != 1 {
			t.Fatalf("%s: redelivery n=%d err=%v, want 1 <nil>", name, n, err)
		}
		if again := segmentBytes(t, dir); !bytes.Equal(again, first) {
			t.Fatalf("%s: redelivery changed the segments:\n got %q\nwant %q", name, again, first)
		}
	}
}

// A different message under an id the segments hold is refused as a
// *PermanentError and dead-lettered, the line standing — whether this
// sink appended the id, or another sink (process) did after this one last
// read the segments, when the pass's Flush fails and the redelivery is
// refused.
func TestSegmentRefusesDifferentContent(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	a, b := mustSegmentSink(t, dir), mustSegmentSink(t, dir)
	m := benchMessage(1)
	other := *m
	other.Body = "a different message"

	deliverPass(t, a, []*Message{m})
	first := segmentBytes(t, dir)
	if err := a.Deliver(ctx, &other); !IsPermanent(err) {
		t.Fatalf("a different message under a delivered id: %v, want a *PermanentError", err)
	}
	// b read the segments before a appended m: its Deliver cannot know,
	// its Flush finds out.
	if err := b.Deliver(ctx, &other); err != nil {
		t.Fatalf("b's delivery before it read a's line: %v", err)
	}
	if err := b.Flush(); err == nil || !strings.Contains(err.Error(), "different message") {
		t.Fatalf("b's flush: %v, want the conflict reported", err)
	}
	if err := b.Deliver(ctx, &other); !IsPermanent(err) {
		t.Fatalf("b's redelivery: %v, want a *PermanentError", err)
	}
	if err := b.Deliver(ctx, m); err != nil {
		t.Fatalf("the same message by b: %v", err)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := segmentBytes(t, dir); !bytes.Equal(got, first) {
		t.Fatalf("the segments changed:\n got %q\nwant %q", got, first)
	}

	// Through the deliverer: the message is dead-lettered, not delivered.
	s := mustOpen(t)
	dir2 := t.TempDir()
	sink := mustSegmentSink(t, dir2)
	d := NewDeliverer(s, sink, nil)
	q := queue(t, s, "k1")
	if n, err := d.DeliverPending(ctx); err != nil || n != 1 {
		t.Fatalf("first delivery: n=%d err=%v", n, err)
	}
	if err := s.Update(ctx, func(tx ledger.Tx) error {
		cur, err := getMessage(tx, q.MessageID)
		if err != nil {
			return err
		}
		cur.State, cur.Body = MessageQueued, "a different message"
		if err := putMessage(tx, cur); err != nil {
			return err
		}
		return tx.Put(collPending, q.MessageID, nil)
	}); err != nil {
		t.Fatal(err)
	}
	if n, err := d.DeliverPending(ctx); n != 0 || err == nil {
		t.Fatalf("delivery of a different message: n=%d err=%v, want 0 and a refusal", n, err)
	}
	s.View(ctx, func(tx ledger.Tx) error {
		cur, _ := getMessage(tx, q.MessageID)
		if cur == nil || cur.State != MessageDead {
			t.Errorf("message %+v, want it dead-lettered", cur)
		}
		return nil
	})
	if got := segmentPayloads(t, dir2); len(got) != 1 || got[q.MessageID].Body != "hello k1" {
		t.Fatalf("segments hold %+v, want the first message alone", got)
	}
}

// Sinks with their own file handles on one directory, delivering the same
// messages at once in different orders and pass sizes, append every id
// exactly once; so do deliverers sharing one ledger and one directory.
func TestSegmentConcurrentSinks(t *testing.T) {
	dir := t.TempDir()
	const n = 300
	msgs := make([]*Message, n)
	for i := range msgs {
		msgs[i] = benchMessage(i)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		sink := mustSegmentSink(t, dir)
		sink.MaxSegmentBytes = 8 << 10 // rotations race too
		wg.Go(func() {
			order := rand.New(rand.NewPCG(uint64(g), 1)).Perm(n)
			pass := 7 + 13*g
			for i := 0; i < n; i += pass {
				var batch []*Message
				for _, j := range order[i:min(i+pass, n)] {
					batch = append(batch, msgs[j])
				}
				for _, m := range batch {
					if err := sink.Deliver(context.Background(), m); err != nil {
						t.Error(err)
						return
					}
				}
				if err := sink.Flush(); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if got := segmentPayloads(t, dir); len(got) != n {
		t.Fatalf("%d messages in the segments, want %d", len(got), n)
	}

	ctx := context.Background()
	s := mustOpen(t)
	dir2 := t.TempDir()
	for i := range 40 {
		queue(t, s, fmt.Sprintf("key-%02d", i))
	}
	for range 4 {
		d := NewDeliverer(s, mustSegmentSink(t, dir2), nil)
		wg.Go(func() {
			if _, err := d.DeliverPending(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := segmentPayloads(t, dir2); len(got) != 40 {
		t.Fatalf("%d messages in the segments, want 40", len(got))
	}
}

// TestSegmentProcesses: processes (this test binary, run again as
// helpers) delivering the same messages to one directory at once append
// every id exactly once.
func TestSegmentProcesses(t *testing.T) {
	if dir := os.Getenv("IDEMGATE_SEGMENT_HELPER_DIR"); dir != "" {
		seed, _ := strconv.Atoi(os.Getenv("IDEMGATE_SEGMENT_HELPER_SEED"))
		sink := mustSegmentSink(t, dir)
		sink.MaxSegmentBytes = 16 << 10
		order := rand.New(rand.NewPCG(uint64(seed), 2)).Perm(400)
		for i := 0; i < len(order); i += 25 {
			var batch []*Message
			for _, j := range order[i : i+25] {
				batch = append(batch, benchMessage(j))
			}
			deliverPass(t, sink, batch)
		}
		return
	}
	dir := t.TempDir()
	var cmds []*exec.Cmd
	for i := range 3 {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestSegmentProcesses$", "-test.count", "1")
		cmd.Env = append(os.Environ(), "IDEMGATE_SEGMENT_HELPER_DIR="+dir, "IDEMGATE_SEGMENT_HELPER_SEED="+strconv.Itoa(i))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("helper %d:\n%s", i, out.String())
			}
		})
		cmds = append(cmds, cmd)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("helper %d: %v", i, err)
		}
	}
	got := segmentPayloads(t, dir)
	if len(got) != 400 {
		t.Fatalf("%d messages in the segments, want 400", len(got))
	}
	for i := range 400 {
		m := benchMessage(i)
		if p, ok := got[m.MessageID]; !ok || !samePayload(p, payloadOf(m)) {
			t.Fatalf("message %d: %+v, want %+v", i, p, payloadOf(m))
		}
	}
}

// A torn tail — an unterminated last line: what a power loss before the
// fdatasync, or a process killed in its write, leaves — is kept aside and
// cut off by the next sink to open the segments or to flush, never read
// as a message; the message it tore is delivered again, once.
func TestSegmentTornTail(t *testing.T) {
	msgs := make([]*Message, 11)
	for i := range msgs {
		msgs[i] = benchMessage(i)
	}
	line10, _ := json.Marshal(payloadOf(msgs[10]))
	for _, tc := range []struct {
		name string
		torn []byte
	}{
		{"half a line", line10[:len(line10)/2]},
		{"a line without its newline", line10},
		{"zeros", make([]byte, 300)},
	} {
		for _, when := range []string{"open", "flush"} {
			t.Run(tc.name+"/"+when, func(t *testing.T) {
				dir := t.TempDir()
				first := mustSegmentSink(t, dir)
				deliverPass(t, first, msgs[:10])
				whole := segmentBytes(t, dir)
				other := mustSegmentSink(t, dir) // a process that read the segments before the crash
				seg := filepath.Join(dir, "segments", segmentName(1))
				f, err := os.OpenFile(seg, os.O_WRONLY|os.O_APPEND, 0)
				if err != nil {
					t.Fatal(err)
				}
				f.Write(tc.torn)
				f.Close()
				sink := other
				if when == "open" {
					sink = mustSegmentSink(t, dir)
					if got := segmentBytes(t, dir); !bytes.Equal(got, whole) {
						t.Fatalf("after open the segment holds %q, want the torn tail cut off", got[len(whole):])
					}
				}
				deliverPass(t, sink, msgs) // the whole pass again: only the torn message is appended
				if got, want := segmentBytes(t, dir), append(whole, append(line10, '\n')...); !bytes.Equal(got, want) {
					t.Fatalf("segments end in %q, want %q", got[len(whole):], want[len(whole):])
				}
				if sink.cut.Load() != int64(len(tc.torn)) || sink.TornTails() != 1 {
					t.Fatalf("cut %d bytes in %d tails, want %d in 1", sink.cut.Load(), sink.TornTails(), len(tc.torn))
				}
				kept, _ := filepath.Glob(seg + ".torn-*")
				if len(kept) != 1 {
					t.Fatalf("kept aside: %v, want one file", kept)
				}
				if b, _ := os.ReadFile(kept[0]); !bytes.Equal(b, tc.torn) {
					t.Fatalf("the kept file holds %q, want the torn tail %q", b, tc.torn)
				}
				// The kept tail is a problem for check until its message is
				// in the segments again; one too short to name it, always.
				want := 0
				if tornID(bytes.NewReader(tc.torn), 0) == "(unreadable)" {
					want = 1
				}
				if problems, err := CheckSegments(dir); err != nil || len(problems) != want {
					t.Fatalf("CheckSegments: %q, %v; want %d problem(s)", problems, err, want)
				}
				if got := segmentPayloads(t, dir); len(got) != 11 {
					t.Fatalf("%d messages, want 11", len(got))
				}
			})
		}
	}

}

// Damage — a whole line that is not a message line, in any segment, or
// an unterminated last line in an older one — is not a torn tail: the
// sink refuses it at open and at a Flush that reads it, with an error
// naming the segment and the line, and cuts nothing: the lines after it
// are kept. CheckSegments lists it.
func TestSegmentDamageIsRefusedNotCut(t *testing.T) {
	msgs := make([]*Message, 51)
	for i := range msgs {
		msgs[i] = benchMessage(i)
	}
	line10, _ := json.Marshal(payloadOf(msgs[10]))
	for _, tc := range []struct {
		name   string
		damage func(b []byte) []byte // the 50 lines of one segment, damaged
		after  int                   // whole lines after the damaged one
	}{
		{"a byte changed at the start of line 11", func(b []byte) []byte { b[lineStart(b, 11)] = 'X'; return b }, 39},
		{"an empty line after line 10", func(b []byte) []byte { return slices.Insert(b, lineStart(b, 11), '\n') }, 40},
		{"zeros then a line at the end", func(b []byte) []byte { return append(b, append(make([]byte, 50), append(line10, '\n')...)...) }, 0},
		{"a cut line then a newline at the end", func(b []byte) []byte { return append(b, append(line10[:40:40], '\n')...) }, 0},
	} {
		for _, when := range []string{"open", "flush"} {
			t.Run(tc.name+"/"+when, func(t *testing.T) {
				dir := t.TempDir()
				seg := filepath.Join(dir, "segments", segmentName(1))
				deliverPass(t, mustSegmentSink(t, dir), msgs[:50])
				other := mustSegmentSink(t, dir) // a process that read the segments before
				if when == "flush" {
					// It must read the damage: another process appended it.
					if err := os.Truncate(seg, 0); err != nil {
						t.Fatal(err)
					}
					other = mustSegmentSink(t, dir)
					deliverPass(t, mustSegmentSink(t, dir), msgs[:50])
				}
				b, err := os.ReadFile(seg)
				if err != nil {
					t.Fatal(err)
				}
				damaged := tc.damage(b)
				if err := os.WriteFile(seg, damaged, 0o600); err != nil {
					t.Fatal(err)
				}
				wantLine := "line 11 "
				if tc.after == 0 {
					wantLine = "line 51 "
				}
				var err2 error
				if when == "open" {
					_, err2 = NewSegmentSink(dir, nil)
				} else {
					other.Deliver(context.Background(), msgs[50])
					err2 = other.Flush()
					if !other.Damaged() {
						t.Errorf("Damaged() is false after a flush refused damage")
					}
				}
				var de *SegmentDamageError
				if !errors.As(err2, &de) || !strings.Contains(err2.Error(), segmentName(1)) || !strings.Contains(err2.Error(), wantLine) || de.After != tc.after {
					t.Fatalf("got %v, want a *SegmentDamageError naming %s, %s and %d lines after it", err2, segmentName(1), wantLine, tc.after)
				}
				if got, _ := os.ReadFile(seg); !bytes.Equal(got, damaged) {
					t.Fatalf("the damaged segment was changed: %d bytes, had %d", len(got), len(damaged))
				}
				problems, err := CheckSegments(dir)
				if err != nil || len(problems) != 1 || !strings.Contains(problems[0], wantLine) {
					t.Fatalf("CheckSegments: %q, %v; want the damaged line", problems, err)
				}
			})
		}
	}

	// In an older segment, an unterminated last line is damage too.
	dir := t.TempDir()
	sink := mustSegmentSink(t, dir)
	sink.MaxSegmentBytes = 1
	deliverPass(t, sink, msgs[:1])
	deliverPass(t, sink, msgs[1:2])
	seg1 := filepath.Join(dir, "segments", segmentName(1))
	f, err := os.OpenFile(seg1, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte("garbage"))
	f.Close()
	if _, err := NewSegmentSink(dir, nil); err == nil || !strings.Contains(err.Error(), segmentName(1)) || !strings.Contains(err.Error(), "damaged") {
		t.Fatalf("opening over a damaged older segment: %v, want an error naming it", err)
	}
	if b, _ := os.ReadFile(seg1); !bytes.HasSuffix(b, []byte("garbage")) {
		t.Fatalf("the damaged segment was changed: %q", b)
	}
}

// lineStart is the offset of line n (from 1) of b.
func lineStart(b []byte, n int) int {
	off := 0
	for range n - 1 {
		off += bytes.IndexByte(b[off:], '\n') + 1
	}
	return off
}

// A pass that would take the newest segment past MaxSegmentBytes starts a
// new one; a pass is never split; the ids of every segment are known
// after a restart and to a sink that read the segments before the
// rotations.
func TestSegmentRotation(t *testing.T) {
	dir := t.TempDir()
	early := mustSegmentSink(t, dir)
	sink := mustSegmentSink(t, dir)
	const limit = 1500
	sink.MaxSegmentBytes = limit
	msgs := make([]*Message, 60)
	for i := range msgs {
		msgs[i] = benchMessage(i)
	}
	for i := 0; i < len(msgs); i += 3 {
		deliverPass(t, sink, msgs[i:i+3])
	}
	seqs, err := segments(filepath.Join(dir, "segments"))
	if err != nil {
		t.Fatal(err)
	}
	if len(seqs) < 5 {
		t.Fatalf("segments %v, want several", seqs)
	}
	for i, seq := range seqs {
		if seq != uint64(i+1) {
			t.Fatalf("segments %v, want 1, 2, 3, …", seqs)
		}
		b, err := os.ReadFile(filepath.Join(dir, "segments", segmentName(seq)))
		if err != nil {
			t.Fatal(err)
		}
		if lines := bytes.Count(b, []byte("\n")); len(b) > limit && lines > 3 || lines%3 != 0 {
			t.Fatalf("segment %d: %d bytes in %d lines: want at most %d bytes or one pass, whole passes", seq, len(b), lines, limit)
		}
	}
	before := segmentBytes(t, dir)
	for _, s := range []*SegmentSink{mustSegmentSink(t, dir), early} {
		deliverPass(t, s, msgs)
		if got := segmentBytes(t, dir); !bytes.Equal(got, before) {
			t.Fatalf("delivering the messages again appended %d bytes", len(got)-len(before))
		}
	}
	if got := segmentPayloads(t, dir); len(got) != len(msgs) {
		t.Fatalf("%d messages, want %d", len(got), len(msgs))
	}
}

// One pass into an existing segment is one write and one fdatasync,
// whatever its size.
func TestSegmentOneSyncPerPass(t *testing.T) {
	ctx := context.Background()
	s := mustOpen(t)
	dir := t.TempDir()
	sink := mustSegmentSink(t, dir)
	d := NewDeliverer(s, sink, nil)
	queue(t, s, "first")
	if _, err := d.DeliverPending(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 40
	for i := range n {
		queue(t, s, fmt.Sprintf("k%02d", i))
	}
	before := sink.syncs.Load()
	if got, err := d.DeliverPending(ctx); err != nil || got != n {
		t.Fatalf("delivered %d, %v; want %d", got, err, n)
	}
	if syncs := sink.syncs.Load() - before; syncs != 1 {
		t.Fatalf("a pass of %d messages took %d syncs, want 1", n, syncs)
	}
	if got := segmentPayloads(t, dir); len(got) != n+1 {
		t.Fatalf("%d messages, want %d", len(got), n+1)
	}
}

// TestSegmentIndexMemory measures the index's memory per id (the figure
// the SegmentSink doc states) and holds it under a bound.
func TestSegmentIndexMemory(t *testing.T) {
	const n = 200_000
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x := newSegmentIndex()
	for i := range n {
		x.add(MessageID("t", strconv.Itoa(i), "confirmation"), segmentLoc{off: int64(i) * 300, seq: 1, n: 300})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("segment index: %.0f bytes per id (%.0f MB per million)", per, per)
	if x.len() != n || per > 80 {
		t.Fatalf("%d ids at %.0f bytes each; want %d at no more than 80", x.len(), per, n)
	}
	runtime.KeepAlive(x)
}

// FuzzScanSegment: the segment reader never panics; what it accepts is a
// prefix of whole lines whose ids it reports in order, each within its
// line; reading that prefix again accepts all of it, with the same ids.
func FuzzScanSegment(f *testing.F) {
	l1, _ := json.Marshal(payloadOf(benchMessage(1)))
	l2, _ := json.Marshal(payloadOf(benchMessage(2)))
	f.Add(append(append(l1, '\n'), l2...), true)
	f.Add(append(append(l1, '\n'), append(l2, '\n')...), false)
	f.Add([]byte("{\"message_id\":\"a\\\"b\"}\n{}\n"), true)
	f.Add([]byte("{\"x\":1,\"message_id\":\"m\"}\n\x00\x00\n"), false)
	f.Add([]byte("\n"), false)
	f.Fuzz(func(t *testing.T, data []byte, strict bool) {
		type hit struct {
			off int64
			n   int
			id  string
		}
		read := func(b []byte) ([]hit, int64) {
			var hits []hit
			end, err := scanSegment(bytes.NewReader(b), strict, func(off int64, n int, id string) { hits = append(hits, hit{off, n, id}) }, func(int64) bool { return false })
			if err != nil {
				t.Fatal(err)
			}
			return hits, end
		}
		hits, end := read(data)
		if end < 0 || end > int64(len(data)) {
			t.Fatalf("end %d outside 0..%d", end, len(data))
		}
		var next int64
		for _, h := range hits {
			if h.off != next || h.n <= 0 || h.off+int64(h.n) > end || data[h.off+int64(h.n)-1] != '\n' || h.id == "" {
				t.Fatalf("hit %+v after %d, end %d: not a whole line in order", h, next, end)
			}
			if id, ok := lineID(data[h.off:h.off+int64(h.n)-1], strict); !ok || id != h.id {
				t.Fatalf("hit %+v: lineID gives %q %v", h, id, ok)
			}
			next = h.off + int64(h.n)
		}
		if next != end {
			t.Fatalf("lines end at %d, scan at %d", next, end)
		}
		again, end2 := read(data[:end])
		if end2 != end || len(again) != len(hits) {
			t.Fatalf("reading the accepted prefix again: end %d, %d lines; want %d, %d", end2, len(again), end, len(hits))
		}
		for i := range again {
			if again[i] != hits[i] {
				t.Fatalf("line %d read again as %+v, was %+v", i, again[i], hits[i])
			}
		}
	})
}

// Ids MessageID makes are kept compactly; other ids work too.
func TestSegmentIndexIDs(t *testing.T) {
	x := newSegmentIndex()
	id := MessageID("t", "k", "s")
	if _, ok := compactID(id); !ok {
		t.Fatalf("%s not compact", id)
	}
	for _, other := range []string{"msg_" + strings.ToUpper(id[4:]), "x", id + "0"} {
		if _, ok := compactID(other); ok {
			t.Fatalf("%q taken as compact", other)
		}
		x.add(other, segmentLoc{seq: 2})
	}
	x.add(id, segmentLoc{seq: 1})
	x.add(id, segmentLoc{seq: 9}) // the first stands
	if loc, ok := x.get(id); !ok || loc.seq != 1 {
		t.Fatalf("get(%s) = %+v %v", id, loc, ok)
	}
	if loc, ok := x.get("msg_" + strings.ToUpper(id[4:])); !ok || loc.seq != 2 || x.len() != 4 {
		t.Fatalf("upper-case id: %+v %v, len %d", loc, ok, x.len())
	}
}

// A message the segments could not give back as itself — no id, an id
// that is not valid UTF-8, a line too long to read back — is refused as
// a *PermanentError and nothing is written: such a line would read as
// damage (and stop every delivery) or escape the index.
func TestSegmentRefusesUnreadableLines(t *testing.T) {
	dir := t.TempDir()
	sink := mustSegmentSink(t, dir)
	huge := benchMessage(2)
	huge.Body = strings.Repeat("x", maxLineBytes)
	for _, m := range []*Message{{Body: "no id"}, {MessageID: "msg_\xff", Body: "bad id"}, huge} {
		if err := sink.Deliver(context.Background(), m); !IsPermanent(err) {
			t.Fatalf("deliver %.40q: %v, want a *PermanentError", m.MessageID, err)
		}
	}
	deliverPass(t, sink, []*Message{benchMessage(1)})
	if got := segmentPayloads(t, dir); len(got) != 1 {
		t.Fatalf("%d messages in the segments, want the good one alone", len(got))
	}
}
