package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestBenchmarkTracingRows measures what tracing costs a call: `idemgate
// bench` spawning its server over stdio (on a fresh ledger file, so a
// fresh owner, which runs the calls) with OTEL_* unset and with it
// pointing at a real OTLP receiver started here, in alternating runs of
// the same length, for new creates and for replays. Run it with
// IDEMGATE_BENCH_TRACING=1 (see BENCHMARKS.md, "Tracing");
// IDEMGATE_BENCH_SECONDS sets each run's length (default 10),
// IDEMGATE_BENCH_ROUNDS the pairs of runs (default 3).
func TestBenchmarkTracingRows(t *testing.T) {
	if os.Getenv("IDEMGATE_BENCH_TRACING") != "1" {
		t.Skip("set IDEMGATE_BENCH_TRACING=1 to measure the cost of tracing (see BENCHMARKS.md)")
	}
	secs := envInt(t, "IDEMGATE_BENCH_SECONDS", 10)
	rounds := envInt(t, "IDEMGATE_BENCH_ROUNDS", 3)
	rcv := newOTLPReceiver(t)
	on := []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + rcv.srv.URL, "OTEL_SERVICE_NAME=idemgate-bench"}
	type figures struct{ p50, cpu []float64 }
	rows := []struct {
		name string
		args []string
	}{
		{"new create_order, 1 caller", []string{"--clients", "1", "--dup-ratio", "0", "--mix", "create_order=1"}},
		{"replayed create_order, 1 caller", []string{"--clients", "1", "--dup-ratio", "1", "--mix", "create_order=1"}},
		{"new create_order, 8 callers", []string{"--clients", "8", "--dup-ratio", "0", "--mix", "create_order=1"}},
	}
	var out strings.Builder
	fmt.Fprintf(&out, "| row | tracing off: p50 / server CPU per call | on: p50 / server CPU per call | on ÷ off: p50 / CPU |\n|---|---|---|---|\n")
	for _, row := range rows {
		var off, traced figures
		for range rounds {
			for _, withTracing := range []bool{false, true} {
				args := append([]string{"bench", "--json", "--duration", fmt.Sprint(secs) + "s", "--drain-timeout", "1m"}, row.args...)
				cmd := exec.Command(idemgate, args...)
				cmd.Env = withoutOTEL(os.Environ())
				if withTracing {
					cmd.Env = append(cmd.Env, on...)
				}
				cmd.Stderr = os.Stderr
				b, err := cmd.Output()
				if err != nil {
					t.Fatalf("bench %v: %v", args, err)
				}
				var r struct {
					Latency struct {
						P50 float64 `json:"p50_us"`
					} `json:"latency"`
					ServerCPU struct {
						PerCall float64 `json:"per_call_us"`
					} `json:"server_cpu"`
				}
				if err := json.Unmarshal(b, &r); err != nil {
					t.Fatalf("bench report: %v", err)
				}
				f := &off
				if withTracing {
					f = &traced
				}
				f.p50 = append(f.p50, r.Latency.P50)
				f.cpu = append(f.cpu, r.ServerCPU.PerCall)
			}
		}
		med := func(v []float64) float64 { s := slices.Clone(v); slices.Sort(s); return s[len(s)/2] }
		fmt.Fprintf(&out, "| %s | %.0f µs / %.0f µs | %.0f µs / %.0f µs | %.2f × / %.2f × |\n", row.name,
			med(off.p50), med(off.cpu), med(traced.p50), med(traced.cpu), med(traced.p50)/med(off.p50), med(traced.cpu)/med(off.cpu))
	}
	rcv.mu.Lock()
	spans := len(rcv.spans)
	rcv.mu.Unlock()
	if spans == 0 {
		t.Errorf("the receiver got no span: the traced runs did not trace")
	}
	fmt.Fprintf(&out, "\n%d rounds of %d s runs, medians; the receiver got %d spans (%s).\n", rounds, secs, spans, time.Now().UTC().Format(time.DateOnly))
	fmt.Println(out.String())
}

// withoutOTEL is env without any OTEL_ variable.
func withoutOTEL(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool { return strings.HasPrefix(kv, "OTEL_") })
}
