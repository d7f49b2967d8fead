package server

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"time"
)

// TestStdioDrain: Drain waits for the answer of every request already
// read (not for notifications, nor for what arrives after it began), then
// ends the input.
func TestStdioDrain(t *testing.T) {
	inR, inW := io.Pipe()
	var out strings.Builder
	d := NewStdioDrain(inR, &out)
	go func() {
		io.WriteString(inW, `{"jsonrpc":"2.0","id":1,"method":"tools/call"}`+"\n")
		io.WriteString(inW, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
		io.WriteString(inW, `{"jsonrpc":"2.0","id":"a","method":"tools/call"}`+"\n")
	}()
	r := bufio.NewReader(d.Reader())
	for i := 0; i < 3; i++ {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	drained := make(chan int)
	go func() { drained <- d.Drain(context.Background()) }()
	w := d.Writer()
	io.WriteString(w, `{"jsonrpc":"2.0","method":"notifications/progress","params":{}}`+"\n")
	io.WriteString(w, `{"jsonrpc":"2.0","id":1.0,"result":{}}`+"\n")
	select {
	case <-drained:
		t.Fatal("Drain returned with request \"a\" unanswered")
	case <-time.After(100 * time.Millisecond):
	}
	io.WriteString(w, `{"jsonrpc":"2.0","id":"a",`)
	io.WriteString(w, `"result":{}}`+"\n")
	select {
	case left := <-drained:
		if left != 0 {
			t.Errorf("Drain: %d unanswered, want 0", left)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return after every answer was written")
	}
	if _, err := r.ReadString('\n'); err != io.EOF {
		t.Errorf("input after Drain: %v, want EOF", err)
	}
	inW.Close()
}

// TestStdioDrainGrace: Drain gives up when its context ends.
func TestStdioDrainGrace(t *testing.T) {
	d := NewStdioDrain(strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"tools/call"}`+"\n"), io.Discard)
	if _, err := bufio.NewReader(d.Reader()).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if left := d.Drain(ctx); left != 1 {
		t.Errorf("Drain after its grace: %d unanswered, want 1", left)
	}
}
