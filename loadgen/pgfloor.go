package loadgen

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ClaimFloor is the PostgreSQL floor (`idemgate bench --floor-db URL`): the
// rate of the barest claim PostgreSQL can make — one INSERT … ON CONFLICT
// DO NOTHING of a new key, each its own transaction committed with the
// database's own durability settings — from as many connections as the run
// has clients, on the database the server's ledger is in. It is measured
// before and after the run; the figure is the mean of the two.
type ClaimFloor struct {
	Connections int     `json:"connections"`
	Rate        float64 `json:"claims_per_s"`
	RateStart   float64 `json:"claims_per_s_start"`
	RateEnd     float64 `json:"claims_per_s_end"`
	// NewCreates is create_order/new calls/s in the run as a share of
	// Rate (0 when the run made no new create).
	NewCreates float64 `json:"new_creates_share,omitempty"`
}

// SetClaimFloor records f and the run's new creates/s as a share of it.
func (r *Report) SetClaimFloor(f ClaimFloor) {
	f.Rate = (f.RateStart + f.RateEnd) / 2
	if k := r.Kinds["create_order/new"]; k != nil && f.Rate > 0 {
		f.NewCreates = k.Throughput / f.Rate
	}
	r.ClaimFloor = &f
}

// IsPostgresURL reports whether s names a PostgreSQL database.
func IsPostgresURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

// PGClaimRate measures the claim floor on the database at url: conns
// connections insert new keys for d into a table of their own (created
// first, dropped afterwards; nothing of idemgate's is touched) and it
// returns the claims per second.
func PGClaimRate(ctx context.Context, url string, conns int, d time.Duration) (float64, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return 0, errors.New("--floor-db is not a valid PostgreSQL URL (not repeated here: it may hold a password)")
	}
	cfg.MaxConns, cfg.MinConns = int32(conns), int32(conns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return 0, fmt.Errorf("--floor-db: %w", err)
	}
	defer pool.Close()
	table := pgx.Identifier{"idemgate_bench_floor_" + strings.ReplaceAll(uuid.NewString()[:13], "-", "")}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+table+" (key text PRIMARY KEY, state text NOT NULL)"); err != nil {
		return 0, fmt.Errorf("--floor-db: creating the floor's table: %w", err)
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP TABLE IF EXISTS "+table)
	insert := "INSERT INTO " + table + " (key, state) VALUES ($1, 'in_progress') ON CONFLICT (key) DO NOTHING"
	// Every connection is opened and has the statement prepared before the
	// clock starts.
	warm := make([]*pgxpool.Conn, 0, conns)
	for range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			for _, c := range warm {
				c.Release()
			}
			return 0, fmt.Errorf("--floor-db: %w", err)
		}
		if _, err := c.Exec(ctx, insert, "warm-"+uuid.NewString()); err != nil {
			c.Release()
			for _, c := range warm {
				c.Release()
			}
			return 0, fmt.Errorf("--floor-db: %w", err)
		}
		warm = append(warm, c)
	}
	var n atomic.Int64
	var firstErr error
	var once sync.Once
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for _, c := range warm {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Release()
			prefix := uuid.NewString()
			for i := 0; time.Now().Before(end); i++ {
				if _, err := c.Exec(ctx, insert, fmt.Sprintf("%s-%d", prefix, i)); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, fmt.Errorf("--floor-db: a claim failed: %w", firstErr)
	}
	return float64(n.Load()) / time.Since(start).Seconds(), nil
}
