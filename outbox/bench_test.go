package outbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"idemgate/ledger"
)

// The directory sink's cost per message, and the segment sink's, a pass
// of passSize messages at a time (Deliver each, then one Flush), against
// a floor measured in the same run: one small file written and fsynced per message, the least a
// sink that syncs each message durably can do. Each sub-benchmark reports
// msgs/s and syncs/msg; compare their ns/op as ratios, the machine is
// shared.
const passSize = 100

func benchMessage(i int) *Message {
	m := &Message{Tenant: "t1", OperationKey: fmt.Sprintf("k%09d", i), Step: "confirmation", Channel: "email",
		To: []string{"customer:c1"}, Subject: "Order ord_1 confirmed", Body: "Your order ord_1 (1 item lines, total 37.00 EUR) has been placed.", OrderID: "ord_1"}
	m.MessageID = MessageID(m.Tenant, m.OperationKey, m.Step)
	return m
}

func BenchmarkDirSink(b *testing.B) {
	run := func(b *testing.B, portable bool, mode int32) {
		sink, err := NewDirSink(b.TempDir())
		if err != nil {
			b.Fatal(err)
		}
		sink.noTmpfile.Store(portable)
		sink.syncMode.Store(mode)
		endPass := sink.Flush
		if mode < 0 {
			endPass = func() error { sink.written = nil; return nil } // creation cost alone: no sync
		}
		deliverPasses(b, sink, &sink.syncs, endPass)
	}
	b.Run("floor=fsync_per_message", func(b *testing.B) {
		dir := b.TempDir()
		data := []byte(`{"message_id": "msg_0123456789abcdef0123456789abcdef", "body": "Your order ord_1 has been placed."}` + "\n")
		i := 0
		start := time.Now()
		for b.Loop() {
			f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("f%09d", i)), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := f.Write(data); err != nil {
				b.Fatal(err)
			}
			if err := f.Sync(); err != nil {
				b.Fatal(err)
			}
			f.Close()
			i++
		}
		b.ReportMetric(float64(i)/time.Since(start).Seconds(), "msgs/s")
		b.ReportMetric(1, "syncs/msg")
	})
	b.Run("sink=tmpfile,sync=none", func(b *testing.B) { run(b, false, -1) })
	b.Run("sink=createtemp,sync=none", func(b *testing.B) { run(b, true, -1) })
	b.Run("sink=tmpfile,sync=syncfs", func(b *testing.B) { run(b, false, syncFS) })
	b.Run("sink=tmpfile,sync=staged", func(b *testing.B) { run(b, false, syncStaged) })
	b.Run("sink=tmpfile,sync=per_file", func(b *testing.B) { run(b, false, syncEach) })
	b.Run("sink=createtemp,sync=per_file", func(b *testing.B) { run(b, true, syncEach) })
	// The segment sink (SegmentSink): each pass one write and one
	// fdatasync of the newest segment.
	b.Run("sink=segments,sync=fdatasync", func(b *testing.B) {
		sink, err := NewSegmentSink(b.TempDir(), nil)
		if err != nil {
			b.Fatal(err)
		}
		deliverPasses(b, sink, &sink.syncs, sink.Flush)
	})
}

// deliverPasses delivers benchMessages to sink until the benchmark stops,
// calling endPass after every passSize of them and once at the end, and
// reports msgs/s and the syncs per message the sink counted in syncs.
func deliverPasses(b *testing.B, sink Sink, syncs *atomic.Int64, endPass func() error) {
	ctx := context.Background()
	i := 0
	start := time.Now()
	for b.Loop() {
		if err := sink.Deliver(ctx, benchMessage(i)); err != nil {
			b.Fatal(err)
		}
		i++
		if i%passSize == 0 {
			if err := endPass(); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := endPass(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(i)/time.Since(start).Seconds(), "msgs/s")
	b.ReportMetric(float64(syncs.Load())/float64(i), "syncs/msg")
}

// BenchmarkDeliverPending is the deliverer end to end: each op is one
// pass of passSize messages queued in the ledger (untimed), delivered by
// DeliverPending to a directory sink and recorded as delivered (one ledger
// commit per pass).
func BenchmarkDeliverPending(b *testing.B) {
	sink, err := NewDirSink(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	benchDeliverPending(b, sink, &sink.syncs)
}

// BenchmarkDeliverPendingSegments is BenchmarkDeliverPending with the
// segment sink.
func BenchmarkDeliverPendingSegments(b *testing.B) {
	sink, err := NewSegmentSink(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	benchDeliverPending(b, sink, &sink.syncs)
}

func benchDeliverPending(b *testing.B, sink Sink, syncs *atomic.Int64) {
	ctx := context.Background()
	s := mustOpen(b)
	d := NewDeliverer(s, sink, nil)
	n := 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		if err := s.Update(ctx, func(tx ledger.Tx) error {
			for j := range passSize {
				m := benchMessage(i*passSize + j)
				m.MessageID = ""
				if err := Enqueue(tx, m); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		got, err := d.DeliverPending(ctx)
		if err != nil || got != passSize {
			b.Fatalf("delivered %d, %v; want %d", got, err, passSize)
		}
		n += got
	}
	b.StopTimer()
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msgs/s")
	b.ReportMetric(float64(syncs.Load())/float64(n), "syncs/msg")
}
