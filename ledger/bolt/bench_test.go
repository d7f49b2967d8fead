package bolt

import (
	"context"
	"encoding/json"
	"fmt"
	"idemgate/ledger"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	bbolt "go.etcd.io/bbolt"
)

// Benchmarks of the bbolt ledger. The 1M-record cases are skipped unless
// IDEMGATE_BENCH_LARGE=1; their file is generated once with raw bbolt and
// cached under os.TempDir() (see largeLedgerFile).

// benchOpts keeps loaded records replayable however old the cached file is.
func benchOpts() ledger.Options { return ledger.Options{Retention: 100 * 365 * 24 * time.Hour} }

const benchTenant = "bench"

// benchKey is the i-th preloaded key: UUID-shaped and in key order, so a
// bulk load appends.
func benchKey(i int) string { return fmt.Sprintf("00000000-0000-4000-8000-%012d", i) }

func benchClaim(key string) ledger.Claim {
	return ledger.Claim{Actor: testActor(benchTenant), Key: key, Tool: "create_order", Fingerprint: "fp-" + key, OnLeaseExpiry: ledger.StateRetryable}
}

// benchApply is a realistic embedded side effect: one order written beside
// the ledger.
func benchApply(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
	order := `{"order_id":"ord_` + rec.Key + `","customer_id":"cus_1","items":[{"sku":"SKU-1","quantity":2,"unit_price_minor":1999}],"currency":"EUR","version":1}`
	if err := tx.Put("orders", rec.Tenant+"/ord_"+rec.Key, []byte(order)); err != nil {
		return ledger.Outcome{}, err
	}
	return ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(`{"order":` + order + `}`), Summary: "order ord_" + rec.Key, DownstreamRef: "ord_" + rec.Key}, nil
}

func BenchmarkExecuteNew(b *testing.B) {
	s := mustOpen(b, ledger.Options{})
	ctx := context.Background()
	for b.Loop() {
		d, err := s.Execute(ctx, benchClaim(uuid.NewString()), benchApply)
		if err != nil || d.Kind != ledger.DecisionExecuted {
			b.Fatalf("Execute = %q, %v", d.Kind, err)
		}
	}
}

func BenchmarkReplay(b *testing.B) {
	s := mustOpen(b, ledger.Options{})
	ctx := context.Background()
	c := benchClaim(uuid.NewString())
	if _, err := s.Execute(ctx, c, benchApply); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		d, err := s.Execute(ctx, c, benchApply)
		if err != nil || d.Kind != ledger.DecisionReplay {
			b.Fatalf("Execute = %q, %v", d.Kind, err)
		}
	}
}

// BenchmarkExecuteParallel: 64 goroutines (SetParallelism multiplies by
// GOMAXPROCS) claiming new keys, so group commit batches them.
func BenchmarkExecuteParallel(b *testing.B) {
	s := mustOpen(b, ledger.Options{})
	ctx := context.Background()
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism(max(1, (64+procs-1)/procs))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			d, err := s.Execute(ctx, benchClaim(uuid.NewString()), benchApply)
			if err != nil || d.Kind != ledger.DecisionExecuted {
				b.Errorf("Execute = %q, %v", d.Kind, err)
				return
			}
		}
	})
}

// benchSizes are the ledger sizes of the *AtSize benchmarks.
var benchSizes = []struct {
	name  string
	n     int
	large bool
}{
	{"10k", 10_000, false},
	{"1M", 1_000_000, true},
}

func BenchmarkReplayAtSize(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(size.name, func(b *testing.B) {
			s := openLoaded(b, size.n, size.large)
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(1, 2))
			for b.Loop() {
				d, err := s.Execute(ctx, benchClaim(benchKey(rng.IntN(size.n))), benchApply)
				if err != nil || d.Kind != ledger.DecisionReplay {
					b.Fatalf("Execute = %q, %v", d.Kind, err)
				}
			}
		})
	}
}

func BenchmarkClaimAtSize(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(size.name, func(b *testing.B) {
			s := openLoaded(b, size.n, size.large)
			ctx := context.Background()
			for b.Loop() {
				d, err := s.Execute(ctx, benchClaim(uuid.NewString()), benchApply)
				if err != nil || d.Kind != ledger.DecisionExecuted {
					b.Fatalf("Execute = %q, %v", d.Kind, err)
				}
			}
		})
	}
}

// openLoaded opens a store in b.TempDir() holding n finished records.
func openLoaded(b *testing.B, n int, large bool) *File {
	b.Helper()
	path := filepath.Join(b.TempDir(), "ledger.db")
	if large {
		if os.Getenv("IDEMGATE_BENCH_LARGE") != "1" {
			b.Skip("set IDEMGATE_BENCH_LARGE=1 for the 1M-record ledger")
		}
		copyFile(b, largeLedgerFile(b, n), path)
		return mustOpenPath(b, path, benchOpts())
	}
	s := mustOpenPath(b, path, benchOpts())
	loadByExecute(b, s, n)
	return s
}

// loadByExecute loads n records through the public API, 64 at a time.
func loadByExecute(b *testing.B, s *File, n int) {
	b.Helper()
	ctx := context.Background()
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if _, err := s.Execute(ctx, benchClaim(benchKey(i)), benchApply); err != nil {
					b.Errorf("load %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
}

// largeLedgerFile returns a cached ledger file of n finished records,
// generating it first if needed. Records are written with raw bbolt in big
// transactions, in the format of putRecord plus the by_time index; the
// cache name carries a version to bump when that format changes.
func largeLedgerFile(b *testing.B, n int) string {
	b.Helper()
	cache := filepath.Join(os.TempDir(), fmt.Sprintf("idemgate-ledger-bench-%d-v%d-r%d.db", n, boltSchemaVersion, ledger.ResultFormat))
	if _, err := os.Stat(cache); err == nil {
		return cache
	}
	start := time.Now()
	tmp := fmt.Sprintf("%s.tmp-%d", cache, os.Getpid())
	defer os.Remove(tmp)
	defer os.Remove(tmp + ".lock")
	defer os.Remove(tmp + ".wait")
	s, err := Open(tmp, benchOpts()) // buckets and schema version
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	db, err := bbolt.Open(tmp, 0o600, &bbolt.Options{NoSync: true, Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	base := time.Now().Add(-time.Duration(n) * time.Millisecond).UTC()
	const chunk = 100_000
	for lo := 0; lo < n; lo += chunk {
		err := db.Update(func(tx *bbolt.Tx) error {
			recs, times := tx.Bucket(bucketRecords), tx.Bucket(bucketByTime)
			recs.FillPercent, times.FillPercent = 0.95, 0.95 // appends in key order
			for i := lo; i < min(lo+chunk, n); i++ {
				key := benchKey(i)
				at := base.Add(time.Duration(i) * time.Millisecond)
				rec := succeededRecord(benchTenant, key, at)
				if err := putRecord(tx, rec); err != nil {
					return err
				}
				if err := times.Put(timeKey(at, benchTenant, key), nil); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			db.Close()
			b.Fatal(err)
		}
	}
	if err := db.Sync(); err != nil {
		b.Fatal(err)
	}
	if err := db.Close(); err != nil {
		b.Fatal(err)
	}
	if err := os.Rename(tmp, cache); err != nil {
		b.Fatal(err)
	}
	b.Logf("generated %s (%d records) in %v", cache, n, time.Since(start).Round(time.Millisecond))
	return cache
}

func copyFile(b *testing.B, from, to string) {
	b.Helper()
	src, err := os.Open(from)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		b.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		b.Fatal(err)
	}
}

// succeededRecord is a finished create_order as the ledger keeps it, for
// files the benchmarks and sweep tests fill directly.
func succeededRecord(tenant, key string, at time.Time) *ledger.Record {
	order := `{"order_id":"ord_` + key + `","customer_id":"cus_1","items":[{"sku":"SKU-1","quantity":2,"unit_price_minor":1999}],"currency":"EUR","version":1}`
	return &ledger.Record{
		Tenant: tenant, Key: key, Tool: "create_order", Fingerprint: "fp-" + key,
		State: ledger.StateSucceeded, Attempts: 1, Generation: 1, OnLeaseExpiry: ledger.StateRetryable,
		Principal: "agent-" + tenant, ResultFormat: ledger.ResultFormat,
		Result:  json.RawMessage(`{"order":` + order + `}`),
		Summary: "order ord_" + key, DownstreamRef: "ord_" + key,
		FirstSeenAt: at, UpdatedAt: at, CompletedAt: at,
	}
}
