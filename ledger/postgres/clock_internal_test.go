package postgres

import (
	"context"
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

	// Pretend this machine's clock is an hour behind the database's.
	d.be.mu.Lock()
	d.be.offset += time.Hour
	d.be.mu.Unlock()
	var seen time.Time
	if err := d.Update(ctx, func(tx ledger.Tx) error { seen = tx.Now(); return nil }); err != nil {
		t.Fatal(err)
	}
	if ahead := seen.Sub(time.Now()); ahead < 59*time.Minute || ahead > 61*time.Minute {
		t.Errorf("the ledger's transaction time is %s from the process's clock, want the database's (+1h)", ahead)
	}
}
