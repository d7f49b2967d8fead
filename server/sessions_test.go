package server

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/bolt"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }
func mustOpenStore(t *testing.T) ledger.Store {
	return mustOpenPath(t, filepath.Join(t.TempDir(), "l.db"))
}

func mustOpenPath(t *testing.T, path string) ledger.Store {
	t.Helper()
	s, err := bolt.Open(path, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// countingStore counts Update transactions.
type countingStore struct {
	ledger.Store
	mu      sync.Mutex
	updates int
}

func (c *countingStore) Update(ctx context.Context, fn func(ledger.Tx) error) error {
	c.mu.Lock()
	c.updates++
	c.mu.Unlock()
	return c.Store.Update(ctx, fn)
}

var alice = Identity{Principal: "alice", Tenant: "acme", Role: "agent"}

func TestSessionsLifecycle(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	store := &countingStore{Store: mustOpenStore(t)}
	s := NewSessions(store, SessionConfig{IdleTimeout: 10 * time.Minute, MaxPerToken: 3, Now: clock.Now}, nil, NewMetrics())
	var freed []string
	s.free = func(id string) { freed = append(freed, id) }

	rec, err := s.Create(ctx, "tokA", alice, "claude", "1.2")
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Lookup(ctx, "tokA", rec.ID)
	if err != nil || got.ClientName != "claude" || got.ClientVersion != "1.2" {
		t.Fatalf("Lookup: %+v %v", got, err)
	}
	t.Run("other token", func(t *testing.T) {
		if _, err := s.Lookup(ctx, "tokB", rec.ID); !errors.Is(err, errNoSession) {
			t.Errorf("another token: %v, want errNoSession", err)
		}
		if err := s.End(ctx, "tokB", rec.ID); !errors.Is(err, errNoSession) {
			t.Errorf("another token ends it: %v, want errNoSession", err)
		}
	})
	t.Run("unknown and malformed", func(t *testing.T) {
		for _, id := range []string{"", "igs_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", "x", "igs_../../../../../../../../../../../.."} {
			if _, err := s.Lookup(ctx, "tokA", id); !errors.Is(err, errNoSession) {
				t.Errorf("Lookup(%q): %v, want errNoSession", id, err)
			}
		}
	})
	t.Run("last seen written only now and then", func(t *testing.T) {
		before := store.updates
		for i := 0; i < 50; i++ {
			clock.Add(time.Second) // 50 s, under a tenth of 10 min
			if _, err := s.Lookup(ctx, "tokA", rec.ID); err != nil {
				t.Fatal(err)
			}
		}
		if n := store.updates - before; n != 0 {
			t.Errorf("%d writes for 50 lookups within a tenth of the timeout, want 0", n)
		}
		clock.Add(20 * time.Second)
		s.Lookup(ctx, "tokA", rec.ID)
		if n := store.updates - before; n != 1 {
			t.Errorf("%d writes after a tenth of the timeout, want 1", n)
		}
	})
	t.Run("idle expiry", func(t *testing.T) {
		clock.Add(9 * time.Minute)
		if _, err := s.Lookup(ctx, "tokA", rec.ID); err != nil {
			t.Fatalf("used within the timeout: %v", err)
		}
		clock.Add(10*time.Minute + time.Second)
		if _, err := s.Lookup(ctx, "tokA", rec.ID); !errors.Is(err, errNoSession) {
			t.Fatalf("after the idle timeout: %v, want errNoSession", err)
		}
		n, err := s.Sweep(ctx)
		if err != nil || n != 1 {
			t.Fatalf("Sweep: %d %v, want 1", n, err)
		}
		if len(freed) != 1 || freed[0] != rec.ID || s.Local() != 0 {
			t.Errorf("memory after expiry: freed %v, %d local", freed, s.Local())
		}
	})
	t.Run("cap evicts the least recently used", func(t *testing.T) {
		var ids []string
		for i := 0; i < 3; i++ {
			r, err := s.Create(ctx, "tokA", alice, "c", "1")
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, r.ID)
			clock.Add(2 * time.Minute)
		}
		if _, err := s.Lookup(ctx, "tokA", ids[0]); err != nil { // ids[1] is now the least recently used
			t.Fatal(err)
		}
		other, _ := s.Create(ctx, "tokB", alice, "c", "1")
		r, err := s.Create(ctx, "tokA", alice, "c", "1")
		if err != nil {
			t.Fatal(err)
		}
		for id, want := range map[string]error{ids[0]: nil, ids[1]: errNoSession, ids[2]: nil, r.ID: nil} {
			if _, err := s.Lookup(ctx, "tokA", id); !errors.Is(err, want) {
				t.Errorf("after the 4th session: Lookup %s: %v, want %v", id, err, want)
			}
		}
		if _, err := s.Lookup(ctx, "tokB", other.ID); err != nil {
			t.Errorf("another token's session was evicted: %v", err)
		}
		if s.Local() != 4 {
			t.Errorf("%d sessions in memory, want 4", s.Local())
		}
	})
	t.Run("end", func(t *testing.T) {
		r, _ := s.Create(ctx, "tokC", alice, "c", "1")
		if err := s.End(ctx, "tokC", r.ID); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Lookup(ctx, "tokC", r.ID); !errors.Is(err, errNoSession) {
			t.Errorf("after End: %v", err)
		}
	})
}

// TestSessionsBoundedMemory: however many sessions a token opens and never
// closes, the ledger and this process hold at most the cap.
func TestSessionsBoundedMemory(t *testing.T) {
	ctx := context.Background()
	store := mustOpenStore(t)
	s := NewSessions(store, SessionConfig{MaxPerToken: 8}, nil, nil)
	for i := 0; i < 500; i++ {
		if _, err := s.Create(ctx, "tok", alice, "leaky", "1"); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	store.View(ctx, func(tx ledger.Tx) error {
		return tx.Scan(sessionsCollection, "", false, func(string, []byte) (bool, error) { n++; return true, nil })
	})
	if n != 8 || s.Local() != 8 {
		t.Errorf("after 500 sessions with a cap of 8: %d in the ledger, %d in memory", n, s.Local())
	}
}

// TestSessionsSharedLedger: a session created through one registry is
// known to another on the same ledger (as two HTTP servers on one
// PostgreSQL ledger share it), and ended for both.
func TestSessionsSharedLedger(t *testing.T) {
	ctx := context.Background()
	store := mustOpenPath(t, filepath.Join(t.TempDir(), "l.db"))
	a := NewSessions(store, SessionConfig{}, nil, nil)
	b := NewSessions(store, SessionConfig{}, nil, nil)
	var freed []string
	a.free = func(id string) { freed = append(freed, id) }
	r, err := a.Create(ctx, "tok", alice, "claude", "2")
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.Lookup(ctx, "tok", r.ID)
	if err != nil || got.ClientName != "claude" {
		t.Fatalf("the other process: %+v %v", got, err)
	}
	if err := b.End(ctx, "tok", r.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Lookup(ctx, "tok", r.ID); !errors.Is(err, errNoSession) {
		t.Errorf("ended on b, a says %v", err)
	}
	if _, err := a.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if len(freed) != 1 || a.Local() != 0 {
		t.Errorf("a still holds the session ended on b: freed %v, %d local", freed, a.Local())
	}
}

// TestSessionsStreamKeepsAlive: a session whose event stream is open here
// does not expire while the stream stays open.
func TestSessionsStreamKeepsAlive(t *testing.T) {
	ctx := context.Background()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s := NewSessions(mustOpenStore(t), SessionConfig{IdleTimeout: 10 * time.Minute, Now: clock.Now}, nil, nil)
	r, _ := s.Create(ctx, "tok", alice, "c", "1")
	s.watch(r.ID)
	for i := 0; i < 10; i++ {
		clock.Add(3 * time.Minute)
		if _, err := s.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Lookup(ctx, "tok", r.ID); err != nil {
		t.Fatalf("after 30 min with its stream open: %v", err)
	}
	s.unwatch(r.ID)
	clock.Add(11 * time.Minute)
	if _, err := s.Lookup(ctx, "tok", r.ID); !errors.Is(err, errNoSession) {
		t.Errorf("idle after its stream closed: %v, want errNoSession", err)
	}
}
