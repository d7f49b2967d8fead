package server

import (
	"bufio"
	"context"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

func TestBoundedLines(t *testing.T) {
	big := strings.Repeat("x", 300)
	tests := []struct {
		name, in, want string
	}{
		{"short lines pass", "a\nbb\n", "a\nbb\n"},
		{"no final newline", "a\nbb", "a\nbb"},
		{"overlong line is replaced", "a\n" + big + "\nc\n", "a\n" + string(oversized) + "c\n"},
		{"overlong last line without newline", "a\n" + big, "a\n" + string(oversized)},
		{"exactly the limit passes", strings.Repeat("y", 99) + "\n", strings.Repeat("y", 99) + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, r := range []io.Reader{strings.NewReader(tt.in), iotest.OneByteReader(strings.NewReader(tt.in))} {
				got, err := io.ReadAll(&boundedLines{r: newBufio(r), max: 100})
				if err != nil {
					t.Fatal(err)
				}
				if string(got) != tt.want {
					t.Errorf("got %q, want %q", got, tt.want)
				}
			}
		})
	}
}

func TestBoundedLinesHugeLineStreams(t *testing.T) {
	// A line far larger than the reader's buffer is dropped without being
	// held whole.
	in := strings.Repeat("z", 5<<20) + "\nok\n"
	got, err := io.ReadAll(newBoundedLines(strings.NewReader(in), 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(oversized)+"ok\n" {
		t.Errorf("got %d bytes %.80q…", len(got), got)
	}
}

func newBufio(r io.Reader) *bufio.Reader { return bufio.NewReaderSize(r, 16) }

// TestStdioDrainRefusesBeforeMCP: a line examine refuses is
// answered on the output and never reaches the drain's reader (mcp-go);
// the lines around it pass unchanged; the drain's writer writes through.
func TestStdioDrainRefusesBeforeMCP(t *testing.T) {
	ok1 := `{"jsonrpc":"2.0","id":1,"method":"tools/list"}` + "\n"
	bad := `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"get_order","NAME":"cancel_order"}}` + "\n"
	deep := `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"create_order","arguments":{"items":` +
		strings.Repeat("[", 9000) + strings.Repeat("]", 9000) + "}}}\n"
	ok2 := "not json\n"
	out := &syncBuilder{}
	d := NewStdioDrain(strings.NewReader(ok1+bad+deep+ok2), out)
	lines := make(chan string)
	go func() {
		r := bufio.NewReader(d.Reader())
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				close(lines)
				return
			}
			lines <- line
		}
	}()
	var passed []string
	for len(passed) < 2 {
		select {
		case l := <-lines:
			passed = append(passed, l)
		case <-time.After(5 * time.Second):
			t.Fatalf("passed on %q, then nothing", passed)
		}
	}
	if got := strings.Join(passed, ""); got != ok1+ok2 {
		t.Errorf("passed on %q, want %q", got, ok1+ok2)
	}
	// The request passed on (id 1) is never answered here: Drain gives up
	// on it at once, then ends the reader.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if left := d.Drain(ctx); left != 1 {
		t.Errorf("Drain: %d unanswered, want 1 (the tools/list passed on)", left)
	}
	if l, more := <-lines; more {
		t.Errorf("passed on %q after the drain", l)
	}
	answers := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(answers) != 2 ||
		!strings.HasPrefix(answers[0], `{"jsonrpc":"2.0","id":2,"error":{"code":-32600,"message":"invalid request: members \"name\" and \"NAME\" in params differ only in case`) ||
		!strings.HasPrefix(answers[1], `{"jsonrpc":"2.0","id":3,"error":{"code":-32600,"message":"invalid request: the message nests arrays and objects more than 64 levels deep`) {
		t.Errorf("answers:\n%s", out.String())
	}
	if _, err := d.Writer().Write([]byte("x\n")); err != nil || !strings.HasSuffix(out.String(), "\nx\n") {
		t.Errorf("the drain's writer does not write through: %v", err)
	}
}
