package e2e

// Faults of a deployment on several machines: two `serve --http`
// replicas of the built binary on one PostgreSQL database, behind the
// round-robin balancer of postgres_test.go (no session affinity), while
// agents place orders through the balancer. One replica is SIGKILLed in
// the middle of a call; PostgreSQL is restarted under load; the
// connection between a replica and the database is cut as it sends
// COMMIT. Each test ends by checking every intent of its load the same
// way (checkIntents): a call answered succeeded has exactly one order; a
// call answered with a documented failure, or not answered at all, has
// no order unless its record settles to succeeded, and the agent's retry
// with the same key completes it with exactly one order. Every answer of
// every call obeys isError ⇔ an error object with a documented code
// (callRaw checks each one).

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"

	"idemgate/ledger/postgres/pgtest"
)

// intent is one create_order call of a load: its key, its customer (one
// per key, so that list_orders counts the key's orders) and what the call
// answered, or the error when no answer came.
type intent struct {
	key, customer string
	args          map[string]any
	env           envelope
	err           error
	sent, ended   time.Time
}

// succeeded reports whether the call was answered succeeded.
func (in *intent) succeeded() bool {
	return in.err == nil && !in.env.IsError && in.env.Status == "succeeded"
}

// load is agents placing orders through one base URL, each on its own
// HTTP session, one call at a time, with a new key per order, until
// finish.
type load struct {
	t    *testing.T
	stop chan struct{}
	wg   sync.WaitGroup

	mu       sync.Mutex
	intents  []*intent
	answered int // calls that got an answer (success or documented failure)
}

// startLoad starts workers agents calling create_order on base with
// token; args gives each call's arguments. finish stops them, and so does
// the end of the test (before the servers started earlier are stopped).
func startLoad(t *testing.T, base, token string, workers int, args func(key, customer string) map[string]any) *load {
	l := &load{t: t, stop: make(chan struct{})}
	t.Cleanup(func() { l.finish() })
	run := newKey()[:8] // customers of this load only
	for w := range workers {
		l.wg.Go(func() {
			var s *session
			for i := 0; ; i++ {
				select {
				case <-l.stop:
					return
				default:
				}
				if s == nil { // a new session, after an error too: the old one may be gone
					var err error
					if s, err = dialHTTP(t, base, token); err != nil {
						s = nil
						time.Sleep(50 * time.Millisecond)
						continue
					}
				}
				in := &intent{key: newKey(), customer: fmt.Sprintf("cust-%s-%d-%d", run, w, i)}
				in.args = args(in.key, in.customer)
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				in.sent = time.Now()
				in.env, in.err = s.call(ctx, "create_order", in.args)
				in.ended = time.Now()
				cancel()
				if in.err != nil {
					s.Close()
					s = nil
				}
				l.mu.Lock()
				l.intents = append(l.intents, in)
				if in.err == nil {
					l.answered++
				}
				l.mu.Unlock()
			}
		})
	}
	return l
}

// answers is how many calls have been answered so far.
func (l *load) answers() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.answered
}

// waitAnswers waits until n more calls than now have been answered, or
// fails the test.
func (l *load) waitAnswers(n int, timeout time.Duration) {
	l.t.Helper()
	want := l.answers() + n
	if !eventually(timeout, func() bool { return l.answers() >= want }) {
		l.t.Fatalf("the load got %d answers within %v, want %d", l.answers(), timeout, want)
	}
}

// finish stops the agents, waits for their calls in flight, and returns
// every call made.
func (l *load) finish() []*intent {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.intents)
}

// dialHTTP is httpSession for an agent's goroutine: an error instead of
// failing the test.
func dialHTTP(t *testing.T, base, token string) (*session, error) {
	tr, err := transport.NewStreamableHTTP(base+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + token}))
	if err != nil {
		return nil, err
	}
	c := client.NewClient(tr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := c.Start(ctx); err != nil {
		return nil, err
	}
	req := mcp.InitializeRequest{}
	req.Params.ClientInfo = mcp.Implementation{Name: "e2e-load", Version: "1"}
	if _, err := c.Initialize(ctx, req); err != nil {
		c.Close()
		return nil, err
	}
	s := &session{t: t, flavor: mcpGoModern, mc: c}
	t.Cleanup(s.Close)
	return s, nil
}

// ordersOf is the ids of the orders list_orders shows for customer.
func ordersOf(t *testing.T, s *session, customer string) []string {
	t.Helper()
	ids, err := listOrderIDs(s.mustSucceed(t, "list_orders", map[string]any{"customer_id": customer, "limit": 100}))
	if err != nil {
		t.Fatalf("list_orders for %s: %v", customer, err)
	}
	return ids
}

// checkIntents checks every call of a load once the fault is over,
// through a new session on base: a call answered succeeded has exactly
// its one order; any other (a documented failure, or no answer) has no
// order unless its record settles to succeeded within settle, and the
// agent's retry with the same key and arguments completes it, with
// exactly one order. It returns how many calls were not answered
// succeeded.
func checkIntents(t *testing.T, base, token string, intents []*intent, settle time.Duration) (notSucceeded int) {
	t.Helper()
	s := httpSession(t, base, token)
	for _, in := range intents {
		ids := ordersOf(t, s, in.customer)
		if in.succeeded() {
			if len(ids) != 1 || ids[0] != in.env.orderID() {
				t.Errorf("key %s was answered succeeded with order %s, and its customer has orders %v, want exactly that one", in.key, in.env.orderID(), ids)
			}
			continue
		}
		notSucceeded++
		if in.err == nil {
			t.Logf("key %s was answered %s: %s", in.key, in.env.code(), in.env.NextAction)
		}
		if len(ids) > 0 {
			st := waitStatus(t, s, in.key, settle, "succeeded")
			if len(ids) != 1 {
				t.Errorf("key %s (answered %v %s): orders %v, want at most one", in.key, in.err, in.env, ids)
			}
			t.Logf("key %s: not answered succeeded (%v %s), its order %v committed and its record settled %s", in.key, in.err, in.env.code(), ids, st.State)
		}
		e := completeIntent(t, s, in, settle)
		if got := ordersOf(t, s, in.customer); len(got) != 1 || got[0] != e.orderID() {
			t.Errorf("key %s: after the retry (order %s) its customer has orders %v, want exactly that one", in.key, e.orderID(), got)
		}
	}
	return notSucceeded
}

// completeIntent retries in's call with its key and arguments, as an
// agent does, until it is answered succeeded or timeout passes (then the
// test fails). Answers in between must be documented failures that
// invite a retry.
func completeIntent(t *testing.T, s *session, in *intent, timeout time.Duration) envelope {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		e := s.callTool(t, "create_order", in.args)
		if !e.IsError && e.Status == "succeeded" {
			return e
		}
		switch e.code() {
		case "operation_in_progress", "outcome_unknown", "downstream_error", "internal":
		default:
			t.Fatalf("key %s: the retry answered %s", in.key, e)
		}
		if time.Now().After(deadline) {
			t.Fatalf("key %s: not completed by retries within %v; last answer %s", in.key, timeout, e)
		}
		if e.NextAction == "reconcile" {
			s.callTool(t, "reconcile_operation", map[string]any{"operation_key": in.key})
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// alive fails the test unless every replica is still the process it
// started as, and answers /healthz with 200 within timeout.
func alive(t *testing.T, reps []*httpProc, timeout time.Duration) {
	t.Helper()
	for i, p := range reps {
		select {
		case <-p.exited:
			t.Fatalf("replica %d exited: %v", i, p.err)
		default:
		}
		var last string
		if !eventually(timeout, func() bool {
			resp, err := http.Get(p.base + "/healthz")
			if err != nil {
				last = err.Error()
				return false
			}
			resp.Body.Close()
			last = resp.Status
			return resp.StatusCode == http.StatusOK
		}) {
			t.Fatalf("replica %d: /healthz did not answer 200 within %v (last: %s)", i, timeout, last)
		}
	}
}

// TestPostgresKilledHTTPReplicaSettledBySweep: two replicas in front of
// the order API, behind the balancer, serve agents placing orders. One
// call is held at the API; the replica serving it is SIGKILLed (and taken
// out of the balancer's rotation, as its health check would), killing
// the agents' calls in flight there too. The held request then commits
// at the API anyway, or is abandoned there uncommitted. The surviving
// replica's background sweep settles the operation once the dead owner's
// lease has expired: succeeded with the API's order, or retryable (the
// API proves it absent and safe retries are on), within a bound; the
// agent's retry through the balancer is then a replay, or the one re-run.
// Either way one order for the key, and every intent of the load
// completes with one order.
func TestPostgresKilledHTTPReplicaSettledBySweep(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		commit    bool
		wantState string
	}{
		{"the API commits the held call", true, "succeeded"},
		{"the API never accepts the held call", false, "retryable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := pgtest.NewDatabase(t)
			api := newFakeAPI(t)
			tokens := filepath.Join(t.TempDir(), "tokens.json")
			alice := addToken(t, tokens, "alice", "acme", "agent")
			// A lease of 1 s (apiArgs), so the sweep runs every third of a
			// second; an API timeout far longer than the test, so the held
			// call is still running when its replica dies.
			const lease = time.Second
			reps, lb := startReplicasBehind(t, db, tokens, 2, apiArgs(api, "--orders-api-safe-retry", "--orders-api-timeout", "2m")...)
			l := startLoad(t, lb.URL(), alice, 3, faOrder)
			l.waitAnswers(6, 30*time.Second)

			key := newKey()
			args := faOrder(key, "cust-held-"+key)
			h := api.InjectHold(fault{Kind: HoldBeforeCommit, Match: matchCreate, Key: idemKey("acme", key), CommitAnyway: tc.commit})
			agent := httpSession(t, lb.URL(), alice)
			type result struct {
				e   envelope
				err error
			}
			done := make(chan result, 1)
			go func() {
				e, err := agent.call(context.Background(), "create_order", args)
				done <- result{e, err}
			}()
			h.Wait(t, 30*time.Second)
			victim := lb.servedBy(key)
			if victim < 0 {
				t.Fatal("the balancer has no call in flight for the held key")
			}
			if err := reps[victim].cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			<-reps[victim].exited
			killed := time.Now()
			lb.takeOut(victim)
			survivor := reps[1-victim]
			h.WaitGone(t, 30*time.Second)
			h.Release()
			select {
			case r := <-done:
				if r.err == nil {
					t.Errorf("the call on the killed replica answered %s, want no answer", r.e)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the call on the killed replica did not end")
			}

			// Settled by the survivor's sweep: nothing calls the key
			// meanwhile (get_operation_status only reads). The bound: the
			// lease, the dead replica's hold on the sweep task (also a
			// lease), a sweep period, and a generous margin for a loaded
			// machine.
			s := httpSession(t, lb.URL(), alice)
			st := waitStatus(t, s, key, 2*lease+15*time.Second, tc.wantState)
			t.Logf("settled %s by replica %d's sweep %v after the kill", st.State, 1-victim, time.Since(killed).Round(10*time.Millisecond))
			l.waitAnswers(6, 30*time.Second) // the load goes on, on the survivor
			intents := l.finish()

			retry := s.mustSucceed(t, "create_order", args)
			o := api.OrderForKey(idemKey("acme", key))
			switch {
			case o == nil || retry.orderID() != o.OrderID:
				t.Errorf("the agent's retry: order %s, the API has %+v", retry.orderID(), o)
			case tc.commit && (!retry.Replayed || st.DownstreamRef != o.OrderID):
				t.Errorf("the retry after the sweep found the order: %s (status %+v), want a replay of %s", retry, st, o.OrderID)
			case !tc.commit && (retry.Replayed || retry.Attempts != 2):
				t.Errorf("the retry after the sweep proved it absent: %s, want the second attempt, run now", retry)
			}
			wantWrites := 1
			if !tc.commit {
				wantWrites = 2 // the abandoned one and the re-run, both under the key
			}
			if w, c := api.WritesFor(idemKey("acme", key)), api.CommitsFor(idemKey("acme", key)); w != wantWrites || c != 1 {
				t.Errorf("the API received %d requests and committed %d orders for the key, want %d and 1", w, c, wantWrites)
			}
			if ids := ordersOf(t, s, "cust-held-"+key); len(ids) != 1 {
				t.Errorf("the held key's customer has orders %v, want one", ids)
			}

			failed := checkIntents(t, lb.URL(), alice, intents, 2*lease+15*time.Second)
			if st := api.Stats(); st.Duplicates != 0 {
				t.Errorf("the API counts %d duplicate side effects, want 0 (%+v)", st.Duplicates, st)
			}
			t.Logf("%d calls of the load, %d not answered succeeded (killed in flight or in progress on the dead replica)", len(intents), failed)
			alive(t, []*httpProc{survivor}, 10*time.Second)
		})
	}
}

// TestPostgresRestartedUnderLoad: PostgreSQL (a cluster of the test's
// own) is restarted with pg_ctl, three times, while agents place orders,
// each with its confirmation, through the balancer in front of two
// replicas. The replicas recover without a restart of their own (the
// same processes answer /healthz, and serve the agents' sessions made
// before the restarts and new ones), nothing is lost (every intent ends
// with its order, a call that failed around a restart completed by the
// agent's retry with the same key; every confirmation delivered) and
// nothing is doubled (one order per key, one confirmation per order).
func TestPostgresRestartedUnderLoad(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t) // the restart must not disturb the other tests' cluster
	db, err := c.CreateDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	outbox := filepath.Join(t.TempDir(), "outbox")
	reps, lb := startReplicasBehind(t, db, tokens, 2, "--outbox-dir", outbox)
	const agents = 4
	withConfirmation := func(key, customer string) map[string]any { return orderArgs(key, customer, coffee, nil) }
	l := startLoad(t, lb.URL(), alice, agents, withConfirmation)
	l.waitAnswers(8, 30*time.Second)
	type window struct{ start, end time.Time }
	var restarts []window
	for range 3 {
		w := window{start: time.Now()}
		if err := c.Restart(); err != nil {
			t.Fatal(err)
		}
		w.end = time.Now()
		restarts = append(restarts, w)
		// The load goes on after the restart, on the same replicas and
		// the agents' sessions made before it.
		l.waitAnswers(8, 40*time.Second)
	}
	intents := l.finish()
	for i, w := range restarts {
		straddled := 0
		for _, in := range intents {
			if in.sent.Before(w.end) && in.ended.After(w.start) {
				straddled++
			}
		}
		t.Logf("restart %d: pg_ctl restart took %v; %d calls were in flight during it", i+1, w.end.Sub(w.start).Round(time.Millisecond), straddled)
		if straddled == 0 {
			t.Errorf("restart %d: no call was in flight during it", i+1)
		}
	}

	alive(t, reps, 20*time.Second)
	for i, p := range reps {
		s := httpSession(t, p.base, alice)
		e := s.mustSucceed(t, "create_order", faOrder(newKey(), fmt.Sprintf("cust-after-restart-%d", i)))
		if e.Replayed {
			t.Errorf("replica %d after the restart: a new key replayed: %s", i, e)
		}
	}
	failed := checkIntents(t, lb.URL(), alice, intents, 30*time.Second)
	t.Logf("%d calls around the restarts, %d not answered succeeded", len(intents), failed)
	// A replica runs a transaction cut before its COMMIT again, and reads
	// back one whose COMMIT was cut: only a call in flight at a restart
	// may fail, and only when the outcome of its COMMIT could not be read
	// back — at most one per agent and restart.
	if failed > agents*len(restarts) {
		t.Errorf("%d calls failed around the restarts, want at most %d (one per agent and restart)", failed, agents*len(restarts))
	}

	// One confirmation per order, every one delivered: the deliverers
	// recovered too.
	want := map[string]bool{}
	s := httpSession(t, lb.URL(), alice)
	for _, in := range intents {
		for _, id := range ordersOf(t, s, in.customer) {
			want[id] = true
		}
	}
	var got map[string]int
	if !eventually(30*time.Second, func() bool {
		got = map[string]int{}
		for _, f := range outboxFiles(t, outbox) {
			got[readMessage(t, filepath.Join(outbox, f)).OrderID]++
		}
		for id := range want {
			if got[id] == 0 {
				return false
			}
		}
		return true
	}) {
		t.Fatalf("confirmations delivered for %d of %d orders within 30 s", len(got), len(want))
	}
	for id, n := range got {
		if n != 1 {
			t.Errorf("order %s has %d confirmations, want 1", id, n)
		}
	}
	if r := runCLI(t, 30*time.Second, "audit", "verify", "--db", db); r.Code != 0 {
		t.Errorf("audit verify after the restart: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
}

// TestPostgresCommitCutNeverExecutesTwice: both replicas reach the
// database through a proxy that drops the connection as a chosen
// transaction sends COMMIT — after the server got it (committed, the
// answer lost) or before (never committed). The agent's call through the
// balancer is answered with the truth, read back from the database: one
// execution, succeeded, never a second one — for the embedded order store
// (the order is in the transaction cut) and for the order API (the
// claim's transaction cut, or the completion's after the API's one
// request). Then, under load, one COMMIT after another is cut, of
// whatever transaction comes (claims, sessions, background work): every
// intent still ends with exactly one order.
func TestPostgresCommitCutNeverExecutesTwice(t *testing.T) {
	t.Parallel()
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	modes := []pgtest.CutMode{pgtest.CutAfter, pgtest.CutBefore}

	// cutOnce arms p for key's transaction (and match), sends one call
	// and checks its answer: executed once, succeeded.
	cutOnce := func(t *testing.T, p *pgtest.CutProxy, lb string, mode pgtest.CutMode, match ...string) (key string, e envelope) {
		t.Helper()
		key = newKey()
		s := httpSession(t, lb, alice)
		before := p.Cuts()
		p.Arm(mode, append([]string{key}, match...)...)
		e = s.callTool(t, "create_order", faOrder(key, "cust-cut-"+key))
		if p.Cuts() != before+1 {
			p.Disarm()
			t.Fatalf("the proxy cut no COMMIT (the answer: %s)", e)
		}
		if e.IsError || e.Status != "succeeded" || e.Replayed || e.Attempts != 1 {
			t.Errorf("the call whose COMMIT was cut %s: %s, want succeeded, executed once (attempt 1)", mode, e)
		}
		if ids := ordersOf(t, s, "cust-cut-"+key); len(ids) != 1 || ids[0] != e.orderID() {
			t.Errorf("orders %v, want exactly the answer's %s", ids, e.orderID())
		}
		again := s.mustSucceed(t, "create_order", faOrder(key, "cust-cut-"+key))
		if !again.Replayed || again.orderID() != e.orderID() {
			t.Errorf("the retry: %s, want a replay of %s", again, e.orderID())
		}
		return key, e
	}

	t.Run("embedded orders", func(t *testing.T) {
		p := pgtest.NewCutProxy(t, pgtest.NewDatabase(t))
		_, lb := startReplicasBehind(t, p.URL(), tokens, 2)
		for _, mode := range modes {
			t.Run("cut "+mode.String(), func(t *testing.T) { cutOnce(t, p, lb.URL(), mode) })
		}
	})

	t.Run("order API", func(t *testing.T) {
		p := pgtest.NewCutProxy(t, pgtest.NewDatabase(t))
		api := newFakeAPI(t)
		_, lb := startReplicasBehind(t, p.URL(), tokens, 2, apiArgs(api, "--orders-api-timeout", "30s")...)
		for _, tx := range []struct {
			name  string
			match []string
		}{
			// Records are stored compressed; the transition's audit
			// entry, written in the same transaction, names the state.
			{"claim", []string{`"state_after":"in_progress"`}},
			{"completion", []string{`"state_after":"succeeded"`}},
		} {
			for _, mode := range modes {
				t.Run(tx.name+" cut "+mode.String(), func(t *testing.T) {
					key, e := cutOnce(t, p, lb.URL(), mode, tx.match...)
					k := idemKey("acme", key)
					if w, c := api.WritesFor(k), api.CommitsFor(k); w != 1 || c != 1 {
						t.Errorf("the API received %d requests and committed %d orders for the key, want 1 and 1", w, c)
					}
					if o := api.OrderForKey(k); o == nil || o.OrderID != e.orderID() {
						t.Errorf("the API's order for the key: %+v, the answer's %s", o, e.orderID())
					}
				})
			}
		}
	})

	t.Run("under load", func(t *testing.T) {
		p := pgtest.NewCutProxy(t, pgtest.NewDatabase(t))
		_, lb := startReplicasBehind(t, p.URL(), tokens, 2)
		l := startLoad(t, lb.URL(), alice, 4, faOrder)
		l.waitAnswers(4, 30*time.Second)
		const cuts = 16
		for i := range cuts {
			p.Arm(modes[i%2])
			if !eventually(20*time.Second, func() bool { return !p.Armed() }) {
				t.Fatalf("cut %d: no COMMIT came within 20 s", i+1)
			}
		}
		l.waitAnswers(4, 30*time.Second) // and the load goes on
		intents := l.finish()
		failed := checkIntents(t, lb.URL(), alice, intents, 30*time.Second)
		t.Logf("%d COMMITs cut under a load of %d calls, %d not answered succeeded", p.Cuts(), len(intents), failed)
	})
}

// TestPostgresHealthzWithholdsTheDatabase (issue 18, item 9): /healthz
// needs no token, so while PostgreSQL is down it says that the ledger
// cannot be read but not the database's user, name or address; an
// approver's token (an operator) sees the driver's error with them. An
// agent's token is not an operator's.
func TestPostgresHealthzWithholdsTheDatabase(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t) // stopped below: not the other tests' cluster
	db, err := c.CreateDatabase(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(db)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	agent := addToken(t, tokens, "alice", "acme", "agent")
	operator := addToken(t, tokens, "olga", "acme", "approver")
	p := startHTTP(t, db, tokens, 0)
	get := func(token string) (int, string) {
		req, _ := http.NewRequest("GET", p.base+"/healthz", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(raw)
	}
	if err := c.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Resume() }) // the server's SIGINT closes its pool cleanly
	secrets := []string{name, u.Port(), "user=", u.User.Username() + "@"}
	for _, who := range []struct{ name, token string }{{"no token", ""}, {"an agent's token", agent}, {"a token not issued", "not-a-token"}} {
		code, body := get(who.token)
		t.Logf("/healthz with %s, the database down: %d %s", who.name, code, body)
		if code != 503 || !strings.Contains(body, "cannot be read") {
			t.Errorf("/healthz with %s, the database down: %d %s; want 503 saying the ledger cannot be read", who.name, code, body)
		}
		for _, s := range secrets {
			if strings.Contains(body, s) {
				t.Errorf("/healthz with %s shows %q of the database: %s", who.name, s, body)
			}
		}
	}
	code, body := get(operator)
	t.Logf("/healthz with an approver's token, the database down: %d %s", code, body)
	// The driver's own error: it names the database when the connection
	// is refused, or gives the server's SQLSTATE when a pooled connection
	// was terminated just then (seen under load).
	if code != 503 || strings.Contains(body, "withheld") || !strings.Contains(body, name) && !strings.Contains(body, "SQLSTATE") {
		t.Errorf("/healthz with an approver's token: %d %s; want 503 with the driver's error (naming database %s, or the server's SQLSTATE)", code, body, name)
	}
	if err := c.Resume(); err != nil {
		t.Fatal(err)
	}
	if !eventually(20*time.Second, func() bool { code, _ := get(""); return code == 200 }) {
		t.Errorf("/healthz once the database is back: %d %s; want 200", code, body)
	}
}

// TestPostgresFrozenReplicaStopsNoOne: two replicas on one database, each
// loaded by agents of its own. Replica A is frozen (SIGSTOP, a paused VM)
// while it holds a write transaction open — PostgreSQL shows its session
// idle in transaction. Meanwhile replica B's creates of other keys go on:
// p99 under a second during the freeze (with the global writer lock of
// earlier builds they waited for the server to end A's session, 10 s).
// Once A is thawed, its calls in flight and after complete; every call of
// both loads ends with exactly one order, and the audit chain verifies.
func TestPostgresFrozenReplicaStopsNoOne(t *testing.T) {
	t.Parallel()
	db := pgtest.NewDatabase(t)
	tokens := filepath.Join(t.TempDir(), "tokens.json")
	alice := addToken(t, tokens, "alice", "acme", "agent")
	reps, _ := startReplicasBehind(t, db, tokens, 2)
	a, b := reps[0], reps[1]
	la := startLoad(t, a.base, alice, 8, faOrder)
	la.waitAnswers(20, 30*time.Second)

	ctx := testContext(t)
	conn, err := pgx.Connect(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	// Freeze A until PostgreSQL shows one of its sessions idle in a
	// transaction it began (B's load has not started: nothing else runs).
	frozen := false
	for try := 0; try < 20 && !frozen; try++ {
		if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(400 * time.Millisecond)
		var open int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND state = 'idle in transaction' AND state_change < now() - interval '300 milliseconds'`).Scan(&open); err != nil {
			t.Fatal(err)
		}
		if frozen = open > 0; !frozen {
			a.cmd.Process.Signal(syscall.SIGCONT)
			time.Sleep(100 * time.Millisecond)
		}
	}
	if !frozen {
		t.Fatal("replica A was never caught with a transaction open in 20 tries")
	}
	freeze := time.Now()
	lb := startLoad(t, b.base, alice, 8, faOrder)
	time.Sleep(4 * time.Second)
	during := lb.finish()
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	thawed := time.Now()

	var lat []time.Duration
	for _, in := range during {
		if in.err != nil || !in.succeeded() {
			t.Errorf("B's call during the freeze: %v %s", in.err, in.env)
			continue
		}
		lat = append(lat, in.ended.Sub(in.sent))
	}
	slices.Sort(lat)
	if len(lat) < 20 {
		t.Fatalf("B made %d creates in the 4 s A was frozen, want at least 20", len(lat))
	}
	p99 := lat[(len(lat)*99)/100]
	t.Logf("during the freeze (%s): B made %d creates, p50 %s, p99 %s, max %s", thawed.Sub(freeze).Round(time.Millisecond),
		len(lat), lat[len(lat)/2].Round(time.Millisecond), p99.Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	if p99 > time.Second {
		t.Errorf("B's creates during A's freeze: p99 %s, want under 1 s", p99)
	}

	la.waitAnswers(10, 60*time.Second) // A serves again
	intents := append(la.finish(), during...)
	failed := checkIntents(t, b.base, alice, intents, 30*time.Second)
	t.Logf("%d calls, %d not answered succeeded (in flight on A across its freeze)", len(intents), failed)
	if r := runCLI(t, 30*time.Second, "audit", "verify", "--db", db); r.Code != 0 {
		t.Errorf("audit verify: %d %s %s", r.Code, r.Stdout, r.Stderr)
	}
	alive(t, reps, 10*time.Second)
}
