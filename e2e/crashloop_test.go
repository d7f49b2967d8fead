package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestCrashLoop is the randomized crash loop: 200 create_order operations
// (distinct keys, distinct customers) sent by 4 client workers, each
// pausing 0–250 ms between operations so the kills spread over them, to one
// `idemgate serve` process in front of the fake order API, while the test
// SIGKILLs that process at random moments (every 50–400 ms) and starts a
// new one on the same ledger file. The fake API injects a random fault in
// one create out of five (reply delayed past the client timeout or
// dropped after the commit, 500 before or after the commit, the request
// abandoned before the commit, the connection reset mid-answer) and makes
// one lookup out of ten unavailable. Each worker retries its key — the same
// key, always — until it ends succeeded, failed or rejected (or waits for a
// human). When the chaos phase ends, a last server reconciles every key
// that is not final, and the test asserts:
//
//   - side effects at the API == keys that ended succeeded;
//   - duplicate side effects == 0 (no write was ever resent for a key that
//     had already taken effect; no two orders for one intent);
//   - no key is lost: each ends succeeded, failed, rejected, awaiting
//     approval or visibly unknown, and a succeeded key names the order the
//     API made for it while no other key has an order at the API.
//
// The seed is logged; IDEMGATE_CRASHLOOP_SEED=N replays the same kill
// schedule and fault draws (the interleaving of processes stays the
// scheduler's).
func TestCrashLoop(t *testing.T) {
	if testing.Short() {
		t.Skip("crash loop: ~30 s")
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("IDEMGATE_CRASHLOOP_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("IDEMGATE_CRASHLOOP_SEED=%q: %v", v, err)
		}
		seed = n
	}
	t.Logf("crash loop seed %d (reproduce the schedule with IDEMGATE_CRASHLOOP_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0x1d3)) // the kill schedule

	const (
		ops       = 200
		workers   = 4
		chaosFor  = 22 * time.Second
		settleFor = 15 * time.Second
	)
	api := newFakeAPI(t)
	api.SetRandomFaults(seed, 0.2, []faultKind{
		DelayAfterCommit, DropReplyAfterCommit, Fail500AfterCommit,
		Fail500BeforeCommit, DelayBeforeCommit, ResetMidResponse,
	}, 0.1)
	db := filepath.Join(t.TempDir(), "ledger.db")
	cfg := serverConfig{DB: db, Args: apiArgs(api, "--orders-api-safe-retry", "--wait", "300ms")}

	keys := make([]string, ops)
	for i := range keys {
		keys[i] = newKey()
	}
	argsOf := func(i int) map[string]any { return faOrder(keys[i], fmt.Sprintf("cust-loop-%03d", i)) }

	var cur atomic.Pointer[session]
	cur.Store(startServer(t, mcpGoModern, cfg))

	var (
		calls, transportErrs, malformed atomic.Int64
		answers                         sync.Map // status → *atomic.Int64
		done                            atomic.Int32
		final                           = make([]string, ops)
	)
	count := func(status string) {
		v, _ := answers.LoadOrStore(status, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), chaosFor)
	defer cancel()
	work := make(chan int, ops)
	for i := range ops {
		work <- i
	}
	close(work)
	var wg sync.WaitGroup
	for w := range workers {
		think := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			for i := range work {
				ctxSleep(ctx, time.Duration(think.IntN(251))*time.Millisecond)
				for ctx.Err() == nil {
					s := cur.Load()
					cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
					e, err := s.call(cctx, "create_order", argsOf(i))
					ccancel()
					calls.Add(1)
					if err != nil {
						if strings.Contains(err.Error(), "isError=") {
							malformed.Add(1) // see TestFaultStaleInProgress
						} else {
							transportErrs.Add(1) // the server was killed under the call
						}
						ctxSleep(ctx, 20*time.Millisecond)
						continue
					}
					count(e.Status)
					if e.Status == "succeeded" || e.Status == "failed" || e.Status == "rejected" || e.Status == "awaiting_approval" {
						final[i] = e.Status
						break
					}
					// unknown: the next same-key call reconciles; in_progress:
					// a dead owner's lease runs out; retryable: run it again.
					ctxSleep(ctx, 50*time.Millisecond)
				}
				done.Add(1)
			}
		})
	}

	// The killer: the test goroutine, so startServer may fail the test.
	kills := 0
	started := time.Now()
	for ctx.Err() == nil && done.Load() < ops {
		ctxSleep(ctx, time.Duration(50+rng.IntN(351))*time.Millisecond)
		if ctx.Err() != nil || done.Load() >= ops {
			break
		}
		old := cur.Load()
		old.Kill()
		kills++
		cur.Store(startServer(t, mcpGoModern, cfg))
	}
	killedFor := time.Since(started)
	wg.Wait()
	cancel()
	finishedInChaos := 0
	for _, st := range final {
		if st != "" {
			finishedInChaos++
		}
	}

	// Settle: no more kills or faults; reconcile every key, and finish the
	// ones that are not final with the same key.
	api.SetRandomFaults(seed, 0, nil, 0)
	s := cur.Load()
	settleCtx, settleCancel := context.WithTimeout(context.Background(), settleFor)
	defer settleCancel()
	reconciled := 0
	for i, key := range keys {
		// reconcile_operation on every key: a final one is reported as it
		// is; an unknown one is settled with the API's lookup.
		r := s.callTool(t, "reconcile_operation", map[string]any{"operation_key": key})
		reconciled++
		if final[i] != "" && r.Status != final[i] {
			t.Errorf("key %d: answered %s during the chaos, reconcile_operation reports %s", i, final[i], r)
		}
		for settleCtx.Err() == nil {
			st, _, found := s.status(t, key)
			if found && (st.State == "succeeded" || st.State == "failed" || st.State == "rejected" || st.State == "awaiting_approval") {
				break
			}
			if found && (st.State == "unknown" || st.State == "in_progress") {
				s.callTool(t, "reconcile_operation", map[string]any{"operation_key": key})
				reconciled++
				if st2, _, _ := s.status(t, key); st2.State == "unknown" || st2.State == "in_progress" {
					ctxSleep(settleCtx, 200*time.Millisecond)
					continue
				}
			}
			// Never sent, or proven absent (retryable): the client's retry.
			e := s.callTool(t, "create_order", argsOf(i))
			if e.Status == "in_progress" || e.Status == "unknown" {
				ctxSleep(settleCtx, 200*time.Millisecond)
			}
		}
	}

	// The three assertions.
	states := map[string]int{}
	succeeded := 0
	for i, key := range keys {
		st, e, found := s.status(t, key)
		state := st.State
		if !found {
			state = "not_found"
		}
		states[state]++
		o := api.OrderForKey(idemKey("", key))
		switch state {
		case "succeeded":
			succeeded++
			if o == nil || st.DownstreamRef != o.OrderID {
				t.Errorf("key %d: the ledger says succeeded with %q, the API has %+v", i, st.DownstreamRef, o)
			}
		case "failed", "rejected", "awaiting_approval":
			if o != nil {
				t.Errorf("key %d: the API has order %s but the ledger says %s: a lost side effect", i, o.OrderID, state)
			}
		case "unknown":
			if e.NextAction != "reconcile" {
				t.Errorf("key %d: unknown without reconcile advice: %s", i, e)
			}
		default:
			t.Errorf("LOST: key %d ended %s: %s", i, state, e)
		}
	}
	stats := api.Stats()
	if stats.Created != succeeded {
		t.Errorf("the API created %d orders; %d keys ended succeeded", stats.Created, succeeded)
	}
	if stats.Duplicates != 0 {
		t.Errorf("duplicate side effects: %d (writes resent after they took effect: %d)", stats.Duplicates, stats.ResentAfter)
	}
	byStatus := map[string]int{}
	answers.Range(func(k, v any) bool {
		byStatus[k.(string)] = int(v.(*atomic.Int64).Load())
		return true
	})
	t.Logf("crash loop: %d operations, %d workers; %d kills (SIGKILL) and %d restarts in %v; %d finished during the chaos; %d reconcile_operation calls after it",
		ops, workers, kills, kills, killedFor.Round(time.Millisecond), finishedInChaos, reconciled)
	t.Logf("crash loop: %d create_order calls (%.2f per operation): answers %s; %d cut by a kill; %d malformed answers",
		calls.Load(), float64(calls.Load())/ops, fmtCounts(byStatus), transportErrs.Load(), malformed.Load())
	t.Logf("crash loop: API: %d write requests, %d orders created, %d replayed by key, %d abandoned before commit, %d lookups; faults injected: %s",
		stats.WriteRequests, stats.Created, stats.Replayed, stats.Abandoned, stats.Lookups, fmtCounts(stats.FaultsByKind))
	t.Logf("crash loop: side effects %d == succeeded keys %d; duplicates %d; keys by final state: %s",
		stats.Created, succeeded, stats.Duplicates, fmtCounts(states))
	appendReport(t, faultReport{
		Test: t.Name(), Faults: stats.FaultsByKind, Requests: stats.WriteRequests, SideEffects: stats.Created,
		Intended: succeeded, Duplicates: stats.Duplicates, States: states,
		Note: fmt.Sprintf("seed %d; %d SIGKILLs/restarts; %d calls; %d answers malformed", seed, kills, calls.Load(), malformed.Load()),
	}.row())
}
