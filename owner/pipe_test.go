package owner

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	initializeLine  = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"test","version":"1"}}}` + "\n"
	initializedLine = `{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n"
)

// pipeTo connects to f and runs a pipe on that connection; Connect
// connects to f again.
func pipeTo(t *testing.T, f *fakeOwner, grace time.Duration) (*client, *ownerConn) {
	t.Helper()
	first, err := f.connect()
	if err != nil {
		t.Fatal(err)
	}
	oc := f.accept(t)
	cl := startPipe(t, first, PipeConfig{Connect: f.connect, Grace: grace})
	return cl, oc
}

// initialize passes the client's initialize and initialized to oc.
func initialize(t *testing.T, cl *client, oc *ownerConn) {
	t.Helper()
	cl.send(t, initializeLine)
	oc.expect(t, initializeLine)
	const answer = `{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18","capabilities":{"tools":{}},"serverInfo":{"name":"idemgate","version":"test"}}}` + "\n"
	oc.send(t, answer)
	cl.expect(t, answer)
	cl.send(t, initializedLine)
	oc.expect(t, initializedLine)
}

func TestConnectSaysHello(t *testing.T) {
	f := newFakeOwner(t)
	c, err := Connect(f.place, Hello{Principal: "p", Config: map[string]string{"--a": "1"}, Workers: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	oc := f.accept(t)
	h := oc.hello
	if h.Protocol != protocol || h.Build != Build() || h.PID != os.Getpid() || h.Principal != "p" || h.Workers != 3 || !maps.Equal(h.Config, map[string]string{"--a": "1"}) {
		t.Errorf("the owner read the hello %+v", h)
	}
	if !c.Welcome.OK || c.Welcome.PID != 4242 || c.Welcome.Build != Build() {
		t.Errorf("the welcome is %+v", c.Welcome)
	}
}

func TestPipePassesLinesUnchanged(t *testing.T) {
	f := newFakeOwner(t)
	cl, oc := pipeTo(t, f, 10*time.Second)
	oc.serve()
	initialize(t, cl, oc)
	fromClient := []string{
		// Spacing, escapes, number spellings and member order as sent.
		`{ "jsonrpc" : "2.0", "id" : "a\u00e9", "method":"tools/call","params":{"arguments":{"n":1.50,"operation_key":"k-1"},"name":"x"}}` + "\n",
		`{"method":"tools/list","jsonrpc":"2.0","id":2,"params":{}}` + "\r\n",
		`{"jsonrpc":"2.0","method":"notifications/roots/list_changed"}` + "\n",
		`not JSON at all` + "\n",
	}
	for _, line := range fromClient {
		cl.send(t, line)
		oc.expect(t, line)
	}
	fromOwner := []string{
		`{"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":"a\u00e9","progress":1,"total":2}}` + "\n",
		`{"jsonrpc":"2.0","id":"s-1","method":"roots/list"}` + "\n", // a request of the owner's
		`{"jsonrpc":"2.0","id":"a\u00e9","result":{"content":[{"type":"text","text":"{}"}],"structuredContent":{},"isError":false}}` + "\n",
		`{"jsonrpc":"2.0","id":2,"result":{"tools":[]}}` + "\n",
		`{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"Parse error"}}` + "\n",
	}
	for _, line := range fromOwner {
		oc.send(t, line)
		cl.expect(t, line)
	}
	// The client's answer to the owner's request.
	const rootsAnswer = `{"jsonrpc":"2.0","id":"s-1","result":{"roots":[]}}` + "\n"
	cl.send(t, rootsAnswer)
	oc.expect(t, rootsAnswer)
	// Every request has its answer: the end of the input ends the pipe at
	// once, and the owner saw its connection end.
	if d := cl.end(t, time.Second); d > 500*time.Millisecond {
		t.Errorf("Pipe took %s to return with no request waiting", d)
	}
	oc.ended(t)
}

func TestPipeAnswersRequestsLostWithTheConnection(t *testing.T) {
	f := newFakeOwner(t)
	var mu sync.Mutex
	dials := 0
	first, err := f.connect()
	if err != nil {
		t.Fatal(err)
	}
	oc := f.accept(t)
	oc.serve()
	cl := startPipe(t, first, PipeConfig{Grace: 10 * time.Second, Connect: func() (*Conn, error) {
		mu.Lock()
		dials++
		mu.Unlock()
		return f.connect()
	}})
	initialize(t, cl, oc)
	const (
		call = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"create_order","arguments":{"operation_key":"op-7","sku":"x"}}}` + "\n"
		list = `{"jsonrpc":"2.0","id":"three","method":"tools/list"}` + "\n"
	)
	cl.send(t, call)
	oc.expect(t, call)
	cl.send(t, list)
	oc.expect(t, list)
	oc.c.Close() // the owner ends

	answers := map[string][]byte{}
	for range 2 {
		line := cl.next(t)
		id := answerID(t, line)
		if answers[id] != nil {
			t.Fatalf("request %s was answered twice: %s and %s", id, answers[id], line)
		}
		answers[id] = line
	}
	msg := toolError(t, answers["2"], "2", "op-7")
	if !strings.Contains(msg, "same operation_key") {
		t.Errorf("the tool error says %q; want it to say to repeat the call with the same operation_key", msg)
	}
	if answers[`"three"`] == nil {
		t.Fatalf("tools/list was not answered; the answers: %q", answers)
	}
	rpcError(t, answers[`"three"`], `"three"`)
	cl.nothing(t, 200*time.Millisecond)
	f.noConn(t)

	// The next request goes over a new connection, opened with the
	// client's initialize (under the pipe's id) and initialized.
	const next = `{"jsonrpc":"2.0","id":4,"method":"tools/list"}` + "\n"
	cl.send(t, next)
	oc2 := f.accept(t)
	oc2.serve()
	mu.Lock()
	if dials != 1 {
		t.Errorf("Connect was called %d times, want 1", dials)
	}
	mu.Unlock()
	init := oc2.next(t)
	var got, want map[string]json.RawMessage
	if err := json.Unmarshal(init, &got); err != nil {
		t.Fatal(err)
	}
	json.Unmarshal([]byte(initializeLine), &want)
	var id string
	if err := json.Unmarshal(got["id"], &id); err != nil || !strings.HasPrefix(id, pipeIDPrefix) {
		t.Fatalf("the repeated initialize has id %s, want a string starting %q", got["id"], pipeIDPrefix)
	}
	delete(got, "id")
	delete(want, "id")
	if !maps.EqualFunc(got, want, func(a, b json.RawMessage) bool { return string(a) == string(b) }) {
		t.Fatalf("the repeated initialize is %s, want the client's %s with another id", init, initializeLine)
	}
	oc2.send(t, `{"jsonrpc":"2.0","id":"`+id+`","result":{"protocolVersion":"2025-06-18","capabilities":{},"serverInfo":{"name":"idemgate","version":"test"}}}`+"\n")
	oc2.expect(t, initializedLine)
	oc2.expect(t, next)
	const answer = `{"jsonrpc":"2.0","id":4,"result":{"tools":[]}}` + "\n"
	oc2.send(t, answer)
	cl.expect(t, answer) // and not the answer to the repeated initialize
	cl.nothing(t, 200*time.Millisecond)
	if d := cl.end(t, time.Second); d > 500*time.Millisecond {
		t.Errorf("Pipe took %s to return with no request waiting", d)
	}
}

func TestPipeGivesUpAStalledOwner(t *testing.T) {
	f := newFakeOwner(t)
	cl, oc := pipeTo(t, f, 10*time.Second) // the owner never reads nor writes
	const call = `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_order","arguments":{"operation_key":"k-stall"}}}` + "\n"
	start := time.Now()
	cl.send(t, call)
	line := cl.nextWithin(t, StallBound+2*time.Second)
	took := time.Since(start)
	t.Logf("a stalled owner was given up after %s (StallBound %s)", took.Round(time.Millisecond), StallBound)
	if took < stallAfter || took > StallBound+500*time.Millisecond {
		t.Errorf("the call was answered after %s, want between %s and StallBound %s", took, stallAfter, StallBound)
	}
	msg := toolError(t, line, "1", "k-stall")
	if !strings.Contains(msg, "has not answered") {
		t.Errorf("the tool error says %q; want it to say the owner has not answered", msg)
	}
	cl.nothing(t, 200*time.Millisecond)
	// What the pipe wrote: the call, then a ping, then it closed.
	oc.serve()
	oc.expect(t, call)
	select {
	case ping := <-oc.pings:
		var m struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(ping, &m); err != nil || !strings.HasPrefix(m.ID, pipeIDPrefix) {
			t.Errorf("the ping %s has not the pipe's id", ping)
		}
	case <-time.After(waitFor):
		t.Error("the pipe did not ping the owner")
	}
	oc.ended(t)
	if d := cl.end(t, time.Second); d > 500*time.Millisecond {
		t.Errorf("Pipe took %s to return with no request waiting", d)
	}
}

func TestPipeWaitsBeforeDialingAgain(t *testing.T) {
	f := newFakeOwner(t)
	first, err := f.connect()
	if err != nil {
		t.Fatal(err)
	}
	oc := f.accept(t)
	oc.serve()
	var (
		mu      sync.Mutex
		dials   []time.Time // when each failed Connect returned
		reached bool
	)
	cl := startPipe(t, first, PipeConfig{Grace: 10 * time.Second, Connect: func() (*Conn, error) {
		mu.Lock()
		defer mu.Unlock()
		if reached {
			return f.connect()
		}
		dials = append(dials, time.Now())
		return nil, errors.New("the owner is down")
	}})
	dialed := func() int { mu.Lock(); defer mu.Unlock(); return len(dials) }
	oc.c.Close()
	cl.logged(t, "lost the connection")

	start := time.Now()
	cl.send(t, `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_order","arguments":{"operation_key":"k-4"}}}`+"\n")
	msg := toolError(t, cl.next(t), "1", "k-4")
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("the call was answered after %s, want at once", took)
	}
	if !strings.Contains(msg, "the owner is down") || !strings.Contains(msg, "same operation_key") {
		t.Errorf("the tool error says %q; want Connect's error and to repeat with the same operation_key", msg)
	}
	if n := dialed(); n != 1 {
		t.Fatalf("Connect was called %d times, want 1", n)
	}
	mu.Lock()
	failed := dials[0]
	mu.Unlock()

	// Within redialPause of the failure: answered at once, no new attempt.
	cl.send(t, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_status","arguments":{}}}`+"\n")
	toolError(t, cl.next(t), "2", "")
	time.Sleep(time.Until(failed.Add(redialPause - 250*time.Millisecond)))
	start = time.Now()
	cl.send(t, `{"jsonrpc":"2.0","id":3,"method":"tools/list"}`+"\n")
	rpcError(t, cl.next(t), "3")
	if took := time.Since(start); took > 200*time.Millisecond {
		t.Errorf("the request was answered after %s, want at once", took)
	}
	if time.Since(failed) >= redialPause {
		t.Fatal("the test was too slow to check the pause")
	}
	if n := dialed(); n != 1 {
		t.Fatalf("Connect was called %d times within %s of its failure, want once", n, redialPause)
	}

	// After it: one attempt, which reaches the owner this time.
	time.Sleep(time.Until(failed.Add(redialPause + 50*time.Millisecond)))
	mu.Lock()
	reached = true
	mu.Unlock()
	const list = `{"jsonrpc":"2.0","id":5,"method":"tools/list"}` + "\n"
	cl.send(t, list)
	oc2 := f.accept(t)
	oc2.serve()
	oc2.expect(t, list) // no initialize to repeat: the client sent none
	const answer = `{"jsonrpc":"2.0","id":5,"result":{"tools":[]}}` + "\n"
	oc2.send(t, answer)
	cl.expect(t, answer)
	f.noConn(t)
}

func TestPipeForgetsACancelledRequest(t *testing.T) {
	f := newFakeOwner(t)
	cl, oc := pipeTo(t, f, 10*time.Second)
	oc.serve()
	const (
		call   = `{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"create_order","arguments":{"operation_key":"k-5"}}}` + "\n"
		cancel = `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":5,"reason":"the user cancelled"}}` + "\n"
	)
	cl.send(t, call)
	oc.expect(t, call)
	cl.send(t, cancel)
	oc.expect(t, cancel) // the owner hears of it too
	// Lost with the connection, it is not answered: nothing waits for it.
	oc.c.Close()
	cl.logged(t, "lost the connection")
	cl.nothing(t, 200*time.Millisecond)
	if d := cl.end(t, time.Second); d > 500*time.Millisecond {
		t.Errorf("Pipe took %s to return; a cancelled request is not waited for (Grace 10s)", d)
	}
}

func TestPipeEndsAfterTheAnswersDue(t *testing.T) {
	t.Run("answered", func(t *testing.T) {
		f := newFakeOwner(t)
		cl, oc := pipeTo(t, f, 5*time.Second)
		oc.serve()
		const call = `{"jsonrpc":"2.0","id":6,"method":"tools/call","params":{"name":"create_order","arguments":{"operation_key":"k-6"}}}` + "\n"
		cl.send(t, call)
		oc.expect(t, call)
		start := time.Now()
		cl.in.Close()
		select {
		case <-cl.done:
			t.Fatal("Pipe returned with a request waiting for its answer")
		case <-time.After(300 * time.Millisecond):
		}
		const answer = `{"jsonrpc":"2.0","id":6,"result":{"content":[],"structuredContent":{"status":"succeeded"},"isError":false}}` + "\n"
		answered := time.Now()
		oc.send(t, answer)
		cl.expect(t, answer)
		select {
		case <-cl.done:
		case <-time.After(waitFor):
			t.Fatal("Pipe did not return once the answer came")
		}
		if d := cl.ended.Sub(answered); d > 500*time.Millisecond {
			t.Errorf("Pipe returned %s after the answer, want at once", d)
		}
		t.Logf("Pipe returned %s after its input ended", cl.ended.Sub(start).Round(time.Millisecond))
	})
	t.Run("unanswered", func(t *testing.T) {
		const grace = 700 * time.Millisecond
		f := newFakeOwner(t)
		cl, oc := pipeTo(t, f, grace)
		oc.serve()
		const list = `{"jsonrpc":"2.0","id":7,"method":"tools/list"}` + "\n"
		cl.send(t, list)
		oc.expect(t, list)
		d := cl.end(t, grace+waitFor)
		if d < grace || d > grace+500*time.Millisecond {
			t.Errorf("Pipe returned %s after its input ended, want after the grace, %s", d, grace)
		}
		cl.logged(t, "shutdown: calls still running")
		cl.nothing(t, 100*time.Millisecond)
	})
}

// A connection lost as a request goes over it: the request is answered
// once, whichever the pipe notices first, the loss or the request.
func TestPipeAnswersARequestRacingTheLoss(t *testing.T) {
	f := newFakeOwner(t)
	cl, oc := pipeTo(t, f, time.Second)
	f.hangUp.Store(true)
	oc.c.Close()
	cl.logged(t, "lost the connection")
	for i := range 200 {
		// Each request dials an owner that hangs up after its welcome.
		cl.send(t, fmt.Sprintf(`{"jsonrpc":"2.0","id":%d,"method":"tools/list"}`+"\n", i))
		rpcError(t, cl.next(t), strconv.Itoa(i))
	}
	cl.nothing(t, 100*time.Millisecond)
}
