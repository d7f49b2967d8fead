package ledgertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"idemgate/ledger"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// Linearizability of the ledger's observable behaviour, checked with
// porcupine against a sequential specification of one operation key.
//
// Operations a client can observe, per key:
//
//	execute(fp)        Execute with an apply that writes an effect and
//	                   returns a result unique to this call → executed R,
//	                   replay R, mismatch, or busy
//	claim(fp)          Claim (the external-downstream path) → claimed gen,
//	                   replay R, mismatch, or busy
//	complete(gen, R)   Complete of a claim → ok, or stale
//	get                Get → absent, or the record (state, fingerprint, R)
//
// The sequential spec: the first execute of a key runs and returns
// executed with its own R, the first claim returns claimed and leaves the
// key in progress (busy for everyone) until its complete, after which it
// holds that complete's R; later calls with the first call's fingerprint
// replay R, and any other fingerprint is a mismatch, in every state. A
// history is linearizable if the concurrent calls can be ordered, each at
// an instant inside its call interval, into a sequence the spec allows.

type linInput struct {
	Op  string // execute, claim, complete, get
	Key string
	FP  string
	Gen uint64 // complete
	R   string // complete: the result it records
}

type linOutput struct {
	Kind   string       // execute/claim: a DecisionKind; complete: ok/stale; get: absent/found
	FP     string       // the record's fingerprint, as answered
	Result string       // the record's result, as answered
	State  ledger.State // get: the record's state
	Gen    uint64       // claim: the claimed generation
}

// linState is one key's state in the spec: phase 0 no record, 1 claimed
// (in progress), 2 done.
type linState struct {
	Phase  int
	FP     string
	Result string
	Gen    uint64
}

// linStep is the spec.
func linStep(state, input, output any) (bool, any) {
	s, in, out := state.(linState), input.(linInput), output.(linOutput)
	switch in.Op {
	case "get":
		switch s.Phase {
		case 0:
			return out.Kind == "absent", s
		case 1:
			return out.Kind == "found" && out.State == ledger.StateInProgress && out.FP == s.FP, s
		default:
			return out.Kind == "found" && out.State == ledger.StateSucceeded && out.FP == s.FP && out.Result == s.Result, s
		}
	case "complete":
		if s.Phase == 1 && s.Gen == in.Gen {
			return out.Kind == "ok", linState{Phase: 2, FP: s.FP, Result: in.R}
		}
		return out.Kind == "stale", s
	case "execute", "claim":
		switch {
		case s.Phase == 0 && in.Op == "execute":
			return out.Kind == string(ledger.DecisionExecuted) && out.FP == in.FP, linState{Phase: 2, FP: in.FP, Result: out.Result}
		case s.Phase == 0:
			return out.Kind == string(ledger.DecisionClaimed) && out.FP == in.FP && out.Gen > 0, linState{Phase: 1, FP: in.FP, Gen: out.Gen}
		case in.FP != s.FP:
			return out.Kind == string(ledger.DecisionMismatch) && out.FP == s.FP && out.Result == s.Result, s
		case s.Phase == 1:
			return out.Kind == string(ledger.DecisionBusy) && out.FP == s.FP, s
		default:
			return out.Kind == string(ledger.DecisionReplay) && out.FP == s.FP && out.Result == s.Result, s
		}
	}
	return false, s
}

// ledgerModel is the spec as a porcupine model, partitioned by key (keys
// are independent, so the history is linearizable iff each key's is).
var ledgerModel = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var order []string
		for _, op := range history {
			k := op.Input.(linInput).Key
			if _, ok := byKey[k]; !ok {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, k := range order {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() any { return linState{} },
	Step: linStep,
	DescribeOperation: func(input, output any) string {
		in, out := input.(linInput), output.(linOutput)
		switch in.Op {
		case "complete":
			return fmt.Sprintf("complete(%s, gen %d, %s) → %s", in.Key[:8], in.Gen, in.R, out.Kind)
		case "get":
			return fmt.Sprintf("get(%s) → %s %s %s", in.Key[:8], out.Kind, out.State, out.Result)
		}
		return fmt.Sprintf("%s(%s, %s) → %s %s", in.Op, in.Key[:8], in.FP, out.Kind, out.Result)
	},
	DescribeState: func(state any) string {
		s := state.(linState)
		return fmt.Sprintf("phase %d fp %s result %s gen %d", s.Phase, s.FP, s.Result, s.Gen)
	},
}

// recordHistory runs goroutines × perG random operations on the stores
// (goroutine g uses stores[g%len(stores)]) and returns the observed
// history. The keys are used a handful at a time: operation i of every
// goroutine picks one of the perKeys keys of generation i/opsPerGen, so
// all goroutines race for each generation's first calls. Every execute's apply writes one effect named by the
// call, so a second execution of a key would show as a second effect.
func recordHistory(t *testing.T, stores []ledger.Store, keys []string, perKeys, opsPerGen, goroutines, perG int, seed uint64) []porcupine.Operation {
	t.Helper()
	ctx := context.Background()
	t0 := time.Now()
	clock := func() int64 { return int64(time.Since(t0)) }
	var (
		mu      sync.Mutex
		history []porcupine.Operation
		wg      sync.WaitGroup
	)
	add := func(op porcupine.Operation) {
		mu.Lock()
		history = append(history, op)
		mu.Unlock()
	}
	fail := func(format string, args ...any) {
		t.Errorf(format, args...)
	}
	for g := range goroutines {
		st := stores[g%len(stores)]
		rnd := rand.New(rand.NewPCG(seed, uint64(g)))
		wg.Go(func() {
			for i := range perG {
				gen := min(i/opsPerGen*perKeys, len(keys)-perKeys)
				key := keys[gen+rnd.IntN(perKeys)]
				fp := key[:8] + "-" + string(rune('a'+rnd.IntN(2)))
				claim := ledger.Claim{Actor: testActor("t1"), Key: key, Tool: "create_order", Fingerprint: fp, OnLeaseExpiry: ledger.StateRetryable}
				switch p := rnd.IntN(100); {
				case p < 50: // execute
					mine := fmt.Sprintf(`{"by":"g%02d-%03d"}`, g, i)
					apply := func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
						if err := tx.Put(effectsCollection, rec.Key+"/"+mine, []byte(fp)); err != nil {
							return ledger.Outcome{}, err
						}
						return ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(mine)}, nil
					}
					call := clock()
					d, err := st.Execute(ctx, claim, apply)
					ret := clock()
					if err != nil {
						fail("execute: %v", err)
						continue
					}
					out := linOutput{Kind: string(d.Kind), FP: d.Record.Fingerprint, Result: string(d.Record.Result)}
					if d.Kind == ledger.DecisionExecuted && out.Result != mine {
						fail("execute answered executed with %s, its apply returned %s", out.Result, mine)
					}
					add(porcupine.Operation{ClientId: g, Input: linInput{Op: "execute", Key: key, FP: fp}, Call: call, Output: out, Return: ret})
				case p < 75: // claim, then complete it when claimed
					call := clock()
					d, err := st.Claim(ctx, claim)
					ret := clock()
					if err != nil {
						fail("claim: %v", err)
						continue
					}
					out := linOutput{Kind: string(d.Kind), FP: d.Record.Fingerprint, Result: string(d.Record.Result), Gen: d.Record.Generation}
					if d.Kind != ledger.DecisionClaimed {
						out.Gen = 0
					}
					add(porcupine.Operation{ClientId: g, Input: linInput{Op: "claim", Key: key, FP: fp}, Call: call, Output: out, Return: ret})
					if d.Kind != ledger.DecisionClaimed {
						continue
					}
					if rnd.IntN(3) == 0 { // let others find it in progress for a moment
						time.Sleep(time.Duration(rnd.IntN(3)) * time.Millisecond)
					}
					r := fmt.Sprintf(`{"by":"g%02d-%03d-complete"}`, g, i)
					call = clock()
					_, err = st.Complete(ctx, claim.Actor, key, d.Record.Generation, ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(r)})
					ret = clock()
					kind := "ok"
					if errors.Is(err, ledger.ErrStaleGeneration) {
						kind = "stale"
					} else if err != nil {
						fail("complete: %v", err)
						continue
					}
					add(porcupine.Operation{ClientId: g, Input: linInput{Op: "complete", Key: key, Gen: d.Record.Generation, R: r}, Call: call, Output: linOutput{Kind: kind}, Return: ret})
				default: // get
					call := clock()
					rec, err := st.Get(ctx, "t1", key)
					ret := clock()
					out := linOutput{Kind: "absent"}
					switch {
					case errors.Is(err, ledger.ErrNotFound):
					case err != nil:
						fail("get: %v", err)
						continue
					default:
						out = linOutput{Kind: "found", FP: rec.Fingerprint, Result: string(rec.Result), State: rec.State}
					}
					add(porcupine.Operation{ClientId: g, Input: linInput{Op: "get", Key: key}, Call: call, Output: out, Return: ret})
				}
			}
		})
	}
	wg.Wait()
	return history
}

// Linearizable checks the ledger's observable behaviour with porcupine:
// 16 goroutines × 50 operations — a handful of keys at a time (5
// generations of 6 keys, two fingerprints each, every goroutine racing for
// each generation) — spread over stores, which are one ledger opened
// several times (as several processes or replicas open it), must form a
// linearizable history; every key is executed at most once (one effect);
// and the same history with one answer falsified is rejected, so the
// check can fail.
func Linearizable(t *testing.T, stores []ledger.Store) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	keys := make([]string, 5*6)
	for i := range keys {
		keys[i] = fmt.Sprintf("%08d-0000-4000-8000-000000000000", i)
	}
	history := recordHistory(t, stores, keys, 6, 10, 16, 50, seed)
	if len(history) < 16*50 {
		t.Fatalf("recorded %d operations, want at least %d", len(history), 16*50)
	}
	kinds := map[string]int{}
	for _, op := range history {
		kinds[op.Input.(linInput).Op+":"+op.Output.(linOutput).Kind]++
	}
	t.Logf("history: %d operations: %v", len(history), kinds)

	res, info := porcupine.CheckOperationsVerbose(ledgerModel, history, time.Minute)
	if res != porcupine.Ok {
		out := filepath.Join(os.TempDir(), fmt.Sprintf("idemgate-linearizability-%d.html", seed))
		if err := porcupine.VisualizePath(ledgerModel, info, out); err == nil {
			t.Logf("visualization: %s", out)
		}
		t.Fatalf("the ledger's history is not linearizable (%v)", res)
	}

	// At most one side effect per key, and exactly one for a key whose
	// first call was an execute.
	effectsPerKey := map[string]int{}
	for k := range effects(t, stores[0]) {
		effectsPerKey[k[:len(keys[0])]]++
	}
	for _, k := range keys {
		if effectsPerKey[k] > 1 {
			t.Errorf("key %s: %d side effects", k, effectsPerKey[k])
		}
		rec := mustGet(t, stores[len(stores)-1], "t1", k)
		if rec.State != ledger.StateSucceeded && rec.State != ledger.StateInProgress {
			t.Errorf("key %s ended %s", k, rec.State)
		}
	}

	// The same history with one replay's answer falsified must be refused:
	// the check can fail.
	bad := slices.Clone(history)
	for i, op := range bad {
		if out := op.Output.(linOutput); out.Kind == string(ledger.DecisionReplay) {
			out.Result = `{"by":"someone else"}`
			bad[i].Output = out
			break
		}
	}
	if porcupine.CheckOperations(ledgerModel, bad) {
		t.Errorf("a history with a falsified replay was accepted")
	}
}

// LinearizabilityModelRejects: hand-made histories that are not
// linearizable are rejected by the model (and their legal twins accepted),
// so a pass of Linearizable means something.
func LinearizabilityModelRejects(t *testing.T) {
	const k = "00000000-0000-4000-8000-000000000000"
	op := func(client int, in linInput, call, ret int64, out linOutput) porcupine.Operation {
		in.Key = k
		return porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret}
	}
	exec := linInput{Op: "execute", FP: "fp-a"}
	executed := func(r string) linOutput {
		return linOutput{Kind: string(ledger.DecisionExecuted), FP: "fp-a", Result: r}
	}
	replay := func(r string) linOutput { return linOutput{Kind: string(ledger.DecisionReplay), FP: "fp-a", Result: r} }
	for _, tc := range []struct {
		name  string
		ok    bool
		ops   []porcupine.Operation
		about string
	}{
		{"executed twice", false, []porcupine.Operation{
			op(0, exec, 0, 10, executed("R1")),
			op(1, exec, 20, 30, executed("R2")),
		}, "a second execution of one key"},
		{"executed twice, concurrently", false, []porcupine.Operation{
			op(0, exec, 0, 30, executed("R1")),
			op(1, exec, 5, 25, executed("R2")),
		}, "two concurrent executions both ran"},
		{"replay of another result", false, []porcupine.Operation{
			op(0, exec, 0, 10, executed("R1")),
			op(1, exec, 20, 30, replay("R2")),
		}, "a replay that is not the saved result"},
		{"absent after the execution returned", false, []porcupine.Operation{
			op(0, exec, 0, 10, executed("R1")),
			op(1, linInput{Op: "get"}, 20, 30, linOutput{Kind: "absent"}),
		}, "a read that misses a completed write"},
		{"absent while the execution runs", true, []porcupine.Operation{
			op(0, exec, 0, 30, executed("R1")),
			op(1, linInput{Op: "get"}, 5, 10, linOutput{Kind: "absent"}),
		}, "legal: the read may come first"},
		{"mismatch before any record", false, []porcupine.Operation{
			op(0, linInput{Op: "execute", FP: "fp-b"}, 0, 10, linOutput{Kind: string(ledger.DecisionMismatch), FP: "fp-a"}),
			op(1, exec, 20, 30, executed("R1")),
		}, "a refusal citing a record that did not exist yet"},
		{"busy after the completion", false, []porcupine.Operation{
			op(0, linInput{Op: "claim", FP: "fp-a"}, 0, 5, linOutput{Kind: string(ledger.DecisionClaimed), FP: "fp-a", Gen: 1}),
			op(0, linInput{Op: "complete", Gen: 1, R: "R1"}, 6, 10, linOutput{Kind: "ok"}),
			op(1, exec, 20, 30, linOutput{Kind: string(ledger.DecisionBusy), FP: "fp-a"}),
		}, "in progress after it was completed"},
		{"busy during the claim", true, []porcupine.Operation{
			op(0, linInput{Op: "claim", FP: "fp-a"}, 0, 5, linOutput{Kind: string(ledger.DecisionClaimed), FP: "fp-a", Gen: 1}),
			op(1, exec, 6, 8, linOutput{Kind: string(ledger.DecisionBusy), FP: "fp-a"}),
			op(0, linInput{Op: "complete", Gen: 1, R: "R1"}, 9, 10, linOutput{Kind: "ok"}),
			op(1, exec, 20, 30, replay("R1")),
		}, "legal: busy between claim and complete, then the completion's result"},
		{"two completions", false, []porcupine.Operation{
			op(0, linInput{Op: "claim", FP: "fp-a"}, 0, 5, linOutput{Kind: string(ledger.DecisionClaimed), FP: "fp-a", Gen: 1}),
			op(0, linInput{Op: "complete", Gen: 1, R: "R1"}, 6, 10, linOutput{Kind: "ok"}),
			op(1, linInput{Op: "complete", Gen: 1, R: "R2"}, 20, 30, linOutput{Kind: "ok"}),
		}, "a second completion accepted (no fencing)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := porcupine.CheckOperations(ledgerModel, tc.ops); got != tc.ok {
				t.Errorf("%s: linearizable=%v, want %v", tc.about, got, tc.ok)
			}
		})
	}
}
