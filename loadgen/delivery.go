package loadgen

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Delivery is how the server's notification deliveries kept up with a
// run, counted from its outbox directory (CountMessages), where the
// directory sink writes each message as one file, <message_id>.json, once
// it is whole, and the segment sink appends it as one line to
// segments/<seq>.jsonl. Every
// answered new create_order queues its customer's confirmation (the tool's
// notify_customer is true unless asked otherwise, and the generator does
// not ask) and every answered new send_notification its message; replays
// and refusals queue nothing.
type Delivery struct {
	Queued int `json:"queued"` // messages the run's answered new keys queued
	// QueuedPerS is Queued over the run's time: the rate deliveries must
	// keep up with.
	QueuedPerS float64 `json:"queued_per_s"`
	// DeliveredDuringRun counts the messages that appeared between
	// the run's start and its last answer (an earlier backlog of the same
	// directory counts too), and DeliveredPerS is that over the run's time.
	DeliveredDuringRun int     `json:"delivered_during_run"`
	DeliveredPerS      float64 `json:"delivered_per_s"`
	// KeepUp is DeliveredPerS / QueuedPerS: 1 when deliveries kept up.
	KeepUp float64 `json:"delivered_x_queued"`
	// BacklogAtEnd is the run's messages not yet delivered at its last
	// answer; DrainSeconds the time from then until they were, when
	// Drained (within the drain timeout), and DrainPerS the backlog over
	// that time.
	BacklogAtEnd int     `json:"backlog_at_end"`
	Drained      bool    `json:"drained"`
	DrainSeconds float64 `json:"drain_s"`
	DrainPerS    float64 `json:"drain_per_s,omitempty"`
	// Left is the backlog still undelivered when the drain timeout ran
	// out (0 when Drained).
	Left int `json:"left,omitempty"`
}

// CountMessages counts the messages delivered to the outbox directory
// dir, in either of its formats: the message files (names that end in
// ".json" and do not start with "." — a sink's temporary files do), and
// the whole lines (ending in "\n") of the segments in dir/segments (one
// per message; outbox.SegmentSink never appends an id twice). A directory
// that does not exist holds none.
func CountMessages(dir string) (int, error) {
	n, err := countFiles(dir, ".json")
	if err != nil {
		return 0, err
	}
	segs, err := os.ReadDir(filepath.Join(dir, "segments"))
	if errors.Is(err, fs.ErrNotExist) {
		return n, nil
	}
	if err != nil {
		return 0, err
	}
	buf := make([]byte, 1<<20)
	for _, e := range segs {
		if !strings.HasSuffix(e.Name(), ".jsonl") {
			continue
		}
		lines, err := countLines(filepath.Join(dir, "segments", e.Name()), buf)
		if err != nil {
			return 0, err
		}
		n += lines
	}
	return n, nil
}

func countFiles(dir, suffix string) (int, error) {
	f, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, name := range names {
		if strings.HasSuffix(name, suffix) && !strings.HasPrefix(name, ".") {
			n++
		}
	}
	return n, nil
}

// countLines counts the "\n" in the file at path (gone: none).
func countLines(path string, buf []byte) (int, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	for {
		k, err := f.Read(buf)
		n += bytes.Count(buf[:k], []byte{'\n'})
		if err == io.EOF {
			return n, nil
		}
		if err != nil {
			return 0, err
		}
	}
}

// DeliveryWatch watches an outbox directory across a run. Start it just
// before the run; call Finish as soon as the run returns.
type DeliveryWatch struct {
	dir   string
	start int
}

// WatchDelivery counts the message files already in dir.
func WatchDelivery(dir string) (*DeliveryWatch, error) {
	n, err := CountMessages(dir)
	if err != nil {
		return nil, err
	}
	return &DeliveryWatch{dir: dir, start: n}, nil
}

// Finish counts the files delivered during rep's run, then waits up to
// timeout (0: not at all) for the rest of the run's messages, polling
// the directory, and records the figures in rep.Delivery. It returns
// early, without an error, when ctx is done.
func (w *DeliveryWatch) Finish(ctx context.Context, rep *Report, timeout time.Duration) error {
	atEnd, err := CountMessages(w.dir)
	if err != nil {
		return err
	}
	end := time.Now()
	d := &Delivery{Queued: rep.Correctness.Keys["create_order"] + rep.Correctness.Keys["send_notification"],
		DeliveredDuringRun: atEnd - w.start}
	if rep.Elapsed > 0 {
		d.QueuedPerS = float64(d.Queued) / rep.Elapsed
		d.DeliveredPerS = float64(d.DeliveredDuringRun) / rep.Elapsed
	}
	if d.QueuedPerS > 0 {
		d.KeepUp = d.DeliveredPerS / d.QueuedPerS
	}
	want := w.start + d.Queued
	d.BacklogAtEnd = max(0, want-atEnd)
	n := atEnd
	deadline := end.Add(timeout)
	for wait := 5 * time.Millisecond; n < want && time.Now().Before(deadline) && ctx.Err() == nil; wait = min(2*wait, 100*time.Millisecond) {
		select {
		case <-ctx.Done():
		case <-time.After(min(wait, time.Until(deadline))):
		}
		if n, err = CountMessages(w.dir); err != nil {
			return err
		}
	}
	if n >= want {
		d.Drained = true
		if d.BacklogAtEnd > 0 {
			d.DrainSeconds = time.Since(end).Seconds()
			d.DrainPerS = float64(d.BacklogAtEnd) / d.DrainSeconds
		}
	} else {
		d.Left = want - n
	}
	rep.Delivery = d
	return nil
}
