package loadgen

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Floors are what an idemgate call cannot cost less than on this machine,
// measured in the same run: a call of a trivial MCP server over stdio (the
// same client library, the same transport, a tool that returns a
// constant) and one raw bbolt commit (a put, fsynced) in the ledger's
// directory. Each is measured before and after the run; the figure is the
// mean of the two, and the drift says how far the machine's speed moved.
type Floors struct {
	NoopP50        float64 `json:"noop_p50_us"`         // one no-op call, one caller at a time
	NoopP50Start   float64 `json:"noop_p50_start_us"`   //
	NoopP50End     float64 `json:"noop_p50_end_us"`     //
	NoopRate       float64 `json:"noop_calls_per_s"`    // no-op calls/s at the run's --clients
	CommitP50      float64 `json:"commit_p50_us"`       // one raw bbolt commit
	CommitP50Start float64 `json:"commit_p50_start_us"` //
	CommitP50End   float64 `json:"commit_p50_end_us"`   //
}

// NoopTool is the one tool of the no-op server (server.ServeNoop, which
// the command line serves with this name).
const NoopTool = "noop"

// NoopLatency makes sequential no-op calls through c for up to d (at most
// max calls) and returns their p50 in µs.
func NoopLatency(ctx context.Context, c Caller, d time.Duration, max int) (float64, error) {
	var durs []time.Duration
	end := time.Now().Add(d)
	for len(durs) < max && time.Now().Before(end) {
		t0 := time.Now()
		if _, err := c.Call(ctx, NoopTool, map[string]any{}); err != nil {
			return 0, fmt.Errorf("no-op call: %w", err)
		}
		durs = append(durs, time.Since(t0))
	}
	return summarize(durs).P50, nil
}

// NoopRate makes no-op calls through c from clients goroutines for d and
// returns the calls per second.
func NoopRate(ctx context.Context, c Caller, clients int, d time.Duration) (float64, error) {
	var n atomic.Int64
	var firstErr error
	var once sync.Once
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				if _, err := c.Call(ctx, NoopTool, map[string]any{}); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return 0, fmt.Errorf("no-op call: %w", firstErr)
	}
	return float64(n.Load()) / time.Since(start).Seconds(), nil
}

// CommitLatency opens a new bbolt file in dir (removed afterwards) and
// makes sequential commits of one put each, with bbolt's default fsync,
// for up to d (at most max) and returns their p50 in µs.
func CommitLatency(dir string, d time.Duration, max int) (float64, error) {
	f, err := os.CreateTemp(dir, "bench-floor-*.db")
	if err != nil {
		return 0, err
	}
	path := f.Name()
	f.Close()
	os.Remove(path)
	defer os.Remove(filepath.Clean(path))
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return 0, err
	}
	defer db.Close()
	value := []byte("a value of a few dozen bytes, like a small record")
	var durs []time.Duration
	end := time.Now().Add(d)
	for i := 0; i < max && time.Now().Before(end); i++ {
		t0 := time.Now()
		err := db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("floor"))
			if err != nil {
				return err
			}
			return b.Put([]byte(fmt.Sprintf("k%09d", i)), value)
		})
		if err != nil {
			return 0, err
		}
		durs = append(durs, time.Since(t0))
	}
	return summarize(slices.Clip(durs)).P50, nil
}
