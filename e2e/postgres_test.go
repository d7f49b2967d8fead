package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"idemgate/ledger/postgres/pgtest"
)

// startPGReplicas starts n `serve --http` processes of the real binary on
// one new PostgreSQL database (started by pgtest; the test skips when
// PostgreSQL is not installed, and fails under CI=true), and a round-robin
// proxy with no session affinity in front of them. It returns the
// database URL, the replicas, the balancer's base URL and alice's token.
func startPGReplicas(t *testing.T, n int) (db string, reps []*httpProc, lb string, token string) {
	t.Helper()
	db = pgtest.NewDatabase(t)
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	token = addToken(t, tokens, "alice", "acme", "agent")
	reps, lb = startReplicasOn(t, db, tokens, n)
	return db, reps, lb, token
}

// startReplicasOn starts n replicas on db with the tokens file, behind a
// round-robin balancer whose base URL it returns.
func startReplicasOn(t *testing.T, db, tokens string, n int) (reps []*httpProc, lb string) {
	t.Helper()
	reps, b := startReplicasBehind(t, db, tokens, n)
	return reps, b.URL()
}

// startReplicasBehind starts n replicas on db with the tokens file and
// the extra flags (they share one --outbox-dir), behind a round-robin
// balancer.
func startReplicasBehind(t *testing.T, db, tokens string, n int, extra ...string) ([]*httpProc, *balancer) {
	t.Helper()
	dir := t.TempDir()
	var wg sync.WaitGroup
	reps := make([]*httpProc, n)
	for i := range n { // at once: their schema migrations race, under the advisory lock
		wg.Go(func() {
			reps[i] = startHTTP(t, db, tokens, 0, append([]string{"--outbox-dir", filepath.Join(dir, "outbox")}, extra...)...)
		})
	}
	wg.Wait()
	return reps, newBalancer(t, reps)
}

// balancer is a plain load balancer in front of replicas: each request
// goes to the next replica in turn (round-robin, no session affinity),
// skipping those taken out of rotation. It keeps the requests it is
// proxying, so a test can tell which replica is serving a given call.
type balancer struct {
	srv     *httptest.Server
	targets []*url.URL
	turn    atomic.Int64

	mu       sync.Mutex
	out      map[int]bool               // replicas taken out of rotation
	inFlight map[*http.Request]inFlight // requests being proxied
}

type inFlight struct {
	replica int
	body    []byte
}

func newBalancer(t *testing.T, reps []*httpProc) *balancer {
	b := &balancer{out: map[int]bool{}, inFlight: map[*http.Request]inFlight{}}
	for _, p := range reps {
		u, _ := url.Parse(p.base)
		b.targets = append(b.targets, u)
	}
	proxy := &httputil.ReverseProxy{
		Rewrite:       func(r *httputil.ProxyRequest) { r.SetURL(b.targets[b.inFlightTo(r.In)]) },
		FlushInterval: -1,
		// A request to a replica that died is answered 502, which the
		// test's client sees; the log line would only repeat it.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		b.mu.Lock()
		b.inFlight[r] = inFlight{replica: b.next(), body: body}
		b.mu.Unlock()
		defer func() {
			b.mu.Lock()
			delete(b.inFlight, r)
			b.mu.Unlock()
		}()
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// URL is the balancer's base URL.
func (b *balancer) URL() string { return b.srv.URL }

// next picks the next replica in rotation; b.mu is held.
func (b *balancer) next() int {
	for range len(b.targets) {
		if i := int(b.turn.Add(1)) % len(b.targets); !b.out[i] {
			return i
		}
	}
	return 0 // every replica is out: the request fails there
}

func (b *balancer) inFlightTo(r *http.Request) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.inFlight[r].replica
}

// servedBy is the replica serving the request in flight whose body
// contains s (a tool call's operation key), or -1.
func (b *balancer) servedBy(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, f := range b.inFlight {
		if bytes.Contains(f.body, []byte(s)) {
			return f.replica
		}
	}
	return -1
}

// takeOut removes replica i from the rotation, as a load balancer's
// health check does once a replica stops answering.
func (b *balancer) takeOut(i int) {
	b.mu.Lock()
	b.out[i] = true
	b.mu.Unlock()
}

// TestPostgresApprovalAcrossReplicas: an operation held for approval on
// one replica is approved by an approver connected to the other, and the
// agent's retry, served by the other replica, gets the one execution's
// result; the order is cancelled once.
func TestPostgresApprovalAcrossReplicas(t *testing.T) {
	db := pgtest.NewDatabase(t)
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	boss := addToken(t, tokens, "boss", "acme", "approver")
	reps, _ := startReplicasOn(t, db, tokens, 2)
	onA, onB := httpSession(t, reps[0].base, alice), httpSession(t, reps[1].base, alice)
	approver := httpSession(t, reps[1].base, boss)

	order := onA.mustSucceed(t, "create_order", orderArgs(newKey(), "cust-pg-approval", coffee, nil))
	args := map[string]any{"operation_key": newKey(), "order_id": orderID(t, order), "expected_version": 1, "reason": "asked"}
	held := onA.mustFail(t, "cancel_order", args, "approval_required")
	if held.Approval == nil || held.Approval.ApprovalID == "" {
		t.Fatalf("held without an approval id: %s", held)
	}
	done := approver.mustSucceed(t, "decide_approval", map[string]any{"approval_id": held.Approval.ApprovalID, "decision": "approve"})
	if done.Status != "succeeded" {
		t.Fatalf("approval on the other replica: %s", done)
	}
	retry := onB.mustSucceed(t, "cancel_order", args)
	if !retry.Replayed || string(retry.Result) != string(done.Result) {
		t.Errorf("the agent's retry on the other replica: %s, want the approved execution's result %s replayed", retry, done.Result)
	}
	got := onA.mustSucceed(t, "get_order", map[string]any{"order_id": orderID(t, order)})
	var o struct {
		Order struct {
			Status  string `json:"status"`
			Version int    `json:"version"`
		} `json:"order"`
	}
	if err := json.Unmarshal(got.Result, &o); err != nil || o.Order.Status != "cancelled" || o.Order.Version != 2 {
		t.Errorf("the order after one approved cancel: %v %s, want cancelled at version 2", err, got)
	}
	r := runCLI(t, 30*time.Second, "ops", "list", "--db", db, "--tenant", "acme", "--json")
	if r.Code != 0 || strings.Count(r.Stdout, `"cancel_order"`) != 1 {
		t.Errorf("ops list: want one cancel_order operation: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
}

func orderID(t *testing.T, e envelope) string {
	t.Helper()
	var r struct {
		Order struct {
			OrderID string `json:"order_id"`
		} `json:"order"`
	}
	if err := json.Unmarshal(e.Result, &r); err != nil || r.Order.OrderID == "" {
		t.Fatalf("create_order result without an order_id: %v: %s", err, e)
	}
	return r.Order.OrderID
}

// TestPostgresReplicasOneOrderPerKey: two replicas on one PostgreSQL
// ledger, behind a round-robin balancer. Every key is sent at the same
// moment by a client pinned to each replica and by one whose requests
// alternate between them, while agents place orders of other keys
// through the balancer (writes of other keys run in parallel with the
// race); each key yields exactly one order, every answer for a key names
// that order, and every call of the load has its one order.
func TestPostgresReplicasOneOrderPerKey(t *testing.T) {
	db, reps, lb, alice := startPGReplicas(t, 2)
	background := startLoad(t, lb, alice, 4, faOrder)
	clients := []*session{httpSession(t, reps[0].base, alice), httpSession(t, reps[1].base, alice), httpSession(t, lb, alice)}
	const keys = 12
	for i := range keys {
		key, customer := newKey(), fmt.Sprintf("cust-pg-%d", i)
		ids := make([]string, len(clients))
		envs := make([]envelope, len(clients))
		var wg sync.WaitGroup
		for j, s := range clients {
			wg.Go(func() { envs[j] = s.callTool(t, "create_order", orderArgs(key, customer, coffee, nil)) })
		}
		wg.Wait()
		executed := 0
		for j, e := range envs {
			if e.IsError || e.Status != "succeeded" {
				t.Fatalf("key %d, client %d: %s", i, j, e)
			}
			if !e.Replayed {
				executed++
			}
			ids[j] = orderID(t, e)
		}
		if executed != 1 {
			t.Errorf("key %d: %d answers say they executed, want exactly 1", i, executed)
		}
		for j := range ids {
			if ids[j] != ids[0] {
				t.Errorf("key %d: answers name orders %v, want one order", i, ids)
				break
			}
		}
		for j, s := range clients {
			if n := s.orderCount(t, customer); n != 1 {
				t.Errorf("key %d: client %d lists %d orders for %s, want 1", i, j, n, customer)
			}
		}
	}

	intents := background.finish()
	if len(intents) < 10 {
		t.Errorf("the load of other keys made %d calls meanwhile, want at least 10", len(intents))
	}
	if failed := checkIntents(t, lb, alice, intents, 30*time.Second); failed > 0 {
		t.Errorf("%d calls of the load were not answered succeeded", failed)
	}

	// The commands work on the PostgreSQL ledger while the replicas run.
	r := runCLI(t, 30*time.Second, "audit", "verify", "--db", db)
	if r.Code != 0 {
		t.Errorf("audit verify: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	r = runCLI(t, 30*time.Second, "ops", "list", "--db", db, "--tenant", "acme", "--limit", "1000")
	if want := keys + len(intents); r.Code != 0 || strings.Count(r.Stdout, "create_order") != want {
		t.Errorf("ops list: %d, %d create_order lines, want %d:\n%s%s", r.Code, strings.Count(r.Stdout, "create_order"), want, r.Stdout, r.Stderr)
	}
	r = runCLI(t, 30*time.Second, "stats", "--db", db, "--tenant", "acme", "--json")
	if r.Code != 0 {
		t.Errorf("stats: %d %s", r.Code, r.Stderr)
	}
	r = runCLI(t, 30*time.Second, "migrate", "--db", db)
	if r.Code != 0 || !strings.Contains(r.Stdout, "up to date") {
		t.Errorf("migrate of a migrated database: %d %q %s", r.Code, r.Stdout, r.Stderr)
	}
}

// TestPostgresFileOnlyCommandsSayWhatToUse: check and backup work on a
// file; given a PostgreSQL URL they exit 2 with what to use instead, and
// init creates the schema (as migrate does).
func TestPostgresFileOnlyCommandsSayWhatToUse(t *testing.T) {
	db := pgtest.NewDatabase(t)
	r := runCLI(t, 30*time.Second, "ops", "list", "--db", db)
	if r.Code == 0 || !strings.Contains(r.Stderr, "idemgate migrate") {
		t.Errorf("ops list on an empty database: %d %q, want a refusal naming idemgate migrate", r.Code, r.Stderr)
	}
	if r = runCLI(t, 30*time.Second, "check", "--db", db); r.Code != 2 || !strings.Contains(r.Stderr, "pg_amcheck") {
		t.Errorf("check of a URL: %d %q", r.Code, r.Stderr)
	}
	if r = runCLI(t, 30*time.Second, "backup", filepath.Join(t.TempDir(), "copy.db"), "--db", db); r.Code != 2 || !strings.Contains(r.Stderr, "pg_dump") {
		t.Errorf("backup of a URL: %d %q", r.Code, r.Stderr)
	}
	if r = runCLI(t, 30*time.Second, "init", "--db", db); r.Code != 0 || !strings.Contains(r.Stdout, "migrated from version 0") {
		t.Errorf("init of a URL: %d %q %q", r.Code, r.Stdout, r.Stderr)
	}
	if r = runCLI(t, 30*time.Second, "ops", "list", "--db", db); r.Code != 0 {
		t.Errorf("ops list after init: %d %q", r.Code, r.Stderr)
	}
	if r = runCLI(t, 30*time.Second, "migrate", "--db", "/tmp/ledger.db"); r.Code != 2 || !strings.Contains(r.Stderr, "postgres://") {
		t.Errorf("migrate of a file: %d %q", r.Code, r.Stderr)
	}
}

// newLedger is the --db of a test's servers and commands: a new ledger
// file in t.TempDir(), or, with IDEMGATE_E2E_DB=postgres, a new database
// in the test binary's PostgreSQL cluster (so the core, approvals and
// unknown-outcome suites run on either store).
func newLedger(t testing.TB) string {
	t.Helper()
	if !onPostgres() {
		return filepath.Join(t.TempDir(), "ledger.db")
	}
	db := pgtest.NewDatabase(t)
	pgOutboxes.Store(db, filepath.Join(t.TempDir(), "outbox"))
	return db
}

// pgOutboxes is the outbox directory of each PostgreSQL ledger newLedger
// made: its servers share it, as servers of one ledger file share the
// directory beside it.
var pgOutboxes sync.Map // URL → directory

// TestPostgresKilledReplicaSettledByTheOther: two servers on one
// PostgreSQL ledger in front of the order API. One is SIGKILLed during
// its call to the API, which commits the order anyway; the other server,
// running all along, lets the lease expire and its background sweep
// settles the operation succeeded with the API's order — no new call to
// create_order, one order, one request to the API.
func TestPostgresKilledReplicaSettledByTheOther(t *testing.T) {
	db := pgtest.NewDatabase(t)
	outbox := filepath.Join(t.TempDir(), "outbox")
	api := newFakeAPI(t)
	a := startAPIServer(t, mcpGoLegacy, api, serverConfig{DB: db, OutboxDir: outbox}, "--orders-api-safe-retry")
	b := startAPIServer(t, mcpGoModern, api, serverConfig{DB: db, OutboxDir: outbox}, "--orders-api-safe-retry")
	key := newKey()
	args := faOrder(key, "cust-pg-crash")
	h := api.InjectHold(fault{Kind: HoldBeforeCommit, Match: matchCreate, CommitAnyway: true})
	done := make(chan error, 1)
	go func() {
		_, err := a.call(context.Background(), "create_order", args)
		done <- err
	}()
	h.Wait(t, 5*time.Second)
	a.Kill()
	h.WaitGone(t, 5*time.Second)
	h.Release()
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("the call to the killed server answered")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call to the killed server did not return")
	}
	st := waitStatus(t, b, key, 10*time.Second, "succeeded")
	o := api.OrderForKey(idemKey("", key))
	if o == nil || st.DownstreamRef != o.OrderID {
		t.Fatalf("settled with %q, the API has %+v", st.DownstreamRef, o)
	}
	if e := b.mustSucceed(t, "create_order", args); !e.Replayed || e.orderID() != o.OrderID {
		t.Errorf("the agent's retry on the surviving server: %s, want a replay of %s", e, o.OrderID)
	}
	if w := api.WritesFor(idemKey("", key)); w != 1 {
		t.Errorf("the API received %d requests, want 1", w)
	}
}
