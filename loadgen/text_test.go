package loadgen

import (
	"strings"
	"testing"
	"time"
)

// TestWriteTextFloorsCPUDelivery: the text report states the floors of
// the run's transport, the server's CPU against the floors' CPU, and how
// deliveries kept up.
func TestWriteTextFloorsCPUDelivery(t *testing.T) {
	rep := &Report{Target: "x", Clients: 1, Calls: 100, Elapsed: 1, Throughput: 100, Mix: map[string]int{"create_order": 1},
		Kinds:       map[string]*Kind{"create_order/new": {Calls: 100, Throughput: 100, Latency: Latency{Count: 100, P50: 1000, P90: 1, P99: 1, Max: 1}}},
		Correctness: Correctness{OK: true, Keys: map[string]int{"create_order": 100}, Orders: 100}}
	rep.SetServerCPU(80 * time.Millisecond)
	rep.ServerCPU.IncludesDrain = true
	rep.SetFloors(Floors{Transport: "stdio", NoopP50: 200, NoopRate: 4000, NoopCPUPerCall: 100, CommitP50: 300, CommitPages: 5,
		InProcess: &InProcess{Creates: 300, Records: 300, P50: 600, CPUPerCreate: 500, CPUPerCreateDelivered: 400, CommitsPerCreate: 1, PagesPerCommit: 32}})
	rep.Delivery = &Delivery{Queued: 100, QueuedPerS: 100, DeliveredDuringRun: 90, DeliveredPerS: 90, KeepUp: 0.9, BacklogAtEnd: 10, Drained: true, DrainSeconds: 0.5, DrainPerS: 20}
	var b strings.Builder
	rep.WriteText(&b)
	out := b.String()
	for _, want := range []string{
		"800 µs per call (until the run's messages were delivered)",
		"= 8.00 × the no-op server's CPU per call",
		"= 2.00 × the in-process create's CPU with its delivery",
		"over stdio; 4000 no-op calls/s with --clients 1; its server's CPU 100 µs per call",
		"5.0 pages per commit",
		"1.00 commits of 32.0 pages",
		"100 messages queued (100/s); 90 delivered during the run (90/s, 0.90 × queued)",
		"backlog at the run's end 10, delivered in 0.50 s (20/s)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report does not say %q:\n%s", want, out)
		}
	}

	rep.Floors.Transport = "http"
	rep.Delivery = &Delivery{Queued: 5, BacklogAtEnd: 3, Left: 3}
	b.Reset()
	rep.WriteText(&b)
	for _, want := range []string{"over Streamable HTTP", "3 still undelivered when the drain timeout ran out"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the report does not say %q:\n%s", want, b.String())
		}
	}
}
