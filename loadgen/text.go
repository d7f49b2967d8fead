package loadgen

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// WriteText writes the report for a person: the run, throughput, latency
// by kind of call, server CPU, floors and ratios, and correctness.
func (r *Report) WriteText(w io.Writer) {
	var mix []string
	for _, t := range Tools {
		if n, ok := r.Mix[t]; ok {
			mix = append(mix, fmt.Sprintf("%s=%d", t, n))
		}
	}
	fmt.Fprintf(w, "target      %s\n", r.Target)
	fmt.Fprintf(w, "workload    %d clients, dup-ratio %g, mismatch-ratio %g, key-space %s, mix %s\n",
		r.Clients, r.DupRatio, r.MismatchRatio, keySpaceText(r.KeySpace), strings.Join(mix, ","))
	fmt.Fprintf(w, "run         %d calls in %.2fs: %.0f calls/s", r.Calls, r.Elapsed, r.Throughput)
	if r.ThroughputVsNoop > 0 {
		fmt.Fprintf(w, " (%.0f%% of no-op calls/s with --clients %d)", 100*r.ThroughputVsNoop, r.Clients)
	}
	fmt.Fprintln(w)
	if r.Failed > 0 {
		fmt.Fprintf(w, "            %d calls got no answer\n", r.Failed)
	}
	if c := r.ServerCPU; c != nil {
		fmt.Fprintf(w, "server CPU  %.0f ms, %.0f µs per call", c.Total, c.PerCall)
		if c.IncludesDrain {
			fmt.Fprint(w, " (until the run's messages were delivered)")
		}
		fmt.Fprintln(w)
		if c.XNoop > 0 {
			fmt.Fprintf(w, "            = %.2f × the no-op server's CPU per call (read it for a run of replays)\n", c.XNoop)
		}
		if c.XInProcess > 0 {
			fmt.Fprintf(w, "            = %.2f × the in-process create's CPU with its delivery (read it for a run of new create_orders)\n", c.XInProcess)
		}
	}
	fmt.Fprintf(w, "\n%-26s %8s %9s %9s %9s %9s %9s", "latency (µs)", "calls", "calls/s", "p50", "p90", "p99", "max")
	if r.Floors != nil {
		fmt.Fprintf(w, " %9s %12s", "p50/noop", "p50/(n+c)")
	}
	fmt.Fprintln(w)
	row := func(name string, calls int64, rate float64, l Latency, ra *Ratio) {
		fmt.Fprintf(w, "%-26s %8d %9.0f %9.0f %9.0f %9.0f %9.0f", name, calls, rate, l.P50, l.P90, l.P99, l.Max)
		if ra != nil {
			nc := "—"
			if ra.NoopCommit > 0 {
				nc = fmt.Sprintf("%.2f×", ra.NoopCommit)
			}
			fmt.Fprintf(w, " %8.2f× %12s", ra.Noop, nc)
		}
		fmt.Fprintln(w)
	}
	kinds := make([]string, 0, len(r.Kinds))
	for k := range r.Kinds {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		row(k, r.Kinds[k].Calls, r.Kinds[k].Throughput, r.Kinds[k].Latency, r.Ratios[k])
	}
	row("all", r.Calls, r.Throughput, r.Latency, nil)
	if f := r.Floors; f != nil {
		fmt.Fprintf(w, "\nfloors (p50, mean of before and after the run):\n")
		fmt.Fprintf(w, "  no-op MCP call  %8.0f µs (%.0f → %.0f) over %s; %.0f no-op calls/s with --clients %d", f.NoopP50, f.NoopP50Start, f.NoopP50End, transportText(f.Transport), f.NoopRate, r.Clients)
		if f.NoopCPUPerCall > 0 {
			fmt.Fprintf(w, "; its server's CPU %.0f µs per call", f.NoopCPUPerCall)
		}
		fmt.Fprintln(w)
		if f.CommitP50 > 0 {
			fmt.Fprintf(w, "  bbolt commit    %8.0f µs (%.0f → %.0f); %.1f pages per commit\n", f.CommitP50, f.CommitP50Start, f.CommitP50End, f.CommitPages)
		}
		if p := f.InProcess; p != nil {
			fmt.Fprintf(w, "  in process      %8.0f µs p50 per new create_order, no MCP (%d creates after %d); CPU %.0f µs, %.0f µs with its delivery; %.2f commits of %.1f pages\n",
				p.P50, p.Creates, p.Records, p.CPUPerCreate, p.CPUPerCreateDelivered, p.CommitsPerCreate, p.PagesPerCommit)
		}
		if r.Clients > 1 {
			fmt.Fprintf(w, "  (with %d clients a call's latency includes its wait in the queue: compare the ratios at --clients 1)\n", r.Clients)
		}
	}
	if r.ReplayVsGet > 0 {
		fmt.Fprintf(w, "\nreplay p50 = %.2f × get_order p50\n", r.ReplayVsGet)
	}
	if d := r.Delivery; d != nil {
		fmt.Fprintf(w, "\ndelivery    %d messages queued (%.0f/s); %d delivered during the run (%.0f/s, %.2f × queued)\n",
			d.Queued, d.QueuedPerS, d.DeliveredDuringRun, d.DeliveredPerS, d.KeepUp)
		switch {
		case d.BacklogAtEnd == 0:
			fmt.Fprintf(w, "            no backlog at the run's end\n")
		case d.Drained:
			fmt.Fprintf(w, "            backlog at the run's end %d, delivered in %.2f s (%.0f/s)\n", d.BacklogAtEnd, d.DrainSeconds, d.DrainPerS)
		default:
			fmt.Fprintf(w, "            backlog at the run's end %d, %d still undelivered when the drain timeout ran out\n", d.BacklogAtEnd, d.Left)
		}
	}
	if f := r.ClaimFloor; f != nil {
		fmt.Fprintf(w, "\nPostgreSQL claim floor (INSERT … ON CONFLICT, %d connections, mean of before and after the run):\n", f.Connections)
		fmt.Fprintf(w, "  %.0f claims/s (%.0f → %.0f)", f.Rate, f.RateStart, f.RateEnd)
		if f.NewCreates > 0 {
			fmt.Fprintf(w, "; create_order/new calls/s = %.1f%% of it", 100*f.NewCreates)
		}
		fmt.Fprintln(w)
	}
	c := r.Correctness
	verdict := "OK"
	if !c.OK {
		verdict = "FAILED"
	}
	var keys []string
	for _, t := range Tools {
		if n, ok := c.Keys[t]; ok {
			keys = append(keys, fmt.Sprintf("%d %s", n, t))
		}
	}
	if len(keys) == 0 {
		keys = []string{"none"}
	}
	fmt.Fprintf(w, "\ncorrectness %s: keys answered: %s; %d distinct orders; %d replays; %d changed requests refused; %d reads\n",
		verdict, strings.Join(keys, ", "), c.Orders, c.Replays, c.RefusedMismatch, c.Reads)
	if c.Failures > 0 {
		fmt.Fprintf(w, "            %d answers broke a guarantee\n", c.Failures)
	}
	if len(c.Unexpected) > 0 {
		codes := make([]string, 0, len(c.Unexpected))
		for code, n := range c.Unexpected {
			codes = append(codes, fmt.Sprintf("%s ×%d", code, n))
		}
		slices.Sort(codes)
		fmt.Fprintf(w, "            unexpected answers: %s\n", strings.Join(codes, ", "))
	}
	for _, e := range c.Examples {
		fmt.Fprintf(w, "  - %s\n", e)
	}
}

func transportText(t string) string {
	if t == "http" {
		return "Streamable HTTP"
	}
	return "stdio"
}

func keySpaceText(n int) string {
	if n == 0 {
		return "all"
	}
	return fmt.Sprint(n)
}
