package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
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
		io.WriteString(inW, `{"jsonrpc":"2.0","id":1,"method":"ping"}`+"\n")
		io.WriteString(inW, `{"jsonrpc":"2.0","method":"notifications/initialized"}`+"\n")
		io.WriteString(inW, `{"jsonrpc":"2.0","id":"a","method":"ping"}`+"\n")
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
	d := NewStdioDrain(strings.NewReader(`{"jsonrpc":"2.0","id":7,"method":"ping"}`+"\n"), io.Discard)
	if _, err := bufio.NewReader(d.Reader()).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if left := d.Drain(ctx); left != 1 {
		t.Errorf("Drain after its grace: %d unanswered, want 1", left)
	}
}

// TestStdioDrainRefusedMessages: a message the strict envelope refuses
// with id null (a duplicate or case-variant id, an id too long) is not a
// call in flight: a shutdown does not wait its whole grace for an answer
// that was already sent, nor report it as unanswered. One refused with
// its id is waited for like any request, and its refusal answers it.
func TestStdioDrainRefusedMessages(t *testing.T) {
	in := `{"jsonrpc":"2.0","id":5,"id":6,"method":"ping"}` + "\n" +
		`{"jsonrpc":"2.0","id":"` + strings.Repeat("x", 200) + `","method":"ping"}` + "\n" +
		`{"jsonrpc":"2.0","id":7,"ID":8,"method":"ping"}` + "\n" +
		`{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":5}}` + "\n"
	out := &syncBuilder{}
	d := NewStdioDrain(strings.NewReader(in), out)
	go io.Copy(io.Discard, d.Reader()) // mcp-go's reading: every line is refused before it
	deadline := time.Now().Add(5 * time.Second)
	for strings.Count(out.String(), "\n") < 4 {
		if time.Now().After(deadline) {
			t.Fatalf("refusals written: %q, want 4", out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	started := time.Now()
	if left := d.Drain(ctx); left != 0 || time.Since(started) > time.Second {
		t.Errorf("Drain after four refused messages: %d unanswered after %s, want 0 at once\n%s", left, time.Since(started), out.String())
	}
}

// syncBuilder is a strings.Builder safe for a writer and a reader.
type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestResponseID: an answer read from its first bytes has the id decoding
// it whole gives, and whatever is not shaped as mcp-go's answers is
// decoded whole.
func TestResponseID(t *testing.T) {
	big := `{"content":[{"type":"text","text":"` + strings.Repeat("x", 5000) + `"}]}`
	tests := []struct {
		name, line string
		want       string
		ok         bool
	}{
		{"number", `{"jsonrpc":"2.0","id":7,"result":` + big + `}`, "7", true},
		{"number written as a float", `{"jsonrpc":"2.0","id":7.0,"result":{}}`, "7", true},
		{"string", `{"jsonrpc":"2.0","id":"a-1","result":{}}`, `"a-1"`, true},
		{"escaped string", `{"jsonrpc":"2.0","id":"a\u0062","result":{}}`, `"ab"`, true},
		{"error answer", `{"jsonrpc":"2.0","id":9,"error":{"code":-32601,"message":"x"}}`, "9", true},
		{"null id", `{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}`, "", false},
		{"a request to the client", `{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{}}`, "", false},
		{"a notification", `{"jsonrpc":"2.0","method":"notifications/progress","params":{}}`, "", false},
		{"other member order", `{"id":4,"jsonrpc":"2.0","result":{}}`, "4", true},
		{"not json", `{"jsonrpc":"2.0","id":4,"result":`, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := responseID([]byte(tt.line))
			if got != tt.want || ok != tt.ok {
				t.Errorf("responseID = %q, %v; want %q, %v", got, ok, tt.want, tt.ok)
			}
			if whole, wok := decodeResponseID([]byte(tt.line)); whole != got || wok != ok {
				t.Errorf("decoded whole: %q, %v; from the first bytes: %q, %v", whole, wok, got, ok)
			}
		})
	}
}

// TestNormalizeIDPlain: an id normalizeID takes as written (plainID) is
// exactly what decoding and encoding it again gives, and ids written
// otherwise are still normalized.
func TestNormalizeIDPlain(t *testing.T) {
	for _, raw := range []string{`0`, `7`, `123456789012345`, `1234567890123456`, `-1`, `-0`, `07`, `7.0`, `1e3`,
		`"a-1"`, `"a b"`, `""`, `"<x>"`, `"a&b"`, `"\u0061"`, `"a\"b"`, `"é"`, "\"\x7f\"", `null`, `true`, `{}`, `"unterminated`} {
		var v any
		want, wantOK := "", false
		if json.Unmarshal([]byte(raw), &v) == nil {
			switch v.(type) {
			case string, float64:
				b, _ := json.Marshal(v)
				want, wantOK = string(b), true
			}
		}
		if plainID([]byte(raw)) && (!wantOK || want != raw) {
			t.Errorf("%s: taken as written, but it normalizes to %q, %v", raw, want, wantOK)
		}
		if got, ok := normalizeID(json.RawMessage(raw)); got != want || ok != wantOK {
			t.Errorf("normalizeID(%s) = %q, %v; want %q, %v", raw, got, ok, want, wantOK)
		}
	}
}
