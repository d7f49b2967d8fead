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
// measured in the same run: a call of a trivial MCP server over the run's
// transport (the same client library, the same transport — stdio, or
// Streamable HTTP with a connection per client —, a tool that returns a
// constant), one raw bbolt commit (a put, fsynced) in the ledger's
// directory, and the same create_order made in one process with no MCP
// at all. The no-op and commit floors are measured before and after the
// run; the figure is the mean of the two, and the drift says how far the
// machine's speed moved.
type Floors struct {
	Transport    string  `json:"transport"`         // "stdio" or "http": how the no-op server was called
	NoopP50      float64 `json:"noop_p50_us"`       // one no-op call, one caller at a time
	NoopP50Start float64 `json:"noop_p50_start_us"` //
	NoopP50End   float64 `json:"noop_p50_end_us"`   //
	NoopRate     float64 `json:"noop_calls_per_s"`  // no-op calls/s at the run's --clients
	// NoopCPUPerCall is the no-op server's CPU time (user + system) per
	// call while it answered one caller at a time (the p50 measurements,
	// before and after the run).
	NoopCPUPerCall float64 `json:"noop_server_cpu_per_call_us,omitempty"`
	CommitP50      float64 `json:"commit_p50_us,omitempty"`       // one raw bbolt commit (spawned bbolt server only)
	CommitP50Start float64 `json:"commit_p50_start_us,omitempty"` //
	CommitP50End   float64 `json:"commit_p50_end_us,omitempty"`   //
	// CommitPages is the pages a raw commit of one put writes (bbolt's
	// write count: the leaf, the root, the freelist, the meta page).
	CommitPages float64 `json:"commit_pages,omitempty"`
	// InProcess is the same create_order without MCP or a second process
	// (spawned bbolt server only; see InProcess).
	InProcess *InProcess `json:"in_process,omitempty"`
}

// InProcess is a new create_order made by a tool service in one process,
// sequentially, on a ledger file of its own in the spawned server's
// directory, with no MCP: what the same call costs when it is not served.
// idemgate bench measures it in a child process of its own (its CPU is
// that process's).
type InProcess struct {
	Records int `json:"records"` // operations in the ledger before the measured creates
	Creates int `json:"creates"` // measured creates in each phase
	// Without the outbox's deliverer running (its confirmations stay
	// queued): the create alone.
	P50              float64 `json:"create_p50_us"`
	Mean             float64 `json:"create_mean_us"`
	CPUPerCreate     float64 `json:"cpu_per_create_us"`
	CommitsPerCreate float64 `json:"commits_per_create"`
	PagesPerCommit   float64 `json:"pages_per_create_commit"`
	// With the deliverer running, as in a server, until every
	// confirmation was delivered: the create and its delivery.
	CPUPerCreateDelivered float64 `json:"cpu_per_create_delivered_us"`
	// FillSeconds is how long filling the ledger to Records took (0 when
	// it was not filled).
	FillSeconds float64 `json:"fill_s,omitempty"`
}

// NoopTool is the one tool of the no-op server (server.ServeNoop, which
// the command line serves with this name).
const NoopTool = "noop"

// NoopSample is a run of sequential no-op calls.
type NoopSample struct {
	P50   float64 // µs
	Calls int
}

// NoopLatency makes sequential no-op calls through c for up to d (at most
// max calls) and returns their p50 in µs and how many were made.
func NoopLatency(ctx context.Context, c Caller, d time.Duration, max int) (NoopSample, error) {
	var durs []time.Duration
	end := time.Now().Add(d)
	for len(durs) < max && time.Now().Before(end) {
		t0 := time.Now()
		if _, err := c.Call(ctx, NoopTool, map[string]any{}); err != nil {
			return NoopSample{}, fmt.Errorf("no-op call: %w", err)
		}
		durs = append(durs, time.Since(t0))
	}
	return NoopSample{P50: summarize(durs).P50, Calls: len(durs)}, nil
}

// NoopRate makes no-op calls from clients goroutines for d, client i
// through callers[i%len(callers)] (one shared connection, or one each, as
// in Run), and returns the calls per second.
func NoopRate(ctx context.Context, callers []Caller, clients int, d time.Duration) (float64, error) {
	var n atomic.Int64
	var firstErr error
	var once sync.Once
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for i := range clients {
		c := callers[i%len(callers)]
		wg.Go(func() {
			for time.Now().Before(end) {
				if _, err := c.Call(ctx, NoopTool, map[string]any{}); err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, fmt.Errorf("no-op call: %w", firstErr)
	}
	return float64(n.Load()) / time.Since(start).Seconds(), nil
}

// CommitSample is a run of sequential raw bbolt commits.
type CommitSample struct {
	P50   float64 // µs
	Pages float64 // pages written per commit
}

// CommitLatency opens a new bbolt file in dir (removed afterwards) and
// makes sequential commits of one put each, with bbolt's default fsync,
// for up to d (at most max), and returns their p50 in µs and the pages
// each wrote.
func CommitLatency(dir string, d time.Duration, max int) (CommitSample, error) {
	f, err := os.CreateTemp(dir, "bench-floor-*.db")
	if err != nil {
		return CommitSample{}, err
	}
	path := f.Name()
	f.Close()
	os.Remove(path)
	defer os.Remove(filepath.Clean(path))
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return CommitSample{}, err
	}
	defer db.Close()
	value := []byte("a value of a few dozen bytes, like a small record")
	put := func(i int) error {
		return db.Update(func(tx *bolt.Tx) error {
			b, err := tx.CreateBucketIfNotExists([]byte("floor"))
			if err != nil {
				return err
			}
			return b.Put([]byte(fmt.Sprintf("k%09d", i)), value)
		})
	}
	if err := put(-1); err != nil { // the bucket's creation is not a put
		return CommitSample{}, err
	}
	writes := func() int64 { st := db.Stats(); return st.TxStats.GetWrite() }
	w0 := writes()
	var durs []time.Duration
	end := time.Now().Add(d)
	for i := 0; i < max && time.Now().Before(end); i++ {
		t0 := time.Now()
		if err := put(i); err != nil {
			return CommitSample{}, err
		}
		durs = append(durs, time.Since(t0))
	}
	s := CommitSample{P50: summarize(slices.Clip(durs)).P50}
	if len(durs) > 0 {
		s.Pages = float64(writes()-w0) / float64(len(durs))
	}
	return s, nil
}
