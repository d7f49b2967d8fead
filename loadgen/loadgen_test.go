package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestSummarizeNearestRank(t *testing.T) {
	var durs []time.Duration
	for i := 100; i >= 1; i-- { // unsorted on purpose
		durs = append(durs, time.Duration(i)*time.Millisecond)
	}
	got := summarize(durs)
	want := Latency{Count: 100, P50: 50_000, P90: 90_000, P99: 99_000, Max: 100_000, Mean: 50_500}
	if got != want {
		t.Fatalf("summarize(1..100 ms) = %+v, want %+v", got, want)
	}
	if got := summarize([]time.Duration{7 * time.Microsecond}); got != (Latency{Count: 1, P50: 7, P90: 7, P99: 7, Max: 7, Mean: 7}) {
		t.Fatalf("summarize(one) = %+v", got)
	}
	if got := summarize(nil); got != (Latency{}) {
		t.Fatalf("summarize(none) = %+v, want zeros", got)
	}
	// Ten values: p99 is the largest (rank ⌈9.9⌉ = 10), p90 the ninth.
	ten := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for i := range ten {
		ten[i] *= time.Microsecond
	}
	if got := summarize(ten); got.P50 != 5 || got.P90 != 9 || got.P99 != 10 {
		t.Fatalf("summarize(1..10 µs) = %+v, want p50 5, p90 9, p99 10", got)
	}
}

func TestParseStatCPU(t *testing.T) {
	// The command name may hold spaces and parentheses.
	stat := "4242 (idem gate) (x)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 130 0 0 20 0 9 0 100 0 0"
	name, got, err := parseStatCPU(stat, false)
	if err != nil {
		t.Fatal(err)
	}
	if want := 3800 * time.Millisecond; got != want || name != "idem gate) (x)" { // (250+130) ticks at 100 Hz
		t.Fatalf("parseStatCPU = %q, %s, want %q, %s", name, got, "idem gate) (x)", want)
	}
	// With its ended children's: cutime 40, cstime 60.
	stat = "4242 (postgres) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 130 40 60 20 0 9 0 100 0 0"
	if _, got, err := parseStatCPU(stat, true); err != nil || got != 4800*time.Millisecond {
		t.Fatalf("parseStatCPU with children = %s, %v, want 4.8s", got, err)
	}
	for _, bad := range []string{"", "12 (x) S 1 2", "12 (x) S 1 2 3 4 5 6 7 8 9 10 ten 12"} {
		if _, _, err := parseStatCPU(bad, false); err == nil {
			t.Errorf("parseStatCPU(%q): no error", bad)
		}
	}
	if _, _, err := parseStatCPU("12 (x) S 1 2 3 4 5 6 7 8 9 10 11 12 13", true); err == nil {
		t.Error("parseStatCPU with children of a line without cutime, cstime: no error")
	}
}

func TestParseMix(t *testing.T) {
	mix, err := ParseMix("create_order=8, get_order=1,send_notification=0")
	if err != nil {
		t.Fatal(err)
	}
	if want := []MixEntry{{"create_order", 8}, {"get_order", 1}}; !reflect.DeepEqual(mix, want) {
		t.Fatalf("ParseMix = %v, want %v", mix, want)
	}
	for in, want := range map[string]string{
		"create_order":                  "want TOOL=WEIGHT",
		"cancel_order=1":                "unknown tool",
		"create_order=1,create_order=2": "given twice",
		"create_order=-1":               "whole number",
		"create_order=1.5":              "whole number",
		"create_order=1001":             "whole number",
		"create_order=0":                "no tool has a weight",
		"":                              "no tool has a weight",
	} {
		if _, err := ParseMix(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseMix(%q) = %v, want an error saying %q", in, err, want)
		}
	}
}

func TestValidateBounds(t *testing.T) {
	ok := Config{Clients: 1, Mix: []MixEntry{{"create_order", 1}}, Duration: time.Second}
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	for want, mod := range map[string]func(*Config){
		"clients must be 1..4096":         func(c *Config) { c.Clients = 0 },
		"clients must be 1..4096, got 40": func(c *Config) { c.Clients = 4097 },
		"dup-ratio must be 0..1":          func(c *Config) { c.DupRatio = 1.5 },
		"dup-ratio must be 0..1, got NaN": func(c *Config) { c.DupRatio = nan() },
		"mismatch-ratio must be 0..1":     func(c *Config) { c.MismatchRatio = -0.1 },
		"must be at most 1":               func(c *Config) { c.DupRatio, c.MismatchRatio = 0.6, 0.6 },
		"key-space must be":               func(c *Config) { c.KeySpace = -1 },
		"duration must be":                func(c *Config) { c.Duration = 25 * time.Hour },
		"calls must be":                   func(c *Config) { c.Calls = -1 },
		"give a duration or a number":     func(c *Config) { c.Duration = 0 },
		"mix is empty":                    func(c *Config) { c.Mix = nil },
	} {
		c := ok
		mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want an error with %q", err, want)
		}
	}
}

func nan() float64 { var z float64; return z / z }

// fakeServer answers like idemgate, in memory: a new key executes (a new
// order or message), the same key and arguments replay the saved result,
// the same key with other arguments is refused. Its faults break one
// guarantee each.
type fakeServer struct {
	mu     sync.Mutex
	keys   map[string]fakeOp
	orders map[string]string // order id → customer
	n      int

	reexecute   bool // a duplicate runs again: a second order for one key
	execChanged bool // a changed request is executed, not refused
	sameOrder   bool // every create names the same order
	noReplayed  bool // replays are not marked replayed
}

type fakeOp struct {
	args   string
	result json.RawMessage
}

func (f *fakeServer) Call(_ context.Context, tool string, args map[string]any) (Answer, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keys == nil {
		f.keys, f.orders = map[string]fakeOp{}, map[string]string{}
	}
	if tool == "get_order" {
		id := args["order_id"].(string)
		if _, ok := f.orders[id]; !ok {
			return envelopeAnswer(map[string]any{"status": "failed", "error": map[string]any{"code": "not_found", "message": "no such order"}}, true), nil
		}
		return envelopeAnswer(map[string]any{"status": "succeeded", "result": map[string]any{"order": map[string]any{"order_id": id}}}, false), nil
	}
	key := args["operation_key"].(string)
	a, _ := json.Marshal(args)
	if op, ok := f.keys[key]; ok && !f.reexecute {
		if op.args != string(a) && !f.execChanged {
			return envelopeAnswer(map[string]any{"status": "failed", "error": map[string]any{"code": "key_reused_with_different_request", "message": "changed"}}, true), nil
		}
		return envelopeAnswer(map[string]any{"status": "succeeded", "replayed": !f.noReplayed, "result": op.result}, false), nil
	}
	f.n++
	var result any
	if tool == "create_order" {
		id := fmt.Sprintf("ord-%d", f.n)
		if f.sameOrder {
			id = "ord-1"
		}
		f.orders[id] = args["customer_id"].(string)
		result = map[string]any{"order": map[string]any{"order_id": id, "status": "confirmed"}}
	} else {
		result = map[string]any{"message": map[string]any{"message_id": fmt.Sprintf("msg-%d", f.n), "state": "queued"}}
	}
	r, _ := json.Marshal(result)
	f.keys[key] = fakeOp{args: string(a), result: r}
	return envelopeAnswer(map[string]any{"status": "succeeded", "replayed": false, "result": json.RawMessage(r)}, false), nil
}

func envelopeAnswer(env map[string]any, isError bool) Answer {
	b, _ := json.Marshal(env)
	return Answer{IsError: isError, Structured: b}
}

func runFake(t *testing.T, f *fakeServer, dup, mismatch float64) *Report {
	t.Helper()
	return runFakeMix(t, f, dup, mismatch, "create_order=8,get_order=1,send_notification=1")
}

func runFakeMix(t *testing.T, f *fakeServer, dup, mismatch float64, mixSpec string) *Report {
	t.Helper()
	mix, err := ParseMix(mixSpec)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), Config{Clients: 4, DupRatio: dup, MismatchRatio: mismatch, Mix: mix, Calls: 600}, []Caller{f})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Calls != 600 {
		t.Fatalf("made %d calls, want exactly --calls 600", rep.Calls)
	}
	return rep
}

func TestCorrectServerIsCorrect(t *testing.T) {
	rep := runFake(t, &fakeServer{}, 0.3, 0.1)
	c := rep.Correctness
	if !c.OK || c.Failures != 0 || len(c.Unexpected) != 0 {
		t.Fatalf("a correct server was reported incorrect: %+v", c)
	}
	if c.Keys["create_order"] == 0 || c.Orders != c.Keys["create_order"] {
		t.Fatalf("%d create keys named %d orders, want one each", c.Keys["create_order"], c.Orders)
	}
	if c.Replays == 0 || c.RefusedMismatch == 0 || c.Reads == 0 {
		t.Fatalf("replays %d, refused mismatches %d, reads %d: want each > 0 at dup 0.3, mismatch 0.1", c.Replays, c.RefusedMismatch, c.Reads)
	}
	// Every call is in exactly one kind, and the kinds add up.
	var sum int64
	for _, k := range rep.Kinds {
		sum += k.Calls
	}
	if sum != rep.Calls || rep.Latency.Count != int(rep.Calls) {
		t.Fatalf("kinds add up to %d calls, latency counts %d, report says %d", sum, rep.Latency.Count, rep.Calls)
	}
	if got := rep.Kinds["create_order/replay"].Calls + rep.Kinds["send_notification/replay"].Calls; got != c.Replays {
		t.Fatalf("%d replay calls but %d replays accounted", got, c.Replays)
	}
}

// TestTwoOrdersForOneKeyIsAFailure: a server that answers one key's
// duplicate with a second order id (the effect ran twice) fails the run.
func TestTwoOrdersForOneKeyIsAFailure(t *testing.T) {
	rep := runFake(t, &fakeServer{reexecute: true}, 0.3, 0)
	c := rep.Correctness
	if c.OK || c.Failures == 0 {
		t.Fatalf("a server creating two orders for one key was reported correct: %+v", c)
	}
	found := false
	for _, e := range c.Examples {
		found = found || strings.Contains(e, "answered two different orders")
	}
	if !found {
		t.Fatalf("no example names the two orders: %q", c.Examples)
	}
}

func TestOtherBrokenGuaranteesAreFailures(t *testing.T) {
	for name, tc := range map[string]struct {
		f        *fakeServer
		dup, mis float64
		mix      string
		want     string
	}{
		"changed request executed": {&fakeServer{execChanged: true}, 0, 0.3, "", "instead of refused"},
		"one order for two keys":   {&fakeServer{sameOrder: true}, 0, 0, "", "named by two keys"},
		"replay not marked":        {&fakeServer{noReplayed: true}, 0.3, 0, "", "not marked replayed"},
		"message sent twice":       {&fakeServer{reexecute: true}, 0.5, 0, "send_notification=1", "different result"},
	} {
		t.Run(name, func(t *testing.T) {
			if tc.mix == "" {
				tc.mix = "create_order=8,get_order=1,send_notification=1"
			}
			rep := runFakeMix(t, tc.f, tc.dup, tc.mis, tc.mix)
			if rep.Correctness.OK {
				t.Fatalf("reported correct: %+v", rep.Correctness)
			}
			if !strings.Contains(strings.Join(rep.Correctness.Examples, "\n"), tc.want) {
				t.Fatalf("no example says %q: %q", tc.want, rep.Correctness.Examples)
			}
		})
	}
}

// failingCaller answers nothing.
type failingCaller struct{}

func (failingCaller) Call(context.Context, string, map[string]any) (Answer, error) {
	return Answer{}, fmt.Errorf("connection refused")
}

func TestNoAnswerIsCountedAndFails(t *testing.T) {
	rep, err := Run(context.Background(), Config{Clients: 2, Mix: []MixEntry{{"create_order", 1}}, Calls: 10}, []Caller{failingCaller{}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Failed != 10 || rep.Correctness.Unexpected["transport"] != 10 || rep.Correctness.OK {
		t.Fatalf("10 unanswered calls: failed %d, unexpected %v, ok %v", rep.Failed, rep.Correctness.Unexpected, rep.Correctness.OK)
	}
}

func TestSetFloorsRatios(t *testing.T) {
	rep := &Report{Throughput: 500, Kinds: map[string]*Kind{
		"create_order/new":    {Calls: 1, Latency: Latency{Count: 1, P50: 1500}},
		"create_order/replay": {Calls: 1, Latency: Latency{Count: 1, P50: 400}},
	}}
	rep.SetFloors(Floors{NoopP50: 200, CommitP50: 300, NoopRate: 2000})
	if r := rep.Ratios["create_order/new"]; r.Noop != 7.5 || r.NoopCommit != 3 {
		t.Fatalf("new: %+v, want 7.5× no-op, 3× no-op+commit", r)
	}
	if r := rep.Ratios["create_order/replay"]; r.Noop != 2 || r.NoopCommit != 0 {
		t.Fatalf("replay: %+v, want 2× no-op and no commit ratio (a read)", r)
	}
	if rep.ThroughputVsNoop != 0.25 {
		t.Fatalf("throughput vs no-op = %v, want 0.25", rep.ThroughputVsNoop)
	}
	if rep.ServerCPU != nil {
		t.Fatalf("a server CPU figure without one measured: %+v", rep.ServerCPU)
	}
}

// TestServerCPURatios: the server's CPU per call is stated against the
// no-op server's and the in-process create's, whichever of the CPU
// figure and the floors comes first, and not against a floor that was not
// measured.
func TestServerCPURatios(t *testing.T) {
	floors := Floors{NoopP50: 200, NoopCPUPerCall: 100, InProcess: &InProcess{CPUPerCreateDelivered: 400}}
	for name, cpuFirst := range map[string]bool{"cpu first": true, "floors first": false} {
		t.Run(name, func(t *testing.T) {
			rep := &Report{Calls: 1000, Kinds: map[string]*Kind{}}
			if cpuFirst {
				rep.SetServerCPU(600 * time.Millisecond)
				rep.SetFloors(floors)
			} else {
				rep.SetFloors(floors)
				rep.SetServerCPU(600 * time.Millisecond)
			}
			if c := rep.ServerCPU; c.PerCall != 600 || c.XNoop != 6 || c.XInProcess != 1.5 {
				t.Fatalf("server CPU %+v, want 600 µs per call = 6 × no-op, 1.5 × in process", c)
			}
		})
	}
	rep := &Report{Calls: 10, Kinds: map[string]*Kind{}}
	rep.SetServerCPU(10 * time.Millisecond)
	rep.SetFloors(Floors{NoopP50: 200, Transport: "http"})
	if c := rep.ServerCPU; c.XNoop != 0 || c.XInProcess != 0 {
		t.Fatalf("ratios to floors not measured: %+v", c)
	}
}

// TestSamplerBoundsMemory: up to maxSamples the figures are exact; beyond,
// count, mean and max stay exact, the sample stays at maxSamples, and the
// percentiles come from a uniform sample.
func TestSamplerBoundsMemory(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	var exact sampler
	var durs []time.Duration
	for i := 1; i <= 1000; i++ {
		d := time.Duration(rng.IntN(5000)) * time.Microsecond
		exact.add(d, rng)
		durs = append(durs, d)
	}
	if got, want := exact.latency(), summarize(durs); got.Count != want.Count || got.P50 != want.P50 || got.P99 != want.P99 || got.Max != want.Max || math.Abs(got.Mean-want.Mean) > 1e-6 {
		t.Fatalf("below the cap: %+v, want exactly %+v", got, want)
	}

	defer func(n int) { maxSamples = n }(maxSamples)
	maxSamples = 500
	var s sampler
	for _, i := range rng.Perm(100_000) {
		s.add(time.Duration(i+1)*time.Microsecond, rng)
	}
	l := s.latency()
	if len(s.samples) != 500 || l.Count != 100_000 || l.Max != 100_000 || l.Mean != 50_000.5 {
		t.Fatalf("kept %d samples; latency %+v: want 500 kept, count 100000, max 100000, mean 50000.5", len(s.samples), l)
	}
	// 500 uniform samples of 1..100000: the median is within 15 % of the
	// true one far beyond chance (σ ≈ 2.2 %); the seed is fixed anyway.
	if l.P50 < 42_500 || l.P50 > 57_500 || l.P90 < 85_000 || l.P90 > 95_000 {
		t.Fatalf("estimated p50 %v, p90 %v from the sample: not near 50000 and 90000", l.P50, l.P90)
	}
}

// slowCaller answers like fakeServer after a pause.
type slowCaller struct {
	fakeServer
	pause time.Duration
}

func (s *slowCaller) Call(ctx context.Context, tool string, args map[string]any) (Answer, error) {
	time.Sleep(s.pause)
	return s.fakeServer.Call(ctx, tool, args)
}

// TestProgressStopsWithTheRun: the progress callback reports the calls
// made while the run lasts, and is never called once Run has returned (the
// command clears the line then).
func TestProgressStopsWithTheRun(t *testing.T) {
	var mu sync.Mutex
	var got []Progress
	returned := false
	late := false
	cfg := Config{Clients: 1, Mix: []MixEntry{{"create_order", 1}}, Calls: 150, Progress: func(p Progress) {
		mu.Lock()
		defer mu.Unlock()
		late = late || returned
		got = append(got, p)
	}}
	rep, err := Run(context.Background(), cfg, []Caller{&slowCaller{pause: 10 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	returned = true
	mu.Unlock()
	time.Sleep(1500 * time.Millisecond) // a tick would have come by now
	mu.Lock()
	defer mu.Unlock()
	if late {
		t.Fatal("the progress callback was called after Run returned")
	}
	if len(got) == 0 { // 150 calls of ≥ 10 ms take ≥ 1.5 s: at least one tick
		t.Fatal("no progress reported during a run of more than a second")
	}
	for i, p := range got {
		if p.Calls < 1 || p.Calls > rep.Calls || p.Target != 150 || (i > 0 && p.Calls < got[i-1].Calls) {
			t.Fatalf("progress %d: %+v (run made %d calls)", i, p, rep.Calls)
		}
	}
}

// TestCommandAndMachineCPU: on Linux, the CPU of the processes named as
// this test is at least this process's, and the machine has been busy at
// least as long.
func TestCommandAndMachineCPU(t *testing.T) {
	self, err := os.ReadFile("/proc/self/comm")
	if err != nil {
		t.Skip("no /proc here:", err)
	}
	for start := time.Now(); time.Since(start) < 50*time.Millisecond; { // some CPU time to see
	}
	own, err := ProcessCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got := CommandCPU(strings.TrimSpace(string(self))); got < own || own == 0 {
		t.Errorf("CommandCPU(%q) = %s, this process alone %s", strings.TrimSpace(string(self)), got, own)
	}
	if busy := MachineBusy(); busy < own {
		t.Errorf("MachineBusy = %s, below this process's %s", busy, own)
	}
}
