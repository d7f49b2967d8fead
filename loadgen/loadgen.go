// Package loadgen drives an idemgate server with concurrent MCP clients and
// reports throughput, latency, server CPU and correctness: the engine of
// `idemgate bench`. It is a client: it knows the tools' arguments and
// answers as any MCP client does, and nothing of the server's internals.
//
// A run issues calls from Config.Clients goroutines until Config.Duration
// has passed or Config.Calls calls were issued. Each call picks a tool from
// Config.Mix by weight, then:
//
//   - create_order and send_notification: with probability DupRatio a
//     duplicate (an earlier key whose first call has answered, with the
//     same arguments: the server must replay the same result), with
//     probability MismatchRatio a reuse of an earlier key with changed
//     arguments (the server must refuse it with
//     key_reused_with_different_request), otherwise a new key with
//     arguments no other key has (so no call is held as a suspected
//     duplicate). Until a tool has an answered key, every call of it is new.
//   - get_order: an order some answered create_order named (a create when
//     there is none yet); the answer must be that order.
//
// Correctness holds when every key's answers name one result (for
// create_order: one order id, and no order id is named by two keys), every
// duplicate is a replay, every mismatch is refused as such, and no call
// failed otherwise.
package loadgen

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
)

// Tools the generator can call, in the order reports list them.
var Tools = []string{"create_order", "get_order", "send_notification"}

// Answer is a tool result as it came off the wire.
type Answer struct {
	IsError    bool
	Structured json.RawMessage // structuredContent (idemgate's envelope)
}

// Caller makes one tool call. It must be safe for concurrent use.
type Caller interface {
	Call(ctx context.Context, tool string, args map[string]any) (Answer, error)
}

// MixEntry is one tool and its weight in the mix.
type MixEntry struct {
	Tool   string
	Weight int
}

// Limits of the configuration, checked by Config.Validate.
const (
	MaxClients = 4096
	// A run keeps every key it made, to check each later answer against
	// the first (some 200 bytes a key): the bounds keep that in memory.
	MaxDuration = time.Hour
	MaxCalls    = 10_000_000
	MaxKeySpace = 100_000_000
	MaxWeight   = 1000
)

// Config is one run's workload.
type Config struct {
	Clients       int           // concurrent callers, 1..MaxClients
	DupRatio      float64       // share of create/send calls that repeat an earlier key, same arguments
	MismatchRatio float64       // share that reuse an earlier key with changed arguments
	KeySpace      int           // duplicates draw from the last KeySpace answered keys of their tool; 0: all
	Mix           []MixEntry    // tools by weight
	Duration      time.Duration // stop issuing after this long (0: no limit; then Calls must be set)
	Calls         int64         // stop after issuing this many calls (0: no limit)
	CallTimeout   time.Duration // bound on one call (default 30 s)
	// Run makes this run's arguments unique, so a run against a ledger
	// that has seen earlier runs creates no suspected duplicates. Default:
	// random.
	Run string
	// Progress, when set, is called about once a second from one goroutine.
	Progress func(Progress)
}

// Progress is the state of a run in progress.
type Progress struct {
	Elapsed time.Duration
	Calls   int64
	Errors  int64 // failed calls and correctness failures so far
	Planned time.Duration
	Target  int64
}

// ParseMix parses "create_order=8,get_order=1,send_notification=1".
func ParseMix(s string) ([]MixEntry, error) {
	var mix []MixEntry
	seen := map[string]bool{}
	total := 0
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, w, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("mix entry %q: want TOOL=WEIGHT, e.g. create_order=8", part)
		}
		name = strings.TrimSpace(name)
		known := false
		for _, t := range Tools {
			known = known || t == name
		}
		if !known {
			return nil, fmt.Errorf("mix entry %q: unknown tool %q (one of %s)", part, name, strings.Join(Tools, ", "))
		}
		if seen[name] {
			return nil, fmt.Errorf("mix: %s is given twice", name)
		}
		seen[name] = true
		var weight int
		if _, err := fmt.Sscan(strings.TrimSpace(w), &weight); err != nil || weight < 0 || weight > MaxWeight || fmt.Sprint(weight) != strings.TrimSpace(w) {
			return nil, fmt.Errorf("mix entry %q: the weight must be a whole number 0..%d", part, MaxWeight)
		}
		total += weight
		if weight > 0 {
			mix = append(mix, MixEntry{Tool: name, Weight: weight})
		}
	}
	if total == 0 {
		return nil, errors.New("mix: no tool has a weight above 0; e.g. create_order=8,get_order=1,send_notification=1")
	}
	return mix, nil
}

// Validate checks the bounds of every field and says which is wrong.
func (c *Config) Validate() error {
	switch {
	case c.Clients < 1 || c.Clients > MaxClients:
		return fmt.Errorf("clients must be 1..%d, got %d", MaxClients, c.Clients)
	case !(c.DupRatio >= 0 && c.DupRatio <= 1):
		return fmt.Errorf("dup-ratio must be 0..1, got %v", c.DupRatio)
	case !(c.MismatchRatio >= 0 && c.MismatchRatio <= 1):
		return fmt.Errorf("mismatch-ratio must be 0..1, got %v", c.MismatchRatio)
	case c.DupRatio+c.MismatchRatio > 1:
		return fmt.Errorf("dup-ratio + mismatch-ratio must be at most 1, got %v", c.DupRatio+c.MismatchRatio)
	case c.KeySpace < 0 || c.KeySpace > MaxKeySpace:
		return fmt.Errorf("key-space must be 0 (every earlier key) .. %d, got %d", MaxKeySpace, c.KeySpace)
	case c.Duration < 0 || c.Duration > MaxDuration:
		return fmt.Errorf("duration must be 0..%s, got %s", MaxDuration, c.Duration)
	case c.Calls < 0 || c.Calls > MaxCalls:
		return fmt.Errorf("calls must be 0..%d, got %d", MaxCalls, c.Calls)
	case c.Duration == 0 && c.Calls == 0:
		return errors.New("give a duration or a number of calls (--duration, --calls; with both the run stops at the first)")
	case c.CallTimeout < 0:
		return fmt.Errorf("call timeout must not be negative, got %s", c.CallTimeout)
	case len(c.Mix) == 0:
		return errors.New("the tool mix is empty")
	}
	return nil
}

// Report is the outcome of a run.
type Report struct {
	Target        string           `json:"target"` // what was driven: the spawned server's command line, or the URL
	Clients       int              `json:"clients"`
	DupRatio      float64          `json:"dup_ratio"`
	MismatchRatio float64          `json:"mismatch_ratio"`
	KeySpace      int              `json:"key_space"`
	Mix           map[string]int   `json:"mix"`
	Elapsed       float64          `json:"elapsed_s"`
	Calls         int64            `json:"calls"`
	Failed        int64            `json:"failed_calls"` // calls that got no answer (transport error or timeout)
	Throughput    float64          `json:"calls_per_s"`
	Latency       Latency          `json:"latency"`
	Kinds         map[string]*Kind `json:"kinds"` // by kind: "create_order/new", "create_order/replay", …
	Correctness   Correctness      `json:"correctness"`
	// ServerCPU is set when the server is a local process.
	ServerCPU *ServerCPU `json:"server_cpu,omitempty"`
	// Floors and Ratios are set when the floors were measured (--floors).
	Floors *Floors           `json:"floors,omitempty"`
	Ratios map[string]*Ratio `json:"ratios,omitempty"` // by kind
	// ThroughputVsNoop is calls/s as a share of no-op calls/s at the same
	// number of clients.
	ThroughputVsNoop float64 `json:"calls_per_s_vs_noop,omitempty"`
	// ClaimFloor is set when the PostgreSQL floor was measured (--floor-db).
	ClaimFloor *ClaimFloor `json:"pg_claim_floor,omitempty"`
	// ReplayVsGet is the p50 of create_order/replay as a multiple of
	// get_order's in the same run (both answer from the ledger without a
	// write); 0 when the run had not both.
	ReplayVsGet float64 `json:"replay_p50_x_get_order,omitempty"`
	// Delivery is set when the server's outbox directory was watched.
	Delivery *Delivery `json:"delivery,omitempty"`
}

// ServerCPU is the CPU time (user + system) the server process used
// during the run, read from /proc/PID/stat before and after (10 ms
// resolution).
type ServerCPU struct {
	Total   float64 `json:"total_ms"`
	PerCall float64 `json:"per_call_us"`
	// IncludesDrain is set when the figure runs on until the run's
	// notifications were delivered (see Delivery), so that a call's CPU
	// includes delivering its message.
	IncludesDrain bool `json:"includes_drain,omitempty"`
	// XNoop is PerCall as a multiple of the no-op server's CPU per call
	// (Floors.NoopCPUPerCall): for a run of replays, what the ledger's
	// check costs the server beyond serving MCP.
	XNoop float64 `json:"per_call_x_noop,omitempty"`
	// XInProcess is PerCall as a multiple of the in-process create's CPU
	// with its delivery (Floors.InProcess): for a run of new create_orders,
	// what serving the call as a separate process costs beyond the call.
	XInProcess float64 `json:"per_call_x_in_process,omitempty"`
}

// Ratio is one kind of call's p50 as a multiple of the floors.
type Ratio struct {
	Noop float64 `json:"p50_x_noop"`
	// NoopCommit is p50 / (no-op + commit): the least a durable answer
	// can cost; set for kinds that write (new keys and refusals).
	NoopCommit float64 `json:"p50_x_noop_plus_commit,omitempty"`
}

// SetFloors records f and computes each kind's ratios to it.
func (r *Report) SetFloors(f Floors) {
	r.Floors = &f
	r.Ratios = map[string]*Ratio{}
	for kind, k := range r.Kinds {
		if f.NoopP50 <= 0 || k.Latency.Count == 0 {
			continue
		}
		ra := &Ratio{Noop: k.Latency.P50 / f.NoopP50}
		if strings.HasSuffix(kind, "/new") && f.CommitP50 > 0 {
			ra.NoopCommit = k.Latency.P50 / (f.NoopP50 + f.CommitP50)
		}
		r.Ratios[kind] = ra
	}
	if f.NoopRate > 0 {
		r.ThroughputVsNoop = r.Throughput / f.NoopRate
	}
	r.cpuRatios()
}

// SetServerCPU records the server's CPU time used during the run.
func (r *Report) SetServerCPU(used time.Duration) {
	r.ServerCPU = &ServerCPU{Total: float64(used.Microseconds()) / 1e3}
	if r.Calls > 0 {
		r.ServerCPU.PerCall = float64(used.Microseconds()) / float64(r.Calls)
	}
	r.cpuRatios()
}

// cpuRatios states the server's CPU per call against the floors' CPU
// figures, once both are known.
func (r *Report) cpuRatios() {
	c, f := r.ServerCPU, r.Floors
	if c == nil || f == nil || c.PerCall <= 0 {
		return
	}
	if f.NoopCPUPerCall > 0 {
		c.XNoop = c.PerCall / f.NoopCPUPerCall
	}
	if f.InProcess != nil && f.InProcess.CPUPerCreateDelivered > 0 {
		c.XInProcess = c.PerCall / f.InProcess.CPUPerCreateDelivered
	}
}

// Kind is the figures of one kind of call.
type Kind struct {
	Calls      int64   `json:"calls"`
	Throughput float64 `json:"calls_per_s"`
	Latency    Latency `json:"latency"`
}

// Correctness is the accounting of the answers against what idemgate
// guarantees.
type Correctness struct {
	OK bool `json:"ok"` // no failure and no unexpected answer
	// Keys answered successfully, by tool; for create_order each names
	// exactly one order (effects per key = 1) when OK.
	Keys            map[string]int `json:"keys"`
	Orders          int            `json:"orders"`            // distinct order ids named by create_order keys
	Replays         int64          `json:"replays"`           // duplicates answered with the saved result
	RefusedMismatch int64          `json:"refused_mismatch"`  // changed requests refused as expected
	Reads           int64          `json:"reads"`             // get_order answers naming the asked order
	Failures        int64          `json:"failures"`          // answers that break a guarantee
	Unexpected      map[string]int `json:"unexpected_errors"` // other error answers by code ("transport" for no answer)
	Examples        []string       `json:"examples,omitempty"`
}

const maxExamples = 10

// keyState is what the run knows of one key.
type keyState struct {
	tool   string
	n      int64             // the index its arguments are made from
	result [sha256.Size]byte // digest of the first successful answer's result, compacted
	order  string            // create_order: the order id it named
}

// run is one run's shared state.
type run struct {
	cfg   Config
	id    string
	total int

	seq    atomic.Int64 // calls issued
	nextN  atomic.Int64 // argument indexes
	failed atomic.Int64

	mu       sync.Mutex
	keys     map[string]*keyState
	answered map[string][]string // by tool: answered keys, oldest first
	orders   map[string]string   // order id → key
	orderIDs []string            // for get_order
	durs     map[string]*sampler
	all      sampler
	rng      *rand.Rand // for the samplers
	corr     Correctness
	errs     atomic.Int64
}

// Run runs cfg's workload. Client i calls through callers[i%len(callers)]
// (one caller shared by every client, as over one stdio connection, or one
// each). It returns when the run ends or ctx is done (calls in flight are
// then still awaited, each up to the call timeout).
func Run(ctx context.Context, cfg Config, callers []Caller) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if len(callers) == 0 {
		return nil, errors.New("loadgen: no caller")
	}
	if cfg.CallTimeout == 0 {
		cfg.CallTimeout = 30 * time.Second
	}
	r := &run{cfg: cfg, id: cfg.Run, keys: map[string]*keyState{}, answered: map[string][]string{},
		orders: map[string]string{}, durs: map[string]*sampler{}, rng: rand.New(rand.NewPCG(1, 2))}
	if r.id == "" {
		r.id = uuid.NewString()[:8]
	}
	r.corr.Keys = map[string]int{}
	r.corr.Unexpected = map[string]int{}
	for _, m := range cfg.Mix {
		r.total += m.Weight
	}
	start := time.Now()
	var deadline time.Time
	if cfg.Duration > 0 {
		deadline = start.Add(cfg.Duration)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range cfg.Clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), uint64(i)))
			c := callers[i%len(callers)]
			for {
				if ctx.Err() != nil || (!deadline.IsZero() && !time.Now().Before(deadline)) {
					return
				}
				if n := r.seq.Add(1); cfg.Calls > 0 && n > cfg.Calls {
					r.seq.Add(-1)
					return
				}
				r.one(c, rng)
			}
		}()
	}
	progressDone := make(chan struct{})
	if cfg.Progress == nil {
		close(progressDone)
	} else {
		go func() {
			defer close(progressDone)
			t := time.NewTicker(time.Second)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					cfg.Progress(Progress{Elapsed: time.Since(start), Calls: r.seq.Load(), Errors: r.errs.Load(), Planned: cfg.Duration, Target: cfg.Calls})
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(stop)
	<-progressDone // no progress call after Run returns
	return r.report(elapsed), nil
}

// one makes one call and accounts for its answer.
func (r *run) one(c Caller, rng *rand.Rand) {
	tool := r.pickTool(rng)
	kind, key, args, st := r.plan(tool, rng)
	tool, _, _ = strings.Cut(kind, "/") // plan may turn a get_order into a create
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.CallTimeout)
	t0 := time.Now()
	ans, err := c.Call(ctx, tool, args)
	d := time.Since(t0)
	cancel()
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.durs[kind]
	if s == nil {
		s = &sampler{}
		r.durs[kind] = s
	}
	s.add(d, r.rng)
	r.all.add(d, r.rng)
	if err != nil {
		r.failed.Add(1)
		r.unexpected("transport", fmt.Sprintf("%s: no answer: %v", kind, err))
		return
	}
	r.account(kind, key, st, args, ans)
}

func (r *run) pickTool(rng *rand.Rand) string {
	w := rng.IntN(r.total)
	for _, m := range r.cfg.Mix {
		if w < m.Weight {
			return m.Tool
		}
		w -= m.Weight
	}
	return r.cfg.Mix[len(r.cfg.Mix)-1].Tool
}

// plan chooses what the call is: its kind, key, arguments, and the key's
// state for a reuse.
func (r *run) plan(tool string, rng *rand.Rand) (kind, key string, args map[string]any, st *keyState) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if tool == "get_order" {
		if len(r.orderIDs) == 0 {
			tool = "create_order"
		} else {
			id := r.orderIDs[rng.IntN(len(r.orderIDs))]
			return "get_order", "", map[string]any{"order_id": id}, nil
		}
	}
	if done := r.answered[tool]; len(done) > 0 {
		p := rng.Float64()
		if p < r.cfg.DupRatio+r.cfg.MismatchRatio {
			pool := done
			if k := r.cfg.KeySpace; k > 0 && len(pool) > k {
				pool = pool[len(pool)-k:]
			}
			key = pool[rng.IntN(len(pool))]
			st = r.keys[key]
			if p < r.cfg.DupRatio {
				return tool + "/replay", key, toolArgs(tool, r.id, key, st.n, false), st
			}
			return tool + "/mismatch", key, toolArgs(tool, r.id, key, st.n, true), st
		}
	}
	n := r.nextN.Add(1)
	key = uuid.NewString()
	return tool + "/new", key, toolArgs(tool, r.id, key, n, false), &keyState{tool: tool, n: n}
}

// toolArgs are the arguments of key's call number n of tool; changed
// alters them (a different quantity or body) for a mismatch.
func toolArgs(tool, run, key string, n int64, changed bool) map[string]any {
	switch tool {
	case "send_notification":
		body := fmt.Sprintf("bench %s message %d", run, n)
		if changed {
			body += " (changed)"
		}
		return map[string]any{"operation_key": key, "channel": "email",
			"to": []any{fmt.Sprintf("bench-%s-%d@example.com", run, n)}, "subject": "bench", "body": body}
	default: // create_order
		qty := 1
		if changed {
			qty = 2
		}
		return map[string]any{"operation_key": key, "customer_id": fmt.Sprintf("bench-%s-%d", run, n), "currency": "EUR",
			"items": []any{map[string]any{"sku": "coffee-1kg", "quantity": qty, "unit_price_minor": 1850}}}
	}
}

// envelope is the part of idemgate's answer the accounting reads.
type envelope struct {
	Status   string          `json:"status"`
	Replayed bool            `json:"replayed"`
	Result   json.RawMessage `json:"result"`
	Error    *struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

func orderIDOf(result []byte) string {
	var v struct {
		Order struct {
			OrderID string `json:"order_id"`
		} `json:"order"`
	}
	_ = json.Unmarshal(result, &v)
	return v.Order.OrderID
}

func compact(b []byte) []byte {
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return b
	}
	return buf.Bytes()
}

// account checks one answer against the guarantees. r.mu is held.
func (r *run) account(kind, key string, st *keyState, args map[string]any, ans Answer) {
	var e envelope
	if err := json.Unmarshal(ans.Structured, &e); err != nil || (ans.IsError != (e.Error != nil)) {
		r.fail(fmt.Sprintf("%s %s: the answer is not an idemgate envelope (isError=%v): %.200s", kind, key, ans.IsError, ans.Structured))
		return
	}
	tool, class, _ := strings.Cut(kind, "/")
	switch {
	case tool == "get_order":
		want, _ := args["order_id"].(string)
		if e.Error != nil {
			r.fail(fmt.Sprintf("get_order %s: refused with %s: %s", want, e.Error.Code, e.Error.Message))
			return
		}
		if got := orderIDOf(e.Result); got != want {
			r.fail(fmt.Sprintf("get_order %s: answered order %q", want, got))
			return
		}
		r.corr.Reads++
	case class == "mismatch":
		if e.Error != nil && e.Error.Code == "key_reused_with_different_request" {
			r.corr.RefusedMismatch++
			return
		}
		if e.Error == nil {
			r.fail(fmt.Sprintf("%s key %s: a changed request was answered %s (replayed=%v) instead of refused with key_reused_with_different_request", tool, key, e.Status, e.Replayed))
			if tool == "create_order" {
				r.nameOrder(key, st, orderIDOf(e.Result))
			}
			return
		}
		r.unexpected(e.Error.Code, fmt.Sprintf("%s key %s (changed request): %s: %s", tool, key, e.Error.Code, e.Error.Message))
	case e.Error != nil:
		r.unexpected(e.Error.Code, fmt.Sprintf("%s key %s (%s): %s: %s", tool, key, class, e.Error.Code, e.Error.Message))
	case e.Status != "succeeded":
		r.unexpected("status "+e.Status, fmt.Sprintf("%s key %s (%s): status %s", tool, key, class, e.Status))
	case class == "new":
		if e.Replayed {
			r.fail(fmt.Sprintf("%s key %s: a new key was answered as a replay", tool, key))
		}
		st.result = sha256.Sum256(compact(e.Result))
		r.keys[key] = st
		r.answered[tool] = append(r.answered[tool], key)
		r.corr.Keys[tool]++
		if tool == "create_order" {
			r.nameOrder(key, st, orderIDOf(e.Result))
		}
	default: // replay
		if tool == "create_order" {
			r.nameOrder(key, st, orderIDOf(e.Result))
		}
		if sha256.Sum256(compact(e.Result)) != st.result {
			if tool != "create_order" || orderIDOf(e.Result) == st.order {
				r.fail(fmt.Sprintf("%s key %s: a duplicate got a different result than its first call: %.200s", tool, key, e.Result))
			}
			return
		}
		if !e.Replayed {
			r.fail(fmt.Sprintf("%s key %s: a duplicate with the same result was not marked replayed", tool, key))
			return
		}
		r.corr.Replays++
	}
}

// nameOrder records that key's create answered order id: a second order
// id for one key, or one order id for two keys, is a failure (an effect
// twice, or two intents merged).
func (r *run) nameOrder(key string, st *keyState, id string) {
	switch {
	case id == "":
		r.fail(fmt.Sprintf("create_order key %s: a success without an order id", key))
	case st.order == "":
		st.order = id
		if other, ok := r.orders[id]; ok && other != key {
			r.fail(fmt.Sprintf("order %s is named by two keys, %s and %s", id, other, key))
			return
		}
		r.orders[id] = key
		r.orderIDs = append(r.orderIDs, id)
	case st.order != id:
		r.fail(fmt.Sprintf("create_order key %s: answered two different orders, %s and %s (the effect ran twice)", key, st.order, id))
	}
}

func (r *run) fail(msg string) {
	r.corr.Failures++
	r.errs.Add(1)
	r.example(msg)
}

func (r *run) unexpected(code, msg string) {
	r.corr.Unexpected[code]++
	r.errs.Add(1)
	r.example(msg)
}

func (r *run) example(msg string) {
	if len(r.corr.Examples) < maxExamples {
		r.corr.Examples = append(r.corr.Examples, msg)
	}
}

func (r *run) report(elapsed time.Duration) *Report {
	r.mu.Lock()
	defer r.mu.Unlock()
	secs := elapsed.Seconds()
	rep := &Report{Clients: r.cfg.Clients, DupRatio: r.cfg.DupRatio, MismatchRatio: r.cfg.MismatchRatio,
		KeySpace: r.cfg.KeySpace, Mix: map[string]int{}, Elapsed: secs, Failed: r.failed.Load(), Kinds: map[string]*Kind{}}
	for _, m := range r.cfg.Mix {
		rep.Mix[m.Tool] = m.Weight
	}
	for kind, s := range r.durs {
		k := &Kind{Calls: s.n, Latency: s.latency()}
		if secs > 0 {
			k.Throughput = float64(s.n) / secs
		}
		rep.Kinds[kind] = k
	}
	rep.Calls = r.all.n
	if secs > 0 {
		rep.Throughput = float64(r.all.n) / secs
	}
	rep.Latency = r.all.latency()
	if rp, g := rep.Kinds["create_order/replay"], rep.Kinds["get_order"]; rp != nil && g != nil && g.Latency.P50 > 0 {
		rep.ReplayVsGet = rp.Latency.P50 / g.Latency.P50
	}
	rep.Correctness = r.corr
	rep.Correctness.Orders = len(r.orders)
	rep.Correctness.OK = r.corr.Failures == 0 && len(r.corr.Unexpected) == 0
	return rep
}
