package ledgertest

import (
	"bytes"
	"errors"
	"fmt"
	"idemgate/ledger"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The concurrent cases of the contract; run them with -race.

// reruns reports whether s runs on a Concurrent backend, which runs a
// transaction again when the database refuses it for a conflict with a
// concurrent one: an apply runs inside the claim's transaction, so there
// it may run more often than once per key, while its effect is committed
// once (what the effects and decisions below prove).
func reruns(s ledger.Store) bool {
	j, ok := s.(interface{ Journaling() bool })
	return ok && j.Journaling()
}

// contractConcurrentSameClaim: 64 goroutines send the same claim at once.
// The side effect happens once; every caller gets its result.
func contractConcurrentSameClaim(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	c := newClaim("t1", "create_order", "fp-1")
	const n = 64
	var (
		start = make(chan struct{})
		wg    sync.WaitGroup
		ds    [n]ledger.Decision
		errs  [n]error
	)
	for i := range n {
		wg.Go(func() {
			<-start
			ds[i], errs[i] = e.s.Execute(e.ctx, c, e.ap.succeed(fmt.Sprintf(`{"order":{"order_id":"ord_%d"}}`, i)))
		})
	}
	close(start)
	wg.Wait()

	executed, replayed := 0, 0
	var result []byte
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("goroutine %d: %v", i, errs[i])
		}
		switch ds[i].Kind {
		case ledger.DecisionExecuted:
			executed++
			result = ds[i].Record.Result
		case ledger.DecisionReplay:
			replayed++
		default:
			t.Errorf("goroutine %d: decision %q, want executed or replay", i, ds[i].Kind)
		}
	}
	if executed != 1 || replayed != n-1 {
		t.Fatalf("executed %d, replayed %d; want 1, %d", executed, replayed, n-1)
	}
	if got := e.ap.n(); got != 1 && !(reruns(e.s) && got > 1) {
		t.Fatalf("apply ran %d times, want 1", got)
	}
	for i := range n {
		if !bytes.Equal(ds[i].Record.Result, result) {
			t.Errorf("goroutine %d got Result %s, want the executed %s", i, ds[i].Record.Result, result)
		}
		if ds[i].Record.Attempts != 1 {
			t.Errorf("goroutine %d: Attempts = %d", i, ds[i].Record.Attempts)
		}
	}
	if got := effects(t, e.s); len(got) != 1 {
		t.Errorf("effects = %d values, want 1", len(got))
	}
}

// contractConcurrentDistinctKeys: 200 goroutines, 100 keys, two callers per
// key. Exactly 100 side effects.
func contractConcurrentDistinctKeys(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	const keys, per = 100, 2
	claims := make([]ledger.Claim, keys)
	for i := range claims {
		claims[i] = newClaim("t1", "create_order", fmt.Sprintf("fp-%d", i))
	}
	var applies atomic.Int64
	apply := func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		applies.Add(1)
		if err := tx.Put("values", rec.Key, []byte(rec.Fingerprint)); err != nil {
			return ledger.Outcome{}, err
		}
		return ledger.Outcome{State: ledger.StateSucceeded, Result: []byte(`"` + rec.Key + `"`)}, nil
	}
	var (
		start    = make(chan struct{})
		wg       sync.WaitGroup
		executed [keys]atomic.Int64
		failures atomic.Int64
	)
	for i := range keys * per {
		wg.Go(func() {
			<-start
			c := claims[i%keys]
			d, err := e.s.Execute(e.ctx, c, apply)
			switch {
			case err != nil:
				failures.Add(1)
				t.Errorf("Execute(%d): %v", i, err)
			case d.Kind == ledger.DecisionExecuted:
				executed[i%keys].Add(1)
			case d.Kind != ledger.DecisionReplay:
				failures.Add(1)
				t.Errorf("Execute(%d): decision %q", i, d.Kind)
			}
			if err == nil && string(d.Record.Result) != `"`+c.Key+`"` {
				t.Errorf("Execute(%d): Result %s belongs to another key", i, d.Record.Result)
			}
		})
	}
	close(start)
	wg.Wait()
	if failures.Load() > 0 {
		t.FailNow()
	}
	if got := applies.Load(); got != keys && !(reruns(e.s) && got > keys) {
		t.Errorf("apply ran %d times, want %d", got, keys)
	}
	for i := range keys {
		if n := executed[i].Load(); n != 1 {
			t.Errorf("key %d executed %d times, want 1", i, n)
		}
	}
	n := 0
	if err := e.s.View(e.ctx, func(tx ledger.Tx) error {
		return tx.Scan("values", "", false, func(string, []byte) (bool, error) { n++; return true, nil })
	}); err != nil {
		t.Fatal(err)
	}
	if n != keys {
		t.Errorf("collection holds %d values, want %d", n, keys)
	}
	recs, err := e.s.List(e.ctx, ledger.Filter{Tenant: "t1", State: ledger.StateSucceeded, Limit: 1000})
	if err != nil || len(recs) != keys {
		t.Errorf("List(succeeded) = %d, %v; want %d", len(recs), err, keys)
	}
}

// contractConcurrentBatchMemberFails: while one slow write holds the store,
// 32 callers queue up (a group-commit backend commits them together); one
// of them fails. The failure leaves no record and takes no other caller
// down with it.
func contractConcurrentBatchMemberFails(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store) {
	e := newEnv(t, open, nil)
	runBatchWithOneFailure(t, e, func() { time.Sleep(100 * time.Millisecond) })
}

// runBatchWithOneFailure starts a blocker whose apply waits until
// queued() returns, then 32 concurrent Executes of which number 7 fails.
func runBatchWithOneFailure(t *testing.T, e *env, queued func()) {
	t.Helper()
	const n, failing = 32, 7
	release := make(chan struct{})
	blockerDone := make(chan error, 1)
	inBlocker := make(chan struct{})
	var entered sync.Once // apply may run again (a concurrent backend's conflict)
	go func() {
		_, err := e.s.Execute(e.ctx, newClaim("t1", "create_order", "fp-blocker"), func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
			entered.Do(func() { close(inBlocker) })
			<-release
			return ledger.Outcome{State: ledger.StateSucceeded}, tx.Put(effectsCollection, rec.Key, []byte("blocker"))
		})
		blockerDone <- err
	}()
	<-inBlocker

	claims := make([]ledger.Claim, n)
	ds := make([]ledger.Decision, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		claims[i] = newClaim("t1", "create_order", fmt.Sprintf("fp-%d", i))
		apply := e.ap.succeed(`{"ok":true}`)
		if i == failing {
			apply = e.ap.fail(errBoom)
		}
		wg.Go(func() { ds[i], errs[i] = e.s.Execute(e.ctx, claims[i], apply) })
	}
	queued()
	close(release)
	wg.Wait()
	if err := <-blockerDone; err != nil {
		t.Fatalf("blocker: %v", err)
	}

	for i := range n {
		if i == failing {
			if !errors.Is(errs[i], errBoom) {
				t.Errorf("failing member: err = %v, want errBoom", errs[i])
			}
			if _, err := e.s.Get(e.ctx, "t1", claims[i].Key); !errors.Is(err, ledger.ErrNotFound) {
				t.Errorf("failing member left a record: Get err = %v", err)
			}
			continue
		}
		if errs[i] != nil || ds[i].Kind != ledger.DecisionExecuted {
			t.Errorf("member %d: decision %q, err %v; want executed", i, ds[i].Kind, errs[i])
			continue
		}
		wantState(t, mustGet(t, e.s, "t1", claims[i].Key), ledger.StateSucceeded)
	}
	got := effects(t, e.s)
	if len(got) != n { // n-1 members + the blocker
		t.Errorf("effects = %d values, want %d", len(got), n)
	}
	for k := range got {
		if strings.Contains(k, claims[failing].Key) {
			t.Errorf("the failing member's effect %s survived", k)
		}
	}
}

// RunBatchWithOneFailure is the ConcurrentBatchMemberFails case for a
// backend that commits concurrent writers together: queued is called with
// the store while a blocker holds it, and returns once the backend has the
// 32 callers waiting for one batch. It returns how many times the
// applies ran (more than 32 when the batch formed, failed and was re-run).
func RunBatchWithOneFailure(t *testing.T, open func(t *testing.T, o ledger.Options) ledger.Store, queued func(s ledger.Store)) int64 {
	e := newEnv(t, open, nil)
	runBatchWithOneFailure(t, e, func() { queued(e.s) })
	return e.ap.n()
}
