package e2e

import (
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// TestRerunRaceDuplicatesWaitForRerun (issue 7 §1): with --orders-api and
// safe retries on, the first attempt of a create hangs at the order API
// past --orders-api-timeout and is never committed (its outcome is
// unknown); 16 calls with the same key arrive meanwhile from 16 real MCP
// clients, each with its own Streamable HTTP session, against one server
// process. The lookup proves the first attempt absent, one duplicate
// re-runs it, and every other duplicate waits for that re-run — none
// answers without waiting. The API ends with exactly one order; every
// duplicate answers succeeded with the operation's one saved result, byte
// for byte — or, had the server's --wait passed first (a very slow
// machine), operation_in_progress with its error object, and then only
// after at least --wait: an in_progress answer sooner is the defect the
// issue found. The duplicates' lookups at the API were coalesced into
// one. The harness checks every answer for isError ⇔ error with a
// documented code.
func TestRerunRaceDuplicatesWaitForRerun(t *testing.T) {
	t.Parallel()
	api := newFakeAPI(t)
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens.json")
	token := addToken(t, tokens, "alice", "acme", "agent")
	const wait = 5 * time.Second // the server's --wait
	base := httpServer(t, filepath.Join(dir, "ledger.db"), tokens,
		"--orders-api", api.URL(), "--orders-api-safe-retry",
		"--orders-api-timeout", "1s", "--lease", "3s", "--wait", wait.String())

	const n = 16
	first := httpSession(t, base, token)
	dups := make([]*session, n)
	for i := range dups {
		dups[i] = httpSession(t, base, token)
	}
	key := newKey()
	args := faOrder(key, "cust-rerun-race")
	h := api.InjectHold(fault{Kind: HoldBeforeCommit, Match: matchCreate}) // never committed: the client gives up first

	ctx := testContext(t)
	firstAnswer := make(chan envelope, 1)
	go func() {
		e, err := first.call(ctx, "create_order", args)
		if err != nil {
			t.Errorf("first call: %v", err)
		}
		firstAnswer <- e
	}()
	h.Wait(t, 10*time.Second)

	answers := make([]envelope, n)
	errs := make([]error, n)
	took := make([]time.Duration, n) // from sending the call to its answer
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, s := range dups {
		wg.Go(func() {
			<-start
			sent := time.Now()
			answers[i], errs[i] = s.call(ctx, "create_order", args)
			took[i] = time.Since(sent)
		})
	}
	close(start) // the 16 arrive while the first attempt hangs at the API
	e := <-firstAnswer
	if e.Status != "unknown" || e.code() != "outcome_unknown" {
		t.Errorf("the first call, whose attempt timed out: want unknown/outcome_unknown, got %s", e)
	}
	h.Release() // the API gives the abandoned request up: nothing committed
	wg.Wait()

	waitedOut := 0
	for i, a := range answers {
		switch {
		case errs[i] != nil:
			t.Errorf("duplicate %d: %v", i, errs[i])
		case a.Status == "in_progress":
			// The documented answer once --wait has passed, and only then.
			if !a.IsError || a.code() != "operation_in_progress" || a.NextAction != "wait_and_poll_status" {
				t.Errorf("duplicate %d: in_progress without isError, operation_in_progress and wait_and_poll_status: %s", i, a)
			}
			if took[i] < wait {
				t.Errorf("duplicate %d: answered operation_in_progress after %v, before the server's --wait of %v: a duplicate of a running operation must wait for its outcome", i, took[i].Round(time.Millisecond), wait)
			}
			waitedOut++
		case a.Status != "succeeded" || a.IsError || a.code() != "":
			t.Errorf("duplicate %d: want succeeded with the re-run's order, got %s", i, a)
		}
	}
	if waitedOut > 0 {
		t.Logf("%d duplicates answered operation_in_progress (the wait bound passed first: a slow machine)", waitedOut)
	}
	if waitedOut == n {
		t.Errorf("no duplicate received the re-run's outcome")
	}

	// The one saved result: what get_operation_status holds once the
	// re-run has succeeded (at once, unless every duplicate waited out).
	st := waitStatus(t, first, key, 10*time.Second, "succeeded")
	saved := string(st.Result)
	if saved == "" || saved == "null" {
		t.Fatalf("the succeeded operation has no saved result: %+v", st)
	}
	for i, a := range answers {
		if errs[i] == nil && a.Status == "succeeded" && string(a.Result) != saved {
			t.Errorf("duplicate %d: result %s, want the saved result byte for byte: %s", i, a.Result, saved)
		}
	}

	stats := api.Stats()
	k := idemKey("acme", key)
	if stats.Created != 1 || stats.Duplicates != 0 || api.CommitsFor(k) != 1 {
		t.Errorf("the API created %d orders (%d for the key, %d duplicates), want exactly 1", stats.Created, api.CommitsFor(k), stats.Duplicates)
	}
	if w := api.WritesFor(k); w != 2 {
		t.Errorf("the API received %d creates for the key, want 2 (the abandoned attempt and one re-run)", w)
	}
	if stats.Abandoned != 1 {
		t.Errorf("the API abandoned %d requests, want 1 (the first attempt)", stats.Abandoned)
	}
	if stats.Lookups != 1 {
		t.Errorf("the API saw %d lookups for one key from one process, want 1 (coalesced)", stats.Lookups)
	}
	o := api.OrderForKey(k)
	if o == nil {
		t.Fatal("the API has no order for the key")
	}
	if got := (envelope{Result: []byte(saved)}).orderID(); got != o.OrderID {
		t.Errorf("the saved result is order %q, the API has %s", got, o.OrderID)
	}
	// A later call is a replay of the same bytes.
	if r := first.mustSucceed(t, "create_order", args); !r.Replayed || string(r.Result) != saved {
		t.Errorf("a later call: want a replay of %s, got %s", saved, r)
	}
}
