package bolt

import (
	"context"
	"errors"
	"fmt"
	"idemgate/ledger"
	"idemgate/ledger/ledgertest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

// TestBoltGroupCommitBatchMemberFails forces the batch: the 32 callers are
// all in the group-commit queue before the blocker's commit ends, so they
// are committed as one batch that fails and is re-run member by member.
func TestBoltGroupCommitBatchMemberFails(t *testing.T) {
	applies := ledgertest.RunBatchWithOneFailure(t, func(t *testing.T, o ledger.Options) ledger.Store { return mustOpen(t, o) }, func(st ledger.Store) {
		s := st.(*File).be
		deadline := time.Now().Add(5 * time.Second)
		for {
			s.gcMu.Lock()
			q := len(s.gcQueue) // the blocker's job was taken off; only the 32 wait
			s.gcMu.Unlock()
			if q == 32 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("only %d callers queued behind the blocker", q)
			}
			time.Sleep(time.Millisecond)
		}
	})
	// The failing member ran in the batch and again alone, so more than 32
	// applies ran (only one commit per member counts, checked above); 32
	// would mean the batch never formed and the test proved nothing.
	if got := applies; got < 33 {
		t.Errorf("applies ran %d times, want at least 33 (batch, then solo re-runs)", got)
	}
}

// TestBoltPanickingApplyDoesNotWedgeWrites: a bug in one downstream that
// panics inside apply must not leave the store unable to write for every
// later caller.
func TestBoltPanickingApplyDoesNotWedgeWrites(t *testing.T) {
	for _, name := range []string{"Execute", "Update"} {
		t.Run(name, func(t *testing.T) {
			s := mustOpen(t, ledger.Options{})
			ctx := context.Background()
			func() {
				defer func() {
					if r := recover(); r == nil {
						t.Errorf("the panic did not reach the caller")
					}
				}()
				if name == "Execute" {
					_, _ = s.Execute(ctx, newClaim("t1", "create_order", "fp-1"), func(ledger.Tx, *ledger.Record) (ledger.Outcome, error) { panic("downstream bug") })
				} else {
					_ = s.Update(ctx, func(ledger.Tx) error { panic("downstream bug") })
				}
			}()

			done := make(chan error, 1)
			go func() {
				_, err := s.Execute(ctx, newClaim("t1", "create_order", "fp-2"), (&applier{}).succeed(`{}`))
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Execute after a panicking apply: %v", err)
				}
			case <-time.After(2 * time.Second):
				t.Fatal("Execute after a panicking apply hangs: the group-commit leader never handed over (gcRunning stuck)")
			}
		})
	}
}

// TestBoltConcurrentMixed runs every kind of call at once on one store, as
// a -race target: claims, completions, renewals, replays, reads, lists,
// sweeps and collection updates.
func TestBoltConcurrentMixed(t *testing.T) {
	s := mustOpen(t, ledger.Options{Lease: time.Minute})
	ctx := context.Background()
	var wg sync.WaitGroup
	keys := make([]ledger.Claim, 20)
	for i := range keys {
		keys[i] = newClaim(fmt.Sprintf("t%d", i%3), "create_order", fmt.Sprintf("fp-%d", i))
	}
	ap := &applier{}
	var claimed sync.Map // key → generation
	for w := range 8 {
		wg.Go(func() {
			// A fixed number of rounds, not a time budget: on a loaded
			// machine a timed run may never reach some keys. The schedule
			// is deterministic, and every key gets an Execute.
			for i := range 120 {
				c := keys[(i*7+w)%len(keys)]
				switch (i + w) % 6 {
				case 0, 1:
					if _, err := s.Execute(ctx, c, ap.succeed(`{"k":1}`)); err != nil {
						t.Errorf("Execute: %v", err)
					}
				case 2:
					d, err := s.Claim(ctx, c)
					if err != nil {
						t.Errorf("Claim: %v", err)
					} else if d.Kind == ledger.DecisionClaimed {
						claimed.Store(c.Key, d.Record.Generation)
						if err := s.RenewLease(ctx, c.Actor.Tenant, c.Key, d.Record.Generation); err != nil {
							t.Errorf("RenewLease of a fresh claim: %v", err)
						}
						if _, err := s.Complete(ctx, c.Actor, c.Key, d.Record.Generation, ledger.Outcome{State: ledger.StateSucceeded}); err != nil {
							t.Errorf("Complete of a fresh claim: %v", err)
						}
					}
				case 3:
					if _, err := s.Get(ctx, c.Actor.Tenant, c.Key); err != nil && !errors.Is(err, ledger.ErrNotFound) {
						t.Errorf("Get: %v", err)
					}
				case 4:
					if _, err := s.List(ctx, ledger.Filter{Tenant: c.Actor.Tenant}); err != nil {
						t.Errorf("List: %v", err)
					}
					if _, _, err := s.Sweep(ctx); err != nil {
						t.Errorf("Sweep: %v", err)
					}
				case 5:
					if err := s.Update(ctx, func(tx ledger.Tx) error { return tx.Put("misc", uuid.NewString(), []byte("x")) }); err != nil {
						t.Errorf("Update: %v", err)
					}
				}
			}
		})
	}
	wg.Wait()
	for _, c := range keys {
		rec, err := s.Get(ctx, c.Actor.Tenant, c.Key)
		if err != nil {
			t.Errorf("Get(%s): %v", c.Key, err)
			continue
		}
		if rec.State != ledger.StateSucceeded {
			t.Fatalf("record state = %s, want %s", rec.State, ledger.StateSucceeded)
		}
	}
	// Every key has at most one effect.
	for k := range effects(t, s) {
		if !strings.HasSuffix(k, "/1") {
			t.Errorf("effect %s of a second attempt", k)
		}
	}
	if n, err := s.VerifyAudit(ctx); err != nil || n == 0 {
		t.Errorf("VerifyAudit = %d, %v", n, err)
	}
}

// TestBoltBackgroundCommitsAloneAfterWaiters: a background transaction
// (the sweep's) queued before three claims' transactions, while another
// commit runs, is committed after them, in a transaction of its own; the
// three share one commit.
func TestBoltBackgroundCommitsAloneAfterWaiters(t *testing.T) {
	f := mustOpen(t, ledger.Options{})
	s := f.be
	var (
		mu    sync.Mutex
		order []string
		wg    sync.WaitGroup
	)
	note := func(name string) func(ledger.BTx) error {
		return func(ledger.BTx) error {
			mu.Lock()
			order = append(order, name)
			mu.Unlock()
			return nil
		}
	}
	started, release := make(chan struct{}), make(chan struct{})
	defer func() {
		select {
		case <-release:
		default:
			close(release) // a failed wait: the blocker ends all the same
		}
	}()
	wg.Go(func() { // holds the commit while the others queue
		if err := s.Update(context.Background(), func(ledger.BTx) error { close(started); <-release; return nil }); err != nil {
			t.Error(err)
		}
	})
	<-started
	wg.Go(func() {
		if err := s.Update(ledger.Background(context.Background()), note("sweep")); err != nil {
			t.Error(err)
		}
	})
	waitQueued(t, s, 0, 1)
	for i := range 3 {
		wg.Go(func() {
			if err := s.Update(context.Background(), note(fmt.Sprint("claim", i))); err != nil {
				t.Error(err)
			}
		})
	}
	waitQueued(t, s, 3, 1)
	before := f.CommitStats()
	close(release)
	wg.Wait()
	after := f.CommitStats()
	if len(order) != 4 || order[3] != "sweep" {
		t.Errorf("committed in the order %v; want the three claims, then the sweep", order)
	}
	if commits, funcs := after.Commits-before.Commits, after.Functions-before.Functions; commits != 3 || funcs != 5 {
		// the blocker's commit, the claims' (three functions), the sweep's
		t.Errorf("%d commits of %d functions; want 3 of 5 (the blocker, the three claims together, the sweep alone)", commits, funcs)
	}
}

// TestBoltBehindBackgroundCounted: a claim's transaction queued while a
// background one runs is counted as waiting behind it, for as long as it
// waited; one queued with no background transaction running is not.
func TestBoltBehindBackgroundCounted(t *testing.T) {
	f := mustOpen(t, ledger.Options{})
	s := f.be
	if err := s.Update(context.Background(), func(ledger.BTx) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if st := f.CommitStats(); st.BehindBackground != 0 {
		t.Fatalf("BehindBackground = %d with no background transaction; want 0", st.BehindBackground)
	}
	started, release := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.Update(ledger.Background(context.Background()), func(ledger.BTx) error { close(started); <-release; return nil }); err != nil {
			t.Error(err)
		}
	})
	defer func() {
		select {
		case <-release:
		default:
			close(release) // a failed wait: the background one ends all the same
		}
	}()
	<-started
	wg.Go(func() {
		if err := s.Update(context.Background(), func(ledger.BTx) error { return nil }); err != nil {
			t.Error(err)
		}
	})
	waitQueued(t, s, 1, 0)
	const held = 30 * time.Millisecond
	time.Sleep(held)
	close(release)
	wg.Wait()
	st := f.CommitStats()
	if st.BehindBackground != 1 || st.BehindBackgroundMax < held {
		t.Errorf("BehindBackground = %d, longest %v; want 1, at least %v", st.BehindBackground, st.BehindBackgroundMax, held)
	}
}

// waitQueued waits until s's group commit holds normal transactions and
// background ones waiting, and fails t after 5 s.
func waitQueued(t *testing.T, s *backend, normal, background int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s.gcMu.Lock()
		n, b := len(s.gcQueue), len(s.bgQueue)
		s.gcMu.Unlock()
		if n == normal && b == background {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queued %d + %d background; want %d + %d", n, b, normal, background)
		}
	}
}

// TestCommitStatsCountsFunctions: CommitStats counts every transaction
// function committed, in fewer commits than functions when they run
// concurrently (group commit).
func TestCommitStatsCountsFunctions(t *testing.T) {
	s := mustOpen(t, ledger.Options{})
	ctx := context.Background()
	s0 := s.CommitStats()
	const n = 24
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			errs <- s.be.Update(ctx, func(tx ledger.BTx) error {
				b, err := tx.Data("stats_test", true)
				if err != nil {
					return err
				}
				return b.Put([]byte(strconv.Itoa(i)), []byte("v"))
			})
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	s1 := s.CommitStats()
	if fns := s1.Functions - s0.Functions; fns != n {
		t.Errorf("Functions grew by %d, want %d", fns, n)
	}
	if c := s1.Commits - s0.Commits; c < 1 || c > n {
		t.Errorf("Commits grew by %d, want 1..%d", c, n)
	}
}
