package server

import (
	"bufio"
	"io"
	"strings"
	"testing"
	"testing/iotest"
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
