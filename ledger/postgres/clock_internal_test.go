package postgres

import (
	"bytes"
	"context"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"idemgate/ledger"
	"idemgate/ledger/postgres/pgtest"
)

// TestLedgerRunsOnTheDatabasesClock: with no Options.Now, the ledger's
// time is the backend's — the database's clock — not the process's: a
// replica whose offset to the database is an hour sees the database's
// time in its transactions, and stamps records with it.
func TestLedgerRunsOnTheDatabasesClock(t *testing.T) {
	url := pgtest.NewDatabase(t)
	d, err := Open(url, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()

	// The sample matches the database's clock_timestamp().
	var db time.Time
	if err := d.be.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	if diff := d.be.Now().Sub(db); diff < -time.Second || diff > time.Second {
		t.Errorf("backend Now is %s off the database's clock", diff)
	}

	// Pretend the database's clock is an hour ahead of this machine's.
	d.be.mu.Lock()
	d.be.dbAt = d.be.dbAt.Add(time.Hour)
	d.be.mu.Unlock()
	var seen time.Time
	if err := d.Update(ctx, func(tx ledger.Tx) error { seen = tx.Now(); return nil }); err != nil {
		t.Fatal(err)
	}
	if ahead := seen.Sub(time.Now()); ahead < 59*time.Minute || ahead > 61*time.Minute {
		t.Errorf("the ledger's transaction time is %s from the process's clock, want the database's (+1h)", ahead)
	}
}

// steppedClock is a localClock under a test's control: a wall clock the
// test steps, and a monotonic clock it advances.
type steppedClock struct {
	mu      sync.Mutex
	wall    time.Time
	elapsed time.Duration
}

func (c *steppedClock) clock() localClock {
	return localClock{
		wall:    func() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.wall },
		elapsed: func() time.Duration { c.mu.Lock(); defer c.mu.Unlock(); return c.elapsed },
	}
}

// step moves the wall clock by jump and lets d pass on the monotonic one
// (a real step: the wall clock moves by jump+d, the monotonic one by d).
func (c *steppedClock) step(jump, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall = c.wall.Add(jump + d)
	c.elapsed += d
}

// TestClockIgnoresWallClockSteps: between samples, the backend's time is
// the last sample of the database's clock plus the monotonic time since:
// a step of the machine's wall clock — an hour forward, three back — is
// not believed, not even until the next sample; the time advances by
// exactly what the monotonic clock measured. The next sample anchors it
// on the database's clock again, and a sample that finds the wall clock
// far off the database's logs one warning (not one per sample).
func TestClockIgnoresWallClockSteps(t *testing.T) {
	url := pgtest.NewDatabase(t)
	d, err := Open(url, ledger.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	var logs bytes.Buffer
	clk := &steppedClock{wall: time.Now()}
	d.be.mu.Lock()
	d.be.local = clk.clock()
	d.be.log = slog.New(slog.NewTextHandler(&logs, nil))
	d.be.mu.Unlock()
	if err := d.be.syncClock(ctx); err != nil {
		t.Fatal(err)
	}
	if logs.Len() != 0 {
		t.Errorf("a sample with the wall clock in step with the database's logged %q", logs.String())
	}
	// The backend's own loop samples every ClockResync: a sample taken
	// while the steps are measured re-anchors the time, so the
	// measurement is taken again (it takes milliseconds; the loop ticks
	// every 10 s).
	anchor := func() time.Time { d.be.mu.Lock(); defer d.be.mu.Unlock(); return d.be.dbAt }
	for attempt := 1; ; attempt++ {
		a0 := anchor()
		base := d.be.Now()
		for _, s := range []struct {
			jump, d time.Duration
		}{
			{time.Hour, 2 * time.Second},
			{-3 * time.Hour, 1500 * time.Millisecond},
			{0, 500 * time.Millisecond},
		} {
			clk.step(s.jump, s.d)
		}
		got := d.be.Now().Sub(base)
		var seen time.Time
		if err := d.Update(ctx, func(tx ledger.Tx) error { seen = tx.Now(); return nil }); err != nil {
			t.Fatal(err)
		}
		if !anchor().Equal(a0) && attempt < 3 {
			continue
		}
		if want := 4 * time.Second; got != want {
			t.Errorf("after wall steps of +1h and -3h and 4 s on the monotonic clock, the backend's time moved %s, want %s", got, want)
		}
		if got := seen.Sub(base); got != 4*time.Second {
			t.Errorf("a transaction's time is %s past the anchor, want 4s", got)
		}
		break
	}

	// The next sample: the database's clock again (the fake monotonic
	// clock ran 4 s ahead of the real one), and a warning about the
	// machine's clock, now 2 h behind, once.
	for range 2 {
		if err := d.be.syncClock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var db time.Time
	if err := d.be.pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&db); err != nil {
		t.Fatal(err)
	}
	if diff := d.be.Now().Sub(db); diff < -time.Second || diff > time.Second {
		t.Errorf("after a new sample the backend's time is %s off the database's clock", diff)
	}
	// The skew logged: the wall clock stepped by -2 h and ran 4 s per
	// attempt on the fake monotonic clock, minus the real time the test
	// took (a few seconds at most, even on a loaded machine).
	m := regexp.MustCompile(`machine_minus_database=(\S+)`).FindStringSubmatch(logs.String())
	var skew time.Duration
	if m != nil {
		skew, _ = time.ParseDuration(m[1])
	}
	if n := strings.Count(logs.String(), "far off"); n != 1 || m == nil || skew < -2*time.Hour-time.Minute || skew > -2*time.Hour+13*time.Second {
		t.Errorf("two samples with the wall clock 2 h behind logged %d warnings (skew %s), want 1 naming a skew of about -2h:\n%s", n, skew, logs.String())
	}
}
