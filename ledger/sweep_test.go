package ledger

import (
	"testing"
	"time"
)

// TestNextSweepChunk: a commit longer than the budget shrinks the next
// transaction in proportion, never below sweepMinChunk; a quick one grows
// it by a quarter, never above sweepChunk; one in between keeps it.
func TestNextSweepChunk(t *testing.T) {
	for _, tc := range []struct {
		chunk  int
		commit time.Duration
		want   int
	}{
		{50, time.Millisecond, 50},
		{50, 10 * time.Millisecond, 25},
		{50, 50 * time.Millisecond, 5},
		{50, time.Second, sweepMinChunk},
		{5, 20 * time.Millisecond, sweepMinChunk},
		{20, 4 * time.Millisecond, 20},
		{20, time.Millisecond, 25},
		{5, time.Millisecond, 6},
		{48, time.Millisecond, 50},
	} {
		if got := nextSweepChunk(tc.chunk, tc.commit); got != tc.want {
			t.Errorf("nextSweepChunk(%d, %v) = %d, want %d", tc.chunk, tc.commit, got, tc.want)
		}
	}
}
