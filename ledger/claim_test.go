package ledger

import (
	"testing"
	"time"
)

// TestIncarnationTimeOrdered: a new incarnation starts with its creation
// time, parses back, and two made at once differ.
func TestIncarnationTimeOrdered(t *testing.T) {
	at := time.UnixMilli(0x19ada3c5e1f)
	a, b := newIncarnation(at), newIncarnation(at.Add(time.Millisecond))
	if got, ok := IncarnationTime(a); !ok || got != "19ada3c5e1f" {
		t.Errorf("IncarnationTime(%s) = %q, %v; want 19ada3c5e1f", a, got, ok)
	}
	if !(a < b) || newIncarnation(at) == a {
		t.Errorf("incarnations %s, %s: want them ordered by time and random after it", a, b)
	}
	for _, old := range []string{"0123456789abcdef", "", "t19ada3c5e1f012345678901g", "T19ada3c5e1f0123456789012"} {
		if _, ok := IncarnationTime(old); ok {
			t.Errorf("IncarnationTime(%q) took it for a time-ordered one", old)
		}
	}
}
