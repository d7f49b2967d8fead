package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"idemgate/loadgen"
)

// TestBenchProgressLine: the progress line redraws itself (carriage
// return, clear to end of line), shows a bar when the run's end is known
// (by time or by calls, whichever is further along), and only the counts
// when it is not.
func TestBenchProgressLine(t *testing.T) {
	for _, tc := range []struct {
		p    loadgen.Progress
		want string
	}{
		{loadgen.Progress{Elapsed: 5 * time.Second, Calls: 1000, Errors: 2, Planned: 10 * time.Second},
			"\r\033[K[############............]  50%  5s  1000 calls  200 calls/s  2 errors"},
		{loadgen.Progress{Elapsed: 2 * time.Second, Calls: 750, Planned: 10 * time.Second, Target: 1000},
			"\r\033[K[##################......]  75%  2s  750 calls  375 calls/s  0 errors"},
		{loadgen.Progress{Elapsed: 12 * time.Second, Calls: 10, Planned: 10 * time.Second},
			"\r\033[K[########################] 100%  12s  10 calls  1 calls/s  0 errors"},
	} {
		var b bytes.Buffer
		drawProgress(&b, tc.p)
		if b.String() != tc.want {
			t.Errorf("drawProgress(%+v) =\n%q, want\n%q", tc.p, b.String(), tc.want)
		}
	}
}

// TestBenchProgressOnlyOnATerminal: a buffer, a regular file and a pipe
// are not terminals; no progress line is drawn on them.
func TestBenchProgressOnlyOnATerminal(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for name, out := range map[string]any{"buffer": &bytes.Buffer{}, "file": f, "pipe": w} {
		if isTerminal(out.(interface{ Write([]byte) (int, error) })) {
			t.Errorf("%s taken for a terminal", name)
		}
	}
}
