package bolt

import (
	"context"
	"encoding/json"
	"errors"
	"idemgate/ledger"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
)

// epoch is where every fake clock starts: a fixed UTC instant, so records
// written in one test run look the same in the next.
var epoch = time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)

// fakeClock is an injectable clock for Options.Now. It is safe for
// concurrent use.
type fakeClock struct {
	mu   sync.Mutex
	now  time.Time     // the time that really passed (Elapsed follows it)
	jump time.Duration // how far the wall clock was set off it (Jump)
}

func newFakeClock() *fakeClock { return &fakeClock{now: epoch} }

// Now is the wall clock, for Options.Now.
func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now.Add(c.jump)
}

// Elapsed is the monotonic clock, for Options.Elapsed: it follows Advance
// and ignores Jump.
func (c *fakeClock) Elapsed() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now.Sub(epoch)
}

// Jump sets the wall clock off by d (forward or back) without time
// passing.
func (c *fakeClock) Jump(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.jump += d
}

// Advance moves the clock forward by d.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// mustOpen opens a bbolt store in a fresh t.TempDir() and closes it when the
// test ends.
func mustOpen(t testing.TB, opts ledger.Options) *File {
	t.Helper()
	return mustOpenPath(t, filepath.Join(t.TempDir(), "ledger.db"), opts)
}

// mustOpenPath opens the bbolt store at path and closes it when the test
// ends (a second Close by the test itself is harmless).
func mustOpenPath(t testing.TB, path string, opts ledger.Options) *File {
	t.Helper()
	s, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return s
}

// mustOpenPathReadOnly opens the bbolt store at path read-only and closes
// it when the test ends.
func mustOpenPathReadOnly(t testing.TB, path string) *File {
	t.Helper()
	s, err := OpenReadOnly(path, ledger.Options{})
	if err != nil {
		t.Fatalf("OpenReadOnly(%s): %v", path, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// testActor is the actor of tenant.
func testActor(tenant string) ledger.Actor {
	return ledger.Actor{Tenant: tenant, Principal: "agent-" + tenant, Role: "agent", ClientName: "ledger-test", ClientVersion: "1"}
}

// newClaim is a claim of a fresh key in tenant for tool with fingerprint fp.
func newClaim(tenant, tool, fp string) ledger.Claim {
	return ledger.Claim{Actor: testActor(tenant), Key: uuid.NewString(), Tool: tool, Fingerprint: fp, OnLeaseExpiry: ledger.StateRetryable}
}

// effectsCollection is where the test applies write their side effects,
// one value per execution, so a duplicate execution is visible as an extra
// value.
const effectsCollection = "effects"

// applier is an ApplyFunc factory that counts how often its functions ran.
type applier struct {
	calls atomic.Int64
}

// succeed returns an apply that writes one effect and succeeds with result.
func (a *applier) succeed(result string) ledger.ApplyFunc {
	return a.outcome(ledger.Outcome{State: ledger.StateSucceeded, Result: json.RawMessage(result)})
}

// outcome returns an apply that writes one effect and returns out (with a
// Summary naming the key when out has none).
func (a *applier) outcome(out ledger.Outcome) ledger.ApplyFunc {
	return func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		a.calls.Add(1)
		if err := tx.Put(effectsCollection, effectKey(rec), []byte(rec.Fingerprint)); err != nil {
			return ledger.Outcome{}, err
		}
		o := out
		if o.Summary == "" {
			o.Summary = "effect " + rec.Key
		}
		return o, nil
	}
}

// fail returns an apply that writes an effect and then fails with err, so
// the effect must be rolled back.
func (a *applier) fail(err error) ledger.ApplyFunc {
	return func(tx ledger.Tx, rec *ledger.Record) (ledger.Outcome, error) {
		a.calls.Add(1)
		if perr := tx.Put(effectsCollection, effectKey(rec), []byte("doomed")); perr != nil {
			return ledger.Outcome{}, perr
		}
		return ledger.Outcome{}, err
	}
}

// effectKey names one execution of rec: tenant, key and attempt.
func effectKey(rec *ledger.Record) string {
	return rec.Tenant + ":" + rec.Key + "/" + strconv.Itoa(rec.Attempts)
}

// n is how many times the applier's functions ran.
func (a *applier) n() int64 { return a.calls.Load() }

// errBoom is an apply's own error.
var errBoom = errors.New("boom: validation failed before the side effect")

// effects returns every value in the effects collection, keyed by key.
func effects(t testing.TB, s ledger.Store) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := s.View(context.Background(), func(tx ledger.Tx) error {
		return tx.Scan(effectsCollection, "", false, func(k string, v []byte) (bool, error) {
			out[k] = string(v)
			return true, nil
		})
	})
	if err != nil {
		t.Fatalf("scan effects: %v", err)
	}
	return out
}

// mustGet returns the record of (tenant, key) or fails the test.
func mustGet(t testing.TB, s ledger.Store, tenant, key string) *ledger.Record {
	t.Helper()
	rec, err := s.Get(context.Background(), tenant, key)
	if err != nil {
		t.Fatalf("Get(%s, %s): %v", tenant, key, err)
	}
	return rec
}

// recordJSON is rec as JSON, to compare whole records.
func recordJSON(t testing.TB, rec *ledger.Record) string {
	t.Helper()
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatalf("marshal record: %v", err)
	}
	return string(b)
}
