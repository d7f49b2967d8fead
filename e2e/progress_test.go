package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// claimer is the testdata/claimer process: a second executor on the ledger
// file holding one operation in_progress (see its doc comment for why the
// binary alone never leaves one behind).
type claimer struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

func startClaimer(t *testing.T, db, tool string, args map[string]any, flags ...string) *claimer {
	t.Helper()
	bin := helperBin(t, "claimer")
	raw, err := json.Marshal(args)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, append([]string{"-db", db, "-tool", tool, "-args", string(raw)}, flags...)...)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &claimer{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		c.stdin.Close()
		if err := c.cmd.Wait(); err != nil {
			t.Errorf("claimer: %v\n%s", err, stderr)
		}
	})
	var claimed struct {
		State string `json:"state"`
	}
	if err := c.readLine(&claimed); err != nil || claimed.State != "in_progress" {
		t.Fatalf("claimer did not claim: %v %+v\n%s", err, claimed, stderr)
	}
	return c
}

func (c *claimer) readLine(v any) error {
	if !c.out.Scan() {
		if err := c.out.Err(); err != nil {
			return err
		}
		return io.ErrUnexpectedEOF
	}
	return json.Unmarshal(c.out.Bytes(), v)
}

// complete finishes the claimed operation as succeeded with result.
func (c *claimer) complete(result string) error {
	if _, err := fmt.Fprintf(c.stdin, "complete %s\n", result); err != nil {
		return err
	}
	var done struct {
		State string `json:"state"`
		Error string `json:"error"`
	}
	if err := c.readLine(&done); err != nil {
		return err
	}
	if done.Error != "" {
		return fmt.Errorf("ledger refused the completion: %s", done.Error)
	}
	if done.State != "succeeded" {
		return fmt.Errorf("claimer completed into state %q", done.State)
	}
	return nil
}

// TestProgressWhileInProgress: while another executor holds an operation
// in_progress, a duplicate call waits (bounded by --wait), sends
// notifications/progress for the progress token the client passed, and
// answers in_progress with advice to poll; when the executor finishes
// during the wait, the waiting duplicate answers with its saved result,
// replayed, and nothing runs twice.
//
// The in_progress record is the first call's, held by the HTTP order API
// (a downstream that runs outside the ledger transaction): `idemgate
// serve` with the embedded order store claims and executes in one
// transaction, so it never leaves an in_progress record another call
// could observe.
func TestProgressWhileInProgress(t *testing.T) {
	forEachFlavor(t, allFlavors, func(t *testing.T, f flavor) {
		t.Parallel()
		api := newFakeAPI(t)
		db := filepath.Join(t.TempDir(), "ledger.db")
		args := orderArgs(newKey(), "cust-progress", coffee, nil)
		key := args["operation_key"].(string)
		// The API's answer and the lease outlast the test's holds.
		s := startAPIServer(t, f, api, serverConfig{DB: db}, "--wait", "1500ms", "--orders-api-timeout", "30s", "--lease", "30s")
		ctx := testContext(t)

		// The first call is held by the API once it has placed the order.
		h := api.InjectHold(fault{Kind: HoldAfterCommit, Match: matchCreate})
		first := make(chan error, 1)
		go func() { _, err := s.call(ctx, "create_order", args); first <- err }()
		h.Wait(t, 5*time.Second)
		if st, _, found := s.status(t, key); !found || st.State != "in_progress" {
			t.Fatalf("get_operation_status of the running key: found=%v %+v", found, st)
		}

		// 1. Nobody finishes: the duplicate waits out --wait and says so.
		token := "wait-" + f.Name
		began := time.Now()
		e, err := s.callWithProgress(ctx, "create_order", args, token)
		waited := time.Since(began)
		if err != nil {
			t.Fatal(err)
		}
		if !e.IsError || e.code() != "operation_in_progress" || e.Status != "in_progress" || e.NextAction != "wait_and_poll_status" {
			t.Errorf("duplicate of a running operation: %s", e)
		}
		if waited < 1400*time.Millisecond {
			t.Errorf("answered after %v, want a wait of about --wait (1.5s)", waited)
		}
		evs := eventsFor(s, token)
		if len(evs) < 3 {
			t.Errorf("got %d progress notifications for token %q during a 1.5s wait, want several (all: %+v)", len(evs), token, s.progressEvents())
		}
		for i, ev := range evs {
			if ev.Total != 1.5 || ev.Progress < 0 || ev.Progress > ev.Total || (i > 0 && ev.Progress < evs[i-1].Progress) || ev.Message == "" {
				t.Errorf("progress notification %d: %+v", i, ev)
			}
		}

		// 2. The first call finishes during the wait: the duplicate gets
		// its result.
		token2 := "finish-" + f.Name
		type answer struct {
			e   envelope
			err error
		}
		ch := make(chan answer, 1)
		go func() {
			e, err := s.callWithProgress(ctx, "create_order", args, token2)
			ch <- answer{e, err}
		}()
		time.Sleep(600 * time.Millisecond)
		h.Release()
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		a := <-ch
		if a.err != nil {
			t.Fatal(a.err)
		}
		if a.e.IsError || a.e.Status != "succeeded" || !a.e.Replayed || a.e.orderID() == "" {
			t.Errorf("duplicate waiting for an operation that then finished: %s", a.e)
		}
		if len(eventsFor(s, token2)) == 0 {
			t.Errorf("no progress notification for token %q while waiting", token2)
		}
		// The duplicates ran nothing: the API received one request.
		if n := api.WritesFor(idemKey("", key)); n != 1 {
			t.Errorf("the API received %d requests, want 1", n)
		}
	})
}

func eventsFor(s *session, token string) []progressEvent {
	var out []progressEvent
	for _, ev := range s.progressEvents() {
		if ev.Token == token {
			out = append(out, ev)
		}
	}
	return out
}

// TestLeaseExpiryFencing: an executor whose lease ran out has lost the
// operation. The embedded store's claims say "retryable on lease expiry"
// (the effect commits with the outcome, so it cannot have happened), so the
// next call with the same key and request runs it as attempt 2; the old
// executor's late completion is refused (fencing generation) and does not
// overwrite the outcome.
func TestLeaseExpiryFencing(t *testing.T) {
	db := filepath.Join(t.TempDir(), "ledger.db")
	customer := "cust-lease"
	args := orderArgs(newKey(), customer, coffee, nil)
	cl := startClaimer(t, db, "create_order", args, "-lease", "300ms")
	s := startServer(t, mcpGoModern, serverConfig{DB: db})

	// While the lease is live a different request under the key is
	// refused at once.
	s.mustFail(t, "create_order", orderArgs(args["operation_key"].(string), customer, []item{{"tea", 1, 990}}, nil), "key_reused_with_different_request")

	time.Sleep(500 * time.Millisecond)
	e := s.mustSucceed(t, "create_order", args)
	if e.Replayed || e.Attempts != 2 || e.orderID() == "" {
		t.Errorf("call after the lease expired: want a fresh run as attempt 2, got %s", e)
	}
	// The old executor opens the file once the server has let it go.
	s.Close()
	stopOwner(t, db)
	if err := cl.complete(`{"order":{"order_id":"ord_stale"}}`); err == nil {
		t.Errorf("a completion from the expired lease's executor was accepted")
	} else if strings.Contains(err.Error(), "open in another process") {
		t.Fatalf("the old executor could not open the ledger: %v", err)
	}
	s = startServer(t, mcpGoModern, serverConfig{DB: db})
	again := s.mustSucceed(t, "create_order", args)
	if !again.Replayed || again.orderID() != e.orderID() || !jsonEqual(again.Result, e.Result) {
		t.Errorf("replay after the stale completion: %s\nwant %s", again, e.Result)
	}
	if ids := s.listOrderIDs(t, customer); len(ids) != 1 || ids[0] != e.orderID() {
		t.Errorf("list_orders = %v, want [%s]", ids, e.orderID())
	}
}

// TestProgressBinaryOnly records what cannot be tested with the binary
// alone; TestProgressWhileInProgress covers the behaviour with the HTTP
// order API.
func TestProgressBinaryOnly(t *testing.T) {
	t.Skip("idemgate serve with the embedded order store claims, executes and completes an operation in ONE bbolt " +
		"write transaction, so no in_progress record is ever visible to another call (not even after SIGKILL: the " +
		"transaction is lost whole). The binary alone cannot provoke a waiting duplicate; TestProgressWhileInProgress " +
		"holds the record in_progress with a call the HTTP order API holds instead.")
}
